"""Server engines of the benchmark: preflight, serve commands, server-side acceptance parsing, and the
benchmark stage end to end against stand-ins for vLLM and SGLang (GPU-only engines).

The stand-ins are this file run as a script (`python tests/engines/test_engines.py vllm serve ...` /
`... sglang --model-path ...`): they parse the flags the benchmark passes with the engines' flag
names, and speak the engines' wire formats as their sources define them (vLLM:
serving_completion.py stream chunks with continuous usage, spec_decode Prometheus counters of
vllm/v1/spec_decode/metrics.py; SGLang: /generate stream with cumulative text and meta_info,
spec_verify_ct / spec_accept_histogram from TokenizerManager). They "decode" deterministically:
token j of every answer is `w{j}`, and speculative step n accepts n mod (k+1) draft tokens.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from http.server import ThreadingHTTPServer
from pathlib import Path

if __name__ == "__main__":  # run as a stand-in server: the helpers beside the tests by their names
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stubs import StubHandler

ROOT = Path(__file__).resolve().parents[2]
STEP_S = 0.002  # one decoding step of the stand-ins


def steps_for(max_tokens: int, k: int | None) -> list[int]:
    """Accepted draft tokens per step until max_tokens are out (k None: plain decoding)."""
    steps, produced = [], 0
    while produced < max_tokens:
        accepted = 0 if k is None else len(steps) % (k + 1)
        steps.append(accepted)
        produced += accepted + 1
    return steps


class StandIn(StubHandler):
    engine = "vllm"
    model = ""
    k: int | None = None
    server_info: dict = {}  # SGLang's /get_server_info
    lock = threading.Lock()
    counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}

    def do_GET(self):
        if self.path == "/health":
            self._json({})
        elif self.path == "/v1/models" and self.engine == "vllm":
            self._json(
                {
                    "object": "list",
                    "data": [{"id": self.model, "object": "model", "owned_by": "vllm"}],
                }
            )
        elif self.path == "/metrics" and self.engine == "vllm":
            self._text(self.metrics_text())
        elif self.path == "/get_server_info" and self.engine == "sglang":
            self._json(self.server_info)
        else:
            self._json({"detail": "Not Found"}, 404)

    def metrics_text(self) -> str:
        """prometheus_client's exposition of vLLM's counters (`_total` samples, labels model_name/engine)."""
        labels = f'engine="0",model_name="{self.model}"'
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} 0.0",
        ]
        if self.k is None:
            return "\n".join(lines) + "\n"
        c = self.counters
        for name, doc, value in (
            ("drafts", "Number of spec decoding drafts.", c["drafts"]),
            ("draft_tokens", "Number of draft tokens.", c["draft_tokens"]),
            ("accepted_tokens", "Number of accepted tokens.", c["accepted"]),
        ):
            lines += [
                f"# HELP vllm:spec_decode_num_{name}_total {doc}",
                f"# TYPE vllm:spec_decode_num_{name}_total counter",
                f"vllm:spec_decode_num_{name}_total{{{labels}}} {float(value)}",
                f"# HELP vllm:spec_decode_num_{name}_created {doc}",
                f"# TYPE vllm:spec_decode_num_{name}_created gauge",
                f"vllm:spec_decode_num_{name}_created{{{labels}}} 1.7e+09",
            ]
        lines += [
            "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
        ]
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{p}"}} {float(v)}'
            for p, v in enumerate(c["per_pos"])
        ]
        return "\n".join(lines) + "\n"

    def _sse(self, obj):
        self.wfile.write(f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode())
        self.wfile.flush()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.engine == "vllm" and self.path == "/v1/completions":
            return self.vllm_stream(body)
        if self.engine == "sglang" and self.path == "/generate":
            return self.sglang_stream(body)
        self._json({"detail": "Not Found"}, 404)

    def vllm_stream(self, body):
        assert (
            body["model"] == self.model
            and body["stream"] is True
            and isinstance(body["prompt"], list)
        )
        continuous = (body.get("stream_options") or {}).get("continuous_usage_stats", False)
        max_tokens, prompt_tokens = body["max_tokens"], len(body["prompt"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        produced = 0
        for accepted in steps_for(max_tokens, self.k):
            time.sleep(STEP_S)
            if self.k is not None:
                with self.lock:
                    self.counters["drafts"] += 1
                    self.counters["draft_tokens"] += self.k
                    self.counters["accepted"] += accepted
                    for p in range(accepted):
                        self.counters["per_pos"][p] += 1
            n = min(accepted + 1, max_tokens - produced)
            text = "".join(f"w{j} " for j in range(produced, produced + n))
            produced += n
            chunk = {
                "id": "cmpl-0",
                "object": "text_completion",
                "created": 0,
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": "length" if produced == max_tokens else None,
                        "stop_reason": None,
                        "prompt_token_ids": None,
                        "token_ids": None,
                    }
                ],
            }
            if continuous:
                chunk["usage"] = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": produced,
                    "total_tokens": prompt_tokens + produced,
                }
            self._sse(chunk)
        if body.get("stream_options", {}).get("include_usage"):
            self._sse(
                {
                    "id": "cmpl-0",
                    "object": "text_completion",
                    "created": 0,
                    "model": self.model,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": produced,
                        "total_tokens": prompt_tokens + produced,
                    },
                }
            )
        self._sse("[DONE]")

    def sglang_stream(self, body):
        assert body["stream"] is True and isinstance(body["input_ids"], list)
        max_tokens = body["sampling_params"]["max_new_tokens"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        steps, produced, text = steps_for(max_tokens, self.k), 0, ""
        for i, accepted in enumerate(steps):
            time.sleep(STEP_S)
            n = min(accepted + 1, max_tokens - produced)
            text += "".join(f"w{j} " for j in range(produced, produced + n))
            produced += n
            meta = {
                "id": "0",
                "prompt_tokens": len(body["input_ids"]),
                "completion_tokens": produced,
                "cached_tokens": 0,
                "finish_reason": {"type": "length", "length": max_tokens}
                if i == len(steps) - 1
                else None,
            }
            if i == len(steps) - 1 and self.k is not None:  # set when the request finishes
                hist = [steps.count(a) for a in range(self.k + 1)]
                meta.update(
                    spec_verify_ct=len(steps),
                    spec_accept_length=produced / len(steps),
                    spec_accept_rate=sum(steps) / (len(steps) * self.k),
                    spec_accept_histogram=hist,
                )
            self._sse({"text": text, "output_ids": [], "meta_info": meta})
        self._sse("[DONE]")


def stand_in_main(argv: list[str]) -> None:
    engine = argv[0]
    parser = argparse.ArgumentParser(prog=engine)
    if engine == "vllm":
        parser.add_argument("subcommand", choices=["serve"])
        parser.add_argument("model")
        parser.add_argument("--speculative-config", type=json.loads)
    else:
        parser.add_argument("--model-path", required=True)
        parser.add_argument(
            "--speculative-algorithm", choices=["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]
        )
        parser.add_argument("--speculative-draft-model-path")
        parser.add_argument("--speculative-num-steps", type=int)
        parser.add_argument("--speculative-eagle-topk", type=int)
        parser.add_argument("--speculative-num-draft-tokens", type=int)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--revision")
    args = parser.parse_args(argv[1:])
    StandIn.engine = engine
    if engine == "vllm":
        StandIn.model = args.model
        spec = args.speculative_config
        if spec:
            assert spec["method"] == "eagle3" and Path(spec["model"]).is_dir()
            StandIn.k = spec["num_speculative_tokens"]
    else:
        StandIn.server_info = {
            "model_path": args.model_path,
            "speculative_algorithm": args.speculative_algorithm,
            "speculative_draft_model_path": args.speculative_draft_model_path,
        }
        if args.speculative_algorithm:
            assert (
                args.speculative_eagle_topk == 1
                and args.speculative_num_draft_tokens == args.speculative_num_steps + 1
            )
            assert Path(args.speculative_draft_model_path).is_dir()
            StandIn.k = args.speculative_num_steps
    StandIn.counters["per_pos"] = [0] * (StandIn.k or 0)
    ThreadingHTTPServer((args.host, args.port), StandIn).serve_forever()


if __name__ == "__main__":
    stand_in_main(sys.argv[1:])
    sys.exit(0)


# ---- tests -------------------------------------------------------------------------------------

import pytest  # noqa: E402
import yaml  # noqa: E402

from draftline.benchmark.config import BenchmarkConfig  # noqa: E402
from draftline.benchmark.spec_metrics import (  # noqa: E402
    parse_prometheus,
    sglang_acceptance,
    vllm_acceptance,
    vllm_spec_counters,
)
from draftline.core.card import TargetCard  # noqa: E402
from draftline.core.io import read_json, write_json, write_jsonl  # noqa: E402
from draftline.draft.checkpoint import read_draft_facts  # noqa: E402
from draftline.draft.preflight import check_draft, check_engine_settings, preflight_engines  # noqa: E402
from draftline.draft.sglang_export import export_sglang  # noqa: E402
from draftline.engines.commands import benchmark_serve_command  # noqa: E402


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory, random_target, vocab_dir):
    """A freshly built draft for the random target, saved in speculators format."""
    import torch

    from draftline.draft.model import build_draft

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("draft")
    build_draft(random_target, vocab_dir, 1, 3).save_pretrained(path)
    return path


def bench_cfg(**overrides) -> BenchmarkConfig:
    return BenchmarkConfig(**overrides)


# -- preflight -----------------------------------------------------------------------------------


def test_preflight_accepts_the_trained_draft_for_vllm(random_target, draft_dir):
    facts = read_draft_facts(draft_dir)
    assert facts.layout == "speculators" and facts.algorithm == "eagle3"
    assert check_draft(random_target, facts, "vllm") == []
    assert check_engine_settings("vllm", bench_cfg(), facts) == []


def test_preflight_refuses_a_non_eagle3_algorithm(random_target, draft_dir):
    facts = read_draft_facts(draft_dir)
    [vllm] = check_engine_settings("vllm", bench_cfg(vllm={"method": "eagle"}), facts)
    assert "benchmark.vllm.method" in vllm and "'eagle3'" in vllm
    sglang = check_engine_settings("sglang", bench_cfg(sglang={"algorithm": "EAGLE"}), facts)
    assert any("benchmark.sglang.algorithm" in p for p in sglang)


def test_preflight_refuses_aux_ids_hidden_size_and_vocab_that_do_not_match(
    random_target, draft_dir
):
    facts = read_draft_facts(draft_dir)
    [aux] = check_draft(replace(random_target, aux_layer_ids=[1, 2, 4]), facts, "vllm")
    assert "aux layer ids" in aux and "[1, 2, 3]" in aux
    hidden = check_draft(replace(random_target, hidden_size=96), facts, "vllm")
    assert len(hidden) == 2 and all("hidden size" in p for p in hidden)
    vocab = check_draft(
        replace(random_target, vocab_size=random_target.vocab_size // 4), facts, "vllm"
    )
    assert any("outside the target vocabulary" in p for p in vocab)
    assert any("t2d covers" in p for p in vocab)


def test_preflight_knows_sglangs_aux_id_convention(
    tmp_path, random_target, draft_dir, eagle3_draft_dir
):
    """SGLang's eagle_config ids name layer outputs: the card's [1, 2, 3] are SGLang's [0, 1, 2]."""
    facts = read_draft_facts(draft_dir)
    assert any(
        "speculators checkpoint" in p for p in check_engine_settings("sglang", bench_cfg(), facts)
    )
    exported = export_sglang(eagle3_draft_dir, random_target, tmp_path / "good")
    good = read_draft_facts(exported)
    assert good.layout == "eagle" and check_draft(random_target, good, "sglang") == []
    assert check_engine_settings("sglang", bench_cfg(), good) == []
    config = read_json(exported / "config.json")
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [
        1,
        2,
        3,
    ]  # written in vLLM's convention by mistake
    write_json(exported / "config.json", config)
    [problem] = check_draft(random_target, read_draft_facts(exported), "sglang")
    assert "[2, 3, 4]" in problem and "id = card id - 1" in problem


def test_serve_commands_for_both_engines(random_target, draft_dir):
    from draftline.engines.config import vllm_engine

    cfg = bench_cfg(
        k=4,
        port=9000,
        vllm={"args": ["--tensor-parallel-size", "8"]},
        sglang={"args": ["--tp-size", "8"]},
    )
    model = str(Path(random_target.model).resolve())
    # engines.vllm: its interpreter (the project's .venv-vllm when there is one), vLLM's server module
    assert benchmark_serve_command("vllm", random_target, cfg, None) == [
        vllm_engine().resolved_python(),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--tensor-parallel-size",
        "8",
    ]
    spec = benchmark_serve_command("vllm", random_target, cfg, "/d")
    assert (
        spec[:-2] == benchmark_serve_command("vllm", random_target, cfg, None)
        and spec[-2] == "--speculative-config"
    )
    assert json.loads(spec[-1]) == {"method": "eagle3", "model": "/d", "num_speculative_tokens": 4}
    assert benchmark_serve_command("sglang", random_target, cfg, "/d") == [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--tp-size",
        "8",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "/d",
        "--speculative-num-steps",
        "4",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "5",
    ]
    deploy = preflight_engines(random_target, cfg, str(draft_dir))
    assert deploy["vllm"]["problems"] == [] and "--speculative-config" in deploy["vllm"]["command"]
    assert deploy["sglang"]["problems"]  # a speculators checkpoint: SGLang needs the other layout


def test_benchmark_params_refuse_a_chain_with_other_draft_token_counts():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="num_draft_tokens must be num_steps \\+ 1"):
        bench_cfg(sglang={"num_steps": 3, "num_draft_tokens": 5})
    with pytest.raises(ValidationError, match="concurrency"):
        bench_cfg(concurrency=[])
    assert (
        bench_cfg(
            sglang={"num_steps": 3, "eagle_topk": 4, "num_draft_tokens": 8}
        ).sglang.num_draft_tokens
        == 8
    )


# -- server-side acceptance --------------------------------------------------------------------


def test_vllm_counters_give_acceptance_between_snapshots():
    StandIn.model, StandIn.k = "m", 3
    StandIn.counters = {"drafts": 4, "draft_tokens": 12, "accepted": 6, "per_pos": [3, 2, 1]}
    before = vllm_spec_counters(StandIn.metrics_text(StandIn))
    StandIn.counters = {"drafts": 14, "draft_tokens": 42, "accepted": 16, "per_pos": [8, 5, 3]}
    after = vllm_spec_counters(StandIn.metrics_text(StandIn))
    acc = vllm_acceptance(before, after)
    assert acc == {
        "drafts": 10,
        "acceptance_length": 2.0,
        "draft_acceptance_rate": round(10 / 30, 4),
        "position_acceptance": {"1": 0.5, "2": 0.3, "3": 0.2},
    }
    StandIn.k = None
    assert vllm_spec_counters(StandIn.metrics_text(StandIn)) is None  # a baseline server has none
    samples = parse_prometheus('x{a="q\\"uote",b="2"} 3.5\n# comment\ny 1e3\n')
    assert samples == [("x", {"a": 'q"uote', "b": "2"}, 3.5), ("y", {}, 1000.0)]


def test_sglang_meta_info_gives_acceptance():
    metas = [
        {"completion_tokens": 10, "spec_verify_ct": 4, "spec_accept_histogram": [1, 1, 1, 1]},
        {"completion_tokens": 6, "spec_verify_ct": 4, "spec_accept_histogram": [2, 2, 0, 0]},
        {"completion_tokens": 3},
    ]  # no spec counters (e.g. an aborted request)
    assert sglang_acceptance(metas) == {
        "drafts": 8,
        "acceptance_length": 2.0,
        "position_acceptance": {"1": 0.625, "2": 0.25, "3": 0.125},
    }
    assert sglang_acceptance([{"completion_tokens": 5}]) is None


# -- the stage against the stand-ins ---------------------------------------------------------------


def run_benchmark_stage(
    tmp_path: Path, card: TargetCard, draft: Path, overrides: dict, conversations=None
) -> subprocess.CompletedProcess:
    """The stage on `conversations` as eval prompts (default: 3 generated ones)."""
    from draftline.target.corpus import generate_conversations

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["benchmark"].update(overrides)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    card.write(tmp_path / "card.json")
    conversations = generate_conversations(3, 9) if conversations is None else conversations
    write_jsonl(
        tmp_path / "eval.jsonl",
        [{"id": f"e{i}", "source": "s", **c} for i, c in enumerate(conversations)],
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "stages.benchmark",
            "card.json",
            str(draft),
            "eval.jsonl",
            "bench.json",
            "deploy.json",
        ],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path)),  # server logs
        capture_output=True,
        text=True,
        timeout=300,
    )


STAND_IN = [sys.executable, str(Path(__file__).resolve())]
LOAD = {
    "k": 3,
    "max_new_tokens": 10,
    "prompts": 3,
    "warmup": 1,
    "concurrency": [1, 4],
    "requests_per_level": 6,
    "startup_timeout_s": 60,
    "request_timeout_s": 30,
}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_benchmark_stage_drives_baseline_and_speculative_servers(
    tmp_path, random_target, draft_dir, eagle3_draft_dir, engine
):
    """vLLM serves the speculators checkpoint as it is; for SGLang the stage exports the draft
    (train.architecture: eagle3) to SGLang's layout and serves that copy."""
    overrides = {
        **LOAD,
        "engine": engine,
        "port": free_port(),
        "vllm": {"launcher": STAND_IN + ["vllm", "serve"]},
        "sglang": {"launcher": STAND_IN + ["sglang"]},
    }
    proc = run_benchmark_stage(
        tmp_path, random_target, draft_dir if engine == "vllm" else eagle3_draft_dir, overrides
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = read_json(tmp_path / "bench.detail.json")
    headline = {
        "speedup",
        "baseline_tokens_per_s",
        "speculative_tokens_per_s",
        "speedup_c1",
        "speedup_c4",
    }
    assert set(read_json(tmp_path / "bench.json")) == headline  # the rest is in the detail file
    # 10 tokens per answer in steps accepting 0, 1, 2, 3 drafts: 4 steps, 1 + 6/4 = 2.5
    assert report["acceptance_length"] == 2.5
    for c in ("c1", "c4"):
        level = report["levels"][c]
        assert level["acceptance_length"] == 2.5
        assert level["speculative"]["position_acceptance"] == {"1": 0.75, "2": 0.5, "3": 0.25}
        for mode in ("baseline", "speculative"):
            assert (
                level[mode]["requests"] == 6
                and level[mode]["failed"] == 0
                and level[mode]["output_tokens"] == 60
            )
            assert (
                level[mode]["ttft_ms_p50"] > 0
                and level[mode]["itl_ms_p99"] > 0
                and level[mode]["tpot_ms_p50"] > 0
            )
        assert level["identical_output_share"] == 1.0 and level["speedup"] > 0
    assert set(report) >= {
        "speedup",
        "speedup_c1",
        "speedup_c4",
        "baseline_tokens_per_s",
        "speculative_tokens_per_s",
    }
    deploy = read_json(tmp_path / "deploy.json")
    assert deploy["benchmark"]["serve_commands"]["speculative"] == deploy[engine]["command"]
    assert deploy[engine]["problems"] == [] and deploy[engine]["command"] in proc.stdout
    assert deploy["benchmark"]["warnings"] == []
    if engine == "sglang":
        exported = Path(deploy["benchmark"]["server_logs"]) / "draft_sglang"
        assert f"--speculative-draft-model-path {exported}" in deploy["sglang"]["command"]
        assert read_json(exported / "config.json")["architectures"] == ["LlamaForCausalLMEagle3"]


def test_hf_benchmark_prints_no_warning_about_engines_not_in_use(
    tmp_path, random_target, draft_dir
):
    """The default draft has speculators' norms, which SGLang cannot serve: deploy.json says so for
    whoever deploys with SGLang, but the hf benchmark prints no warning about it."""
    overrides = {
        "engine": "hf",
        "k": 2,
        "max_new_tokens": 6,
        "prompts": 2,
        "warmup": 0,
        "repeats": 1,
    }
    proc = run_benchmark_stage(tmp_path, random_target, draft_dir, overrides)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert read_json(tmp_path / "deploy.json")["sglang"]["problems"]
    assert (
        "warning" not in (proc.stdout + proc.stderr).lower()
        and "deploy.json notes what deploying with sglang" in proc.stdout
    )
    assert set(read_json(tmp_path / "bench.json")) == {
        "speedup",
        "baseline_tokens_per_s",
        "speculative_tokens_per_s",
    }


def test_benchmark_stage_stops_before_launching_on_a_preflight_error(
    tmp_path, random_target, draft_dir, eagle3_draft_dir
):
    overrides = {
        **LOAD,
        "engine": "sglang",
        "port": free_port(),
        "sglang": {"launcher": STAND_IN + ["sglang"], "algorithm": "EAGLE"},
    }
    proc = run_benchmark_stage(tmp_path, random_target, eagle3_draft_dir, overrides)
    assert proc.returncode != 0 and not (tmp_path / "bench.json").exists()
    assert "benchmark.sglang.algorithm" in proc.stderr and "starting" not in proc.stdout
    # a draft with speculators' norms has no SGLang copy: refused before any server starts
    overrides["sglang"]["algorithm"] = "EAGLE3"
    proc = run_benchmark_stage(tmp_path, random_target, draft_dir, overrides)
    assert proc.returncode != 0 and not (tmp_path / "bench.json").exists()
    assert (
        "cannot be served by SGLang" in proc.stderr and "train.architecture: eagle3" in proc.stderr
    )
    assert "starting" not in proc.stdout


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_benchmark_on_already_running_servers(
    tmp_path, random_target, draft_dir, eagle3_draft_dir, engine
):
    """benchmark.endpoints: the stage starts nothing, checks each running server (target, draft or
    none), and measures them; a baseline URL that points at the speculative server is refused."""
    import httpx

    from draftline.draft.sglang_export import export_sglang
    from draftline.engines.commands import draft_path_for

    draft = draft_dir if engine == "vllm" else eagle3_draft_dir
    cfg = BenchmarkConfig(
        **{
            **LOAD,
            "engine": engine,
            "vllm": {"launcher": STAND_IN + ["vllm", "serve"]},
            "sglang": {"launcher": STAND_IN + ["sglang"]},
        }
    )
    served = (
        export_sglang(draft, random_target, tmp_path / "draft_sglang")
        if engine == "sglang"
        else draft
    )
    ports, procs = {"baseline": free_port(), "speculative": free_port()}, []
    for mode, port in ports.items():
        cmd = benchmark_serve_command(
            engine,
            random_target,
            cfg,
            draft_path_for(engine, cfg, str(served)) if mode == "speculative" else None,
            port,
        )
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        for port in ports.values():
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
        urls = {mode: f"http://127.0.0.1:{port}" for mode, port in ports.items()}
        overrides = {
            **LOAD,
            "engine": engine,
            "port": free_port(),
            "endpoints": urls,
            "vllm": {"launcher": ["/nonexistent/vllm"]},
            "sglang": {"launcher": ["/nonexistent/sglang"], "draft_model_path": str(served)},
        }
        proc = run_benchmark_stage(tmp_path, random_target, draft, overrides)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert "starting" not in proc.stdout and "preflight" in proc.stdout
        assert read_json(tmp_path / "bench.detail.json")["acceptance_length"] == 2.5
        swapped = {
            **overrides,
            "endpoints": {"baseline": urls["speculative"], "speculative": urls["speculative"]},
        }
        proc = run_benchmark_stage(tmp_path, random_target, draft, swapped)
        assert (
            proc.returncode != 0
            and "error: benchmark.endpoints:" in proc.stderr
            and "speculative decoding" in proc.stderr
        )
    finally:
        for p in procs:
            p.terminate()
            p.wait()
