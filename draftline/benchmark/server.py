"""Benchmark engines `vllm` and `sglang`: a baseline server and a speculative server per k (and per
k of each draft in benchmark.compare), driven by the same prompts in rounds of timed passes.

Two designs (benchmark.layout), named in the report:
- `side_by_side` (auto on a host without a GPU, and with servers already running): the servers
  of the sweep are up at once. Each round runs, at each load, every server in shuffled order, one
  untimed request after each switch, each pass lasting at least benchmark.min_pass_s; a
  speculative pass is paired with the baseline pass nearest it in time at that load. The CPU time
  the idle servers take during each pass is recorded: the design must not tax the server under
  test. Launched servers start with the baseline alone: what it takes from the host's memory
  sizes the groups of speculative servers that run beside it (benchmark.max_servers caps them),
  one group after another, each with its own rounds; where not even one fits, `auto` falls back
  to `sequential`. `separate_gpus` is the same with each launched server on its own share of the
  GPUs, all at once.
- `sequential` (auto on a GPU host: a big target fits once): the baseline's rounds, each
  speculative server's in turn, then the baseline's again; a speculative pass is paired with
  the baseline interpolated (in log tokens/s, over wall-clock time) between its mean before and
  after, and that drift widens the interval (draftline/benchmark/intervals.py).

Acceptance comes from the server itself: vLLM's spec-decode counters on /metrics (read before each
visit, so that a pass's steps have been recorded by the next read; the switch request, a request
like the pass's own, is counted with it), SGLang's per-request meta_info of the timed requests.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shlex
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.benchmark import lossless
from draftline.benchmark.commands import benchmark_serve_command, free_serve_command
from draftline.benchmark.config import BenchmarkError
from draftline.benchmark.engines import ServedEngine, served_engine
from draftline.benchmark.intervals import Rule, decide_load
from draftline.benchmark.rounds import Pass, ServerRun, pair_sequential, pair_side_by_side
from draftline.benchmark.spec_metrics import add_counters, counter_delta
from draftline.benchmark.sweep import Level, Sweep
from draftline.benchmark.verdict import free_statements
from draftline.engines.preflight import preflight_benchmark
from draftline.engines.servers import ManagedServer, launch_env, server_url, startup_timeout_s

if TYPE_CHECKING:
    from draftline.benchmark.config import BenchmarkConfig
    from draftline.core.card import TargetCard

log = logging.getLogger(__name__)


REFERENCE_LOGPROBS = 5  # top logprobs per token of the baseline's reference outputs (near-ties)


@dataclass(frozen=True)
class ServerBench:
    """What every server of one benchmark shares: the engine, its params, the target, the prompts'
    token ids and where the servers' logs go."""

    engine: str
    cfg: BenchmarkConfig
    card: TargetCard
    prompts: list
    log_dir: Path

    @property
    def server(self) -> ServedEngine:
        """The engine's hooks (draftline/benchmark/engines.py)."""
        return served_engine(self.engine)


@dataclass(frozen=True)
class Mode:
    """One server of the sweep: `baseline`, `k<k>` for this run's draft, `<name>:k<k>` for a
    draft of benchmark.compare or a method of benchmark.free (no draft model)."""

    name: str
    draft_path: str | None
    k: int | None
    draft: str | None = None  # None: this run's draft; else the benchmark.compare / free name
    free: bool = False  # `draft` names a benchmark.free method (draftline/draft/free.py)

    @property
    def speculative(self) -> bool:
        return self.draft_path is not None or self.free

    @property
    def free_method(self) -> str | None:
        """The benchmark.free method this server runs instead of a draft (None: not one)."""
        return self.draft if self.free else None


def mode_command(bench: ServerBench, mode: Mode, port: int | None = None) -> list[str]:
    """The serve command of a mode's server: a free method's, else the draft's or the baseline's."""
    if mode.free:
        return free_serve_command(bench.engine, bench.card, bench.cfg, mode.draft, mode.k, port)
    return benchmark_serve_command(
        bench.engine, bench.card, bench.cfg, mode.draft_path, port, k=mode.k
    )


def sweep_modes(cfg: BenchmarkConfig, draft_path: str, compare: dict[str, str]) -> list[Mode]:
    modes = [Mode("baseline", None, None)]
    modes += [Mode(f"k{k}", draft_path, k) for k in cfg.ks]
    # the free methods next to the draft's ks: side by side they share its first group's rounds
    modes += [
        Mode(f"{name}:k{f.k}", None, f.k, name, True) for name, f in cfg.measured_free.items()
    ]
    for name, path in sorted(compare.items()):
        modes += [Mode(f"{name}:k{k}", path, k, name) for k in cfg.compare_ks]
    return modes


def gpu_ids() -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES, else those nvidia-smi lists."""
    if (visible := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        return [g for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(done.stdout.splitlines()) if line.startswith("GPU ")]


def gpu_shares(gpus: list[str], servers: int) -> list[str]:
    """CUDA_VISIBLE_DEVICES of each of `servers` servers side by side: equal shares, in order."""
    per = len(gpus) // servers
    if per < 1:
        raise BenchmarkError(
            f"error: benchmark.layout separate_gpus: {servers} servers need at least {servers} GPUs, "
            f"this host has {len(gpus)}; use layout sequential"
        )
    return [",".join(gpus[i * per : (i + 1) * per]) for i in range(servers)]


def resolve_layout(cfg: BenchmarkConfig) -> str:
    """benchmark.layout with `auto` decided: side_by_side with servers already running or without
    a GPU, sequential on a GPU host (one target may fill it)."""
    if cfg.layout != "auto":
        return cfg.layout
    if cfg.endpoints or not gpu_ids():
        return "side_by_side"
    return "sequential"


def mode_server(bench: ServerBench, mode: Mode, commands: list, log_path: Path, port, env_extra):
    """The server of one mode, as a context manager giving (base URL, its ManagedServer or None):
    benchmark.endpoints' running one (preflight-checked), else a launched one whose command is
    appended to `commands`."""
    engine, cfg, card = bench.engine, bench.cfg, bench.card
    role = "speculative" if mode.speculative else "baseline"
    if role in cfg.endpoints and mode.draft is None:  # already running: checked, not started
        base_url = cfg.endpoints[role].rstrip("/")
        algorithm = bench.server.algorithm(cfg)
        seen = preflight_benchmark(bench.server.probe, base_url, card, mode.draft_path, algorithm)
        log.info(f"benchmark: {mode.name} server at {base_url} (preflight: {seen})")
        return contextlib.nullcontext((base_url, None))
    limit, why = startup_timeout_s(cfg.startup_timeout_s, card.model, card.revision)

    def command(at: int) -> list[str]:  # a fixed port, else a free port chosen at start
        commands.append(mode_command(bench, mode, at))
        log.info(
            f"benchmark: starting {shlex.join(commands[-1])}  (log: {log_path}, start-up limit "
            f"{limit:.0f}s: {why})"
        )
        return commands[-1]

    env = {**launch_env(engine, card.model, log_path.parent / ".hf_cache"), **env_extra}
    server = ManagedServer(command, env, server_url(cfg.host, port), log_path, limit)

    @contextlib.contextmanager
    def started():
        with server as url:
            yield url, server

    return started()


def process_tree(pid: int) -> list:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_total(pid: int | None, measure) -> float | None:
    """measure(process) summed over a server's process tree; None for one not launched here."""
    if pid is None:
        return None
    import psutil

    total = 0.0
    for proc in process_tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += measure(proc)
    return total


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a server's process tree so far."""
    return tree_total(pid, lambda p: p.cpu_times().user + p.cpu_times().system)


def available_gib() -> float:
    """The host's available memory (GiB)."""
    import psutil

    return psutil.virtual_memory().available / 2**30


def groups_of(modes: list[Mode], size: int) -> list[list[Mode]]:
    """`modes` in order, in as few groups of at most `size` as hold them, as even as can be."""
    count = -(-len(modes) // size)
    base, extra = divmod(len(modes), count)
    out, at = [], 0
    for i in range(count):
        n = base + (i < extra)
        out.append(modes[at : at + n])
        at += n
    return out


def rss_gib(pid: int | None) -> float | None:
    total = tree_total(pid, lambda p: p.memory_info().rss)
    return None if total is None else round(total / 2**30, 3)


@dataclass
class Running:
    """A server up for the sweep: its mode, URL, launched process (None when already running),
    command, the counters read so far and the load its last pass ran at."""

    mode: Mode
    url: str
    pid: int | None
    command: str
    endpoint: object = None
    last_snapshot: dict | None = None
    last_c: int | None = None
    counters: dict = field(default_factory=dict)  # {c: summed vLLM counters of its passes}
    startup_s: float | None = None


class Sweeper:
    """The rounds of one benchmark: the servers, the loads, the pass-level bookkeeping."""

    def __init__(self, bench: ServerBench, layout: str):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.bench, self.cfg, self.layout = bench, bench.cfg, layout
        self.passes: list[Pass] = []
        self.rng = random.Random(bench.cfg.seed)
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
        self.runs: dict[str, ServerRun] = {}
        self.reference = None
        self.memory_gib: dict[str, float | None] = {}
        self.orders: list[list] = []  # side by side: [round, load, [server, ...]] as they ran
        self.groups: list[list[str]] = []  # side by side: the speculative servers up together
        self.fit: dict | None = None  # side by side: how the groups were sized
        self.looks: list[dict] = []  # side by side: each planned look at the passes, group by group
        self.stops: list[dict] = []  # side by side: where each group's rounds stopped, and why

    # ---- one server ---------------------------------------------------------------------------

    def start(
        self, stack: contextlib.ExitStack, modes: list[Mode], envs: list[dict], first: int = 0
    ) -> dict:
        """Start `modes` at once (threads: their start-ups overlap); {name: Running}. A fixed
        benchmark.port gives the i-th server of the sweep (`first` + its place here) port + i."""
        bench, cfg = self.bench, self.cfg

        def one(i: int, mode: Mode):
            commands = [mode_command(bench, mode)]
            log_path = bench.log_dir / f"{bench.engine}_{mode.name.replace(':', '_')}.log"
            port = cfg.port + first + i if cfg.port else None
            ctx = mode_server(bench, mode, commands, log_path, port, envs[i])
            url, server = ctx.__enter__()
            return ctx, Running(
                mode,
                url,
                server.proc.pid if server else None,
                shlex.join(commands[-1]),
                startup_s=server.startup_s if server else None,
            )

        running, errors = {}, []
        # the pool outlives the servers (the stack closes it last): a server gets SIGTERM when
        # the thread that launched it ends (PR_SET_PDEATHSIG follows the thread, not the process)
        pool = stack.enter_context(ThreadPoolExecutor(max_workers=len(modes)))
        futures = [pool.submit(one, i, m) for i, m in enumerate(modes)]
        for future in futures:
            try:
                ctx, run = future.result()
            except Exception as err:  # noqa: BLE001 - the others are stopped, then it is raised
                errors.append(err)
                continue
            stack.push(ctx.__exit__)
            running[run.mode.name] = run
        if errors:
            raise errors[0]
        for run in running.values():
            run.endpoint = bench.server.endpoint(run.url)
            self.memory_gib[run.mode.name] = rss_gib(run.pid)
            self.runs.setdefault(
                run.mode.name, ServerRun(run.mode.name, run.mode.k, run.mode.draft)
            )
            self.runs[run.mode.name].command = run.command
        return running

    def load(
        self,
        run: Running,
        description: str,
        requests: int,
        c: int,
        min_s: float = 0.0,
        endpoint=None,
    ):
        import asyncio

        from draftline.benchmark.loadgen import Load, run_load

        task = self.bar.add_task(description, total=requests)
        out = asyncio.run(
            run_load(
                endpoint or run.endpoint,
                self.bench.prompts,
                Load(
                    requests,
                    c,
                    self.cfg.max_new_tokens,
                    self.cfg.request_timeout_s,
                    min_s,
                ),
                on_done=lambda _r: self.bar.advance(task),
            )
        )
        self.bar.remove_task(task)
        return out

    def warm_up(self, run: Running) -> None:
        for i in range(self.cfg.warmup):
            self.load(
                run,
                f"{run.mode.name} warm-up {i + 1}",
                len(self.bench.prompts),
                max(self.cfg.concurrency),
            )

    def read_counters(self, run: Running) -> None:
        """Credit the counters since the last read to the load of the server's last pass."""
        if not self.bench.server.server_counters or not run.mode.speculative:
            return
        now = self.bench.server.counters(run.url)
        if run.last_c is not None and now is not None:
            delta = counter_delta(run.last_snapshot, now)
            run.counters[run.last_c] = add_counters(run.counters.get(run.last_c), delta)
        run.last_snapshot = now

    def timed_pass(self, run: Running, c: int, rnd: int, idle: list[Running]) -> None:
        """A switch request (untimed), then one timed pass of `run` at load c; the idle servers'
        CPU use during it recorded."""
        cfg = self.cfg
        self.read_counters(run)
        # one whole request like the pass's own, so that the server's counters, which take it in,
        # count requests of one kind
        self.load(run, f"{run.mode.name} switch", 1, 1)
        requests = cfg.requests_per_level or max(len(self.bench.prompts), 4 * c)
        before = {o.mode.name: cpu_seconds(o.pid) for o in idle}
        started = time.time()
        results, wall = self.load(
            run,
            f"{run.mode.name} c={c} round {rnd + 1}/{cfg.repeats}",
            requests,
            c,
            cfg.min_pass_s,
        )
        ended = time.time()
        idle_cpu = {
            o.mode.name: round((cpu_seconds(o.pid) - before[o.mode.name]) / wall, 4)
            for o in idle
            if before[o.mode.name] is not None and wall > 0
        }
        run.last_c = c
        p = Pass(run.mode.name, c, rnd, started, ended, results, wall, idle_cpu)
        self.passes.append(p)
        self.runs[run.mode.name].passes.append(p)
        failed = sum(not r.ok for r in results)
        if failed == len(results):
            raise BenchmarkError(
                f"error: benchmark: every request of {run.mode.name} at concurrency {c} failed, e.g. {results[0].error}"
            )
        log.info(
            f"benchmark: {run.mode.name} c={c} round {rnd + 1}: {p.tokens_per_s:.1f} tok/s "
            f"over {wall:.2f} s, {failed} failed"
        )

    def ask_reference(self, run: Running) -> None:
        """The baseline answers every prompt once more, untimed, with its top logprobs: the
        reference the speculative outputs are judged against."""
        endpoint = self.bench.server.endpoint(run.url, REFERENCE_LOGPROBS)
        self.reference, _ = self.load(
            run,
            "baseline reference",
            len(self.bench.prompts),
            max(self.cfg.concurrency),
            endpoint=endpoint,
        )

    def finish(self, running: list[Running]) -> None:
        """The last counters of each server (after the frontend has recorded its last steps)."""
        if self.bench.server.server_counters:
            time.sleep(1.0)
        for run in running:
            self.read_counters(run)
            self.runs[run.mode.name].counters = run.counters

    # ---- designs ------------------------------------------------------------------------------

    def rounds(self, running: dict[str, Running]) -> None:
        """Rounds of the servers up, at each load each in shuffled order, until a planned look
        (benchmark.looks) finds every decision of these servers settled, or the budget
        (benchmark.repeats rounds, benchmark.budget_s seconds) is spent."""
        cfg, started = self.cfg, time.time()
        group = len(self.stops)
        for rnd in range(cfg.repeats):
            for c in cfg.concurrency:
                order = list(running)
                self.rng.shuffle(order)
                self.orders.append([rnd + 1, c, order])
                for name in order:
                    idle = [r for n, r in running.items() if n != name]
                    self.timed_pass(running[name], c, rnd, idle)
            if rnd + 1 not in cfg.looks:
                continue
            look = self.look(running, rnd + 1, time.time() - started, group)
            self.looks.append(look)
            if look["stop"]:  # the last look (repeats is one) always stops
                self.stops.append(look)
                return

    def look(self, running: dict[str, Running], done: int, elapsed: float, group: int) -> dict:
        """Whether the rounds of these servers stop after round `done`: every load of every draft
        among them settled (draftline/benchmark/intervals.py), or the next planned look past the
        budget; what was unsettled."""
        cfg = self.cfg
        names = set(running)
        passes = [p for p in self.passes if p.server in names]
        pairs = pair_side_by_side(passes)
        rule = look_rule(cfg, running)
        unsettled = []
        for draft, by_c in drafts_of(running, pairs).items():
            for c, ratios in sorted(by_c.items()):
                d = decide_load(ratios, rule)
                if not d["settled"]:
                    unsettled.append(f"{draft or 'draft'}@c{c}")
        out = {"group": group, "round": done, "seconds": round(elapsed, 1), "unsettled": unsettled}
        later = [n for n in cfg.looks if n > done]
        if not unsettled:
            out["stop"] = "settled"
        elif not later:
            out["stop"] = "repeats"
        elif cfg.budget_s and elapsed / done * later[0] > cfg.budget_s:
            out["stop"] = "budget_s"
        else:
            out["stop"] = None
        if out["stop"]:
            log.info(
                f"benchmark: rounds stop after {done}: "
                + (
                    "every decision settled"
                    if not unsettled
                    else f"budget ({out['stop']}) spent, unsettled: {', '.join(unsettled)}"
                )
            )
        return out

    def side_by_side(self, modes: list[Mode], envs: list[dict]) -> bool:
        """The baseline up first, then the speculative servers in groups that fit beside it (all
        of them in one group where nothing is launched here). False, with nothing measured, where
        layout auto finds that not even one speculative server fits beside the baseline."""
        baseline, speculative = modes[0], modes[1:]
        with contextlib.ExitStack() as stack, self.bar:
            before = available_gib()
            base = self.start(stack, [baseline], envs[:1])["baseline"]
            self.warm_up(base)
            size = self.group_size(base, before, len(speculative))
            if size == 0:
                return False
            first = 1
            for group in groups_of(speculative, size):
                self.groups.append([m.name for m in group])
                with contextlib.ExitStack() as inner:
                    up = self.start(inner, group, envs[first : first + len(group)], first)
                    for run in up.values():
                        self.warm_up(run)
                    self.rounds({"baseline": base, **up})
                    self.finish(list(up.values()))
                first += len(group)
            self.finish([base])
            self.ask_reference(base)
        return True

    def group_size(self, base: Running, before_gib: float, speculative: int) -> int:
        """How many speculative servers run beside the baseline at once: benchmark.max_servers - 1
        where set, else what the memory left holds (90% of it) at the baseline's footprint (its
        process tree's RSS or what the host lost starting it, whichever is more) plus 15% for a
        draft; every one where the servers are not launched here. 0: none fits (layout auto
        goes sequential; side_by_side named explicitly is an error)."""
        cfg = self.cfg
        if base.pid is None:
            return speculative
        after = available_gib()
        footprint = max(self.memory_gib.get("baseline") or 0.0, before_gib - after)
        fits = int(0.9 * after / (1.15 * footprint)) if footprint > 0 else speculative
        self.fit = {
            "baseline_gib": round(footprint, 3),
            "available_gib": round(after, 3),
            "speculative_fit": fits,
            "max_servers": cfg.max_servers,
        }
        size = min(speculative, fits, (cfg.max_servers or speculative + 1) - 1)
        if size >= 1:
            log.info(
                f"benchmark: the baseline takes {footprint:.2f} GiB, {after:.2f} GiB left: "
                f"{size} speculative server(s) beside it at a time"
            )
            return size
        why = (
            f"the baseline server takes {footprint:.2f} GiB and {after:.2f} GiB are left: no "
            "speculative server fits beside it"
        )
        if cfg.layout == "side_by_side":
            raise BenchmarkError(
                f"error: benchmark.layout side_by_side: {why}; use layout sequential"
            )
        log.warning(f"benchmark: {why}: one server at a time (layout sequential)")
        return 0

    def all_at_once(self, modes: list[Mode], envs: list[dict]) -> None:
        """Every server up at once (separate_gpus: each on its own GPUs), one group."""
        with contextlib.ExitStack() as stack, self.bar:
            running = self.start(stack, modes, envs)
            for run in running.values():
                self.warm_up(run)
            self.groups.append([m.name for m in modes[1:]])
            self.rounds(running)
            self.finish(list(running.values()))
            self.ask_reference(running["baseline"])

    def sequential(self, modes: list[Mode], env: dict) -> None:
        """One server at a time: the baseline before and after the speculative servers."""
        baseline, speculative = modes[0], modes[1:]
        for i, mode in enumerate([baseline, *speculative, baseline]):
            with contextlib.ExitStack() as stack, self.bar:
                run = self.start(stack, [mode], [env])[mode.name]
                self.warm_up(run)
                for rnd in range(self.cfg.repeats):
                    for c in self.cfg.concurrency:
                        self.timed_pass(run, c, rnd, [])
                self.finish([run])
                if i == 0:
                    self.ask_reference(run)


def look_rule(cfg: BenchmarkConfig, running: dict[str, Running]) -> Rule:
    """The family the looks judge by: the verdict's (every load, every k of a draft, every planned
    look), so that a look settles only what the verdict will hold settled."""
    ks = Counter(r.mode.draft for r in running.values() if r.mode.k is not None)
    return Rule(
        confidence=cfg.confidence,
        k_margin=cfg.k_margin,
        margin=cfg.margin,
        loads=len(cfg.concurrency),
        ks=max([len(cfg.ks), *ks.values()]),
        looks=len(cfg.looks),
        extra=free_statements(len(cfg.measured_free), len(cfg.concurrency)),
    )


def drafts_of(running: dict[str, Running], pairs: dict) -> dict:
    """{draft: {c: {k: paired ratios}}} of the speculative servers up (draft None: this run's)."""
    out: dict = {}
    for name, run in running.items():
        if run.mode.k is None:
            continue
        for (server, c), entry in pairs.items():
            if server == name:
                out.setdefault(run.mode.draft, {}).setdefault(c, {})[run.mode.k] = entry[
                    "paired_speedups"
                ]
    return out


def run_sweep(bench: ServerBench, draft_path: str, compare: dict[str, str]) -> tuple[Sweeper, list]:
    cfg = bench.cfg
    layout = resolve_layout(cfg)
    modes = sweep_modes(cfg, draft_path, compare)
    sweep = Sweeper(bench, layout)
    log.info(
        f"benchmark: design {layout}: {len(modes)} servers ({', '.join(m.name for m in modes)}), "
        f"up to {cfg.repeats} rounds (looks after {cfg.looks}) at loads {cfg.concurrency}, passes of "
        f"at least {cfg.min_pass_s:g} s"
    )
    base_env = bench.server.launch_env(cfg)
    if layout == "sequential":
        sweep.sequential(modes, base_env)
    else:
        envs = [dict(base_env) for _ in modes]
        if layout == "separate_gpus":
            for env, share in zip(envs, gpu_shares(gpu_ids(), len(modes)), strict=True):
                env["CUDA_VISIBLE_DEVICES"] = share
            sweep.all_at_once(modes, envs)
        elif not sweep.side_by_side(modes, envs):
            sweep = Sweeper(bench, "sequential")
            sweep.sequential(modes, base_env)
    return sweep, modes


def check_counters(engine: ServedEngine, name: str, acceptance: dict | None) -> None:
    """The baseline must not speculate and a speculative server must."""
    if name == "baseline":
        if acceptance and acceptance.get("drafts"):
            raise BenchmarkError(
                "error: benchmark: the baseline server reported speculative decoding: it must run without a draft"
            )
        return
    if not acceptance or not acceptance.get("drafts"):
        raise BenchmarkError(
            f"error: benchmark: the speculative server {name} reported no speculative steps ({engine.no_counters})"
        )


def benchmark_server(
    bench: ServerBench, draft_path: str, compare: dict[str, str] | None = None
) -> Sweep:
    """Every server of the sweep (sweep_modes) in the design benchmark.layout names: its levels,
    the design that ran, each server's command and the warnings."""
    cfg = bench.cfg
    sweep, modes = run_sweep(bench, draft_path, compare or {})
    pairs = (pair_sequential if sweep.layout == "sequential" else pair_side_by_side)(sweep.passes)
    references = lossless.references(sweep.reference, len(bench.prompts))
    tolerance = cfg.resolved_tie_tolerance()
    warnings, levels = [], {}
    for c in cfg.concurrency:
        base = sweep.runs["baseline"]
        level = Level(
            baseline={
                **base.summary(c),
                "output_verdicts": lossless.tally(
                    lossless.judge_all(base.results(c), references, tolerance)
                ),
            },
            speculative={},
        )
        for mode in modes[1:]:
            run = sweep.runs[mode.name]
            acceptance = bench.server.acceptance(run, c)
            check_counters(bench.server, mode.name, acceptance)
            entry = {
                **run.summary(c),
                **{name: v for name, v in acceptance.items() if name != "drafts"},
                "drafts": acceptance["drafts"],
                **pairs.get((mode.name, c), {}),
            }
            verdicts = lossless.judge_all(run.results(c), references, tolerance)
            if mode.free:  # no draft: its acceptance is what prompt lookup finds, not a fault
                level.free[mode.draft] = {
                    "k": mode.k,
                    **entry,
                    "output_verdicts": lossless.tally(verdicts),
                }
                continue
            if mode.draft is None:
                level.speculative[mode.k] = entry
                level.verdicts[mode.k] = verdicts
            else:
                entry["output_verdicts"] = lossless.tally(verdicts)
                level.compare.setdefault(mode.draft, {})[mode.k] = entry
            if acceptance.get("acceptance_length", 0) < 1.1:
                warnings.append(
                    f"c{c} {mode.name}: acceptance length {acceptance.get('acceptance_length')} is "
                    "~1: the draft is not helping (wrong algorithm, aux layers or vocabulary in the "
                    "server?)"
                )
        check_counters(
            bench.server, "baseline", bench.server.acceptance(sweep.runs["baseline"], None)
        )
        levels[c] = level
    return Sweep(
        levels=levels,
        acceptance_by_k={
            m.k: (bench.server.acceptance(sweep.runs[m.name], None) or {}).get("acceptance_length")
            for m in modes[1:]
            if m.draft is None
        },
        design=design_report(sweep, modes),
        serve_commands={m.name: sweep.runs[m.name].command for m in modes},
        warnings=warnings,
    )


def rounds_run(sweep: Sweeper) -> int:
    """The most rounds any server ran (each group stops on its own)."""
    return max((p.round + 1 for p in sweep.passes), default=0)


def design_report(sweep: Sweeper, modes: list[Mode]) -> dict:
    """The design that ran, for the detail report: servers, rounds, pass lengths and what the
    idle servers took from the one under test."""
    cfg = sweep.cfg
    idle = [share for p in sweep.passes for share in p.idle_cpu.values()]
    walls = [p.wall_s for p in sweep.passes]
    out = {
        "layout": sweep.layout,
        "servers": [m.name for m in modes],
        "rounds": rounds_run(sweep),
        "rounds_budget": cfg.repeats,
        # the side-by-side rounds look at their passes at these rounds (the confidence is split
        # over them); the sequential design runs every round and looks once
        "looks_planned": len(cfg.looks) if sweep.layout != "sequential" else 1,
        "looks_at": cfg.looks if sweep.layout != "sequential" else [cfg.repeats],
        "stopping_rule": "rounds stop at the first planned look where every load of every draft "
        "is settled, or when benchmark.repeats or benchmark.budget_s is spent; every interval at "
        "1 - (1 - confidence) / (statements x looks planned)",
        "looks": sweep.looks,
        "stops": sweep.stops,
        "min_pass_s": cfg.min_pass_s,
        "passes": len(sweep.passes),
        "pass_s_min": round(min(walls), 3) if walls else None,
        "pass_s_median": round(sorted(walls)[len(walls) // 2], 3) if walls else None,
        "order": "shuffled per round and load (benchmark.seed)"
        if sweep.layout != "sequential"
        else "baseline, each speculative server, baseline again",
        "servers_rss_gib": sweep.memory_gib,
        "rounds_order": sweep.orders,
    }
    if sweep.layout != "sequential":
        # the speculative servers up together beside the baseline, group after group
        out["groups"] = sweep.groups
        if sweep.fit:
            out["fit"] = sweep.fit
    if idle:
        # CPU cores' worth of time all idle servers together took during a pass
        per_pass = [sum(p.idle_cpu.values()) for p in sweep.passes if p.idle_cpu]
        out["idle_servers_cpu_cores"] = {
            "per_server_median": round(sorted(idle)[len(idle) // 2], 4),
            "per_server_max": round(max(idle), 4),
            "all_idle_per_pass_median": round(sorted(per_pass)[len(per_pass) // 2], 4),
            "all_idle_per_pass_max": round(max(per_pass), 4),
        }
    return out
