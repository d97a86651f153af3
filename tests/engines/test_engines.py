"""Server engines of the benchmark: preflight, serve commands, server-side acceptance parsing, and the
benchmark stage end to end against stand-ins for vLLM and SGLang (GPU-only engines).

The stand-ins are this file run as a script (`python tests/engines/test_engines.py vllm serve ...` /
`... sglang --model-path ...`): they parse the flags the benchmark passes with the engines' flag
names, and speak the engines' wire formats as their sources define them (vLLM 0.32:
entrypoints/openai/completion/serving.py stream chunks with continuous usage, `token_ids` per chunk
for `return_token_ids`, `logprobs.top_logprobs` keyed "token_id:<id>" for `logprobs` +
`return_tokens_as_token_ids`; spec_decode Prometheus counters of vllm/v1/spec_decode/metrics.py;
SGLang: /generate stream with cumulative text and meta_info, spec_verify_ct /
spec_accept_histogram from TokenizerManager). They "decode" deterministically: token j of every
answer is the word `w{j}`, token id j, and speculative step n accepts n mod (k+1) draft tokens.

A speculative stand-in's step costs more with more requests in flight, the more so the larger its
k (a compute-bound verify): STEP_S x (1 + k x (requests in flight - 1)); the baseline's step is
STEP_S at any load. So speculation pays at 1 request in flight (k=3 most) and loses at 4.
Environment of the stand-ins (for the lossless gate): STAND_IN_DIVERGE_AT=p makes a speculative
server answer token id ALT + p (the word `x{p}`) at position p instead of the baseline's p;
STAND_IN_TIE_GAP (default 5.0) is how far below the greedy token's logprob the baseline ranks that
token in its top logprobs.
"""

import argparse
import contextlib
import json
import os
import shlex
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
STEP_S = 0.004  # one decoding step of the stand-ins (the baseline's at any load)
ALT = 1000  # the token id a diverging speculative stand-in answers at STAND_IN_DIVERGE_AT: ALT + p


def steps_for(max_tokens: int, k: int | None) -> list[int]:
    """Accepted draft tokens per step until max_tokens are out (k None: plain decoding)."""
    steps, produced = [], 0
    while produced < max_tokens:
        accepted = 0 if k is None else len(steps) % (k + 1)
        steps.append(accepted)
        produced += accepted + 1
    return steps


def answer_ids(k: int | None, first: int, n: int) -> list[int]:
    """Token ids first .. first + n - 1 of an answer: j, or ALT + j at STAND_IN_DIVERGE_AT for a
    speculative server."""
    diverge = os.environ.get("STAND_IN_DIVERGE_AT")
    at = int(diverge) if diverge and k is not None else None
    return [ALT + j if j == at else j for j in range(first, first + n)]


def word(token_id: int) -> str:
    return f"x{token_id - ALT} " if token_id >= ALT else f"w{token_id} "


def top_logprobs(token_ids: list[int]) -> dict:
    """vLLM's completion `logprobs` of these greedy tokens with return_tokens_as_token_ids: each
    token's top logprobs keyed "token_id:<id>", the runner-up (ALT + j) STAND_IN_TIE_GAP below."""
    gap = float(os.environ.get("STAND_IN_TIE_GAP", "5.0"))
    return {
        "text_offset": [0] * len(token_ids),
        "token_logprobs": [-0.25] * len(token_ids),
        "tokens": [f"token_id:{t}" for t in token_ids],
        "top_logprobs": [
            {f"token_id:{t}": -0.25, f"token_id:{ALT + t}": -0.25 - gap} for t in token_ids
        ],
    }


class StandIn(StubHandler):
    engine = "vllm"
    model = ""
    k: int | None = None
    server_info: dict = {}  # SGLang's /get_server_info
    lock = threading.Lock()
    counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
    active = 0  # requests in flight

    @contextlib.contextmanager
    def in_flight(self):
        with self.lock:
            StandIn.active += 1
        try:
            yield
        finally:
            with self.lock:
                StandIn.active -= 1

    def step(self) -> None:
        """One decoding step: dearer with more requests in flight for a speculative server."""
        load = 0 if self.k is None else self.k * max(0, StandIn.active - 1)
        time.sleep(STEP_S * (1 + load))

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

    def count_step(self, accepted: int) -> None:
        if self.k is not None:
            with self.lock:
                self.counters["drafts"] += 1
                self.counters["draft_tokens"] += self.k
                self.counters["accepted"] += accepted
                for p in range(accepted):
                    self.counters["per_pos"][p] += 1

    def vllm_stream(self, body):
        assert (
            body["model"] == self.model
            and body["stream"] is True
            and isinstance(body["prompt"], list)
        )
        continuous = (body.get("stream_options") or {}).get("continuous_usage_stats", False)
        want_ids = body.get("return_token_ids", False)
        want_logprobs = body.get("logprobs") is not None
        # the benchmark reads logprobs by token id: vLLM keys them by the decoded token otherwise
        assert not want_logprobs or body.get("return_tokens_as_token_ids") is True
        max_tokens, prompt_tokens = body["max_tokens"], len(body["prompt"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        produced = 0
        with self.in_flight():
            for accepted in steps_for(max_tokens, self.k):
                self.step()
                self.count_step(accepted)
                n = min(accepted + 1, max_tokens - produced)
                ids = answer_ids(self.k, produced, n)
                chunk = {
                    "id": "cmpl-0",
                    "object": "text_completion",
                    "created": 0,
                    "model": self.model,
                    "choices": [
                        {
                            "index": 0,
                            "text": "".join(word(t) for t in ids),
                            "logprobs": top_logprobs(ids) if want_logprobs else None,
                            "finish_reason": "length" if produced + n == max_tokens else None,
                            "stop_reason": None,
                            # the first chunk carries the prompt's ids with return_token_ids
                            "prompt_token_ids": body["prompt"]
                            if want_ids and not produced
                            else None,
                            "token_ids": ids if want_ids else None,
                        }
                    ],
                }
                produced += n
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
        """Text only (output_ids empty): the lossless gate compares texts."""
        assert body["stream"] is True and isinstance(body["input_ids"], list)
        max_tokens = body["sampling_params"]["max_new_tokens"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        steps, produced, text = steps_for(max_tokens, self.k), 0, ""
        with self.in_flight():
            for i, accepted in enumerate(steps):
                self.step()
                n = min(accepted + 1, max_tokens - produced)
                text += "".join(word(t) for t in answer_ids(self.k, produced, n))
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
        parser.add_argument("--dtype")  # benchmark.vllm.args' default
        parser.add_argument("--enforce-eager", action="store_true")
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
            # a draft served as EAGLE-3, or n-gram prompt lookup with no draft (benchmark.free)
            assert (spec["method"] == "eagle3" and Path(spec["model"]).is_dir()) or (
                spec["method"] == "ngram" and "model" not in spec
            )
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

from draftline.benchmark.commands import (  # noqa: E402
    benchmark_serve_command,
    k_per_batch_size_command,
)
from draftline.benchmark.config import BenchmarkConfig  # noqa: E402
from draftline.benchmark.preflight import check_engine_settings, preflight_engines  # noqa: E402
from draftline.benchmark.spec_metrics import (  # noqa: E402
    parse_prometheus,
    sglang_acceptance,
    vllm_acceptance,
    vllm_spec_counters,
)
from draftline.core.card import TargetCard  # noqa: E402
from draftline.core.io import read_json, write_json, write_jsonl  # noqa: E402
from draftline.draft.checkpoint import read_draft_facts  # noqa: E402
from draftline.draft.preflight import check_draft  # noqa: E402
from draftline.draft.sglang_export import export_sglang  # noqa: E402


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
    from draftline.train.config import TrainConfig

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("draft")
    build_draft(random_target, vocab_dir, TrainConfig()).save_pretrained(path)
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


def test_serve_commands_at_each_k_and_k_per_batch_size(random_target):
    """One server per k of the sweep (no k: the largest); vLLM's k per batch size rides in its
    speculative config; benchmark.sglang.num_steps, when set, wins over k."""
    cfg = bench_cfg(k=[1, 3, 2], port=9000)

    def spec(**kw) -> dict:
        cmd = benchmark_serve_command("vllm", random_target, cfg, "/d", **kw)
        return json.loads(cmd[cmd.index("--speculative-config") + 1])

    def scheduled(schedule) -> dict:
        cmd = k_per_batch_size_command(random_target, cfg, "/d", schedule)
        return json.loads(cmd[cmd.index("--speculative-config") + 1])

    assert spec()["num_speculative_tokens"] == 3 and cfg.ks == [1, 2, 3]
    assert spec(k=1) == {"method": "eagle3", "model": "/d", "num_speculative_tokens": 1}
    schedule = [[1, 2, 3], [3, 8, 1], [9, 16, 0]]
    assert scheduled(schedule) == {
        "method": "eagle3",
        "model": "/d",
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": schedule,
    }
    baseline = benchmark_serve_command("vllm", random_target, cfg, None, k=2)
    assert "--speculative-config" not in baseline

    def sglang_steps(cfg, k) -> list[str]:
        cmd = benchmark_serve_command("sglang", random_target, cfg, "/d", k=k)
        return cmd[cmd.index("--speculative-num-steps") :]

    assert sglang_steps(cfg, 2) == [
        "--speculative-num-steps",
        "2",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "3",
    ]
    fixed = bench_cfg(k=[1, 3], sglang={"num_steps": 5})
    assert sglang_steps(fixed, 1)[:2] == ["--speculative-num-steps", "5"]


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


def test_benchmark_params_k_list_loads_and_goals():
    """k: a list of distinct counts (an int is a list of one); the serve load one of the measured
    loads (engine hf measures 1 request in flight and ignores it); the tie tolerance by dtype."""
    from pydantic import ValidationError

    assert bench_cfg(k=3).k == [3] and bench_cfg(k=[3, 1]).ks == [1, 3]
    for k in ([], [0, 1], [2, 2]):
        with pytest.raises(ValidationError, match="k: give distinct draft token counts"):
            bench_cfg(k=k)
    with pytest.raises(ValidationError, match="repeats a level"):
        bench_cfg(concurrency=[1, 4, 4])
    with pytest.raises(ValidationError, match="serve_concurrency 8 is not one of concurrency"):
        bench_cfg(concurrency=[1, 4], serve_concurrency=8)
    assert bench_cfg(engine="hf", concurrency=[1, 4], serve_concurrency=8).serve_concurrency == 8
    with pytest.raises(ValidationError, match="speedup_goals"):
        bench_cfg(speedup_goals=[])
    with pytest.raises(ValidationError):
        bench_cfg(max_output_mismatch_share=1.5)
    assert bench_cfg().resolved_tie_tolerance() == 0.0  # float32
    assert bench_cfg(dtype="bfloat16").resolved_tie_tolerance() == 0.5
    assert bench_cfg(dtype="bfloat16", tie_tolerance=0.2).resolved_tie_tolerance() == 0.2


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
    tmp_path: Path,
    card: TargetCard,
    draft: Path,
    overrides: dict,
    conversations=None,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """The stage on `conversations` as eval prompts (default: 3 generated ones), as dvc.yaml runs
    it but without the acceptance-vs-samples points; `env` added to its environment (and its
    servers')."""
    from draftline.targets.corpus import generate_conversations

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    # no benchmark.free servers unless asked: the stand-ins serve drafts only (a real n-gram
    # server: tests/benchmark/test_free_methods.py)
    raw["benchmark"].update({"free": {}, **overrides})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    card.write(tmp_path / "card.json")
    conversations = generate_conversations(3, 9) if conversations is None else conversations
    write_jsonl(
        tmp_path / "eval.jsonl",
        [{"id": f"e{i}", "source": "s", **c} for i, c in enumerate(conversations)],
    )
    return subprocess.run(
        [sys.executable, "-m", "stages.benchmark", "card.json", str(draft), "eval.jsonl"]
        + ["bench.json", "deploy.json", "plots"],
        cwd=tmp_path,
        # TMPDIR: the server logs
        env=dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path), **(env or {})),
        capture_output=True,
        text=True,
        timeout=300,
    )


STAND_IN = [sys.executable, str(Path(__file__).resolve())]
LOAD = {
    "k": [1, 3],
    "max_new_tokens": 10,
    "prompts": 3,
    "warmup": 1,
    "concurrency": [1, 4],
    "serve_concurrency": 4,
    "requests_per_level": 6,
    "repeats": 1,  # one round (test_benchmark_rounds_run_the_servers_side_by_side...: more)
    "min_pass_s": 0,  # each pass exactly requests_per_level requests
    "startup_timeout_s": 60,
    "request_timeout_s": 30,
}
# 10 tokens per answer in steps accepting 0, 1, ..., k, 0, ... drafts: k=1 7 steps (3 accepted),
# k=3 4 steps (6 accepted)
ACCEPTANCE = {1: round(10 / 7, 4), 3: 2.5}
POSITIONS = {1: {"1": round(3 / 7, 4)}, 3: {"1": 0.75, "2": 0.5, "3": 0.25}}


def stand_ins(engine: str) -> dict:
    return {
        "engine": engine,
        "port": free_port(),
        "vllm": {"launcher": STAND_IN + ["vllm", "serve"]},
        "sglang": {"launcher": STAND_IN + ["sglang"]},
    }


def spec_k(engine: str, command: str) -> int | None:
    """The k a server command line serves (None: no draft)."""
    import shlex

    argv = shlex.split(command)
    if engine == "vllm":
        if "--speculative-config" not in argv:
            return None
        return json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"]
    if "--speculative-num-steps" not in argv:
        return None
    draft_tokens = int(argv[argv.index("--speculative-num-draft-tokens") + 1])
    steps = int(argv[argv.index("--speculative-num-steps") + 1])
    assert draft_tokens == steps + 1  # a chain verifies k + 1 tokens
    return steps


def test_benchmark_rounds_run_the_servers_side_by_side_shuffled_and_paired(
    tmp_path, random_target, draft_dir
):
    """benchmark.repeats rounds with every server up at once: in each round every server runs one
    pass of at least min_pass_s in a shuffled order, each speculative pass is paired with the
    baseline pass beside it, the idle servers' CPU use is recorded, and the decision is made on
    the pairs' interval: k=3 pays at 1 request in flight (the stand-ins' cost), decided yes; at 4
    every k loses, decided no; vLLM's k per batch size follows."""
    import shlex

    overrides = {**LOAD, **stand_ins("vllm"), "repeats": 4, "min_pass_s": 0.5}
    proc = run_benchmark_stage(tmp_path, random_target, draft_dir, overrides)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = read_json(tmp_path / "bench.detail.json")
    design = report["verdict"]["design"]
    assert design["layout"] == "side_by_side" and design["servers"] == ["baseline", "k1", "k3"]
    assert design["rounds"] == 4 and design["passes"] == 4 * 2 * 3 and design["pass_s_min"] >= 0.5
    orders = [tuple(order) for _, _, order in design["rounds_order"]]
    assert len(orders) == 4 * 2 and all(sorted(o) == ["baseline", "k1", "k3"] for o in orders)
    assert len(set(orders)) > 1  # shuffled: not the same order every round
    idle = design["idle_servers_cpu_cores"]
    assert 0 <= idle["per_server_median"] <= idle["per_server_max"] < 1
    assert all(gib and gib > 0 for gib in design["servers_rss_gib"].values())
    level = report["levels"]["c1"]
    for mode in ("baseline", "k1", "k3"):
        assert len(level[mode]["runs_tokens_per_s"]) == 4 and level[mode]["passes"] == 4
        assert level[mode]["requests"] >= 4 * 6  # at least 6 a pass, more while 0.5 s last
    for k in (1, 3):
        pairs = level[f"k{k}"]["paired_speedups"]
        assert len(pairs) == 4 and level[f"k{k}"]["speedup_low"] < level[f"k{k}"]["speedup_high"]
    compared = sum(report["levels"][c][k]["requests"] for c in ("c1", "c4") for k in ("k1", "k3"))
    assert report["lossless"]["compared_outputs"] == compared  # every pass judged
    v = report["verdict"]
    d = v["decisions"]["1"]
    assert (d["decision"], d["k"]) == ("yes", 3) and 1 < d["low"] < d["speedup"] < d["high"]
    assert v["confidence"] == 0.9 and "Bonferroni" in v["method"]
    assert f"k=3 gives {d['speedup']:.2f}x [{d['low']:.2f}-{d['high']:.2f}]" in v["words"]
    # at 4 in flight every k's interval lies below 1: no; vLLM's k per batch size from the decisions
    assert v["decisions"]["4"]["decision"] == "no" and v["decisions"]["4"]["high"] < 1
    assert v["break_even"]["pays_at"] == [1] and v["break_even"]["loses_at"] == [4]
    assert 1 < v["break_even"]["break_even_concurrency"] < 4
    deploy = read_json(tmp_path / "deploy.json")
    assert deploy["vllm"]["k_per_batch_size"] == v["k_per_batch_size"] == [[1, 2, 3], [3, 1024, 0]]
    argv = shlex.split(deploy["vllm"]["command_k_per_batch_size"])
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] == 3
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 2, 3], [3, 1024, 0]]
    assert deploy["verdict"]["decision"] == "no" and deploy["verdict"]["decided_loads"] == [1, 4]


def test_benchmark_compare_serves_another_draft_against_the_same_baseline_passes(
    tmp_path, random_target, draft_dir
):
    """benchmark.compare: another draft (under drafts/) served at compare_k in the same shuffled
    rounds, each of its passes paired with the same baseline passes as the run's own draft, decided
    on its own (verdict.compare), its outputs judged; it does not move the run's own verdict."""
    import shutil

    shutil.copytree(draft_dir, tmp_path / "drafts" / "other")
    overrides = {**LOAD, **stand_ins("vllm"), "k": [1], "concurrency": [1], "repeats": 3}
    overrides.update(serve_concurrency=1, compare={"other": "drafts/other"}, compare_k=[3])
    proc = run_benchmark_stage(tmp_path, random_target, draft_dir, overrides)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = read_json(tmp_path / "bench.detail.json")
    v = report["verdict"]
    assert v["design"]["servers"] == ["baseline", "k1", "other:k3"]
    assert all(
        sorted(order) == ["baseline", "k1", "other:k3"] for *_, order in v["design"]["rounds_order"]
    )
    level = report["levels"]["c1"]
    other = level["compare"]["other"]["k3"]
    assert len(other["paired_speedups"]) == len(level["k1"]["paired_speedups"]) == 3
    assert other["acceptance_length"] == ACCEPTANCE[3] and other["output_verdicts"]["mismatch"] == 0
    d = v["compare"]["other"]["1"]
    assert (d["decision"], d["k"]) == ("yes", 3) and 1 < d["low"] <= d["speedup"] <= d["high"]
    assert set(d["by_k"]) == {"3"}  # its own family: the ks it was served at
    assert list(v["decisions"]["1"]["by_k"]) == ["1"] and report["ks"] == [1]
    assert report["lossless"]["compared_outputs"] == level["k1"]["requests"]  # the run's own draft
    served = read_json(tmp_path / "deploy.json")["benchmark"]["serve_commands"]
    assert spec_k("vllm", served["other:k3"]) == 3 and "drafts/other" in served["other:k3"]


def test_benchmark_servers_that_do_not_fit_at_once_run_in_groups_beside_the_baseline(
    tmp_path, random_target, draft_dir
):
    """benchmark.max_servers 2: the baseline stays up and the speculative servers run one group
    after another beside it, each group its own rounds; each speculative pass is paired with a
    baseline pass of its own group (the nearest in time), and the report names the groups."""
    overrides = {**LOAD, **stand_ins("vllm"), "concurrency": [1], "repeats": 2}
    overrides.update(serve_concurrency=1, max_servers=2)
    proc = run_benchmark_stage(tmp_path, random_target, draft_dir, overrides)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = read_json(tmp_path / "bench.detail.json")
    design = report["verdict"]["design"]
    assert design["layout"] == "side_by_side" and design["groups"] == [["k1"], ["k3"]]
    assert design["fit"]["max_servers"] == 2 and design["fit"]["speculative_fit"] >= 1
    orders = [sorted(order) for *_, order in design["rounds_order"]]
    assert orders == [["baseline", "k1"]] * 2 + [["baseline", "k3"]] * 2
    level = report["levels"]["c1"]
    assert level["baseline"]["passes"] == 4 and level["k1"]["passes"] == level["k3"]["passes"] == 2
    assert len(level["k1"]["paired_speedups"]) == len(level["k3"]["paired_speedups"]) == 2
    assert report["verdict"]["decisions"]["1"]["decision"] in ("yes", "undecided")


@pytest.mark.parametrize(
    ("layout", "max_servers", "available", "expected"),
    [
        ("auto", None, 16.0, 3),  # 0.9 x 16 / (1.15 x 4) = 3.1: three beside the baseline
        ("auto", 3, 16.0, 2),  # capped by benchmark.max_servers
        ("auto", None, 4.0, 0),  # not one: auto runs one server at a time
        ("side_by_side", None, 4.0, "error"),
    ],
)
def test_group_size_is_what_the_memory_left_holds(
    monkeypatch, layout, max_servers, available, expected
):
    """A baseline of 4 GiB (its RSS, or what the host lost starting it, whichever is more)."""
    from types import SimpleNamespace

    from draftline.benchmark import server
    from draftline.core.errors import DraftlineError

    monkeypatch.setattr(server, "available_gib", lambda: available)
    sweep = SimpleNamespace(
        cfg=SimpleNamespace(layout=layout, max_servers=max_servers),
        memory_gib={"baseline": 3.0},
        fit=None,
    )
    base = SimpleNamespace(pid=1)
    if expected == "error":
        with pytest.raises(DraftlineError, match="no speculative server fits.*layout sequential"):
            server.Sweeper.group_size(sweep, base, available + 4.0, 6)
        return
    assert server.Sweeper.group_size(sweep, base, available + 4.0, 6) == expected
    assert sweep.fit["baseline_gib"] == 4.0
    assert server.Sweeper.group_size(sweep, SimpleNamespace(pid=None), 0.0, 6) == 6  # not launched


def test_groups_of_split_servers_evenly_in_order():
    from draftline.benchmark.server import groups_of

    assert groups_of(list("abcdefg"), 4) == [list("abcd"), list("efg")]
    assert groups_of(list("abcdefg"), 3) == [list("abc"), list("de"), list("fg")]
    assert groups_of(list("abc"), 5) == [list("abc")]
    assert groups_of(list("ab"), 1) == [["a"], ["b"]]


def test_benchmark_one_server_at_a_time_runs_the_baseline_before_and_after(
    tmp_path, random_target, draft_dir
):
    """benchmark.layout sequential (a target that fits once): the baseline's rounds, the
    speculative server's, the baseline's again; each speculative pass paired with the baseline
    interpolated to its time, the drift between the two baselines recorded and widening the
    interval."""
    overrides = {**LOAD, **stand_ins("vllm"), "k": [3], "concurrency": [1], "repeats": 3}
    overrides.update(serve_concurrency=1, layout="sequential")
    proc = run_benchmark_stage(tmp_path, random_target, draft_dir, overrides)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = read_json(tmp_path / "bench.detail.json")
    design = report["verdict"]["design"]
    assert design["layout"] == "sequential" and design["servers"] == ["baseline", "k3"]
    assert design["passes"] == 3 * 3 and design["rounds_order"] == []  # baseline twice, k3 once
    assert "idle_servers_cpu_cores" not in design  # nothing else runs beside the one measured
    deploy = read_json(tmp_path / "deploy.json")
    assert deploy["benchmark"]["design"] == "sequential"
    assert set(deploy["benchmark"]["serve_commands"]) == {"baseline", "k3"}
    level = report["levels"]["c1"]
    assert level["baseline"]["passes"] == 6 and level["k3"]["passes"] == 3
    assert len(level["k3"]["paired_speedups"]) == 3 and "drift_log" in level["k3"]
    d = report["verdict"]["decisions"]["1"]
    iv = d["by_k"]["3"]
    assert iv["half_width_log"] >= abs(level["k3"]["drift_log"]) / 2
    assert d["decision"] == "yes" and d["low"] > 1  # the stand-ins' k=3 pays at 1 in flight


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_benchmark_stage_drives_baseline_and_speculative_servers(
    tmp_path, random_target, draft_dir, eagle3_draft_dir, engine
):
    """A baseline server and one speculative server per k (1 and 3), each at 1 and 4 requests in
    flight: acceptance per k from each server, the outputs judged against the baseline's, the
    verdict (speculation pays at 1 request in flight and loses at 4, by the stand-ins' cost), the
    plots, deploy.json's commands at the verdict's k and vLLM's k per batch size. vLLM serves the
    speculators checkpoint as it is; for SGLang the stage exports the draft (train.architecture:
    eagle3) to SGLang's layout and serves that copy."""
    from draftline.benchmark.run import HEADLINE

    proc = run_benchmark_stage(
        tmp_path,
        random_target,
        draft_dir if engine == "vllm" else eagle3_draft_dir,
        {**LOAD, **stand_ins(engine)},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = read_json(tmp_path / "bench.detail.json")
    bench = read_json(tmp_path / "bench.json")  # the headline; the rest is in the detail file
    assert list(bench) == HEADLINE + ["speedup_c1", "speedup_c4"]
    assert bench == {key: report[key] for key in bench}
    assert report["ks"] == [1, 3] and report["concurrency"] == [1, 4] and report["prompts"] == 3
    assert report["acceptance_by_k"] == {str(k): a for k, a in ACCEPTANCE.items()}

    # every level: the baseline and each k, acceptance from that k's server, identical outputs
    for c in (1, 4):
        level = report["levels"][f"c{c}"]
        assert list(level) == ["baseline", "k1", "k3"]
        for mode, figures in level.items():
            assert figures["requests"] == 6 and figures["failed"] == 0
            assert figures["output_tokens"] == 60
            assert figures["ttft_ms_p50"] > 0 and figures["itl_ms_p99"] > 0
            assert figures["tpot_ms_p50"] > 0
            assert figures["output_verdicts"] == {"identical": 6, "near_tie": 0, "mismatch": 0}
            if mode == "baseline":
                assert "acceptance_length" not in figures and "speedup" not in figures
                continue
            k = int(mode[1:])
            assert figures["acceptance_length"] == ACCEPTANCE[k]
            assert figures["position_acceptance"] == POSITIONS[k]
            assert figures["speedup"] == pytest.approx(
                figures["output_tokens_per_s"] / level["baseline"]["output_tokens_per_s"], abs=1e-3
            )
    gate = report["lossless"]
    assert gate["passed"] and gate["compared_outputs"] == 2 * 2 * 6 == gate["identical"]
    assert gate["mismatch"] == gate["near_tie"] == 0 and gate["lossless_share"] == 1.0
    assert gate["tie_tolerance"] == 0.0  # float32 servers: no near-ties

    # one round: one pair per k and load, no spread to judge by: undecided at every load, and
    # deployed without speculation (benchmark.undecided_k 0)
    v = report["verdict"]
    assert v["decision"] == "undecided" and v["pays_off"] is None
    for c in ("1", "4"):
        d = v["decisions"][c]
        assert d["decision"] == "undecided" and d["low"] is None and d["high"] is None
        assert d["why"] == "one pass per server: no spread to judge by"
        assert d["by_k"]["1"]["n"] == d["by_k"]["3"]["n"] == 1
    # the point estimates still rank the ks: k=3 best at 1 in flight, every k below 1 at 4
    c1, c4 = report["levels"]["c1"], report["levels"]["c4"]
    assert c1["k3"]["speedup"] > c1["k1"]["speedup"] and c1["k3"]["speedup"] > 1.2
    assert max(c4["k1"]["speedup"], c4["k3"]["speedup"]) < 0.8
    assert v["serve_concurrency"] == 4 and v["speedup"] == v["decisions"]["4"]["speedup"]
    assert (bench["decision"], bench["k"], bench["speedup"]) == ("undecided", v["k"], v["speedup"])
    assert bench["speedup_c1"] == v["decisions"]["1"]["speedup"]
    assert bench["speedup_c4"] == v["decisions"]["4"]["speedup"]
    assert bench["acceptance_length"] == c4[f"k{v['k']}"]["acceptance_length"]
    assert bench["lossless_share"] == 1.0
    be = v["break_even"]
    assert be["pays_at"] == be["loses_at"] == [] and be["undecided_at"] == [1, 4]
    assert be["break_even_concurrency"] is None and bench["break_even_concurrency"] is None
    assert v["k_per_batch_size"] == [[1, 1024, 0]]
    model = v["cost_model"]
    assert model["terms"] == ["1", "k", "log2c"] and len(model["held_out"]) == 4
    # (its three terms miss the stand-ins' k x load cost: a point left out may be predicted at a
    # step cost <= 0, then counted in held_out_unpredicted; the headline carries the figure)
    assert bench["cost_model_held_out_error"] == model["held_out_mean_abs_error"]
    assert "at 4 requests in flight it cannot be told" in v["words"] and v["words"] in proc.stdout

    # the plots: speedup against load, one line per k; the baseline's tokens/s
    assert read_json(tmp_path / "plots/speedup_vs_load.json") == [
        {
            "concurrency": c,
            "k": str(k),
            "speedup": report["levels"][f"c{c}"][f"k{k}"]["speedup"],
            "low": None,
            "high": None,
        }
        for c in (1, 4)
        for k in (1, 3)
    ]
    assert [r["concurrency"] for r in read_json(tmp_path / "plots/baseline_tokens_per_s.json")] == [
        1,
        4,
    ]

    # one server per k, each started with its own k; deploy.json's commands at the verdict's k
    deploy = read_json(tmp_path / "deploy.json")
    served = deploy["benchmark"]["serve_commands"]
    assert {mode: spec_k(engine, cmd) for mode, cmd in served.items()} == {
        "baseline": None,
        "k1": 1,
        "k3": 3,
    }
    for cmd in served.values():
        assert f"starting {cmd}" in proc.stdout
    assert deploy[engine]["problems"] == [] and deploy["benchmark"]["warnings"] == []
    # benchmark.port set: the servers side by side on port, port + 1, ...; the one benchmarked at
    # the verdict's k is the deployment command on benchmark.port
    ports = [int(shlex.split(cmd)[shlex.split(cmd).index("--port") + 1]) for cmd in served.values()]
    assert ports == [ports[0], ports[0] + 1, ports[0] + 2]
    assert deploy[engine]["command"] == served[f"k{v['k']}"].replace(
        f"--port {ports[0] + 1 + [1, 3].index(v['k'])}", f"--port {ports[0]}"
    )
    for name in ("vllm", "sglang"):
        assert deploy[name]["k"] == v["k"] and spec_k(name, deploy[name]["command"]) == v["k"]
    # vLLM: no k per batch size where no load is decided (every range would be 0)
    assert "k_per_batch_size" not in deploy["vllm"]
    assert deploy["verdict"] == {
        "serve_concurrency": 4,
        "decision": "undecided",
        "k": v["k"],
        "speedup": v["speedup"],
        "speedup_interval": [None, None],
        "confidence": 0.9,
        "pays_off": None,
        "decided_loads": [],
        "no_gain_loads": [],
        "undecided_loads": [1, 4],
        "settled": {"1": False, "4": False},
        "rounds": 1,
        "undecided_k": 0,
        "recommendation": "undecided at 4 requests in flight: serving without speculation "
        "(benchmark.undecided_k) until more passes decide it",
    }
    if engine == "sglang":
        exported = Path(deploy["benchmark"]["server_logs"]) / "draft_sglang"
        assert f"--speculative-draft-model-path {exported}" in deploy["sglang"]["command"]
        assert read_json(exported / "config.json")["architectures"] == ["LlamaForCausalLMEagle3"]


@pytest.mark.parametrize(
    "gap, tolerance, max_share, verdict",
    [
        (5.0, None, 0.0, "mismatch"),  # float32 servers: tie tolerance 0
        # the baseline's runner-up, within tie_tolerance (beyond it, a mismatch: test_lossless.py)
        (0.05, 0.1, 0.0, "near_tie"),
        (5.0, None, 1.0, "mismatch"),  # counted, allowed by max_output_mismatch_share
    ],
)
def test_benchmark_stage_gates_on_the_baselines_greedy_outputs(
    tmp_path, random_target, draft_dir, gap, tolerance, max_share, verdict
):
    """A speculative server answering another token than the baseline at position 4: a near-tie
    where the baseline ranked that token within benchmark.tie_tolerance of its own choice (its top
    logprobs), else a mismatch that fails the stage (benchmark.max_output_mismatch_share) after
    the reports are written."""
    overrides = {
        **LOAD,
        **stand_ins("vllm"),
        "k": [3],
        "concurrency": [1, 2],
        "serve_concurrency": 1,
        "tie_tolerance": tolerance,
        "max_output_mismatch_share": max_share,
    }
    env = {"STAND_IN_DIVERGE_AT": "4", "STAND_IN_TIE_GAP": str(gap)}
    proc = run_benchmark_stage(tmp_path, random_target, draft_dir, overrides, env=env)
    fails = verdict == "mismatch" and max_share < 1
    # the reports first, whatever the gate says
    for name in ("bench.json", "bench.detail.json", "deploy.json", "plots/speedup_vs_load.json"):
        assert (tmp_path / name).is_file(), name
    report = read_json(tmp_path / "bench.detail.json")
    gate = report["lossless"]
    assert gate["compared_outputs"] == 2 * 6 == gate[verdict]
    assert gate["identical"] == 0 and gate["identical_output_share"] == 0.0
    assert gate["tie_tolerance"] == (0.0 if tolerance is None else tolerance)
    assert gate["max_output_mismatch_share"] == max_share
    for c in (1, 2):
        level = report["levels"][f"c{c}"]
        assert level["baseline"]["output_verdicts"]["identical"] == 6  # its own reference
        assert level["k3"]["output_verdicts"][verdict] == 6
    assert read_json(tmp_path / "bench.json")["lossless_share"] == gate["lossless_share"]
    if verdict == "near_tie":
        assert gate["passed"] and gate["mismatch"] == 0 and gate["lossless_share"] == 1.0
        assert gate["mismatches_at"] == []
    else:
        assert gate["mismatch"] == 12 and gate["mismatch_share"] == 1.0
        assert gate["lossless_share"] == 0.0
        assert gate["mismatches_at"] == ["c1 k=3: 6 of 6", "c2 k=3: 6 of 6"]
        assert gate["passed"] is not fails
    if fails:
        assert proc.returncode != 0
        assert "benchmark.max_output_mismatch_share 0.0" in proc.stderr
        assert "12 of 12 speculative outputs (100.0%) differ" in proc.stderr
        assert "c1 k=3: 6 of 6" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_hf_benchmark_prints_no_warning_about_engines_not_in_use(
    tmp_path, random_target, draft_dir
):
    """The default draft has speculators' norms, which SGLang cannot serve: deploy.json says so for
    whoever deploys with SGLang, but the hf benchmark prints no warning about it. A single k is a
    list of one; the built-in engine's verdict is for 1 request in flight and says so."""
    from draftline.benchmark.run import HEADLINE

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
    bench = read_json(tmp_path / "bench.json")
    assert list(bench) == HEADLINE + ["speedup_c1"]
    assert bench["engine"] == "hf" and bench["serve_concurrency"] == 1 and bench["k"] == 2
    detail = read_json(tmp_path / "bench.detail.json")
    assert detail["ks"] == [2] and list(detail["levels"]["c1"]) == ["baseline", "k2"]
    assert detail["lossless"]["passed"] and "1 request in flight" in detail["verdict"]["note"]
    assert "command_k_per_batch_size" not in read_json(tmp_path / "deploy.json")["vllm"]


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
    none), and measures them at the one k the speculative server was started with (a list of k is
    refused); a baseline URL that points at the speculative server is refused."""
    import httpx
    from pydantic import ValidationError

    from draftline.benchmark.commands import draft_path_for
    from draftline.draft.sglang_export import export_sglang

    draft = draft_dir if engine == "vllm" else eagle3_draft_dir
    load = {**LOAD, "k": 3}
    cfg = BenchmarkConfig(**load, **stand_ins(engine))
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
        with pytest.raises(ValidationError, match="a running speculative server"):
            BenchmarkConfig(**{**LOAD, "engine": engine, "endpoints": urls})
        overrides = {
            **load,
            "engine": engine,
            "port": free_port(),
            "endpoints": urls,
            "vllm": {"launcher": ["/nonexistent/vllm"]},
            "sglang": {"launcher": ["/nonexistent/sglang"], "draft_model_path": str(served)},
        }
        proc = run_benchmark_stage(tmp_path, random_target, draft, overrides)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert "starting" not in proc.stdout and "preflight" in proc.stdout
        report = read_json(tmp_path / "bench.detail.json")
        assert report["acceptance_by_k"] == {"3": 2.5} and report["k"] == 3
        assert list(report["levels"]["c1"]) == ["baseline", "k3"]
        assert report["levels"]["c4"]["k3"]["acceptance_length"] == 2.5
        assert report["lossless"]["passed"] and report["lossless"]["identical"] == 12
        refused = run_benchmark_stage(tmp_path, random_target, draft, {**overrides, "k": [1, 3]})
        assert refused.returncode != 0 and "a running speculative server" in refused.stderr
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
