"""The worked examples of docs/targets.md: each YAML block, merged over params.yaml as a user
would, validates as `check_params` validates it, sets every size for its target with a reason
(none left at the tiny target's default), and follows the rules that keep the stages' checks
quiet on a sound run: no row cut by tokenize.max_length (the truncation check, and the hidden-state
disk estimate that counts the rows), room for whole answers (the max_tokens check), a draft
vocabulary of a real drafter's size (the coverage check), and hidden states that fit the disk the
example names (the disk check)."""

import copy
import re
from pathlib import Path

import pytest
import yaml

from draftline.data.workspace import params_problems
from draftline.hidden_states.plan import PlanSettings, human, make_plan
from draftline.params import parse_params

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "targets.md"
SECTION = ("## Sizes for a real target", "## A real target on CPU")
BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)

# What docs/targets.md says of each example: a typical answer and a typical sample (prompt and
# answer), in tokens; the target's hidden size; the free disk it names for the hidden states.
FACTS = {
    "meta-llama/Llama-3.1-8B-Instruct": dict(answer=600, sample=900, hidden_size=4096, free=1e12),
    "moonshotai/Kimi-K2-Thinking": dict(answer=4000, sample=4500, hidden_size=7168, free=4e12),
    "moonshotai/Kimi-K2.5": dict(answer=4000, sample=4500, hidden_size=7168, free=4e12),
}
# Sizes every example sets itself, each on a line with its reason...
SIZES = (
    "samples",
    "mix.eval_samples",
    "mix.long_threshold_tokens",
    "regenerate.max_tokens",
    "regenerate.max_model_len",
    "regenerate.short.concurrency",
    "regenerate.short.max_context",
    "regenerate.long.concurrency",
    "regenerate.long.max_context",
    "tokenize.max_length",
    "vocab.draft_vocab_size",
    "hidden_states.mode",
    "hidden_states.format",
    "hidden_states.backend",
    "train.pack_len",
    "train.epochs",
    "train.lr",
    "evaluate.k",
    "evaluate.max_new_tokens",
    "evaluate.prompts",
    "benchmark.k",
    "benchmark.prompts",
    "benchmark.max_new_tokens",
    "benchmark.concurrency",
)
# ...and these are the tiny target's sizes: a real target's differ
TOY = (
    "samples",
    "mix.eval_samples",
    "regenerate.max_tokens",
    "regenerate.short.concurrency",
    "regenerate.short.max_context",
    "regenerate.long.concurrency",
    "regenerate.long.max_context",
    "tokenize.max_length",
    "vocab.draft_vocab_size",
    "train.pack_len",
    "train.epochs",
    "train.lr",
    "evaluate.max_new_tokens",
    "evaluate.prompts",
    "benchmark.prompts",
    "benchmark.max_new_tokens",
)
TEMPLATE_SLACK = 256  # tokens a chat template may add when it closes a turn
REFERENCE_DRAFT_VOCAB = 32000  # EAGLE-3 reference drafters (Llama 3.1, AQ-MedAI's Kimi K2)


def blocks() -> list[str]:
    text = DOC.read_text()
    start, end = text.index(SECTION[0]), text.index(SECTION[1])
    return BLOCK.findall(text[start:end])


def merged(block: dict, base: dict) -> dict:
    """`base` with every key of `block` set, nested keys one by one (lists replace)."""
    out = copy.deepcopy(base)
    for key, value in block.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(value, out[key])
        else:
            out[key] = copy.deepcopy(value)
    return out


def lookup(node, dotted: str):
    for part in dotted.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def given(block: dict, dotted: str) -> bool:
    node = block
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def size_problems(text: str) -> list[str]:
    """Sizes the block leaves out or leaves at the tiny default, and values set without a reason."""
    base_raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    block = yaml.safe_load(text)
    params, base = parse_params(merged(block, base_raw)), parse_params(base_raw)
    problems = [f"{key}: not set" for key in SIZES if not given(block, key)]
    problems += [
        f"{key}: {lookup(params, key)!r}, the tiny target's default"
        for key in TOY
        if lookup(params, key) == lookup(base, key)
    ]
    for line in text.splitlines():
        body = line.split("#")[0].rstrip()
        if body and not body.endswith(":") and "#" not in line:
            problems.append(f"no reason given: {line.strip()}")
    return problems


def rule_problems(text: str) -> list[str]:
    """Where the sizes would make a stage refuse the run, or the disk check rest on cut rows."""
    base_raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    p, base = parse_params(merged(yaml.safe_load(text), base_raw)), parse_params(base_raw)
    r, facts = p.regenerate, FACTS[p.target.model]
    contexts = [r.short.max_context, r.long.max_context]
    problems = []
    if None in contexts or r.max_model_len is None:
        return ["regenerate: give both partitions' max_context and max_model_len"]
    if p.tokenize.max_length < max(contexts) + TEMPLATE_SLACK:
        problems.append("tokenize.max_length: rows of the longest context would be cut")
    if p.train.pack_len < p.tokenize.max_length:
        problems.append("train.pack_len: the longest row would be cut in its pack")
    if r.short.max_context < p.mix.long_threshold_tokens + r.max_tokens:
        problems.append("regenerate.short.max_context: no room for a whole answer")
    if r.max_model_len < max(contexts):
        problems.append("regenerate.max_model_len: below a partition's max_context")
    if r.max_tokens < 2 * facts["answer"]:
        problems.append("regenerate.max_tokens: typical answers would reach it")
    for section in (p.evaluate, p.benchmark):
        if section.max_new_tokens < facts["answer"]:
            problems.append(f"{section.__class__.__name__}.max_new_tokens: below a typical answer")
        if section.prompts > p.mix.eval_samples:
            problems.append(f"{section.__class__.__name__}.prompts: more than mix.eval_samples")
    if p.vocab.draft_vocab_size < REFERENCE_DRAFT_VOCAB:
        problems.append("vocab.draft_vocab_size: below a reference drafter's")
    thresholds = (
        "regenerate.max_length_share",
        "tokenize.max_truncated_share",
        "vocab.min_coverage",
    )
    for key in thresholds:  # the checks stay on, at the shipped thresholds
        if lookup(p, key) != lookup(base, key):
            problems.append(f"{key}: the example changes a degenerate-run check's threshold")
    if p.hidden_states.mode == "offline":
        plan = make_plan(
            p.samples * facts["sample"],
            p.samples,
            facts["hidden_size"],
            PlanSettings(pack_len=p.train.pack_len, margin=p.hidden_states.disk_margin),
            free=int(facts["free"]),
        )
        mode = plan["modes"][f"offline_{p.hidden_states.format}"]
        if not mode["fits"]:
            problems.append("hidden_states: the states do not fit the disk the example names")
        if human(mode["total_bytes"]).replace(".0 ", " ") not in text:
            problems.append(f"hidden_states: the block does not quote {human(mode['total_bytes'])}")
    problems += params_problems(
        p.datasets, p.train.init, ROOT / "datasets" / "sources.yaml", ROOT / "models" / "draft"
    )
    return problems


def test_three_worked_examples():
    models = [yaml.safe_load(b)["target"]["model"] for b in blocks()]
    assert models == list(FACTS)


@pytest.mark.parametrize("text", blocks(), ids=lambda b: yaml.safe_load(b)["target"]["model"])
def test_every_size_is_set_for_the_target_with_a_reason(text):
    assert size_problems(text) == []


@pytest.mark.parametrize("text", blocks(), ids=lambda b: yaml.safe_load(b)["target"]["model"])
def test_the_sizes_keep_the_stage_checks_quiet_and_fit_the_disk(text):
    assert rule_problems(text) == []


def test_a_size_left_at_the_tiny_default_is_caught():
    kimi = blocks()[1]
    cut = kimi.replace("max_length: 16640 ", "max_truncated_share: 0.05 ")  # max_length left out
    assert cut != kimi and "tokenize.max_length: not set" in size_problems(cut)
    assert "tokenize.max_length: 512, the tiny target's default" in size_problems(cut)
    assert "tokenize.max_length: rows of the longest context would be cut" in rule_problems(cut)
    small = kimi.replace("max_tokens: 8192 ", "max_tokens: 96   ")
    assert "regenerate.max_tokens: 96, the tiny target's default" in size_problems(small)
    assert "regenerate.max_tokens: typical answers would reach it" in rule_problems(small)
    toy_vocab = kimi.replace("draft_vocab_size: 32000", "draft_vocab_size: 256")
    assert "vocab.draft_vocab_size: below a reference drafter's" in rule_problems(toy_vocab)
    bare = kimi.replace("epochs: 3                 # fine-tuning", "epochs: 3\n#")
    assert "no reason given: epochs: 3" in size_problems(bare)
