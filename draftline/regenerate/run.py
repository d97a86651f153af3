"""One run of the regenerate stage, from its prompts to its report.

Checks first that the backend can answer as asked; counts the conversations already made that
still hold (draftline/regenerate/store.py: load_finished, which moves nothing); starts the server
of `regenerate.backend` on the target (draftline/engines/servers.py, its command line from
draftline/regenerate/launch.py), or takes the `external` endpoints; checks each endpoint before
the first request (draftline/engines/preflight.py: the card's target, not speculative); only then
moves the stale lines to superseded.jsonl and the superseded ones that hold again back
(set_aside_superseded), and sends the missing prompts (draftline/regenerate/replay.py) with a
progress bar, or a plain progress line every tick in a log file. The report counts everything;
too many failures come back as an error that says, per failure reason, what to change
(draftline/regenerate/progress.py), and so does a run whose answers mostly ended at max_tokens
(regenerate.max_length_share, over every conversation kept: this run's and earlier ones').
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from draftline.core.card import TargetCard
from draftline.core.config import ResumeConfig, output_shaping
from draftline.core.derivation import superseded
from draftline.core.io import read_json, write_meta
from draftline.engines.commands import transformers_serve_loads
from draftline.engines.preflight import (
    PreflightError,
    ProbeLimits,
    ServedTarget,
    preflight_regeneration,
)
from draftline.engines.servers import launch_env, server_url, startup_timeout_s
from draftline.regenerate.client import RetryPolicy, close_pool, open_pool
from draftline.regenerate.config import RegenerateError
from draftline.regenerate.index import all_entries
from draftline.regenerate.launch import regenerate_command
from draftline.regenerate.progress import failure_error, progress_bar
from draftline.regenerate.replay import ProgressHooks, ReplayJob, Sampling, regenerate_all
from draftline.regenerate.settings import SETTING_NAMES, engine_record, wanted_settings
from draftline.regenerate.spot_check import (
    SCORES_PROMPTS,
    Scorer,
    SpotCheck,
    SpotCheckFailed,
    sample_kept,
    spot_check,
)
from draftline.regenerate.store import (
    SUPERSEDED,
    Finished,
    PromptFile,
    canonical_order,
    load_finished,
    set_aside_superseded,
)
from draftline.tokens.chat import chat_prompt_ids

if TYPE_CHECKING:
    from draftline.regenerate.config import RegenerateConfig
    from draftline.regenerate.replay import Tally
    from draftline.regenerate.settings import Wanted

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegenerateRun:
    """One run's who and where, settled before any work: the params, the target, the engine that
    answers (the backend, or regenerate.external_engine), the name and API key requests carry,
    and the output directory."""

    cfg: RegenerateConfig
    card: TargetCard
    engine: str
    model_name: str
    api_key: str | None
    out: Path
    verify: ResumeConfig = ResumeConfig()  # the spot-check of kept conversations


class Pending(NamedTuple):
    """What a run has to do, known before it starts any server."""

    by_id: PromptFile  # the prompts by id, in order
    digests: dict[str, str]  # id -> prompt_line of its raw line (regenerate/index.py)
    wanted: Wanted
    tags: dict  # the regeneration record's settings, engine and run, on every line of this run
    finished: Finished  # load_finished's reading: what is done, its counts, what is to move
    todo: list[dict]  # the prompts to send

    @property
    def resume(self) -> dict:
        """load_finished's counts (the report's `resume`)."""
        return self.finished.counts


def pending(
    cfg: RegenerateConfig, engine: str, card: TargetCard, prompts_path: str | Path, out: Path
) -> Pending:
    """Reads the prompts and counts the conversations already made that still hold, moving
    nothing: lines made with other settings (or cut by a kill) move to superseded.jsonl, and
    superseded lines that hold again come back, only once every endpoint passed its preflight
    (set_aside_superseded), so a refused server (wrong endpoint, a draft attached...) leaves
    conversations.jsonl exactly as it was. This is the whole of a rerun's start-up before its
    server: on a conversations file of gigabytes it reads the index beside it
    (draftline/regenerate/index.py)."""
    by_id = PromptFile(prompts_path)  # rows read when asked for: the ones to send, mostly
    digests = by_id.digests
    out.mkdir(parents=True, exist_ok=True)
    # what shaped the answers (compared) and what answered them (provenance), on every line
    wanted = wanted_settings(cfg, card)
    tags = {
        "fingerprint": wanted.fingerprint,
        "settings": wanted.settings,
        "engine": engine_record(cfg, engine),
    }
    finished = load_finished(out / "conversations.jsonl", by_id, wanted, digests)
    tags["run"] = finished.counts["last_run"] + 1  # after every kept line (tokenize's order)
    todo = [by_id[pid] for pid in by_id if pid not in finished.done]
    return Pending(by_id, digests, wanted, tags, finished, todo)


def moved_counts(resume: dict) -> dict:
    """Of load_finished's counts, the lines that move to superseded.jsonl."""
    return {
        k: v
        for k, v in resume.items()
        if v and k not in ("not_in_prompts", "last_run", "restored", "named")
    }


class Regenerated(NamedTuple):
    report: dict
    fingerprint: str  # of the settings that shaped the conversations (regeneration_settings)
    error: str | None  # more failures than regenerate.max_failure_rate: by cause, what to change


class Sent(NamedTuple):
    """What sending gave: the tally (None: nothing sent), what each endpoint's preflight saw, when
    sending started, the requests one endpoint runs at once."""

    tally: Tally | None
    seen: list[dict]
    start: float
    slots: int | None
    spot: SpotCheck | None = None  # the spot-check of kept conversations (None: no server up)


def regenerate(
    cfg: RegenerateConfig,
    card: TargetCard,
    prompts_path: str | Path,
    out: Path,
    verify: ResumeConfig | None = None,
) -> Regenerated:
    """Regenerates the prompts of `prompts_path` not yet in out/conversations.jsonl (append-only,
    keyed by prompt id); failures.jsonl gets one line per conversation that failed in this run."""
    engine = cfg.external_engine if cfg.backend == "external" else cfg.backend
    check_backend(cfg, card, engine)
    run = RegenerateRun(
        cfg,
        card,
        engine,
        cfg.served_model_name or card.model,
        endpoint_api_key(cfg),
        out,
        verify or ResumeConfig(),
    )
    p = pending(cfg, engine, card, prompts_path, out)
    conversations_path = out / "conversations.jsonl"
    resume = p.resume
    moving = moved_counts(resume)
    log.info(
        f"regenerate: {len(p.by_id) - len(p.todo)} of {len(p.by_id)} conversations already done, {len(p.todo)} to send"
        + "".join(f", {v} {k.replace('_', ' ')} to move to {SUPERSEDED}" for k, v in moving.items())
        + (f", {resume['restored']} back from {SUPERSEDED}" if resume["restored"] else "")
    )
    # "target weights changed: 12 conversations superseded"
    for fields, n in sorted(p.finished.plan.changed.items()):
        names = [SETTING_NAMES.get(f, f"params ({f})") for f in fields.split(", ")]
        log.info(f"regenerate: {superseded(names, n, 'conversations')}")
    for reason, lines in resume["named"].items():  # what is set aside, and why: the first few
        log.info(f"regenerate: {reason.replace('_', ' ')}: {', '.join(lines)}")

    sent = Sent(None, [], time.perf_counter(), None)
    if p.todo or spot_checks(run, p):  # kept work is checked whenever the stage reruns
        sent = send(run, p)
    else:
        set_aside_superseded(
            p.finished
        )  # nothing to send: lines to move or bring back, or a cut line
    report = run_report(run, p, sent, time.perf_counter() - sent.start)
    # the same conversations, the same bytes, whatever order they finished in or path they took
    canonical_order(conversations_path, p.digests)
    # over every conversation the next stages will read, so a rerun that sends nothing checks too
    report["check"] = length_check(
        conversations_path, p.by_id, p.tags["fingerprint"], cfg.max_length_share
    )
    errors = [length_error(cfg, report["check"], conversations_path)]
    tally = sent.tally
    if tally is not None:
        log.info(
            f"regenerate: {tally.ok} ok, {tally.failed} failed, {tally.truncated} truncated, "
            f"{report['streamed_tokens_per_s']} tok/s; {report['missing']} of {len(p.by_id)} still missing"
        )
        errors.insert(0, failure_error(cfg, tally, len(p.todo), out))
    return Regenerated(report, p.tags["fingerprint"], "\n".join(e for e in errors if e) or None)


def length_check(
    path: Path, prompts: dict[str, dict], tags_fingerprint: str, max_share: float
) -> dict:
    """reports/regenerate.json's `check`: of the answers (assistant turns) of the conversations
    kept for these prompts (the first line of each id made with these settings), the share that
    ended at max_tokens (finish_reason "length"), against regenerate.max_length_share."""
    answers, length, conversations, seen = 0, 0, 0, set()
    for e in all_entries(path):  # the index of the file, and the lines past it
        if e.answers is None or e.id in seen or e.id not in prompts:
            continue  # a cut or foreign line: the resume already counted it
        if e.fingerprint != tags_fingerprint:
            continue
        seen.add(e.id)
        conversations += 1
        answers += e.answers
        length += e.length
    share = length / answers if answers else None
    return {
        "param": "regenerate.max_length_share",
        "conversations": conversations,
        "answers": answers,
        "length": length,
        "share": round(share, 4) if share is not None else None,
        "threshold": max_share,
        "verdict": "skipped" if share is None else ("fail" if share > max_share else "pass"),
    }


def length_error(cfg: RegenerateConfig, check: dict, path: Path) -> str | None:
    """The stage's error when more answers ended at max_tokens than regenerate.max_length_share."""
    if check["verdict"] != "fail":
        return None
    return (
        f"error: {check['length']} of {check['answers']} answers ({check['share']:.1%}) ended at "
        f"regenerate.max_tokens {cfg.max_tokens} (finish_reason length), more than "
        f"regenerate.max_length_share {check['threshold']}: the data would hold the beginnings of "
        "answers and few endings. Raise regenerate.max_tokens (a thinking model's answers run to "
        "thousands of tokens), and regenerate.short/long.max_context where that is what cut them; "
        "or raise regenerate.max_length_share (1.0 turns the check off). The conversations stay in "
        f"{path}: a new max_tokens regenerates them, a new max_length_share reuses them."
    )


def check_backend(cfg: RegenerateConfig, card: TargetCard, engine: str) -> None:
    """Stops before any work where `transformers serve` would not answer as asked."""
    if cfg.backend == "transformers":
        if not transformers_serve_loads(
            card.architecture, card.config_model_type or card.model_type
        ):
            raise RegenerateError(
                f"error: regenerate.backend: transformers serve loads only model classes transformers ships; "
                f"the target's {card.architecture} is the checkpoint's own code. Use backend vllm or "
                "sglang (they get --trust-remote-code from target.trust_remote_code) or external endpoints"
            )
    if (
        engine == "transformers"
        and max([cfg.temperature] + [t.value for t in cfg.temperatures]) > 0
    ):
        # transformers loads on first use: this stage itself never loads a model
        from transformers import GenerationConfig

        try:
            do_sample = GenerationConfig.from_pretrained(
                card.model, revision=card.revision
            ).do_sample
        except OSError:
            do_sample = False
        if not do_sample:  # transformers serve would silently answer a temperature > 0 greedily
            raise RegenerateError(
                "error: regenerate.temperature > 0 but the target's generation_config has no "
                "do_sample: true, so `transformers serve` would decode greedily"
            )


def endpoint_api_key(cfg: RegenerateConfig) -> str | None:
    """The API key of the endpoints, from the environment variable regenerate.api_key_env names."""
    if not cfg.api_key_env:
        return None
    api_key = os.environ.get(cfg.api_key_env)
    if not api_key:
        raise RegenerateError(
            f"error: regenerate.api_key_env names {cfg.api_key_env}, which is not set"
        )
    return api_key


def send(run: RegenerateRun, p: Pending) -> Sent:
    """Starts the server (a free port unless regenerate.port is set) or takes the external endpoints,
    preflights each, moves the stale lines aside, sends p.todo, stops the server."""
    # bound at call time: tests replace target.card_tokenizer
    from draftline.targets.model import card_tokenizer

    cfg = run.cfg
    tokenizer = card_tokenizer(run.card)
    server, urls = server_or_endpoints(run)
    slots = server_slots(cfg, run.engine)

    def count_ids(messages, tools):
        return chat_prompt_ids(tokenizer, messages, tools, cfg.chat_template_kwargs)

    job = replay_job(run, p, count_ids)
    with server as launched:
        urls = urls or [launched]
        seen = preflight_endpoints(run, urls, count_ids)
        spot = check_kept(run, p, urls[0], count_ids, tokenizer)  # before anything moves
        set_aside_superseded(p.finished)
        import aiohttp  # noqa: F401  its import is set-up, not sending time

        start = time.perf_counter()
        bound = (
            f", at most {slots * len(urls)} requests in flight (regenerate.server_slots {slots})"
            if slots
            else ""
        )
        log.info(
            f"regenerate: sending {len(p.todo)} conversations to {len(urls)} endpoint(s){bound}"
        )
        with progress_bar(len(p.todo), slots and slots * len(urls)) as (on_done, on_tick):
            hooks = ProgressHooks(on_done, on_tick, cfg.progress_every_s)
            try:
                tally = asyncio.run(send_over_pool(run, urls, slots, job, p.todo, hooks))
            except KeyboardInterrupt:
                raise RegenerateError(
                    "regenerate: interrupted; finished conversations are kept, a rerun sends the rest"
                ) from None
    return Sent(tally, seen, start, slots, spot)


def spot_checks(run: RegenerateRun, p: Pending) -> bool:
    """Whether the kept conversations are scored by the server answering now: some are kept,
    resume.verify_sample asks for it, and the engine scores a prompt. Then a rerun with nothing to
    send still starts the server (or asks the external one) to check them: DVC reruns the stage
    when what it depends on changed, which is when kept answers need the proof."""
    return bool(p.finished.done and run.verify.verify_sample > 0 and run.engine in SCORES_PROMPTS)


def check_kept(
    run: RegenerateRun, p: Pending, url: str, prompt_ids: Callable, tokenizer
) -> SpotCheck:
    """resume.verify_sample kept conversations scored by the server at `url`
    (draftline/regenerate/spot_check.py); RegenerateError when one disagrees."""
    n = run.verify.verify_sample
    result = SpotCheck(n)
    if n == 0:
        result.not_run = "resume.verify_sample is 0"
    elif run.engine not in SCORES_PROMPTS:
        result.not_run = f"{run.engine} servers do not score a prompt (prompt_logprobs)"
    rows = sample_kept(run.out / "conversations.jsonl", p.finished.done, n, seed=0)
    if result.not_run is None and not rows:
        result.not_run = "no conversation kept"
    if result.not_run is not None:
        if p.finished.done:
            log.info(f"regenerate: kept conversations not spot-checked: {result.not_run}")
        return result
    scorer = Scorer(url, run.model_name, run.api_key, prompt_ids)
    try:
        result = spot_check(rows, scorer, run.verify.verify_margin, n, tokenizer)
    except SpotCheckFailed as err:
        raise RegenerateError(str(err)) from None
    log.info(
        f"regenerate: spot-check: {len(result.checked)} kept conversations scored by {url}, "
        f"{result.tokens} answer tokens, {result.near_ties} near ties within "
        f"resume.verify_margin {run.verify.verify_margin}"
        + "".join(f"; {v} skipped ({k})" for k, v in result.skipped.items())
    )
    return result


def replay_job(run: RegenerateRun, p: Pending, count_ids: Callable) -> ReplayJob:
    """What every conversation of this run is sent and recorded with (regenerate_all)."""
    cfg = run.cfg
    sampling, policy = request_settings(cfg)
    return ReplayJob(
        model=run.model_name,
        sampling=sampling,
        policy=policy,
        partitions={
            "short": (cfg.short.concurrency, cfg.short.max_context),
            "long": (cfg.long.concurrency, cfg.long.max_context),
        },
        tags=p.tags,
        count_ids=count_ids,
        max_failures=math.floor(cfg.max_failure_rate * len(p.todo)),
        extra_body=engine_request_fields(run.engine, cfg.tool_call_parser),
        prompt_digests=p.digests,
    )


def server_or_endpoints(
    run: RegenerateRun,
) -> tuple[contextlib.AbstractContextManager, list[str]]:
    """(the server to enter, no URLs: entering it gives its URL), or for regenerate.backend
    external (a null context, the endpoints' URLs). Nothing starts before it is entered."""
    # bound at call time: tests replace servers.ManagedServer
    from draftline.engines.servers import ManagedServer

    cfg, card, out = run.cfg, run.card, run.out
    if cfg.backend == "external":
        return contextlib.nullcontext(), [u.rstrip("/") for u in cfg.endpoints]
    limit, why = startup_timeout_s(cfg.startup_timeout_s, card.model, card.revision)
    log.info(
        f"regenerate: starting {cfg.backend} server, start-up limit {limit:.0f}s ({why}); log {out / 'server.log'}"
    )
    server = ManagedServer(
        lambda port: regenerate_command(cfg, card, run.model_name, out, port),
        launch_env(cfg.backend, card.model, out / ".hf_cache"),
        server_url(cfg.host, cfg.port),
        out / "server.log",
        limit,
    )
    return server, []


def request_settings(cfg: RegenerateConfig) -> tuple[Sampling, RetryPolicy]:
    """The sampling of every conversation and the timeouts and retries of every request."""
    sampling = Sampling(
        cfg.max_tokens,
        cfg.temperature,
        cfg.top_p,
        cfg.seed,
        tuple((t.value, t.weight) for t in cfg.temperatures),
        dict(cfg.chat_template_kwargs),
    )
    policy = RetryPolicy(
        cfg.max_retries,
        cfg.retry_backoff_s,
        cfg.retry_backoff_max_s,
        cfg.first_token_timeout_s,
        cfg.token_timeout_s,
    )
    return sampling, policy


def preflight_endpoints(run: RegenerateRun, urls: list[str], count_ids: Callable) -> list[dict]:
    """What each endpoint's preflight saw, in order; the first endpoint refused stops the run
    before anything is sent or moved."""
    cfg = run.cfg
    target = ServedTarget(run.model_name, count_ids, dict(cfg.chat_template_kwargs))
    limits = ProbeLimits(cfg.first_token_timeout_s, cfg.max_retries + 1)
    seen = []
    for url in urls:
        try:
            seen.append(preflight_regeneration(url, run.engine, target, run.api_key, limits))
        except PreflightError as err:
            raise RegenerateError(
                f"error: preflight refused the endpoint: {err} (nothing was sent or "
                f"moved: {run.out / 'conversations.jsonl'} is as it was)"
            ) from None
    return seen


async def send_over_pool(
    run: RegenerateRun,
    urls: list[str],
    slots: int | None,
    job: ReplayJob,
    todo: list[dict],
    hooks: ProgressHooks,
) -> Tally:
    """Sends `todo` (regenerate_all) through a pool of the endpoints opened in the running loop,
    and closes the pool however the run ends."""
    cfg, out = run.cfg, run.out
    pool = open_pool(urls, run.api_key, cfg.short.concurrency + cfg.long.concurrency, slots)
    try:
        return await regenerate_all(
            pool, job, todo, out / "conversations.jsonl", out / "failures.jsonl", hooks
        )
    finally:
        await close_pool(pool)


# the report's figures of this run only (timings, how the server happened to batch, the port a
# launched server got): they go to the run's record, out of the hashed report
# (draftline/core/machine.py)
RUN_FACTS = (
    "url",
    "seconds",
    "conversations_per_s",
    "requests_per_s",
    "completion_tokens_per_s",
    "streamed_tokens_per_s",
    "server",
)


def run_report(run: RegenerateRun, p: Pending, sent: Sent, elapsed: float) -> dict:
    """reports/regenerate.json: the prompts of `p`, those of p.todo sent in this run."""
    cfg, out = run.cfg, run.out
    prompts, todo, resume = len(p.by_id), len(p.todo), p.resume
    tally, seen, slots = sent.tally, sent.seen, sent.slots
    turns = sum(tally.finish_reasons.values()) if tally else 0
    server_stats = None
    if cfg.backend == "hf" and todo and (out / "server_stats.json").is_file():
        server_stats = read_json(
            out / "server_stats.json"
        )  # batches, near-tie tokens (draftline/engines/batch_server.py)
    return {
        "backend": cfg.backend,
        "endpoints": seen,
        "prompts": prompts,
        "reused": prompts - todo,
        "resume": resume,
        # kept conversations scored by the server before they were trusted (spot_check.py)
        "spot_check": sent.spot.as_dict() if sent.spot else {"not_run": "no server started"},
        "sent": tally.done if tally else 0,
        "ok": tally.ok if tally else 0,
        "failed": tally.failed if tally else 0,
        "cancelled": tally.cancelled if tally else 0,
        "server_slots": slots if tally else None,
        "failure_reasons": dict(tally.failure_reasons) if tally else {},
        "retries": dict(tally.retries) if tally else {},
        "truncated": tally.truncated if tally else 0,
        # answers that came with the server's token ids (tokenize compares them with its own)
        "turns_with_token_ids": tally.turns_with_token_ids if tally else 0,
        "finish_reasons": dict(tally.finish_reasons) if tally else {},
        "length_share": round(tally.finish_reasons["length"] / turns, 4) if turns else None,
        "stopped": dict(tally.stopped) if tally else {},
        "requests": tally.requests if tally else 0,
        "prompt_tokens": tally.prompt_tokens if tally else 0,
        "completion_tokens": tally.completion_tokens if tally else 0,
        "seconds": round(elapsed, 2),
        "requests_per_s": round(tally.requests / elapsed, 2) if tally else None,
        "completion_tokens_per_s": round(tally.completion_tokens / elapsed, 1) if tally else None,
        # tokens as they streamed in (what the progress line counts): with a server that sends no
        # usage, the completion tokens above stay 0 and these still count its answers
        "streamed_tokens": tally.streamed_tokens if tally else 0,
        "streamed_tokens_per_s": round(tally.streamed_tokens / elapsed, 1) if tally else None,
        "partitions": {name: p.summary() for name, p in tally.partitions.items()} if tally else {},
        "server": server_stats,
        "conversations": prompts - todo + (tally.ok if tally else 0),
        "missing": todo - (tally.ok if tally else 0),
    }


def engine_request_fields(engine: str, tool_call_parser: str | None = None) -> dict:
    """Fields beyond the chat completion basics that every request to `engine` carries. vLLM and
    SGLang send the usage of a streamed answer only when asked (stream_options); `return_token_ids`
    makes vLLM, SGLang and the built-in hf server return the completion's token ids (vLLM in each
    streamed chunk, SGLang and hf in a whole answer), which tokenize compares with its own tokens.
    Neither changes what the model generates. transformers serve answers 422 to a field it does
    not know (and sends the usage anyway), so it gets neither. `with_tools` goes only into requests
    that carry tools: vLLM without a tool-call parser refuses the default tool_choice "auto" (HTTP
    400 "auto" tool choice requires --enable-auto-tool-choice), so those ask "none", which keeps the
    tools in the prompt (vLLM drops them only with --exclude-tools-when-tool-choice-none) and
    leaves tool-call markup inline in the content, as no parser means everywhere."""
    if engine == "transformers":
        return {}
    # backend hf puts the usage on every chunk when asked, so its tokens count as they come even
    # where their text is held back (a tool call, say)
    usage = {"include_usage": True, **({"continuous_usage_stats": True} if engine == "hf" else {})}
    fields = {"stream_options": usage, "return_token_ids": True}
    if engine == "vllm" and tool_call_parser is None:
        fields["with_tools"] = {"tool_choice": "none"}
    return fields


def server_slots(cfg: RegenerateConfig, engine: str) -> int | None:
    """Requests one endpoint runs at once: given, or known for the server (None: no bound beyond the
    partitions' concurrency). More in flight would only queue, and a queued request's clock runs."""
    if cfg.server_slots is not None:
        return cfg.server_slots
    if engine == "hf":  # the batch server: up to max_batch together (its own flag when run by you)
        return cfg.hf.max_batch if cfg.backend == "hf" else None
    if engine == "transformers":  # one inference thread; continuous batching takes what it is sent
        return None if cfg.continuous_batching else 1
    flag = {"vllm": "--max-num-seqs", "sglang": "--max-running-requests"}[engine]
    args = list(cfg.extra_args) if cfg.backend != "external" else []
    for i, arg in enumerate(args):
        value = (
            arg.split("=", 1)[1]
            if arg.startswith(flag + "=")
            else (args[i + 1] if arg == flag and i + 1 < len(args) else None)
        )
        if value is not None and value.isdigit():
            return int(value)
    return None


class Paths(NamedTuple):
    card: Path  # models/target/card.json
    prompts: Path  # datasets/prompts/train.jsonl
    out: Path  # datasets/regenerated: conversations.jsonl, its index, superseded.jsonl, meta.json


def run(params, paths: Paths) -> Regenerated:
    """Stage `regenerate`: the prompts not yet answered, answered into paths.out, and meta.json;
    the result, whose report the stage writes and whose `error` fails it."""
    cfg = params.regenerate
    card = TargetCard.load(paths.card)
    verify = getattr(params, "resume", None)
    result = regenerate(cfg, card, str(paths.prompts), paths.out, verify)
    # meta.json holds only what shapes the conversations: the operational settings (ports,
    # endpoints, concurrency, timeouts, the engine and its launch arguments) go to the report and
    # each line's engine record, so changing them keeps every conversation
    write_meta(
        paths.out,
        "regenerate",
        output_shaping(cfg),
        target=card.model,
        chat_template_sha256=card.chat_template_sha256,
        fingerprint=result.fingerprint,
    )
    return result
