"""Stage `regenerate`: every assistant turn answered again by the target, through a plain server.

    python -m stages.regenerate models/target/card.json datasets/prompts/train.jsonl datasets/regenerated reports/regenerate.json

Starts the server of `regenerate.backend` on the target (transformers serve on CPU by default;
vllm or sglang from params), or uses the `external` endpoints; checks each endpoint before the
first request (the card's target, not speculative); sends the prompts with the `openai` async
client, per short/long partition concurrency; stops the server. Output datasets/regenerated/
conversations.jsonl is append-only and keyed by prompt id (persist: true in dvc.yaml): a rerun
after a crash, or after growing `samples`, sends only the prompts not yet there. failures.jsonl
has one line per conversation that failed in the last run; the report counts everything.
"""

import asyncio
import contextlib
import math
import os
import signal
import sys
import time
from pathlib import Path

from draftline.card import TargetCard
from draftline.config import output_shaping, stage_params
from draftline.threads import apply_thread_policy


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C: the server is stopped, files closed


def regeneration_settings(cfg, card: dict) -> dict:
    """Everything that shapes the answers: the target, its chat template and the output-shaping
    regenerate params (draftline/config.py). Conversations made under other settings are redone."""
    return {"model": card["model"], "revision": card.get("revision"), "chat_template_sha256": card["chat_template_sha256"],
            **output_shaping(cfg)}


def cut_last_line(path: Path) -> bool:
    """The file ends in a line a kill cut short (no final newline)."""
    if not path.exists() or not path.stat().st_size:
        return False
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def read_prompts(path: str) -> list[dict]:
    from draftline.io import read_jsonl

    rows, seen = [], set()
    for n, row in enumerate(read_jsonl(path), 1):
        if not isinstance(row.get("id"), str) or not isinstance(row.get("messages"), list):
            raise SystemExit(f"error: {path} line {n}: a prompt needs a string `id` and a `messages` list")
        if row["id"] in seen:
            raise SystemExit(f"error: {path} line {n}: duplicate prompt id {row['id']!r}")
        seen.add(row["id"])
        rows.append(row)
    return rows


def server_slots(cfg, engine: str) -> int | None:
    """Requests one endpoint runs at once: given, or known for the server (None: no bound beyond the
    partitions' concurrency). More in flight would only queue, and a queued request's clock runs."""
    if cfg.server_slots is not None:
        return cfg.server_slots
    if engine == "hf":  # draftline.batch_server decodes up to max_batch requests together, answers each whole
        return cfg.hf.max_batch
    if engine == "transformers":  # one inference thread; continuous batching takes what it is sent
        return None if cfg.continuous_batching else 1
    flag = {"vllm": "--max-num-seqs", "sglang": "--max-running-requests"}[engine]
    args = list(cfg.extra_args) if cfg.backend != "external" else []
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith(flag + "=") else (args[i + 1] if arg == flag and i + 1 < len(args) else None)
        if value is not None and value.isdigit():
            return int(value)
    return None


def eta(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "?"
    minutes, sec = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{sec:02d}s"


def progress_line(t, total: int, elapsed: float, slots: int | None) -> str:
    """One plain progress line: done, in flight (of what the servers run at once), rates, ETA."""
    rate = t.done / elapsed if elapsed > 0 else 0.0
    left = (total - t.done) / rate if rate else float("inf")
    bound = f" (at most {slots})" if slots else ""
    return (f"regenerate: {t.done}/{total} done (ok {t.ok}, failed {t.failed}, truncated {t.truncated}), "
            f"in flight {t.in_flight}{bound}, {t.streamed_tokens / max(elapsed, 1e-6):.0f} tok/s, "
            f"{t.requests / max(elapsed, 1e-6):.2f} req/s, ETA {eta(left)}"
            + (f"; retries {dict(t.retries)}" if t.retries else ""))


@contextlib.contextmanager
def progress_bar(total: int, slots: int | None):
    """(on_done, on_tick) for regenerate_all: a rich bar on a terminal; a plain line every tick
    otherwise (a log file), even while no conversation finishes."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    fields = "ok {task.fields[ok]} failed {task.fields[failed]} truncated {task.fields[truncated]}  " \
             "in flight {task.fields[in_flight]}  {task.fields[rps]:.1f} req/s {task.fields[tps]:.0f} tok/s"
    with Progress(TextColumn("regenerate"), BarColumn(), MofNCompleteColumn(), TextColumn(fields),
                  TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task("regenerate", total=total, ok=0, failed=0, truncated=0, in_flight=0, rps=0.0, tps=0.0)
        start = time.monotonic()

        def update(t):
            elapsed = max(time.monotonic() - start, 1e-6)
            bar.update(task, completed=t.done, ok=t.ok, failed=t.failed, truncated=t.truncated, in_flight=t.in_flight,
                       rps=t.requests / elapsed, tps=t.streamed_tokens / elapsed)

        def on_tick(t):
            update(t)
            if not console.is_terminal:
                print(progress_line(t, total, time.monotonic() - start, slots), file=sys.stderr, flush=True)

        yield update, on_tick


# What to change when conversations fail, by failure reason: the cause and the param.
ADVICE = {
    "first_token_timeout": "the server did not start answering within regenerate.first_token_timeout_s; raise it "
                           "(long prompts prefill slowly), or set regenerate.server_slots to what the server runs at "
                           "once so that requests do not wait in its queue",
    "token_timeout": "the server stalled between two tokens longer than regenerate.token_timeout_s; raise it, or "
                     "check the server log for a stall",
    "timeout": "the connection timed out; see the server log, or raise regenerate.first_token_timeout_s",
    "connection": "the server dropped connections or is down; see the server log",
    "stream_error": "the server reported errors mid-answer; see the server log",
    "bad_response": "the server's answers are not chat completions; check regenerate.external_engine / the endpoint",
    "empty_response": "the server answered without choices; see the server log",
    "prompt_too_long": "prompts longer than the partition's max_context; raise regenerate.short.max_context / "
                       "regenerate.long.max_context, or lower mix.long_threshold_tokens",
    "template_error": "the target's chat template rejects these conversations; see failures.jsonl",
}


def failure_advice(reasons: dict) -> str:
    lines = []
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        if reason.startswith("http_"):
            code = int(reason[5:])
            text = ("server errors; see the server log" if code >= 500 or code in (408, 429) else
                    "the server refused the request; see the detail in failures.jsonl (regenerate.max_tokens or "
                    "max_context beyond the model's context, or chat_template_kwargs it does not accept?)")
        else:
            text = ADVICE.get(reason, "see failures.jsonl")
        lines.append(f"  {count} x {reason}: {text}")
    return "\n".join(lines)


def main(card_path: str, prompts_path: str, out_dir: str, report_path: str) -> None:
    params = stage_params()
    apply_thread_policy("regenerate")  # before torch loads: draftline/threads.py
    cfg = params.regenerate
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    from draftline import batch_server  # noqa: F401  the server backend hf launches (commands.HF_BATCH_SERVER)
    from draftline.commands import regenerate_command
    from draftline.io import read_json, write_json, write_meta
    from draftline.preflight import PreflightError, preflight_regeneration
    from draftline.regeneration import (RetryPolicy, Sampling, chat_prompt_ids, close_pool, fingerprint,
                                        load_finished, open_pool, regenerate_all)
    from draftline.servers import ManagedServer, server_env, server_url

    card = TargetCard.load(card_path)
    model_name = cfg.served_model_name or card["model"]
    engine = cfg.external_engine if cfg.backend == "external" else cfg.backend
    if cfg.backend == "transformers":
        from draftline.commands import transformers_serve_loads

        if not transformers_serve_loads(card["architecture"], card.get("config_model_type", card["model_type"])):
            raise SystemExit(f"error: regenerate.backend: transformers serve loads only model classes transformers ships; "
                             f"the target's {card['architecture']} is the checkpoint's own code. Use backend vllm or "
                             "sglang (they get --trust-remote-code from target.trust_remote_code) or external endpoints")
    if engine == "transformers" and max([cfg.temperature] + [t.value for t in cfg.temperatures]) > 0:
        from transformers import GenerationConfig

        try:
            do_sample = GenerationConfig.from_pretrained(card["model"], revision=card.get("revision")).do_sample
        except OSError:
            do_sample = False
        if not do_sample:  # transformers serve would silently answer a temperature > 0 greedily
            raise SystemExit("error: regenerate.temperature > 0 but the target's generation_config has no "
                             "do_sample: true, so `transformers serve` would decode greedily")
    api_key = None
    if cfg.api_key_env:
        api_key = os.environ.get(cfg.api_key_env)
        if not api_key:
            raise SystemExit(f"error: regenerate.api_key_env names {cfg.api_key_env}, which is not set")

    prompts = read_prompts(prompts_path)
    by_id = {row["id"]: row for row in prompts}
    tags = {"fingerprint": fingerprint(regeneration_settings(cfg, card))}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    conversations_path = out / "conversations.jsonl"
    # Count first, drop later: lines made with other settings (or cut by a kill) are removed only
    # once every endpoint passed its preflight, so a refused server (wrong endpoint, a draft
    # attached...) leaves conversations.jsonl exactly as it was.
    done, resume = load_finished(conversations_path, by_id, tags["fingerprint"], rewrite=False)
    tags["run"] = resume["last_run"] + 1  # this run's lines sort after every kept one (tokenize)
    dropping = {k: v for k, v in resume.items() if v and k not in ("not_in_prompts", "last_run")}
    to_drop = bool(dropping) or cut_last_line(conversations_path)
    todo = [row for row in prompts if row["id"] not in done]
    print(f"regenerate: {len(prompts) - len(todo)} of {len(prompts)} conversations already done, {len(todo)} to send"
          + "".join(f", {v} {k.replace('_', ' ')} to drop" for k, v in dropping.items()))

    def drop_stale_lines() -> None:
        if to_drop:
            load_finished(conversations_path, by_id, tags["fingerprint"], rewrite=True)

    tally, seen, start, slots = None, [], time.perf_counter(), None
    if todo:
        from draftline.target import card_tokenizer

        tokenizer = card_tokenizer(card)
        if cfg.backend == "external":
            server, urls = contextlib.nullcontext(), [u.rstrip("/") for u in cfg.endpoints]
        else:  # a free port chosen at start unless regenerate.port is set
            from draftline.servers import startup_timeout_s

            limit, why = startup_timeout_s(cfg.startup_timeout_s, card["model"], card.get("revision"))
            print(f"regenerate: starting {cfg.backend} server, start-up limit {limit:.0f}s ({why}); log {out / 'server.log'}")
            server, urls = ManagedServer(lambda port: regenerate_command(cfg, card, model_name, out, port),
                                         server_env(out / ".hf_cache"), server_url(cfg.host, cfg.port),
                                         out / "server.log", limit, say=print), []
        sampling = Sampling(cfg.max_tokens, cfg.temperature, cfg.top_p, cfg.seed,
                            tuple((t.value, t.weight) for t in cfg.temperatures), dict(cfg.chat_template_kwargs))
        policy = RetryPolicy(cfg.max_retries, cfg.retry_backoff_s, cfg.retry_backoff_max_s, cfg.first_token_timeout_s,
                             cfg.token_timeout_s)
        slots = server_slots(cfg, engine)
        # vLLM and SGLang send the usage of a streamed answer only when asked; transformers serve
        # sends it anyway and refuses the field
        extra_body = {} if engine == "transformers" else {"stream_options": {"include_usage": True}}
        partitions = {"short": (cfg.short.concurrency, cfg.short.max_context),
                      "long": (cfg.long.concurrency, cfg.long.max_context)}

        def count_ids(messages, tools):
            return chat_prompt_ids(tokenizer, messages, tools, cfg.chat_template_kwargs)

        async def run(on_done, on_tick):
            pool = open_pool(urls, api_key, cfg.short.concurrency + cfg.long.concurrency, slots)
            try:
                return await regenerate_all(pool, model_name, todo, sampling, policy, partitions, conversations_path,
                                            out / "failures.jsonl", tags, count_ids,
                                            math.floor(cfg.max_failure_rate * len(todo)), on_done, on_tick,
                                            cfg.progress_every_s, extra_body)
            finally:
                await close_pool(pool)

        with server as launched:
            urls = urls or [launched]
            for url in urls:
                try:
                    seen.append(preflight_regeneration(url, engine, model_name, count_ids, dict(cfg.chat_template_kwargs),
                                                       api_key, timeout_s=cfg.first_token_timeout_s,
                                                       attempts=cfg.max_retries + 1))
                except PreflightError as err:
                    raise SystemExit(f"error: preflight refused the endpoint: {err} (nothing was sent or "
                                     f"dropped: {conversations_path} is as it was)") from None
            drop_stale_lines()
            import openai  # noqa: F401  the SDK's import (~1 s) is set-up, not sending time

            start = time.perf_counter()
            bound = f", at most {slots * len(urls)} requests in flight (regenerate.server_slots {slots})" if slots else ""
            print(f"regenerate: sending {len(todo)} conversations to {len(urls)} endpoint(s){bound}", flush=True)
            with progress_bar(len(todo), slots and slots * len(urls)) as (on_done, on_tick):
                try:
                    tally = asyncio.run(run(on_done, on_tick))
                except KeyboardInterrupt:
                    raise SystemExit("regenerate: interrupted; finished conversations are kept, a rerun sends the rest") from None
    else:
        drop_stale_lines()  # nothing to send: only lines of ids no longer prompted, or a cut line
    elapsed = time.perf_counter() - start

    turns = sum(tally.finish_reasons.values()) if tally else 0
    server_stats = None
    if cfg.backend == "hf" and todo and (out / "server_stats.json").is_file():
        server_stats = read_json(out / "server_stats.json")  # batches, near-tie tokens (draftline/batch_server.py)
    report = {
        "backend": cfg.backend,
        "endpoints": seen,
        "prompts": len(prompts),
        "reused": len(prompts) - len(todo),
        "resume": resume,
        "sent": tally.done if tally else 0,
        "ok": tally.ok if tally else 0,
        "failed": tally.failed if tally else 0,
        "cancelled": tally.cancelled if tally else 0,
        "server_slots": slots if tally else None,
        "failure_reasons": dict(tally.failure_reasons) if tally else {},
        "retries": dict(tally.retries) if tally else {},
        "truncated": tally.truncated if tally else 0,
        "finish_reasons": dict(tally.finish_reasons) if tally else {},
        "length_share": round(tally.finish_reasons["length"] / turns, 4) if turns else None,
        "stopped": dict(tally.stopped) if tally else {},
        "requests": tally.requests if tally else 0,
        "prompt_tokens": tally.prompt_tokens if tally else 0,
        "completion_tokens": tally.completion_tokens if tally else 0,
        "seconds": round(elapsed, 2),
        "requests_per_s": round(tally.requests / elapsed, 2) if tally else None,
        "completion_tokens_per_s": round(tally.completion_tokens / elapsed, 1) if tally else None,
        "partitions": {name: p.summary() for name, p in tally.partitions.items()} if tally else {},
        "server": server_stats,
        "conversations": len(prompts) - len(todo) + (tally.ok if tally else 0),
        "missing": len(todo) - (tally.ok if tally else 0),
    }
    write_json(report_path, report)
    # meta.json holds only what shapes the conversations: operational settings (ports, endpoints,
    # concurrency, timeouts: draftline/config.py OPERATIONAL) go to the report, so changing them
    # leaves this output byte-identical and the stages after it cached.
    write_meta(out, "regenerate", output_shaping(cfg), target=card["model"],
               chat_template_sha256=card["chat_template_sha256"], fingerprint=tags["fingerprint"])
    if tally is None:
        return
    print(f"regenerate: {tally.ok} ok, {tally.failed} failed, {tally.truncated} truncated, "
          f"{report['completion_tokens_per_s']} tok/s; {report['missing']} of {len(prompts)} still missing")
    if tally.aborted or tally.failed > cfg.max_failure_rate * len(todo):
        stopped = (f" (stopped early; {tally.cancelled} in flight cancelled)"
                   if tally.aborted and tally.done < len(todo) else "")
        raise SystemExit(f"error: {tally.failed} of {len(todo)} conversations failed{stopped}, more than "
                         f"regenerate.max_failure_rate {cfg.max_failure_rate}; by cause:\n"
                         f"{failure_advice(dict(tally.failure_reasons))}\n"
                         f"Details in {out / 'failures.jsonl'}; a rerun sends only the missing ones.")


if __name__ == "__main__":
    main(*sys.argv[1:])
