"""Stage `regenerate`: every assistant turn answered again by the target, through a plain server.

    python -m stages.regenerate models/target/card.json datasets/prompts/train.jsonl datasets/regenerated reports/regenerate.json

Starts `transformers serve` on the target, sends the prompts with the `openai` async client
(concurrency per short/long partition), stops the server. Output datasets/regenerated/
conversations.jsonl is append-only and keyed by prompt id (persist: true in dvc.yaml): a rerun
after a crash, or after growing `samples`, sends only the ids not yet there.
"""

import asyncio
import sys
import time
from pathlib import Path

from draftline.config import stage_params


def main(card_path: str, prompts_path: str, out_dir: str, report_path: str) -> None:
    params = stage_params()
    cfg = params.regenerate
    from openai import AsyncOpenAI
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from draftline.io import read_json, read_jsonl, read_jsonl_tolerant, write_json, write_jsonl, write_meta
    from draftline.regeneration import Sampling, regenerate_all
    from draftline.serving import ManagedServer, server_env, transformers_serve_command

    card = read_json(card_path)
    if cfg.temperature > 0:
        from transformers import GenerationConfig

        try:
            do_sample = GenerationConfig.from_pretrained(card["model"], revision=card.get("revision")).do_sample
        except OSError:
            do_sample = False
        if not do_sample:
            # transformers serve only samples when the model's generation_config says do_sample:
            # otherwise a temperature > 0 request is silently answered greedily.
            raise SystemExit("error: regenerate.temperature > 0 but the target's generation_config has no "
                             "do_sample: true, so `transformers serve` would decode greedily")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    conversations_path = out / "conversations.jsonl"
    done, bad_lines = read_jsonl_tolerant(conversations_path)
    prompts = list(read_jsonl(prompts_path))
    wanted = {row["id"] for row in prompts}
    seen, kept = set(), []
    for row in done:  # drop a line cut by a kill, duplicates, and rows no longer in the prompts
        if row["id"] in wanted and row["id"] not in seen:
            seen.add(row["id"])
            kept.append(row)
    if bad_lines or len(kept) != len(done):
        write_jsonl(conversations_path, kept)
    todo = [row for row in prompts if row["id"] not in seen]
    print(f"regenerate: {len(seen)} of {len(prompts)} conversations already done, {len(todo)} to send")

    tally = None
    start = time.perf_counter()
    if todo:
        base_url = f"http://{cfg.host}:{cfg.port}"
        command = transformers_serve_command(card["model"], cfg.host, cfg.port, cfg.continuous_batching, cfg.cb_num_blocks)
        sampling = Sampling(cfg.max_tokens, cfg.temperature, cfg.top_p, cfg.seed)
        with ManagedServer(command, server_env(out / ".hf_cache"), base_url, out / "server.log", cfg.startup_timeout_s):
            client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=cfg.request_timeout_s, max_retries=cfg.max_retries)
            with Progress(TextColumn("regenerate"), BarColumn(), TextColumn("{task.completed}/{task.total} ok {task.fields[ok]} failed {task.fields[failed]} truncated {task.fields[truncated]}  {task.fields[tps]:.0f} tok/s"), TimeRemainingColumn()) as bar:
                task = bar.add_task("regen", total=len(todo), ok=0, failed=0, truncated=0, tps=0.0)

                def on_done(t):
                    bar.update(task, completed=t.ok + t.failed, ok=t.ok, failed=t.failed, truncated=t.truncated,
                               tps=t.completion_tokens / (time.perf_counter() - start))

                tally = asyncio.run(regenerate_all(client, card["model"], todo, sampling,
                                                   {"short": cfg.concurrency, "long": cfg.long_concurrency},
                                                   conversations_path, out / "failures.jsonl", on_done))
    elapsed = time.perf_counter() - start
    write_meta(out, "regenerate", cfg.model_dump(), target=card["model"], chat_template_sha256=card["chat_template_sha256"])
    report = {
        "prompts": len(prompts),
        "reused": len(seen),
        "sent": len(todo),
        "ok": tally.ok if tally else 0,
        "failed": tally.failed if tally else 0,
        "failure_reasons": tally.reasons if tally else {},
        "truncated": tally.truncated if tally else 0,
        "completion_tokens": tally.completion_tokens if tally else 0,
        "tokens_per_s": round(tally.completion_tokens / elapsed, 1) if tally else None,
        "seconds": round(elapsed, 1),
        "dropped_partial_lines": bad_lines,
    }
    write_json(report_path, report)
    if tally and tally.failed / len(todo) > cfg.max_failure_rate:
        raise SystemExit(f"error: {tally.failed} of {len(todo)} conversations failed (> regenerate.max_failure_rate "
                         f"{cfg.max_failure_rate}); see {out / 'failures.jsonl'}. Rerun to retry only the missing ones.")


if __name__ == "__main__":
    main(*sys.argv[1:])
