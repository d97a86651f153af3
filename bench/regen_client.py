"""Regeneration client overhead: achieved requests/s over the ideal, against a fixed-latency stub.

    python bench/regen_client.py --out reports/bench/regen_client.json

A stub OpenAI-compatible server (its own process, aiohttp) answers every chat completion after
exactly `latency` seconds. With `c` requests in flight the ideal rate is c / latency; the client is
our regeneration path (draftline.regeneration.regenerate_all: endpoint pool, retries, partitions,
one flushed JSONL line per conversation). Target: achieved / ideal >= 0.95 at c = 1, 64, 256.
"""

import argparse
import asyncio
import json
import multiprocessing as mp
import socket
import tempfile
import time
from pathlib import Path

from draftline.regeneration import RetryPolicy, Sampling, close_pool, open_pool, regenerate_all


def stub_server(port: int, latency: float) -> None:
    from aiohttp import web

    async def chat(request):
        body = await request.json()
        await asyncio.sleep(latency)
        return web.json_response({
            "id": "stub", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10},
        })

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, backlog=1024)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def run_client(url: str, concurrency: int, n: int, out_dir: Path) -> float:
    rows = [{"id": f"p{i}", "source": "bench", "partition": "short", "tools": None,
             "messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": ""}]} for i in range(n)]
    pool = open_pool([url], None, concurrency)
    try:
        start = time.perf_counter()
        tally = await regenerate_all(pool, "stub", rows, Sampling(16, 0.0, 1.0, 0), RetryPolicy(0, 0.1, 1.0, 30.0),
                                     {"short": (concurrency, None), "long": (1, None)},
                                     out_dir / "out.jsonl", out_dir / "failures.jsonl", tags={})
        elapsed = time.perf_counter() - start
    finally:
        await close_pool(pool)
    assert tally.ok == n, f"{n - tally.ok} requests failed against the stub"
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--waves", type=int, default=8)  # requests = waves x concurrency
    ap.add_argument("--out", default="reports/bench/regen_client.json")
    args = ap.parse_args()
    port = free_port()
    server = mp.get_context("spawn").Process(target=stub_server, args=(port, args.latency), daemon=True)
    server.start()
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        levels = {}
        for c in args.concurrency:
            n = max(4, args.waves * c)
            with tempfile.TemporaryDirectory() as tmp:
                elapsed = asyncio.run(run_client(url, c, n, Path(tmp)))
            ideal = c / args.latency
            achieved = n / elapsed
            levels[f"c{c}"] = {"requests": n, "seconds": round(elapsed, 3), "achieved_rps": round(achieved, 2),
                               "ideal_rps": round(ideal, 2), "ratio": round(achieved / ideal, 4)}
            print(f"concurrency {c}: {achieved:.1f} req/s of ideal {ideal:.1f} ({achieved / ideal:.3f})")
    finally:
        server.terminate()
        server.join(5)
    result = {"latency_s": args.latency, "levels": levels, "target_ratio": 0.95,
              "meets_target": all(v["ratio"] >= 0.95 for v in levels.values()),
              "speculators_regenerate_responses": "not run: it needs vLLM's token-id responses and /v1/models, which a stub would have to imitate wholesale"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
