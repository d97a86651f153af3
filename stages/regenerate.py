"""Stage `regenerate`: every assistant turn answered again by the target, through a plain server.

    python -m stages.regenerate models/target/card.json datasets/prompts/train.jsonl datasets/regenerated reports/regenerate.json

Starts the server of `regenerate.backend` on the target (transformers serve on CPU by default;
vllm or sglang from params), or uses the `external` endpoints; checks each endpoint before the
first request (the card's target, not speculative); sends the prompts with the `openai` async
client, per short/long partition concurrency; stops the server (draftline/regeneration_run.py).
Output datasets/regenerated/conversations.jsonl is append-only and keyed by prompt id (persist:
true in dvc.yaml): a rerun after a crash, or after growing `samples`, sends only the prompts not
yet there. failures.jsonl has one line per conversation that failed in the last run; the report
counts everything.
"""

import signal
import sys
from pathlib import Path

from draftline.card import TargetCard
from draftline.config import output_shaping, stage_params
from draftline.threads import apply_thread_policy


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C: the server is stopped, files closed


def launch_command(cfg, card: dict, model_name: str, out: Path | None = None, port: int | None = None) -> list[str]:
    """The server command of a launched backend on `port` (else regenerate.port; with neither, no
    --port: a command to show); `out` (the stage's output dir) takes backend hf's stats."""
    from draftline.serving import (has_cuda, hf_batch_serve_command, sglang_serve_command, transformers_serve_command,
                                   vllm_serve_command)

    port = port if port is not None else cfg.port
    trust = card.get("trust_remote_code", False)
    if cfg.backend == "hf":
        from draftline import batch_server  # the server it launches: an edit to it changes the answers

        return hf_batch_serve_command(batch_server.__name__, card["model"], cfg.host, port, cfg.hf.max_batch,
                                      cfg.hf.gather_ms, cfg.hf.tie_tolerance, cfg.hf.threads,
                                      out / "server_stats.json" if out else None, trust) + cfg.extra_args
    if cfg.backend == "transformers":
        return transformers_serve_command(card["model"], cfg.host, port, "cuda" if has_cuda() else "cpu",
                                          cfg.continuous_batching, cfg.cb_num_blocks, cfg.extra_args, trust,
                                          cfg.chat_template_kwargs)
    build = vllm_serve_command if cfg.backend == "vllm" else sglang_serve_command
    return build(card["model"], model_name, cfg.host, port, card.get("revision"), cfg.tensor_parallel_size,
                 cfg.data_parallel_size, cfg.max_model_len, cfg.reasoning_parser, cfg.tool_call_parser, cfg.extra_args,
                 trust)


def main(card_path: str, prompts_path: str, out_dir: str, report_path: str) -> None:
    params = stage_params()
    apply_thread_policy("regenerate")  # before torch loads: draftline/threads.py
    cfg = params.regenerate
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    from draftline.io import write_json, write_meta
    from draftline.regeneration_run import regenerate

    card = TargetCard.load(card_path)
    out = Path(out_dir)
    result = regenerate(cfg, card, prompts_path, out, launch_command)
    write_json(report_path, result.report)
    # meta.json holds only what shapes the conversations: operational settings (ports, endpoints,
    # concurrency, timeouts: draftline/config.py OPERATIONAL) go to the report, so changing them
    # leaves this output byte-identical and the stages after it cached.
    write_meta(out, "regenerate", output_shaping(cfg), target=card.model,
               chat_template_sha256=card.chat_template_sha256, fingerprint=result.fingerprint)
    if result.error:
        raise SystemExit(result.error)


if __name__ == "__main__":
    main(*sys.argv[1:])
