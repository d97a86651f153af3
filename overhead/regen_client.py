"""Regeneration client overhead: achieved requests/s over the ideal, against a fixed-latency stub,
for our client and, side by side on the same stub, speculators' `regenerate-responses`; and a
rerun's start-up on a large conversations file.

    python overhead/regen_client.py --out reports/overhead/regen_client.json

A stub OpenAI-compatible server (its own process, aiohttp) answers every chat completion after
exactly `latency` seconds, in vLLM's wire format: streamed (server-sent events: the headers at
once, then after `latency` the role chunk, as vLLM sends it with the first token, one chunk a
token, the usage chunk last) when the request asks for it, as ours does, else one JSON object with
`return_token_ids` (speculators needs the token ids). Its answers are made once per model name:
on the same cores as the client it times, the stub spends no more per request than the HTTP
exchange. With `c` requests in flight the ideal rate is c / latency.

- ours: draftline.regenerate.replay.regenerate_all (endpoint pool, retries, partitions, one flushed JSONL
  line per conversation and its index entry), timed from its start to its end, as the stage runs
  it; `client_cpu_ms_per_request` is its process's CPU time over the requests;
- speculators: `speculators regenerate-responses` over a local JSONL of the same prompts, its own
  throughput line (timed from its first request, after loading its tokenizer and dataset);
- bare: the thinnest asyncio client, a ceiling for any client on this stub and these cores
  (run_bare: one aiohttp session, a prepared body posted, the answer read to its end, nothing
  parsed or written); `over_bare` on each of our levels is ours over it.

Both are also timed by the stub (first request in to last answer out), the same clock for both,
and `stub_cpu_ms_per_request` is the stub's CPU time for each side's requests: a streamed answer
costs the stub more than a whole one, on the same cores as the client.
At each level the clients alternate for `rounds` rounds (devtools/ab_timing.py: ours, bare,
speculators, then the reverse, ...); each side's figures are its median round by ratio, with
every round's ratios beside them; the load averages and CPU count are recorded.
Each level runs `waves` x c requests: a fixed latency keeps the requests in lockstep, so the first
wave (c requests at once on cold connections) is paid once per level, and a short level weighs it
more than a regeneration of hours does; `first_wave_dispatch_s` (stub clock) shows that cost.
Target: ours achieved / ideal >= 0.98 at c = 1, 64, 256, and at the highest level >= speculators'.

Start-up (`startup`): a rerun of the stage after `--startup-lines` conversations (default 100,000
of `--startup-tokens` 4,096 tokens: two user turns and two answers, the answers' token ids recorded
as vLLM returns them; 3.1 GB, and 1.6 GB of prompts) with `--startup-new` prompts still to send.
A fresh process runs what the stage runs before its server (draftline.regenerate.run.pending:
read the prompts, count the conversations that still hold), then sends the missing prompts to the
stub; `to_first_request_s` is from launching that process to the stub's first request in. The
first start finds no index beside the conversations (a file of a run before it, or a lost index):
it parses every line and writes the index; the next one, with more prompts to send, reads the
index. The files' page cache is dropped before each start. Left out: the target's tokenizer
(loaded for max_context and the preflight), the server's start and the preflight, which do not
grow with the file. The files are written in the run's temporary directory and removed after.
"""

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # devtools/ is not installed

from devtools.ab_timing import alternate, drop_page_cache, loadavg, machine_load, median_run
from draftline.regenerate.client import RetryPolicy, close_pool, open_pool
from draftline.regenerate.replay import ReplayJob, Sampling, regenerate_all

TARGET_RATIO = 0.98  # ours achieved / ideal, at every level


def stub_server(port: int, latency: float) -> None:
    from aiohttp import web

    arrivals: list[float] = []
    departures: list[float] = []

    answers: dict[str, tuple[bytes, bytes, bytes]] = {}
    cpu = [time.process_time()]

    def answer(model: str) -> tuple[bytes, bytes, bytes]:
        """(the first streamed chunk, the rest of the stream, the whole answer) for `model`, made
        once: the stub shares the cores with the client it times, so it does no more per request
        than the HTTP exchange, streamed or whole."""
        if model not in answers:

            def sse(chunk: dict) -> bytes:
                return b"data: " + json.dumps(chunk).encode() + b"\n\n"

            def delta(**d):
                return {
                    "id": "stub",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": model,
                    "choices": [{"index": 0, **d}],
                }

            usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
            # as vLLM streams: role, then the tokens, then finish_reason and usage
            first = sse(delta(delta={"role": "assistant", "content": ""}, finish_reason=None))
            rest = (
                sse(delta(delta={"content": "o"}, finish_reason=None))
                + sse(delta(delta={"content": "k"}, finish_reason=None))
                + sse(delta(delta={}, finish_reason="stop"))
                + sse(
                    {"id": "stub", "object": "chat.completion.chunk", "choices": [], "usage": usage}
                )
                + b"data: [DONE]\n\n"
            )
            whole = {
                "id": "stub",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "prompt_token_ids": [1, 2, 3],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "token_ids": [4, 5],
                        "message": {"role": "assistant", "content": "ok"},
                    }
                ],
                "usage": usage,
            }
            answers[model] = (first, rest, json.dumps(whole).encode())
        return answers[model]

    async def chat(request):
        if not arrivals:
            cpu[0] = time.process_time()  # the stub's CPU is counted from the first request on
        arrivals.append(time.monotonic())
        body = await request.json()
        first, rest, whole = answer(body["model"])
        if body.get("stream"):
            # the headers at once; the role with the first token, as vLLM sends it (its stream
            # generator writes the role chunk on the engine's first output), then the rest
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await asyncio.sleep(latency)
            await response.write(first + rest)
            departures.append(time.monotonic())
            await response.write_eof()
            return response
        await asyncio.sleep(latency)
        departures.append(time.monotonic())
        return web.Response(body=whole, content_type="application/json")

    async def count(request):
        return web.json_response({"arrivals": len(arrivals)})

    async def stats(request):  # what the stub saw since the last call, then forget it
        now = time.process_time()
        seen = {
            "arrivals": sorted(arrivals),
            "departures": sorted(departures),
            "cpu_s": now - cpu[0],
        }
        arrivals.clear()
        departures.clear()
        cpu[0] = now
        return web.json_response(seen)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/stats", stats)
    app.router.add_get("/count", count)
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


async def run_ours(
    url: str, concurrency: int, rows: list[dict], out_dir: Path, tags=None, digests=None
) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of regenerate_all over `rows`."""
    pool = open_pool([url], None, concurrency)
    try:
        start, cpu = time.perf_counter(), time.process_time()
        job = ReplayJob(
            "stub",
            Sampling(16, 0.0, 1.0, 0),
            RetryPolicy(0, 0.1, 1.0, 30.0),
            {"short": (concurrency, None), "long": (1, None)},
            tags or {},
            prompt_digests=digests,
        )
        tally = await regenerate_all(
            pool, job, rows, out_dir / "conversations.jsonl", out_dir / "failures.jsonl"
        )
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        await close_pool(pool)
    assert tally.ok == len(rows), f"{len(rows) - tally.ok} requests failed against the stub"
    return elapsed, cpu


async def run_bare(url: str, concurrency: int, n: int) -> tuple[float, float]:
    """The thinnest client there is, for a ceiling: `concurrency` tasks on one aiohttp session,
    each posting one prepared streamed request and reading the answer to its end, nothing else
    (no request built, no stream parsed, nothing written). (wall seconds, CPU seconds)."""
    import aiohttp

    body = json.dumps(
        {
            "model": "stub",
            "messages": [{"role": "user", "content": "question"}],
            "max_tokens": 16,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    headers = {"Content-Type": "application/json"}
    left = iter(range(n))  # shared: each request goes to one task
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=connector) as session:

        async def worker() -> None:
            for _ in left:
                async with session.post("/v1/chat/completions", data=body, headers=headers) as r:
                    r.raise_for_status()
                    await r.read()

        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - start, time.process_time() - cpu


def run_speculators(
    url: str, concurrency: int, n: int, out_dir: Path, tokenizer_dir: Path
) -> tuple[float, float]:
    """speculators' regenerate-responses over the same prompts: (its own rate in req/s, its CPU
    seconds from its first request on: its process's total less what it had used by then)."""
    import psutil

    data = out_dir / "prompts.jsonl"
    data.write_text(
        "".join(
            json.dumps({"id": row["id"], "messages": row["messages"][:1]}) + "\n"
            for row in prompts(n)
        )
    )
    cli = Path(sys.executable).with_name("speculators")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out_dir / "stdout", "w+") as stdout, open(out_dir / "stderr", "w+") as stderr:
        proc = subprocess.Popen(
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
            stdout=stdout,
            stderr=stderr,
        )
        at_first = None
        try:
            ps = psutil.Process(proc.pid)
            while proc.poll() is None and not stub_arrivals(url):
                time.sleep(0.005)
            times = ps.cpu_times()
            at_first = times.user + times.system + times.children_user + times.children_system
        except psutil.NoSuchProcess:
            pass
        proc.wait(timeout=600)
        stdout.seek(0)
        stderr.seek(0)
        out, err = stdout.read(), stderr.read()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    done = re.search(r"(\d+) conversations \((\d+) ok", out)
    rate = re.search(r"Throughput: ([\d.]+) req/s", out)
    if proc.returncode or not done or int(done.group(2)) != n or not rate or at_first is None:
        raise RuntimeError(
            f"speculators regenerate-responses failed (exit {proc.returncode}):\n"
            f"{out[-2000:]}\n{err[-2000:]}"
        )
    return float(rate.group(1)), total - at_first


def stub_arrivals(url: str) -> int:
    """Requests the stub has seen since its clock was last read (it forgets nothing here)."""
    return json.loads(urllib.request.urlopen(f"{url}/count", timeout=30).read())["arrivals"]


def stub_seen(url: str) -> dict:
    """What the stub saw since the last call: arrivals, departures (time.monotonic), its CPU."""
    return json.loads(urllib.request.urlopen(f"{url}/stats", timeout=30).read())


def stub_clock(url: str, concurrency: int) -> dict:
    seen = stub_seen(url)
    arrivals, departures = seen["arrivals"], seen["departures"]
    return {
        "requests": len(arrivals),
        "span_s": departures[-1] - arrivals[0],
        "first_wave_dispatch_s": arrivals[min(concurrency, len(arrivals)) - 1] - arrivals[0],
        "cpu_s": seen["cpu_s"],
    }


def level_result(
    n: int, seconds: float, ideal: float, stub: dict, cpu: float | None = None
) -> dict:
    result = {
        "requests": n,
        "seconds": round(seconds, 3),
        "achieved_rps": round(n / seconds, 2),
        "ratio": round(n / seconds / ideal, 4),
        "stub_clock_ratio": round(stub["requests"] / stub["span_s"] / ideal, 4),
        "first_wave_dispatch_s": round(stub["first_wave_dispatch_s"], 4),
        "stub_cpu_ms_per_request": round(stub["cpu_s"] / n * 1e3, 4),
    }
    if cpu is not None:
        result["client_cpu_ms_per_request"] = round(cpu / n * 1e3, 4)
    return result


def level_summary(runs: list[dict]) -> dict:
    """The median round (by ratio) of one client at one level, with every round's ratios."""
    return {
        **median_run(runs, "ratio"),
        "rounds_ratio": [r["ratio"] for r in runs],
        "rounds_stub_clock_ratio": [r["stub_clock_ratio"] for r in runs],
    }


# ---- start-up on a large conversations file ------------------------------------------------------

STARTUP_WORDS = (
    "the of and to in is was for on that with as by at from his her an which or be".split()
)


def startup_config(url: str):
    from draftline.regenerate.config import RegenerateConfig

    return RegenerateConfig(backend="external", endpoints=[url], external_engine="vllm")


def startup_card():
    """A card as `target` writes it (the fields the settings read; the rest a Llama's)."""
    from draftline.core.card import TargetCard

    return TargetCard(
        model="/models/target",
        source="hub-or-local",
        revision="0" * 40,
        trust_remote_code=False,
        architecture="LlamaForCausalLM",
        model_type="llama",
        config_model_type="llama",
        num_layers=32,
        hidden_size=4096,
        vocab_size=128256,
        norm_eps=1e-5,
        tie_word_embeddings=False,
        eos_token_id=2,
        aux_layer_ids=(2, 16, 29),
        chat_template_sha256="0" * 64,
        quantization=None,
        verifier_tensors={},
    )


def write_startup_files(directory: Path, url: str, lines: int, tokens: int, new: int) -> None:
    """out/conversations.jsonl with `lines` conversations as the stage writes them (made with the
    settings startup_config gives), and train.jsonl with their prompts and `new` more. A
    conversation: two user turns and two answers of tokens/4 words each, the answers' token ids
    recorded; 16 of them, told apart by their ids (what a rerun reads per line is the same)."""
    from draftline.regenerate.settings import engine_record, prompt_sha256, wanted_settings

    cfg = startup_config(url)
    out = directory / "out"
    out.mkdir(parents=True)
    wanted = wanted_settings(cfg, startup_card())
    tags = {
        "fingerprint": wanted.fingerprint,
        "settings": wanted.settings,
        "engine": engine_record(cfg, "vllm"),
        "run": 1,
    }
    rng, turn, kinds = random.Random(0), tokens // 4, []
    for _ in range(16):
        messages = [
            {"role": role, "content": " ".join(rng.choices(STARTUP_WORDS, k=turn))}
            for role in ("user", "assistant", "user", "assistant")
        ]
        row = {"source": "bench", "partition": "short", "tools": None, "messages": messages}
        regen = {
            **tags,
            "prompt_sha256": prompt_sha256(row),
            "temperature": 0.0,
            "seed": rng.randrange(2**31),
            "finish_reasons": ["stop", "stop"],
            "stopped": "end",
            "prompt_tokens": 4 * turn,
            "completion_tokens": 2 * turn,
            "turn_completion_tokens": [turn, turn],
            "completion_token_ids": [[rng.randrange(128000) for _ in range(turn)] for _ in "ab"],
        }
        # each line is '{"id": ...' and the rest of its row, as json.dumps writes it
        kinds.append(
            (
                json.dumps(row, ensure_ascii=False)[1:],
                json.dumps({**row, "regeneration": regen}, ensure_ascii=False)[1:],
            )
        )
    with open(directory / "train.jsonl", "w") as p, open(out / "conversations.jsonl", "w") as c:
        for i in range(lines + new):
            prompt, done = kinds[i % len(kinds)]
            head = '{"id": ' + json.dumps(f"p{i:07d}") + ", "
            p.write(head + prompt + "\n")
            if i < lines:
                c.write(head + done + "\n")
        for f in (p, c):
            f.flush()
            os.fsync(f.fileno())


def startup_child(directory: Path, url: str) -> None:
    """One rerun's start (a fresh process, timed by the parent): the stage's own work before its
    server (draftline.regenerate.run.pending), then the prompts still missing sent to the stub;
    prints when each phase ended (time.monotonic, as the stub's clock)."""
    main_at = time.monotonic()
    from draftline.regenerate.run import pending
    from draftline.regenerate.store import set_aside_superseded

    imported_at = time.monotonic()
    todo = pending(
        startup_config(url), "vllm", startup_card(), directory / "train.jsonl", directory / "out"
    )
    set_aside_superseded(todo.finished)  # the index written where it was off, as the stage does
    pending_at = time.monotonic()
    elapsed, _ = asyncio.run(
        run_ours(
            url,
            min(256, max(1, len(todo.todo))),
            todo.todo,
            directory / "out",
            todo.tags,
            todo.digests,
        )
    )
    print(
        json.dumps(
            {
                "main_at": main_at,
                "imported_at": imported_at,
                "pending_at": pending_at,
                "done_before": len(todo.by_id) - len(todo.todo),
                "sent": len(todo.todo),
            }
        )
    )


def measure_startup(url: str, directory: Path, lines: int, tokens: int, new: int) -> dict:
    """The first start (no index: every conversation parsed, the index written) and the next one
    (the index read), each with `new` prompts to send, page cache dropped before each."""
    written_at = time.monotonic()
    write_startup_files(directory, url, lines, tokens, new)
    conversations = directory / "out" / "conversations.jsonl"
    result = {
        "conversations": lines,
        "tokens_per_conversation": tokens,
        "new_prompts_per_start": new,
        "conversations_mb": round(conversations.stat().st_size / 1e6, 1),
        "prompts_mb": round((directory / "train.jsonl").stat().st_size / 1e6, 1),
        "write_s": round(time.monotonic() - written_at, 1),
        "page_cache_dropped": True,
    }
    for start in ("first_start", "next_start"):
        if start == "next_start":  # `samples` grown: more prompts, the earlier lines as they were
            with open(directory / "train.jsonl", "a") as p:
                for i in range(lines + new, lines + 2 * new):
                    row = {"id": f"p{i:07d}", "source": "bench", "partition": "short"}
                    row["messages"] = [
                        {"role": "user", "content": f"question {i}"},
                        {"role": "assistant", "content": ""},
                    ]
                    p.write(json.dumps(row) + "\n")
                p.flush()
                os.fsync(p.fileno())
        files = [
            p for p in (directory / "train.jsonl", *conversations.parent.iterdir()) if p.is_file()
        ]
        drop_page_cache(files)
        stub_seen(url)  # forget what came before
        launched = time.monotonic()
        proc = subprocess.run(
            [sys.executable, __file__, "--startup-child", str(directory), url],
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if proc.returncode:
            raise RuntimeError(f"start-up run failed:\n{proc.stderr[-3000:]}")
        phases = json.loads(proc.stdout.strip().splitlines()[-1])
        first = stub_seen(url)["arrivals"][0]
        result[start] = {
            "to_first_request_s": round(first - launched, 3),
            "python_and_imports_s": round(phases["imported_at"] - launched, 3),
            "prompts_and_resume_s": round(phases["pending_at"] - phases["imported_at"], 3),
            "done_before": phases["done_before"],
            "sent": phases["sent"],
        }
    index = conversations.with_name("conversations.index.jsonl")
    result["index_mb"] = round(index.stat().st_size / 1e6, 1) if index.exists() else None
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--waves", type=int, default=16)  # requests = waves x concurrency
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of each client")
    ap.add_argument("--no-speculators", action="store_true", help="only our client")
    ap.add_argument("--out", default="reports/overhead/regen_client.json")
    ap.add_argument(
        "--startup-lines", type=int, default=100_000, help="conversations done (0: no start-up)"
    )
    ap.add_argument("--startup-tokens", type=int, default=4096, help="tokens per conversation")
    ap.add_argument("--startup-new", type=int, default=256, help="prompts to send per start")
    ap.add_argument("--startup-child", nargs=2, metavar=("DIR", "URL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.startup_child:
        return startup_child(Path(args.startup_child[0]), args.startup_child[1])
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
        ours, theirs, bare, startup = {}, {}, {}, None
        stub_seen(url)  # the stub's clock and CPU from here on
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer_dir = Path(tmp) / "tokenizer"
            if (
                not args.no_speculators
            ):  # speculators decodes the token ids with the served model's tokenizer
                from draftline.targets.tiny import train_tokenizer

                train_tokenizer([f"question {i} ok" for i in range(200)], 300).save_pretrained(
                    tokenizer_dir
                )
            for c in args.concurrency:
                n = max(4, args.waves * c)
                ideal = c / args.latency

                def ours_level(c=c, n=n, ideal=ideal) -> dict:
                    with tempfile.TemporaryDirectory(dir=tmp) as work:
                        elapsed, cpu = asyncio.run(run_ours(url, c, prompts(n), Path(work)))
                    return level_result(n, elapsed, ideal, stub_clock(url, c), cpu)

                def speculators_level(c=c, n=n, ideal=ideal) -> dict:
                    with tempfile.TemporaryDirectory(dir=tmp) as work:
                        rate, cpu = run_speculators(url, c, n, Path(work), tokenizer_dir)
                    return level_result(n, n / rate, ideal, stub_clock(url, c), cpu)

                def bare_level(c=c, n=n, ideal=ideal) -> dict:
                    elapsed, cpu = asyncio.run(run_bare(url, c, n))
                    return level_result(n, elapsed, ideal, stub_clock(url, c), cpu)

                sides = {"ours": ours_level, "bare": bare_level}
                if not args.no_speculators:
                    sides["speculators"] = speculators_level
                runs = alternate(sides, args.rounds)  # each its own stub clock, read after it
                ours[f"c{c}"] = level_summary(runs["ours"])
                bare[f"c{c}"] = level_summary(runs["bare"])
                ours[f"c{c}"]["over_bare"] = round(
                    ours[f"c{c}"]["ratio"] / bare[f"c{c}"]["ratio"], 4
                )
                print(f"bare aiohttp c={c}: ratio {bare[f'c{c}']['ratio']:.3f}")
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
            if args.startup_lines:
                startup = measure_startup(
                    url,
                    Path(tmp) / "startup",
                    args.startup_lines,
                    args.startup_tokens,
                    args.startup_new,
                )
                print(f"start-up: {json.dumps(startup)}")
    finally:
        server.terminate()
        server.join(5)
    top = f"c{max(args.concurrency)}"  # where ours must also reach speculators' ratio
    result = {
        "latency_s": args.latency,
        "waves": args.waves,
        "rounds": args.rounds,
        "levels": ours,
        "target_ratio": TARGET_RATIO,
        "target_vs_speculators_at": top,
        "meets_target": all(v["ratio"] >= TARGET_RATIO for v in ours.values())
        and (not theirs or ours[top]["ratio"] >= theirs[top]["ratio"]),
        "speculators_regenerate_responses": theirs or "not run (--no-speculators)",
        # the ceiling of a Python asyncio client on this stub and these cores (run_bare)
        "bare_aiohttp_client": bare,
        "startup": startup or "not run (--startup-lines 0)",
        **machine_load(at_start),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
