"""Regeneration client overhead: achieved requests/s over the ideal, against a fixed-latency stub,
for our client and, side by side on the same stub, speculators' `regenerate-responses`.

    python overhead/regen_client.py --out reports/overhead/regen_client.json

A stub OpenAI-compatible server (its own process, aiohttp) answers every chat completion after
exactly `latency` seconds, in vLLM's wire format: streamed (server-sent events, one chunk a token,
the usage chunk last) when the request asks for it, as ours does, else one JSON object with
`return_token_ids` (speculators needs the token ids). With `c` requests in flight the ideal rate is
c / latency.

- ours: draftline.regeneration.regenerate_all (endpoint pool, retries, partitions, one flushed JSONL
  line per conversation), timed from its start to its end, as the stage runs it;
- speculators: `speculators regenerate-responses` over a local JSONL of the same prompts, its own
  throughput line (timed from its first request, after loading its tokenizer and dataset).

Both are also timed by the stub (first request in to last answer out), the same clock for both.
At each level the two clients alternate for `rounds` rounds (draftline/ab_timing.py: ours then
speculators, then the reverse, ...); each side's figures are its median round by ratio, with
every round's ratios beside them; the load averages and CPU count are recorded.
Each level runs `waves` x c requests: a fixed latency keeps the requests in lockstep, so the first
wave (c requests at once on cold connections) is paid once per level, and a short level weighs it
more than a regeneration of hours does; `first_wave_dispatch_s` (stub clock) shows that cost.
Target: ours achieved / ideal >= 0.95 at c = 1, 64, 256.
"""

import argparse
import asyncio
import json
import multiprocessing as mp
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from draftline.ab_timing import alternate, loadavg, machine_load, median_run
from draftline.openai_client import RetryPolicy, close_pool, open_pool
from draftline.regeneration import Sampling, regenerate_all


def stub_server(port: int, latency: float) -> None:
    from aiohttp import web

    arrivals: list[float] = []
    departures: list[float] = []

    def sse(chunk: dict) -> bytes:
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    async def chat(request):
        arrivals.append(time.monotonic())
        body = await request.json()
        if body.get(
            "stream"
        ):  # as vLLM streams: role, then the tokens, then finish_reason and usage
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)

            def delta(**d):
                return {
                    "id": "stub",
                    "object": "chat.completion.chunk",
                    "created": 0,  # noqa: E731
                    "model": body["model"],
                    "choices": [{"index": 0, **d}],
                }

            await response.write(
                sse(delta(delta={"role": "assistant", "content": ""}, finish_reason=None))
            )
            await asyncio.sleep(latency)
            await response.write(
                sse(delta(delta={"content": "o"}, finish_reason=None))
                + sse(delta(delta={"content": "k"}, finish_reason=None))
                + sse(delta(delta={}, finish_reason="stop"))
                + sse(
                    {
                        "id": "stub",
                        "object": "chat.completion.chunk",
                        "choices": [],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                    }
                )
                + b"data: [DONE]\n\n"
            )
            departures.append(time.monotonic())
            await response.write_eof()
            return response
        await asyncio.sleep(latency)
        departures.append(time.monotonic())
        return web.json_response(
            {
                "id": "stub",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "prompt_token_ids": [1, 2, 3],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "token_ids": [4, 5],
                        "message": {"role": "assistant", "content": "ok"},
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            }
        )

    async def stats(request):  # what the stub saw since the last call, then forget it
        seen = {"arrivals": sorted(arrivals), "departures": sorted(departures)}
        arrivals.clear()
        departures.clear()
        return web.json_response(seen)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/stats", stats)
    web.run_app(app, host="127.0.0.1", port=port, print=None, backlog=1024, access_log=None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts(n: int) -> list[dict]:
    return [
        {
            "id": f"p{i}",
            "source": "bench",
            "partition": "short",
            "tools": None,
            "messages": [
                {"role": "user", "content": f"question {i}"},
                {"role": "assistant", "content": ""},
            ],
        }
        for i in range(n)
    ]


async def run_ours(url: str, concurrency: int, n: int, out_dir: Path) -> float:
    pool = open_pool([url], None, concurrency)
    try:
        start = time.perf_counter()
        tally = await regenerate_all(
            pool,
            "stub",
            prompts(n),
            Sampling(16, 0.0, 1.0, 0),
            RetryPolicy(0, 0.1, 1.0, 30.0),
            {"short": (concurrency, None), "long": (1, None)},
            out_dir / "out.jsonl",
            out_dir / "failures.jsonl",
            tags={},
        )
        elapsed = time.perf_counter() - start
    finally:
        await close_pool(pool)
    assert tally.ok == n, f"{n - tally.ok} requests failed against the stub"
    return elapsed


def run_speculators(
    url: str, concurrency: int, n: int, out_dir: Path, tokenizer_dir: Path
) -> float:
    """speculators' regenerate-responses over the same prompts; its own rate (req/s)."""
    data = out_dir / "prompts.jsonl"
    data.write_text(
        "".join(
            json.dumps({"id": row["id"], "messages": row["messages"][:1]}) + "\n"
            for row in prompts(n)
        )
    )
    cli = Path(sys.executable).with_name("speculators")
    proc = subprocess.run(
        [
            str(cli),
            "regenerate-responses",
            "--endpoint",
            f"{url}/v1/chat/completions",
            "--model",
            str(tokenizer_dir),
            "--dataset",
            str(data),
            "--limit",
            str(n),
            "--concurrency",
            str(concurrency),
            "--max-tokens",
            "16",
            "--max-retries",
            "0",
            "--outfile",
            str(out_dir / "speculators.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    done = re.search(r"(\d+) conversations \((\d+) ok", proc.stdout)
    rate = re.search(r"Throughput: ([\d.]+) req/s", proc.stdout)
    if proc.returncode or not done or int(done.group(2)) != n or not rate:
        raise RuntimeError(
            f"speculators regenerate-responses failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return float(rate.group(1))


def stub_clock(url: str, concurrency: int) -> dict:
    seen = json.loads(urllib.request.urlopen(f"{url}/stats", timeout=30).read())
    arrivals, departures = seen["arrivals"], seen["departures"]
    return {
        "requests": len(arrivals),
        "span_s": departures[-1] - arrivals[0],
        "first_wave_dispatch_s": arrivals[min(concurrency, len(arrivals)) - 1] - arrivals[0],
    }


def level_result(n: int, seconds: float, ideal: float, stub: dict) -> dict:
    return {
        "requests": n,
        "seconds": round(seconds, 3),
        "achieved_rps": round(n / seconds, 2),
        "ratio": round(n / seconds / ideal, 4),
        "stub_clock_ratio": round(stub["requests"] / stub["span_s"] / ideal, 4),
        "first_wave_dispatch_s": round(stub["first_wave_dispatch_s"], 4),
    }


def level_summary(runs: list[dict]) -> dict:
    """The median round (by ratio) of one client at one level, with every round's ratios."""
    return {
        **median_run(runs, "ratio"),
        "rounds_ratio": [r["ratio"] for r in runs],
        "rounds_stub_clock_ratio": [r["stub_clock_ratio"] for r in runs],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--waves", type=int, default=16)  # requests = waves x concurrency
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of each client")
    ap.add_argument("--no-speculators", action="store_true", help="only our client")
    ap.add_argument("--out", default="reports/overhead/regen_client.json")
    args = ap.parse_args()
    at_start = loadavg()
    port = free_port()
    server = mp.get_context("spawn").Process(
        target=stub_server, args=(port, args.latency), daemon=True
    )
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
        ours, theirs = {}, {}
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer_dir = Path(tmp) / "tokenizer"
            if (
                not args.no_speculators
            ):  # speculators decodes the token ids with the served model's tokenizer
                from draftline.tiny import train_tokenizer

                train_tokenizer([f"question {i} ok" for i in range(200)], 300).save_pretrained(
                    tokenizer_dir
                )
            for c in args.concurrency:
                n = max(4, args.waves * c)
                ideal = c / args.latency

                def ours_level(c=c, n=n, ideal=ideal) -> dict:
                    with tempfile.TemporaryDirectory(dir=tmp) as work:
                        elapsed = asyncio.run(run_ours(url, c, n, Path(work)))
                    return level_result(n, elapsed, ideal, stub_clock(url, c))

                def speculators_level(c=c, n=n, ideal=ideal) -> dict:
                    with tempfile.TemporaryDirectory(dir=tmp) as work:
                        rate = run_speculators(url, c, n, Path(work), tokenizer_dir)
                    return level_result(n, n / rate, ideal, stub_clock(url, c))

                sides = {"ours": ours_level}
                if not args.no_speculators:
                    sides["speculators"] = speculators_level
                runs = alternate(sides, args.rounds)  # each its own stub clock, read after it
                ours[f"c{c}"] = level_summary(runs["ours"])
                print(
                    f"ours         c={c}: ratio {ours[f'c{c}']['ratio']:.3f} of ideal {ideal:.1f} req/s "
                    f"(rounds {ours[f'c{c}']['rounds_ratio']})"
                )
                if "speculators" in runs:
                    theirs[f"c{c}"] = level_summary(runs["speculators"])
                    print(
                        f"speculators  c={c}: ratio {theirs[f'c{c}']['ratio']:.3f} of ideal {ideal:.1f} req/s "
                        f"(rounds {theirs[f'c{c}']['rounds_ratio']})"
                    )
    finally:
        server.terminate()
        server.join(5)
    result = {
        "latency_s": args.latency,
        "waves": args.waves,
        "rounds": args.rounds,
        "levels": ours,
        "target_ratio": 0.95,
        "meets_target": all(v["ratio"] >= 0.95 for v in ours.values()),
        "speculators_regenerate_responses": theirs or "not run (--no-speculators)",
        **machine_load(at_start),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
