"""Measured figures in the docs, generated from the JSON reports (`make docs-figures`).

    python -m devtools.docs_figures            # rewrite every figure in README.md and docs/*.md (and below)
    python -m devtools.docs_figures --check    # list the figures that differ from the committed JSON; exit 1

A figure is the text between two HTML comments (invisible once rendered), in two forms:

- a value inside a sentence: `<!-- fig FILE#POINTER FORMAT -->3.62<!-- /fig -->`. FILE is a JSON
  file from the repository root, POINTER a JSON pointer into it (RFC 6901: `/levels/c256/ratio`;
  `~1` stands for `/`), FORMAT the rule that prints it: a Python format spec (`.2f` two decimals,
  `,d` an integer with a thousands separator, `.0%` a percentage), `yesno` for a boolean, `s` for
  text. Nothing is rounded by hand.
- a table: `<!-- figures:NAME:begin -->` ... `<!-- figures:NAME:end -->`, NAME one of FIGURES
  below, which renders it from its JSON files (each column with its own format spec) and ends it
  with a line naming those files and key paths.

`--check` (tests/devtools/test_docs_figures.py runs it) fails when regenerating would change a doc: a JSON
edited without regenerating, a number edited by hand inside a figure, a key that is gone.

Which reports (`--reports`, class Reports): the check compares the docs with the reports they were
generated from, the ones committed in HEAD (`committed`, its default), not with the working tree's:
`make repro` and `make overhead` rewrite reports/ with one's own measurements, which must not fail
one's own `make test`. Writing (`make docs-figures`) reads the working tree's (`worktree`, its
default): after a run of one's own, regenerate the docs from its reports and commit both together;
until then the check still compares with HEAD's. Outside a git work tree (a copy without .git) both
read the working tree's files.

params.yaml, scripts/*.sh, scripts/*.py and the comments and docstrings of draftline/, stages/ and devtools/
hold value figures the same way, regenerated with the docs, and no other figure: both commands fail
on a decimal (1.52, 3.3x), a count ("0 of 969"), an approximation (~35 s) or a ratio (4x) there
outside a figure, which no regenerating would ever update. Code and names are not figures: a
`code span`, an option's values, `key=value`, a version (Python 3.12), and a number the file's own
code or config sets (`0.02  # 0.02 lets ...`); see "figures outside the docs" below.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import math
import os
import posixpath
import re
import subprocess
import sys
import tokenize
from collections.abc import Callable
from pathlib import Path

from draftline.draft.methods import drafter, names
from draftline.hidden_states.formats import bytes_per_token

ROOT = Path(__file__).resolve().parents[1]
DOC_GLOBS = ("README.md", "docs/*.md")

VALUE = re.compile(
    r"<!-- fig (?P<file>\S+)#(?P<pointer>\S*) (?P<fmt>\S+) -->(?P<body>[^\n]*?)<!-- /fig -->"
)
BLOCK = re.compile(
    r"<!-- figures:(?P<name>[a-z0-9_]+):begin -->(?P<body>.*?)<!-- figures:(?P=name):end -->",
    re.S,
)
STRAY = re.compile(r"<!-- (?:fig |/fig|figures:)")


class FigureError(ValueError):
    pass


SOURCES = ("committed", "worktree")  # --reports
# git reads these from the environment before -C: a hook or a caller's repository, not root's
GIT_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR")


def git(root: Path, *args: str) -> str | None:
    """git's stdout in root; None when git fails or is not installed."""
    env = {k: v for k, v in os.environ.items() if k not in GIT_ENV}
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, env=env, check=False
        )
    except OSError:
        return None
    return done.stdout.decode() if done.returncode == 0 else None


class Reports:
    """The JSON reports (and params.yaml) under root that the figures are generated from, each read
    once: as committed in the git revision `rev`, or, with rev None, the working tree's files.

    With a revision, a file is read from it (`git cat-file`) when root is the top level of a git
    work tree; a file that is not in that revision (untracked, or added since) counts as absent,
    as it would in a fresh clone: `make overhead` writing a report that no commit holds changes no
    committed figure. Only when root is not the top of a git work tree (a copy without .git, the
    suite's tmp roots; also when git is missing or refuses the repository) are the working tree's
    files read instead; `source` says which were read."""

    def __init__(self, root: Path, rev: str | None = None):
        self.root = Path(root)
        self._cache: dict[str, object] = {}
        self.rev: str | None = None
        self._commit = ""
        self._files: set[str] = set()
        self.source = "the working tree's reports"
        if rev is None:
            return
        top = git(self.root, "rev-parse", "--show-toplevel")
        if top is None or Path(top.strip()).resolve() != self.root.resolve():
            self.source += " (root is not the top of a git work tree)"
            return
        commit = git(self.root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
        if commit is None:
            raise FigureError(f"{rev}: no such commit in {self.root}")
        commit = commit.strip()
        listing = git(self.root, "ls-tree", "-r", "-z", "--name-only", "--full-tree", commit)
        if listing is None:
            raise FigureError(f"{rev}: git ls-tree failed in {self.root}")
        self.rev, self._commit = rev, commit
        self._files = set(listing.split("\0")) - {""}
        self.source = f"the reports committed in {rev}"

    def _key(self, file: str) -> str:
        return posixpath.normpath(file)

    def exists(self, file: str) -> bool:
        if self.rev is not None:
            return self._key(file) in self._files
        return (self.root / file).is_file()

    def _git_text(self, file: str) -> str:
        text = git(self.root, "cat-file", "blob", f"{self._commit}:{self._key(file)}")
        if text is None:
            raise FigureError(f"{file}: git cat-file failed on {self.rev}")
        return text

    def _file_text(self, file: str) -> str:
        return (self.root / file).read_text()

    def text(self, file: str) -> str:
        """The file's text from this source; FigureError when it has no such file."""
        if not self.exists(file):
            where = f" in {self.rev} (not committed there)" if self.rev is not None else ""
            raise FigureError(f"{file}: no such file{where}")
        return self._git_text(file) if self.rev is not None else self._file_text(file)

    def load(self, file: str):
        if file not in self._cache:
            self._cache[file] = json.loads(self.text(file))
        return self._cache[file]

    def get(self, file: str, pointer: str):
        value = self.load(file)
        if pointer == "":
            return value
        if not pointer.startswith("/"):
            raise FigureError(f"{file}#{pointer}: a JSON pointer starts with /")
        for part in pointer[1:].split("/"):
            key = part.replace("~1", "/").replace("~0", "~")
            if isinstance(value, dict) and key in value:
                value = value[key]
            elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
                value = value[int(key)]
            else:
                raise FigureError(f"{file}#{pointer}: no {key!r} there")
        return value

    def params(self) -> dict:
        """params.yaml (the settings a figure is compared against), from the same source."""
        import yaml

        return yaml.safe_load(self.text("params.yaml"))


def fmt(value, spec: str) -> str:
    """One value by its declared rule (module docstring)."""
    if spec == "yesno":
        if not isinstance(value, bool):
            raise FigureError(f"format yesno wants a boolean, got {value!r}")
        return "yes" if value else "no"
    if spec == "s":
        return str(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FigureError(f"format {spec!r} wants a number, got {value!r}")
    try:
        return format(value, spec)
    except ValueError as err:
        raise FigureError(f"format {spec!r}: {err}") from None


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def source(*parts: str) -> str:
    return "Source: " + "; ".join(parts) + "."


# ---- the tables ---------------------------------------------------------------------------------

OVERHEAD = "reports/overhead"


def rounds_text(data: dict) -> str:
    """How a report's sides were timed: alternating rounds (devtools/ab_timing.py), or, in a file
    written before the overhead scripts alternated, one after the other."""
    if "rounds" in data:
        return f"each side its median of {fmt(data['rounds'], 'd')} alternating rounds"
    return "the sides one after the other (a file from before the scripts alternated: rerun it)"


def load_text(data: dict) -> str:
    """The load a report ran under, as far as its file records it."""
    if "loadavg_at_start" not in data:
        return "load not recorded"
    text = "load average " + ", ".join(fmt(x, ".2f") for x in data["loadavg_at_start"])
    text += " at the start"
    if "loadavg_at_end" in data:
        text += ", " + ", ".join(fmt(x, ".2f") for x in data["loadavg_at_end"]) + " at the end"
    if "cpus" in data:
        text += f", {fmt(data['cpus'], 'd')} CPUs"
    return text


def regen_client_target(data: dict) -> str:
    """The regeneration client's target as its report states it (an older report: the ratio alone)."""
    text = f">= {fmt(data['target_ratio'], '.2f')} at every level"
    if "target_vs_speculators_at" in data:
        at = data["target_vs_speculators_at"].removeprefix("c")
        text += f", and >= speculators' at {at} in flight"
    return text


def regen_client_startup(data: dict) -> str:
    """A rerun's start-up on a large conversations file, when the report measured it."""
    startup = data.get("startup")
    if not isinstance(startup, dict):
        return "Start-up: not in this report (rerun `overhead/regen_client.py`)."
    first, then = startup["first_start"], startup["next_start"]
    return (
        f"Start-up of a rerun on {fmt(startup['conversations'], ',d')} conversations of "
        f"{fmt(startup['tokens_per_conversation'], ',d')} tokens "
        f"({fmt(startup['conversations_mb'], ',.0f')} MB, prompts {fmt(startup['prompts_mb'], ',.0f')} MB; "
        f"page cache dropped), launch to first request: {fmt(first['to_first_request_s'], '.1f')} s "
        f"without an index (every line parsed, the index written; prompts and resume "
        f"{fmt(first['prompts_and_resume_s'], '.1f')} s), {fmt(then['to_first_request_s'], '.1f')} s "
        f"with it (prompts and resume {fmt(then['prompts_and_resume_s'], '.1f')} s; index "
        f"{fmt(startup['index_mb'], '.1f')} MB)."
    )


def regen_client_levels(r: Reports) -> str:
    f = f"{OVERHEAD}/regen_client.json"
    data = r.load(f)
    spec = data["speculators_regenerate_responses"]

    def cpu(level: dict) -> str:
        value = level.get("client_cpu_ms_per_request")
        return "—" if value is None else fmt(value, ".2f")

    bare = data.get("bare_aiohttp_client") or {}  # an older report has no ceiling
    rows = []
    for level, ours in data["levels"].items():
        theirs = spec[level]
        row = [
            level.removeprefix("c"),
            fmt(ours["requests"], ",d"),
            fmt(ours["ratio"], ".3f"),
            fmt(ours["stub_clock_ratio"], ".3f"),
            fmt(ours["first_wave_dispatch_s"], ".3f"),
            cpu(ours),
            fmt(theirs["ratio"], ".3f"),
            fmt(theirs["stub_clock_ratio"], ".3f"),
            cpu(theirs),
        ]
        if bare:
            row += [
                fmt(bare[level]["ratio"], ".3f"),
                cpu(bare[level]),
                fmt(ours["over_bare"], ".3f"),
            ]
        rows.append(row)
    return "\n".join(
        [
            table(
                [
                    "in flight",
                    "requests",
                    "ours: ratio",
                    "ours: stub clock",
                    "ours: first wave out (s)",
                    "ours: CPU ms/request",
                    "speculators: ratio",
                    "speculators: stub clock",
                    "speculators: CPU ms/request",
                    *(
                        ["bare aiohttp: ratio", "bare aiohttp: CPU ms/request", "ours / bare"]
                        if bare
                        else []
                    ),
                ],
                rows,
            ),
            "",
            f"Target: ratio {regen_client_target(data)}; met: "
            f"{fmt(data['meets_target'], 'yesno')}. Timing: {rounds_text(data)}; {load_text(data)}. "
            + regen_client_startup(data)
            + " "
            + source(
                f"`{f}` (`/levels/<level>/{{ratio,stub_clock_ratio,first_wave_dispatch_s,"
                "client_cpu_ms_per_request,over_bare}`, `/speculators_regenerate_responses/<level>/...`, "
                "`/bare_aiohttp_client/<level>/...`, "
                "`/target_ratio`, `/target_vs_speculators_at`, `/meets_target`, `/startup`, "
                "`/rounds`, `/loadavg_at_start`, `/loadavg_at_end`, `/cpus`)"
            ),
        ]
    )


def _specdec_row(r: Reports) -> list[str]:
    """The speedup row; stale when its run, on the evaluate stage's prompts, k and max_new_tokens,
    no longer gives the committed evaluate report's acceptance length (the same decoder: it must)."""
    f = f"{OVERHEAD}/specdec_speedup.json"
    data = r.load(f)
    ours = r.load("reports/acceptance.detail.json")
    evaluate = r.params()["evaluate"]
    same_setup = (data["prompts"], data["k"], data["max_new_tokens"]) == (
        ours["prompts"],
        ours["k"],
        evaluate["max_new_tokens"],
    )
    text = (
        f"{fmt(data['speedup'], '.2f')}x, acceptance length "
        f"{fmt(data['acceptance_length'], '.4f')} ({fmt(data['prompts'], 'd')} prompts, "
        f"k = {fmt(data['k'], 'd')}, {fmt(data['max_new_tokens'], 'd')} new tokens)"
    )
    if same_setup and data["acceptance_length"] != ours["acceptance_length"]:
        text += (
            f"; **stale**: the committed evaluate report gives "
            f"{fmt(ours['acceptance_length'], '.4f')} for the same prompts, k and max_new_tokens, "
            "so it was measured on an older run of the pipeline (rerun `overhead/specdec_speedup.py`)"
        )
    elif not same_setup:
        text += "; not the evaluate stage's prompts and settings"
    return ["speculative vs. greedy decoding, default target (`specdec_speedup.json`)", text, "—"]


def _hs_formats_row(r: Reports) -> list[str]:
    f = f"{OVERHEAD}/hs_format_tradeoffs.json"
    part = "hidden-state formats: bytes per token over the minimum, fp8 argmax vs the target, val tau_sim (`hs_format_tradeoffs.json`)"
    target = "argmax >= 0.99, online within 0.05"
    if not r.exists(f):
        return [part, f"not in a committed file (`make overhead` writes `{f}`)", target]
    data = r.load(f)
    formats = data["formats"]
    text = (
        f"bytes: bf16 {fmt(formats['bf16']['ratio_to_minimum'], '.4f')}, fp8 "
        f"{fmt(formats['fp8']['ratio_to_minimum'], '.4f')} (H = {fmt(data['hidden_size'], 'd')}); "
        f"argmax bf16 {fmt(formats['bf16']['argmax_agreement'], '.4f')}, fp8 "
        f"{fmt(formats['fp8']['argmax_agreement'], '.4f')}; tau_sim fp8 - bf16 "
        f"{fmt(data['tau_sim_fp8_minus_bf16'], '+.4f')}, online - bf16 "
        f"{fmt(data['tau_sim_online_minus_offline_bf16'], '+.4f')}"
    )
    return [part, text, target]


def _dvc_hashing_row(r: Reports) -> list[str]:
    h = r.load(f"{OVERHEAD}/dvc_hashing.json")
    text = (
        f"{fmt(h['dvc_hash_cold_gbps'], '.3f')} GB/s, {fmt(h['dvc_hash_hours_per_tb'], '.2f')} h per TB "
        f"({fmt(h['files'], 'd')} files of {fmt(h['file_bytes'] / 1e6, '.0f')} MB, not in the page cache; "
        f"one-thread md5 {fmt(h['md5_one_thread_cold_gbps'], '.3f')} GB/s); copy into the cache "
        f"{fmt(h['copy']['commit_gbps'], '.3f')} GB/s"
    )
    return [
        "DVC hashing hidden-state files at commit (`dvc_hashing.json`; the table in hidden-states.md)",
        text,
        "—",
    ]


def dvc_cache_costs(r: Reports) -> str:
    """Per TB of hidden states, what each DVC cache type costs: cache disk, commit, each rerun."""
    f = f"{OVERHEAD}/dvc_hashing.json"
    h = r.load(f)

    def per_tb(gbps: float) -> float:
        return 1e12 / (gbps * 1e9) / 3600

    hash_h, copy_h = h["dvc_hash_hours_per_tb"], per_tb(h["copy"]["commit_gbps"])
    rerun_h = per_tb(h["hardlink"]["unprotect_gbps"]) + hash_h  # copied back, hashed from disk
    rows = [
        ["reflink (XFS with reflink=1, Btrfs)", "0", f"{fmt(hash_h, '.2f')} h (hashing)", "0"],
        [
            "copy (`reflink,copy` without reflink: ext4)",
            f"{fmt(h['copy']['cache_over_states'], '.2f')} TB",
            f"{fmt(hash_h + copy_h, '.2f')} h (hashing, then {fmt(copy_h, '.2f')} h copying)",
            "0",
        ],
        [
            "hardlink / symlink",
            "0",
            f"{fmt(hash_h, '.2f')} h (hashing)",
            f"{fmt(rerun_h, '.2f')} h and 1 TB more disk (copied back, hashed again)",
        ],
    ]
    return "\n".join(
        [
            table(["cache.type", "DVC cache", "commit", "each rerun of the stage"], rows),
            "",
            f"Measured on {fmt(h['cpu_count'], 'd')} cores, {fmt(h['filesystem'], 's')}, load average "
            f"{fmt(h['loadavg_before'][0], '.1f')} at the start, {fmt(h['files'], 'd')} files of "
            f"{fmt(h['file_bytes'] / 1e6, '.0f')} MB evicted from the page cache before hashing.",
            source(
                f"`{f}` (`/dvc_hash_hours_per_tb`, `/copy/commit_gbps`, `/copy/cache_over_states`, "
                "`/hardlink/unprotect_gbps`: `dvc unprotect`, the copy back before the hashing again)"
            ),
        ]
    )


def _train_loader_row(r: Reports) -> list[str]:
    f = f"{OVERHEAD}/train_loader.json"
    part = "train step, hidden states read from disk vs. already in memory (`train_loader.json`)"
    target = "<= 1.05"
    if not r.exists(f):
        return [part, f"not in a committed file (`make overhead` writes `{f}`)", target]
    data = r.load(f)
    text = (
        f"{fmt(data['ratio_read_ahead_over_in_memory'], '.3f')} read ahead by "
        f"{fmt(data['loader_workers'], 'd')} threads, "
        f"{fmt(data['ratio_synchronous_over_in_memory'], '.3f')} read between steps "
        f"(H = {fmt(data['hidden_size'], ',d')}, pack_len {fmt(data['pack_len'], 'd')}); "
        f"target met: {fmt(data['meets_target'], 'yesno')}"
    )
    return [part, text, target]


def train_loader_steps(r: Reports) -> str:
    f = f"{OVERHEAD}/train_loader.json"
    data = r.load(f)
    names = {
        "in_memory": "packs already in memory",
        "read_ahead": f"read from disk, {fmt(data['loader_workers'], 'd')} threads ahead (the default)",
        "synchronous": "read from disk between steps (`loader_workers: 0`)",
    }
    memory = data["step_s"]["in_memory"]
    rows = [
        [
            name,
            fmt(data["step_s"][key], ".3f"),
            fmt(data["step_s"][key] / memory, ".3f"),
            fmt(data["wait_for_pack_s"][key] * 1000, ".1f"),
            fmt(data["process_cpu_s"][key], ".3f"),
        ]
        for key, name in names.items()
    ]
    load = ", ".join(fmt(x, ".2f") for x in data["loadavg_before"])
    after = ", ".join(fmt(x, ".2f") for x in data["loadavg_after"])
    return "\n".join(
        [
            table(
                ["packs", "step (s)", "vs in memory", "wait for the pack (ms)", "CPU per step (s)"],
                rows,
            ),
            "",
            f"Medians of {fmt(data['timed_steps_per_variant'], 'd')} steps each, interleaved; "
            f"H = {fmt(data['hidden_size'], ',d')}, {fmt(data['pack_len'], 'd')} tokens "
            f"({fmt(data['pack_bytes_on_disk'] / 1e6, '.1f')} MB on disk) a pack, "
            f"{fmt(data['threads'], 'd')} compute thread(s); load average before: {load}, after: "
            f"{after}. "
            + source(
                f"`{f}` (`/step_s/<packs>`, `/wait_for_pack_s/<packs>`, `/process_cpu_s/<packs>`, "
                "`/loader_workers`, `/loadavg_before`, `/loadavg_after`)"
            ),
        ]
    )


def scale_stages(r: Reports) -> str:
    f = f"{OVERHEAD}/scale.json"
    data = r.load(f)
    sizes = [str(n) for n in data["sizes"]]
    rows = []
    for stage, exponent in data["exponents"].items():
        cells = [f"`{stage}`"]
        for n in sizes:
            s = data["runs"][n]["stages"][stage]
            cells.append(
                f"{fmt(s['wall_s'], '.1f')} / {fmt(s['cpu_s'], '.1f')} / {fmt(s['peak_rss_mb'], ',.0f')}"
            )
        cells.append(f"{fmt(exponent['wall_s'], '.2f')} / {fmt(exponent['cpu_s'], '.2f')}")
        rows.append(cells)
    header = [
        "stage",
        *[f"{int(n):,} conversations: wall s / CPU s / peak RSS MB" for n in sizes],
        "exponent (wall / CPU)",
    ]
    targets, passed = data["targets"], data["pass"]
    whole = data.get("tokenize_ratio_whole_process") or {}
    startup = data.get("tokenize_startup_s") or {}
    ratios = ", ".join(
        f"{int(n):,}: {fmt(data['tokenize_ratio'][n], '.3f')} "
        f"({fmt(data['tokenize_ratio_cpu'][n], '.3f')} per CPU second"
        + (
            f"; {fmt(whole[n], '.3f')} over the whole process, its {fmt(startup[n], '.1f')} s "
            "start-up included"
            if n in whole and n in startup
            else ""
        )
        + ")"
        for n in sizes
    )
    grown = []
    for n in sizes:
        inc = data["runs"][n]["incremental"]
        grown.append(
            f"{int(n):,} -> {fmt(inc['samples'][1], ',d')}: {fmt(inc['conversations_tokenized'], ',d')} "
            f"tokenized of {fmt(inc['conversations_added'], ',d')} added, "
            f"{fmt(inc['conversations_kept'], ',d')} kept, {fmt(inc['rows_copied'], ',d')} copied, "
            f"{fmt(inc['stages']['tokenize']['wall_s'], '.1f')} s"
        )
    return "\n".join(
        [
            table(header, rows),
            "",
            f"~{fmt(data['tokens_per_conversation_calibrated'], ',d')} tokens a conversation. "
            "Tokenize's throughput once started over the tokenizer's own batched throughput on "
            f"the same rows: {ratios} "
            f"(target >= {fmt(targets['tokenize_ratio_min'], '.1f')} from "
            f"{fmt(targets['tokenize_ratio_judged_from_conversations'], ',d')} conversations; met: "
            f"{fmt(passed['tokenize_ratio'], 'yesno')}). Exponents <= "
            f"{fmt(targets['exponent_max'], '.1f')}: {fmt(passed['exponents'], 'yesno')}; every "
            f"peak RSS <= {fmt(targets['rss_bound_mb'], ',d')} MB: {fmt(passed['rss_bound'], 'yesno')}. "
            f"Samples grown by 10%: {'; '.join(grown)}; only the new rows: "
            f"{fmt(passed['incremental_only_new_rows'], 'yesno')}. {load_text(data)}. "
            + source(
                f"`{f}` (`/runs/<size>/stages/<stage>/{{wall_s,cpu_s,peak_rss_mb}}`, "
                "`/exponents/<stage>`, `/tokenize_ratio`, `/tokenize_ratio_cpu`, "
                "`/tokenize_ratio_whole_process`, `/tokenize_startup_s`, "
                "`/runs/<size>/incremental`, `/targets`, `/pass`)"
            ),
        ]
    )


SEEDS_RUNS = (25_000, 100_000)  # the seeds' regenerated conversations: the first run, the last
SEEDS_HIDDEN_SIZE = 7168  # their target's hidden size (a DeepSeek-V3-sized model)


def seeds_scale(r: Reports) -> str:
    """What the measured rates mean for the seeds' runs: the data stages at each run's size (the
    scale benchmark's nearest measured size, carried by each stage's fitted exponent), the bf16
    hidden states and DVC's hashing of them at commit, the regeneration client's share."""
    scale = r.load(f"{OVERHEAD}/scale.json")
    hashing = r.load(f"{OVERHEAD}/dvc_hashing.json")
    loader = r.load(f"{OVERHEAD}/train_loader.json")
    client = r.load(f"{OVERHEAD}/regen_client.json")
    sizes = scale["sizes"]
    per_conversation = scale["tokens_per_conversation_calibrated"]
    per_token = bytes_per_token(SEEDS_HIDDEN_SIZE, "bf16")
    rows = []
    for n in SEEDS_RUNS:
        near = min(sizes, key=lambda m: abs(math.log(n / m)))
        run = scale["runs"][str(near)]["stages"]
        stages = {
            stage: run[stage]["wall_s"] * (n / near) ** (scale["exponents"][stage]["wall_s"] or 1)
            for stage in run
        }
        tokens = n * per_conversation
        state_tb = tokens * per_token / 1e12
        how = "measured" if near == n else f"from {near:,}"
        rows.append(
            [
                f"{n:,} x ~{per_conversation:,} tokens ({tokens / 1e6:,.0f}M)",
                f"{sum(stages.values()) / 60:.1f} min ({how}; tokenize {stages['tokenize'] / 60:.1f})",
                f"{state_tb:.1f} TB",
                f"{state_tb * hashing['dvc_hash_hours_per_tb']:.1f} h",
            ]
        )
    c256 = client["levels"]["c256"]
    return "\n".join(
        [
            table(
                [
                    "regenerated conversations",
                    "prepare + mix + tokenize + vocab, this 2-core machine",
                    f"bf16 hidden states, H = {SEEDS_HIDDEN_SIZE:,} (4 layers)",
                    "DVC hashing at commit (ext4 rate)",
                ],
                rows,
            ),
            "",
            f"Beside them: the trainer reads packs from disk at {fmt(loader['ratio_read_ahead_over_in_memory'], '.3f')} "
            f"of its in-memory step time; the regeneration client reaches {fmt(c256['ratio'], '.3f')} of "
            f"the ideal rate at 256 in flight against a stub answering in {fmt(client['latency_s'], '.1f')} s, "
            f"{fmt(c256['client_cpu_ms_per_request'], '.2f')} ms of client CPU a request. "
            + source(
                f"`{OVERHEAD}/scale.json` (`/runs/<size>/stages/<stage>/wall_s`, `/exponents`, "
                "`/tokens_per_conversation_calibrated`), "
                f"`{OVERHEAD}/dvc_hashing.json` (`/dvc_hash_hours_per_tb`), "
                f"`{OVERHEAD}/train_loader.json` (`/ratio_read_ahead_over_in_memory`), "
                f"`{OVERHEAD}/regen_client.json` (`/levels/c256`, `/latency_s`); bytes per token: "
                "`draftline/hidden_states/formats.bytes_per_token`"
            ),
        ]
    )


def _hs_extraction_text(hs: dict) -> str:
    text = (
        f"{fmt(hs['ratio_ours_over_bare'], '.3f')} ({fmt(hs['ours_s'], '.2f')} vs "
        f"{fmt(hs['bare_s'], '.2f')} s, {fmt(hs['model_parameters'] / 1e6, '.0f')}M-param Llama, "
        f"{fmt(hs['tokens'], ',d')} tokens"
    )
    if "bare_work" not in hs:  # a file from before the bare side ran our forward
        return text + (
            "; **not like with like**: its bare side computed the logits of every position, "
            "ours of the last only (rerun `overhead/hs_extraction.py`))"
        )
    return text + f"; both last-position logits only, no cache; {rounds_text(hs)}; {load_text(hs)})"


def _train_step_text(step: dict) -> str:
    text = (
        f"{fmt(step['ratio_ours_over_bare'], '.3f')} ({fmt(step['ours_step_s'], '.3f')} vs "
        f"{fmt(step['bare_step_s'], '.3f')} s, pack_len {fmt(step['pack_len'], 'd')}"
    )
    if "checkpoints_timed" not in step:
        return text + (
            "; **stale**: ours' time left out its resume checkpoints and the sides ran one after "
            "the other (rerun `overhead/train_step.py`))"
        )
    return (
        text + f"; ours includes the {fmt(step['checkpoints_timed'], 'd')} resume checkpoints "
        f"written between its steps; {rounds_text(step)}; {load_text(step)})"
    )


def overhead_parts(r: Reports) -> str:
    client = r.load(f"{OVERHEAD}/regen_client.json")
    hs = r.load(f"{OVERHEAD}/hs_extraction.json")
    step = r.load(f"{OVERHEAD}/train_step.json")
    dvc = r.load(f"{OVERHEAD}/dvc_bookkeeping.json")
    tp = r.load(f"{OVERHEAD}/regen_throughput.json")
    cpu = r.load(f"{OVERHEAD}/cpu_load.json")
    c256, spec256 = client["levels"]["c256"], client["speculators_regenerate_responses"]["c256"]
    throughput = "; ".join(
        f"{name} {fmt(t['ratio'], '.3f')} ({fmt(tp['prompts'][name], 'd')} prompts x "
        f"{fmt(tp['max_tokens'], 'd')} tokens: {fmt(t['ours']['tokens_per_s'], ',.0f')} vs "
        f"{fmt(t['bare_generate']['tokens_per_s'], ',.0f')} tok/s, answers equal "
        f"{fmt(t['answers_equal'], '.0%')})"
        for name, t in tp["targets"].items()
    )
    policy = [s["policy"]["ratio"] for s in cpu["stages"].values()]
    default = [s["torch_default"]["ratio"] for s in cpu["stages"].values()]
    rows = [
        [
            "regeneration client vs. the ideal rate at 256 in flight (`regen_client.json`; every level below)",
            f"{fmt(c256['ratio'], '.3f')} (speculators' `regenerate-responses` "
            f"{fmt(spec256['ratio'], '.3f')}); target met: {fmt(client['meets_target'], 'yesno')}",
            regen_client_target(client),
        ],
        [
            "hidden-state extraction (capture, bf16 files) vs. the same forward with "
            "`output_hidden_states`, writing nothing (`hs_extraction.json`)",
            _hs_extraction_text(hs),
            f"<= {fmt(hs['target_ratio'], '.2f')}",
        ],
        [
            "bytes written per token vs. 4 x H x 2 (`hs_extraction.json`)",
            f"{fmt(hs['bytes_ratio'], '.4f')} (token ids and header)",
            "1 + ids and header",
        ],
        [
            "train step vs. bare Eagle3DraftModel forward + backward + AdamW (`train_step.json`)",
            _train_step_text(step),
            f"<= {fmt(step['target_ratio'], '.2f')}",
        ],
        _train_loader_row(r),
        _hs_formats_row(r),
        [
            f"no-op `dvc repro` / `dvc status`, {fmt(dvc['files'], ',d')} hidden-state files of "
            "128 bytes, DVC's per-file work (`dvc_bookkeeping.json`; per byte: the next row)",
            f"{fmt(dvc['noop_repro_s'], '.1f')} s / {fmt(dvc['status_s'], '.1f')} s; target met: "
            f"{fmt(dvc['meets_target'], 'yesno')}",
            f"<= {fmt(dvc['target_noop_repro_s'], 'd')} s",
        ],
        _dvc_hashing_row(r),
        _specdec_row(r),
        [
            "regenerate stage (backend hf) vs. bare batched `generate`, same prompts and max_tokens (`regen_throughput.json`)",
            throughput,
            ">= 0.5",
        ],
        [
            f"stage work next to {fmt(cpu['hogs'], 'd')} busy processes / idle, {fmt(cpu['steps'], 'd')} steps (`cpu_load.json`; every stage below)",
            f"thread policy {fmt(min(policy), '.2f')}-{fmt(max(policy), '.2f')}, torch's default "
            f"{fmt(min(default), '.2f')}-{fmt(max(default), '.2f')}",
            "<= 3",
        ],
    ]
    return "\n".join(
        [
            table(["part", "ours vs baseline", "target"], rows),
            "",
            source(
                f"`{OVERHEAD}/*.json` as named in each row (key paths: the tables below, and "
                "`/ratio_ours_over_bare`, `/bytes_ratio`, `/noop_repro_s`, `/status_s`, "
                "`/dvc_hash_cold_gbps`, `/dvc_hash_hours_per_tb`, `/copy/commit_gbps`, `/speedup`, "
                "`/acceptance_length`, `/targets/<target>/ratio`, `/ratio_read_ahead_over_in_memory`, "
                "`/ratio_synchronous_over_in_memory`); the stale check reads "
                "`reports/acceptance.detail.json` (`/acceptance_length`, `/prompts`, `/k`) and "
                "`params.yaml` (`evaluate.max_new_tokens`)"
            ),
        ]
    )


def regen_throughput_targets(r: Reports) -> str:
    f = f"{OVERHEAD}/regen_throughput.json"
    data = r.load(f)
    rows = []
    for name, t in data["targets"].items():
        server = t["ours"]["server"]
        rows.append(
            [
                name,
                f"{fmt(data['prompts'][name], 'd')} x {fmt(data['max_tokens'], 'd')}",
                fmt(t["bare_generate"]["tokens_per_s"], ",.1f"),
                fmt(t["ours"]["tokens_per_s"], ",.1f"),
                fmt(t["ratio"], ".3f"),
                fmt(t["answers_equal"], ".0%"),
                fmt(server["mean_batch"], ".1f"),
                fmt(server["near_tie_tokens"], "d"),
                fmt(t["vllm"]["tokens_per_s"], ",.1f") if "vllm" in t else "not run",
                fmt(t["vllm_vs_hf"], ".2f") + "x" if "vllm" in t else "—",
                fmt(t["vllm_answers_equal"], ".0%") if "vllm" in t else "—",
            ]
        )
    return "\n".join(
        [
            table(
                [
                    "target",
                    "prompts x max_tokens",
                    "bare generate (tok/s)",
                    "regenerate stage (tok/s)",
                    "ratio",
                    "answers equal",
                    "mean batch",
                    "near-tie tokens",
                    "vLLM CPU (tok/s)",
                    "vLLM / regenerate hf",
                    "vLLM answers equal to hf",
                ],
                rows,
            ),
            "",
            f"Timing: {rounds_text(data)}; {load_text(data)}; "
            f"{fmt(data['threads']['threads'], 'd')} threads, {data['threads']['wait_policy']} wait. "
            + source(
                f"`{f}` (`/targets/<target>/{{bare_generate,ours}}/tokens_per_s`, `/ratio`, "
                "`/answers_equal`, `/ours/server/{mean_batch,near_tie_tokens}`, "
                "`/vllm/tokens_per_s`, `/vllm_vs_hf`, `/vllm_answers_equal`, `/rounds`, "
                "`/loadavg_at_start`, `/loadavg_at_end`, `/cpus`)"
            ),
        ]
    )


def cpu_load_stages(r: Reports) -> str:
    f = f"{OVERHEAD}/cpu_load.json"
    data = r.load(f)
    rows = []
    for stage, s in data["stages"].items():
        p, d = s["policy"], s["torch_default"]
        rows.append(
            [
                f"`{stage}`",
                fmt(p["idle_s"], ".1f"),
                fmt(p["loaded_s"], ".1f"),
                fmt(p["ratio"], ".2f"),
                fmt(d["idle_s"], ".1f"),
                fmt(d["loaded_s"], ".1f"),
                fmt(d["ratio"], ".2f"),
            ]
        )
    return "\n".join(
        [
            table(
                [
                    "stage",
                    "policy: idle (s)",
                    "policy: loaded (s)",
                    "policy: ratio",
                    "torch default: idle (s)",
                    "torch default: loaded (s)",
                    "torch default: ratio",
                ],
                rows,
            ),
            "",
            f"{fmt(data['steps'], 'd')} steps of each stage's work, alone and next to "
            f"{fmt(data['hogs'], 'd')} busy-looping processes on {fmt(data['cores'], 'd')} cores; "
            f"timing: {rounds_text(data)}; {load_text(data)}. "
            + source(
                f"`{f}` (`/stages/<stage>/{{policy,torch_default}}/{{idle_s,loaded_s,ratio}}`, "
                "`/rounds`, `/loadavg_at_start`, `/loadavg_at_end`)"
            ),
        ]
    )


def cpu_load_train_threads(r: Reports) -> str:
    f = f"{OVERHEAD}/cpu_load_train_threads.json"
    data = r.load(f)
    train = data["stages"]["train"]
    names = {
        "policy": "every core, passive wait (the policy)",
        "passive_one_thread": "one thread, passive wait",
    }
    rows = [
        [
            names.get(key, key),
            fmt(c["idle_s"], ".1f"),
            fmt(c["loaded_s"], ".1f"),
            fmt(c["ratio"], ".2f"),
        ]
        for key, c in train.items()
    ]
    return "\n".join(
        [
            table(["`train`", "idle (s)", "loaded (s)", "ratio"], rows),
            "",
            f"{fmt(data['steps'], 'd')} steps; timing: {rounds_text(data)}; {load_text(data)}. "
            + source(
                f"`{f}` (`/stages/train/<configuration>/{{idle_s,loaded_s,ratio}}`, `/rounds`, "
                "`/loadavg_at_start`, `/loadavg_at_end`)"
            ),
        ]
    )


# The SmolLM2 recipe's runs (scripts/recipe_smollm2.sh). RECIPE: on the split held out by content,
# with a dev split (test and dev figures); RECIPE_BY_ID: the earlier runs, eval held out by id on the
# templated sets only. Which table a run belongs to and what it changes; a run in a JSON without a
# line here is an error, a line without a run is a run not measured (yet) on that split.
RECIPE = "reports/recipe_smollm2/experiments.json"
RECIPE_BY_ID = "reports/recipe_smollm2/by_id/experiments.json"
RECIPE_HELDOUT = {
    "L27-500": ("500", "the earlier recipe"),
    "d500-emb": ("500", "train_embeddings"),
    "d500-head": ("500", "train_lm_head"),
    "d500-emb-head": ("500", "train_embeddings, train_lm_head (chosen on dev)"),
    "d500-emb-head-ep15": ("500", "train_embeddings, train_lm_head, 15 epochs"),
    "d500-emb-head-len256": ("500", "train_embeddings, train_lm_head, 256-token answers"),
    "d500-emb-head-verdict": (
        "500",
        "the chosen recipe, whole pipeline; speedup: vLLM at 4 in flight, best k (L27-500's: built-in engine, 1 in flight)",
    ),
    "d500-peagle-verdict": (
        "500",
        "the verdict run as P-EAGLE (train.method; drafters.md); vLLM alone measures, no tau_sim",
    ),
    "d500-dflash-verdict": (
        "500",
        "the verdict run as DFlash, 64 blocks per pack (drafters.md); vLLM alone, no tau_sim",
    ),
    "d500-long": (
        "500 + long rows",
        "the verdict run's draft fine-tuned 2 epochs with long rows (pack 5,120); verdict at 4 in flight",
    ),
    "d375-emb-head": ("375", "the chosen recipe, on the verdict run's code and split"),
    "d250-emb-head": ("250", "the chosen recipe, on the verdict run's code and split"),
    "d125-emb-head": ("125", "the chosen recipe, on the verdict run's code and split"),
    "L27-250": ("250", "the earlier recipe"),
    "L27-125": ("125", "the earlier recipe"),
}
# Speedups in experiments.json that the drafters' one run replaced: single-pass points measured
# before the side-by-side design, which contradict that run (reports/drafters/smollm2.json):
# the recipe table leaves them out and points to the drafters table.
RECIPE_SPEEDUP_RETIRED = {"d500-peagle-verdict", "d500-dflash-verdict"}
RECIPE_RUNS = {
    "base-250": ("runs", "250", "4", "random"),
    "ep10-250": ("runs", "250", "10", "random"),
    "L27-250": ("runs", "250", "10", "target layer 27"),
    "L27-125": ("runs", "125", "10", "target layer 27"),
    "L27-500": ("runs", "500", "10", "target layer 27"),
    "c125-lr1e-2": ("c125", "lr 1e-2"),
    "c125-ttt5": ("c125", "lr 1e-2, ttt_steps 5 (speculative_tokens 3)"),
    "c125-head": ("c125", "train_lm_head"),
    "c125-vocab8k": ("c125", "train_lm_head, draft vocabulary 8,192"),
    "c125-lr1e-3": ("c125", "train_lm_head, lr 1e-3"),
    "c125-len64": ("c125", "regenerate.max_tokens 64 (every conversation regenerated)"),
    "c125-emb": ("c125", "train_embeddings"),
}


def _recipe_data(r: Reports, path: str, known: dict) -> dict:
    data = r.load(path)
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise FigureError(
            f"{path}: runs {unknown} have no line in devtools/docs_figures.py's table of runs"
        )
    return data


def _recipe_rows(r: Reports, which: str) -> list[tuple[str, tuple, dict]]:
    data = _recipe_data(r, RECIPE_BY_ID, RECIPE_RUNS)
    return [
        (name, RECIPE_RUNS[name][1:], data[name])
        for name in RECIPE_RUNS
        if RECIPE_RUNS[name][0] == which and name in data
    ]


def measured(tau_sim) -> str:
    """A tau_sim, or a dash where vLLM alone measured (P-EAGLE, DFlash: no built-in simulation)."""
    return "—" if tau_sim is None else fmt(tau_sim, ".4f")


def recipe_heldout(r: Reports) -> str:
    data = _recipe_data(r, RECIPE, RECIPE_HELDOUT)
    rows = [
        [
            name,
            samples,
            change,
            fmt(data[name]["acceptance_length"], ".4f"),
            measured(data[name]["tau_sim"]),
            fmt(data[name]["dev_acceptance_length"], ".4f"),
            measured(data[name]["dev_tau_sim"]),
            " / ".join(
                fmt(data[name]["eval_twins_in_train"][k], "d") for k in ("exact", "template")
            ),
            (
                "(retired: drafters.md)"
                if name in RECIPE_SPEEDUP_RETIRED
                else fmt(data[name]["speedup"], ".4f")
                if "speedup" in data[name]
                else "(not run)"
            ),
        ]
        for name, (samples, change) in RECIPE_HELDOUT.items()
        if name in data
    ]
    header = ["Experiment", "samples", "change", "test acceptance_length", "test tau_sim"]
    header += ["dev acceptance_length", "dev tau_sim", "eval twins in train (exact / template)"]
    header += ["speedup"]
    return "\n".join(
        [
            table(header, rows),
            "",
            source(
                f"`{RECIPE}` (`/<experiment>/{{acceptance_length,tau_sim,dev_acceptance_length,"
                "dev_tau_sim,eval_twins_in_train,speedup}`)"
            ),
        ]
    )


def recipe_runs(r: Reports) -> str:
    rows = [
        [
            name,
            samples,
            epochs,
            layer,
            fmt(m["acceptance_length"], ".4f"),
            fmt(m["tau_sim"], ".4f"),
            fmt(m["speedup"], ".4f"),
        ]
        for name, (samples, epochs, layer), m in _recipe_rows(r, "runs")
    ]
    return "\n".join(
        [
            table(
                [
                    "Experiment",
                    "samples",
                    "train.epochs",
                    "draft layer from",
                    "acceptance_length",
                    "tau_sim",
                    "speedup",
                ],
                rows,
            ),
            "",
            source(f"`{RECIPE_BY_ID}` (`/<experiment>/{{acceptance_length,tau_sim,speedup}}`)"),
        ]
    )


def recipe_candidates(r: Reports) -> str:
    rows = [
        [name, change, fmt(m["acceptance_length"], ".4f"), fmt(m["tau_sim"], ".4f")]
        for name, (change,), m in _recipe_rows(r, "c125")
    ]
    return "\n".join(
        [
            table(["Experiment", "change from L27-125", "acceptance_length", "tau_sim"], rows),
            "",
            source(f"`{RECIPE_BY_ID}` (`/<experiment>/{{acceptance_length,tau_sim}}`)"),
        ]
    )


def _recipe_forecast(r: Reports, f: str) -> str:
    """The forecast's tables: each target by each fitted curve, the preferred (lower AICc) first,
    and each curve's parameters with their draws' 10-90% and AICc."""
    data = r.load(f)
    preferred = data["preferred"]
    curves = [preferred] + [c for c, v in data["fits"].items() if c != preferred and v is not None]
    rows = []
    for target, by_fit in data["forecasts"].items():
        for curve in curves:
            one = by_fit.get(curve)
            if one is None:
                continue
            if data.get("why_not"):  # too few points: no number from any curve
                rows.append([target, curve, "no number", "-", data["why_not"]])
                continue
            interval = one["interval_10_90"]
            span = (
                "no residual: no interval"
                if interval is None
                else " - ".join("never" if v is None else fmt(v, ",d") for v in interval)
            )
            if one.get("samples") is None:  # the central fit does not get there: say how sure
                words = one.get("why_not") or one.get("trust")
                rows.append([target, curve, "not by the central fit", span, words])
                continue
            rows.append([target, curve, fmt(one["samples"], ",d"), span, one["trust"]])
    fits = []
    for curve in curves:
        fit = data["fits"][curve]
        params = ", ".join(f"{k} = {fmt(v, '.3f')}" for k, v in fit["params"].items())
        draws = fit.get("draws_10_90")
        spread = (
            "no residual: no draws"
            if draws is None
            else ", ".join(
                f"{k} {fmt(lo, '.3f')} - {fmt(hi, '.3f')}" for k, (lo, hi) in draws.items()
            )
        )
        aicc = "infinite" if fit.get("aicc") is None else fmt(fit["aicc"], ".2f")
        fits.append(
            [
                curve,
                fit["form"],
                params,
                spread,
                fmt(fit["rmse"], ".4f"),
                fmt(fit["residual_dof"], "d"),
                aicc,
            ]
        )
    undefined = data["selection"].get("undefined")
    return "\n".join(
        [
            table(
                ["target acceptance length", "curve", "samples needed", "10-90%", "trust"],
                rows,
            ),
            "",
            table(
                ["curve", "form", "fit", "draws, 10-90%", "rmse", "residual dof", "AICc"],
                fits,
            ),
            "",
            f"Preferred: {preferred}, "
            + (
                f"the lower AICc over {fmt(len(data['points']), 'd')} points"
                if data["fits"][preferred].get("aicc") is not None
                else f"the fewer parameters: no curve has a finite AICc over "
                f"{fmt(len(data['points']), 'd')} points"
            )
            + (f"; {undefined}" if undefined else "")
            + ". "
            + source(
                f"`{f}` (`/forecasts/<target>/<curve>/{{samples,interval_10_90,trust,why_not}}`, "
                "`/fits/<curve>/{params,draws_10_90,rmse,residual_dof,aicc}`, `/selection`, `/points`)"
            ),
        ]
    )


# How a rerun was made, by its label without the number (devtools/benchmark_reruns.py's LABEL=...).
RERUN_KINDS = {
    "quiet": "quiet, nothing else running",
    "busy": "beside a busy process",
    "seven_servers": "with seven servers up",
}


def benchmark_reruns(r: Reports) -> str:
    """How many reruns of each kind reruns.json holds, their labels, and its contradictions."""
    f = "reports/benchmark_design/reruns.json"
    data = r.load(f)
    kinds: dict[str, list[str]] = {}
    for label in data["runs"]:
        kinds.setdefault(label.rstrip("0123456789"), []).append(label)
    parts = [
        f"{fmt(len(labels), 'd')} {RERUN_KINDS.get(kind, kind)} ("
        + ", ".join(f"`{label}`" for label in labels)
        + ")"
        for kind, labels in kinds.items()
    ]
    contradictions = data["contradictions"]
    said = (
        "no yes/no contradiction between any two"
        if not contradictions
        else f"{fmt(len(contradictions), 'd')} yes/no contradictions"
    )
    return (
        f"{fmt(len(data['runs']), 'd')} runs: "
        + "; ".join(parts)
        + f"; {said}. "
        + source(f"`{f}` (`/runs`, `/contradictions`)")
    )


def benchmark_reruns_paired(r: Reports) -> str:
    """The reruns under the paired rule side by side: each run's rounds and why they stopped, each
    load's decision, k and interval, its k per batch size; how many share the most common
    schedule, each load's k against the best k pooled over the runs, and contradictions."""
    f = "reports/benchmark_design/reruns_paired.json"
    data = r.load(f)
    loads = sorted({c for run in data["runs"].values() for c in run["loads"]}, key=int)

    def cell(d: dict) -> str:
        k = f" k={fmt(d['k'], 'd')}" if d["k"] is not None else ""
        iv = f" [{fmt(d['low'], '.2f')}-{fmt(d['high'], '.2f')}]" if d["low"] is not None else ""
        return f"{d['decision']}{k}, {fmt(d['speedup'], '.2f')}x{iv}"

    rows = []
    for label, run in data["runs"].items():
        stop = (run.get("stops") or [{}])[-1].get("stop") or "-"
        rows.append(
            [
                f"`{label}`",
                f"{fmt(run['rounds'], 'd')} ({stop})",
                *(cell(run["loads"][c]) for c in loads),
                f"`{json.dumps(run['k_per_batch_size'])}`",
            ]
        )
    sched = data["schedules"]
    within = [
        v["within_k_margin_of_pooled_best"]
        for p in data.get("pooled", {}).values()
        for v in p["runs"].values()
        if v["within_k_margin_of_pooled_best"] is not None
    ]
    said = (
        "no yes/no contradiction between any two"
        if not data["contradictions"]
        else f"{fmt(len(data['contradictions']), 'd')} yes/no contradictions"
    )
    return "\n".join(
        [
            table(
                ["run", "rounds (stop)", *(f"{c} in flight" for c in loads), "k per batch size"],
                rows,
            ),
            "",
            f"{fmt(sched['runs_with_most_common'], 'd')} of {fmt(len(data['runs']), 'd')} runs "
            f"deploy the same schedule ({fmt(sched['distinct'], 'd')} distinct); a deployed k "
            f"within the k margin of the best k pooled over the runs in "
            f"{fmt(sum(within), 'd')} of {fmt(len(within), 'd')} load-runs decided yes; {said}. "
            + source(f"`{f}` (`/runs`, `/schedules`, `/pooled`, `/contradictions`)"),
        ]
    )


def recipe_forecast(r: Reports) -> str:
    return _recipe_forecast(r, "reports/forecast.json")


def recipe_forecast_by_id(r: Reports) -> str:
    return _recipe_forecast(r, "reports/recipe_smollm2/by_id/forecast.json")


def make_exps_example(r: Reports) -> str:
    """The first rows of `make exps` on the committed default run, padded as DVC prints them."""
    acc, train, bench = (
        r.load("reports/acceptance.json"),
        r.load("reports/train.json"),
        r.load("reports/benchmark.json"),
    )
    params = r.params()
    header = [
        "Experiment",
        "acceptance_length",
        "tau_sim",
        "val_loss",
        "speedup",
        "samples",
        "train.lr",
    ]
    values = [
        fmt(acc["acceptance_length"], "s"),
        fmt(acc["tau_sim"], "s"),
        fmt(train["val_loss"], "s"),
        fmt(bench["speedup"], "s"),
        fmt(params["samples"], "s"),
        fmt(params["train"]["lr"], "s"),
    ]
    rows = [
        ["workspace", *values],
        ["main", *values],
        ["├── 5b92787 [lr-0.01]", "…", "…", "…", "…", values[4], "0.01"],
        ["└── 7883c21 [more-data]", "…", "…", "…", "…", "1000", values[5]],
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join(
        [
            "```",
            line(header),
            "|" + "|".join("-" * (w + 2) for w in widths) + "|",
            *(line(row) for row in rows),
            "```",
            "",
            source(
                "`reports/acceptance.json` (`/acceptance_length`, `/tau_sim`), `reports/train.json` "
                "(`/val_loss`), `reports/benchmark.json` (`/speedup`), `params.yaml` (`samples`, "
                "`train.lr`); the two experiment rows are made up"
            ),
        ]
    )


def free_label(method: str) -> str:
    """A benchmark.free method as the tables name it (its title, draftline/draft/free.py)."""
    from draftline.draft.free import FREE_METHODS

    return FREE_METHODS[method].title if method in FREE_METHODS else method


def drafter_label(method: str) -> str:
    """A drafter as the tables name it (its label, draftline/draft/methods/); an unknown one as is."""
    return drafter(method).label if method in names() else method


LONG_ROWS = "reports/recipe_smollm2/long_rows.json"


def _bucket_cell(b: dict) -> str:
    point = fmt(b["acceptance_length"], ".2f")
    if b["low"] is None:
        return f"{point} (one prompt: no interval)"
    return f"{point} [{fmt(b['low'], '.2f')}-{fmt(b['high'], '.2f')}] ({fmt(b['prompts'], 'd')} prompts)"


def _minutes(seconds) -> str:
    return "(not timed)" if seconds is None else f"{fmt(seconds / 60, '.0f')} min"


def long_rows(r: Reports) -> str:
    """The recipe's draft beside one trained with longer rows (devtools/long_rows.py)."""
    drafts = r.load(LONG_ROWS)["drafts"]
    cols = list(drafts.values())
    rows = [
        ["longest row trained on (tokens)"] + [fmt(d["longest_trained_row"], ",d") for d in cols]
    ]
    for i, b in enumerate(cols[0]["by_context"]):
        rows.append(
            [f"acceptance at context {b['bucket']}"]
            + [_bucket_cell(d["by_context"][i]) for d in cols]
        )
    rows.append(["longest bucket / shortest"] + [fmt(d["collapse_ratio"], ".0%") for d in cols])
    rows.append(
        ["held-out chats (test / dev)"]
        + [
            f"{fmt(d['chat_acceptance_length'], '.2f')} / {fmt(d['dev_acceptance_length'], '.2f')}"
            for d in cols
        ]
    )
    rows.append(
        [f"verdict at {fmt(cols[0]['verdict']['serve_concurrency'], 'd')} in flight"]
        + [
            f"{d['verdict']['decision']}: {fmt(d['verdict']['speedup'], '.2f')}x "
            f"[{fmt(d['verdict']['low'], '.2f')}-{fmt(d['verdict']['high'], '.2f')}] at k={fmt(d['verdict']['k'], 'd')}"
            for d in cols
        ]
    )
    rows.append(
        ["training loop (steps x median step)"]
        + [
            f"{_minutes(d['train_seconds'])} ({fmt(d['train_steps'], ',d')} steps, pack {fmt(d['pack_len'], ',d')})"
            for d in cols
        ]
    )
    scratch = r.load(LONG_ROWS)["from_scratch"]
    rows.append(
        [f"from scratch, {fmt(scratch['epochs'], 'd')} epochs at its pack (steps x median step)"]
        + ["—", f"{_minutes(scratch['seconds'])} ({fmt(scratch['steps'], ',d')} steps)"]
    )
    rows.append(["whole run, wall"] + [_minutes(d["run_seconds"]) for d in cols])
    rows.append(["context measurement, wall"] + [_minutes(d["context_seconds"]) for d in cols])
    roles = {"recipe": "the recipe's draft", "long_rows": "with long rows"}
    header = [""] + [f"{roles[role]} (`{d['experiment']}`)" for role, d in drafts.items()]
    return "\n".join([
        table(header, rows),
        "",
        source(f"`{LONG_ROWS}` (`python -m devtools.long_rows`), from each draft's context_, "
               "verdict_ and experiments.json records and its train report"),
    ])  # fmt: skip


def drafters(name: str) -> Callable[[Reports], str]:
    """The drafters compared on one data set (reports/drafters/<name>.json, devtools/drafters.py):
    train tau_sim, held-out acceptance, and the serving verdict at the serve load."""

    def build(r: Reports) -> str:
        path = f"reports/drafters/{name}.json"
        data = r.load(path)
        if "served" in data["sources"]:
            return served_drafters(path, data)
        rows = []
        for method, f in data["methods"].items():
            rows.append(
                [
                    drafter_label(method),
                    fmt(f["val_tau_sim"], ".2f"),
                    f"{fmt(f['acceptance_length'], '.2f')} ({f['acceptance_engine']}, "
                    f"k={fmt(f['evaluate_k'], 'd')})",
                    f"{fmt(f['speedup'], '.2f')}x at k={fmt(f['k'], 'd')}",
                    f"{fmt(f['speedup_c1'], '.2f')}x / {fmt(f['speedup_c16'], '.2f')}x",
                    f"{fmt(f['speculative_tokens_per_s'], '.0f')} vs "
                    f"{fmt(f['baseline_tokens_per_s'], '.0f')}",
                    fmt(f["pays_off"], "yesno"),
                    ", ".join(f"`{k}` {v}" for k, v in f["method_params"].items()) or "defaults",
                ]
            )
        conc = data["methods"][next(iter(data["methods"]))]["serve_concurrency"]
        sources = data["sources"]
        baseline = (
            "the committed run"
            if sources["baseline"] == "HEAD"
            else f"experiment `{sources['baseline']}`"
        )
        return "\n".join(
            [
                table(
                    [
                        "train.method",
                        "val tau_sim",
                        "acceptance (held out)",
                        f"speedup at {fmt(conc, 'd')} in flight",
                        "alone / at 16",
                        "tokens/s (draft vs plain)",
                        "pays off",
                        "method's params",
                    ],
                    rows,
                ),
                "",
                source(
                    f"`{path}` (`python -m devtools.drafters`, from {baseline} and the "
                    "`dvc exp run -S train.method=...` experiments "
                    + ", ".join(f"`{name}`" for name in sources["experiments"])
                    + ")"
                ),
            ]
        )

    return build


def interval(f: dict, suffix: str = "") -> str:
    """ "<speedup>x [<low>-<high>]" of a drafters row, the bare point where there is no interval."""
    point, low, high = (f[f"{key}{suffix}"] for key in ("speedup", "low", "high"))
    if low is None:
        return f"{fmt(point, '.2f')}x (no interval)"
    return f"{fmt(point, '.2f')}x [{fmt(low, '.2f')}-{fmt(high, '.2f')}]"


def against(data: dict) -> str:
    """Which baseline passes a served drafters run paired its drafts with: one set, or each group
    of servers its own (benchmark.max_servers, or what the host's memory held)."""
    groups = data.get("groups") or []
    if len(groups) < 2:
        return "the same baseline passes"
    sizes = "+".join(str(len(group)) for group in groups)
    return (
        f"the same baseline server, in {len(groups)} groups of servers ({sizes}) each with its "
        "own rounds and baseline passes"
    )


def served_drafters(path: str, data: dict) -> str:
    """The drafters served in one run against the same baseline passes (drafters --served)."""
    methods = data["methods"]
    first = next(iter(methods.values()))
    conc = first["serve_concurrency"]
    loads = sorted(int(key.rsplit("_c", 1)[1]) for key in first if key.startswith("speedup_c"))
    rows = [
        [
            f"{free_label(method)} (no trained draft)" if f.get("free") else drafter_label(method),
            fmt(f["val_tau_sim"], ".2f") if f["val_tau_sim"] is not None else "-",
            fmt(f["served_acceptance_length"], ".2f"),
            f"{f['decision']}: {interval(f)} at k={fmt(f['k'], 'd')}",
            " / ".join(interval(f, f"_c{c}") for c in loads),
        ]
        for method, f in methods.items()
    ]
    return "\n".join(
        [
            table(
                [
                    "train.method",
                    "val tau_sim",
                    f"acceptance (served, {fmt(conc, 'd')} in flight)",
                    f"decision at {fmt(conc, 'd')} in flight",
                    " / ".join(f"{c} in flight" for c in loads),
                ],
                rows,
            ),
            "",
            source(
                f"`{path}` (`python -m devtools.drafters --served`): one run, every draft against "
                f"{against(data)} ({fmt(data['rounds'], 'd')} rounds, {data['design']}), "
                f"intervals at {fmt(data['confidence'], '.0%')} shared by the ks compared"
            ),
        ]
    )


def baseline_by_group(name: str) -> Callable[[Reports], str]:
    """A served drafters run whose servers ran in groups (reports/drafters/<name>.json): the
    baseline's own passes in each group, per load (geometric mean tokens/s), each group against
    the first (ratio, and Welch's t test on the log tokens/s): how far the baseline drifted between
    groups, which a comparison of rows from different groups carries."""

    def build(r: Reports) -> str:
        from scipy import stats

        data = r.load(f"reports/drafters/{name}.json")
        sweep_path = f"reports/recipe_smollm2/verdict_{data['sources']['served']}.json"
        sweep = r.load(sweep_path)
        design = sweep["verdict"]["design"]
        groups = design["groups"]
        rows = []
        for level, results in sweep["levels"].items():
            c = int(level.lstrip("c"))
            passes = results["baseline"]["runs_tokens_per_s"]
            # the baseline's passes in the order run: one per (round, load) entry, in its group
            entries = [servers for _, load, servers in design["rounds_order"] if load == c]
            if len(entries) != len(passes):
                raise FigureError(
                    f"{sweep_path}: {len(passes)} baseline passes at {level}, "
                    f"{len(entries)} rounds run there"
                )
            by_group = [[] for _ in groups]
            for servers, tokens_per_s in zip(entries, passes):
                group = next(i for i, g in enumerate(groups) if set(g) & set(servers))
                by_group[group].append(math.log(tokens_per_s))
            means = [sum(g) / len(g) for g in by_group]
            cells = [fmt(math.exp(m), ".1f") for m in means]
            for g in by_group[1:]:
                ratio = math.exp(sum(g) / len(g) - means[0])
                p = stats.ttest_ind(g, by_group[0], equal_var=False).pvalue
                cells.append(f"{fmt(ratio - 1, '+.1%')} (p = {fmt(float(p), '.2f')})")
            rows.append([fmt(c, "d")] + cells)
        header = ["requests in flight"]
        header += [f"baseline tokens/s, group {i + 1}" for i in range(len(groups))]
        header += [f"group {i + 1} vs group 1" for i in range(1, len(groups))]
        return "\n".join(
            [
                table(header, rows),
                "",
                source(
                    f"`{sweep_path}` (`/levels/<load>/baseline/runs_tokens_per_s`, in the order of "
                    "`/verdict/design/rounds_order`, grouped by `/verdict/design/groups`; geometric "
                    "means, Welch's t test on the log tokens/s)"
                ),
            ]
        )

    return build


FIGURES: dict[str, Callable[[Reports], str]] = {
    "drafters_default": drafters("default"),
    "drafters_smollm2": drafters("smollm2"),
    "drafters_smollm2_baseline_by_group": baseline_by_group("smollm2"),
    "long_rows_smollm2": long_rows,
    "overhead_parts": overhead_parts,
    "regen_client_levels": regen_client_levels,
    "regen_throughput_targets": regen_throughput_targets,
    "cpu_load_stages": cpu_load_stages,
    "cpu_load_train_threads": cpu_load_train_threads,
    "train_loader_steps": train_loader_steps,
    "recipe_heldout": recipe_heldout,
    "recipe_runs": recipe_runs,
    "recipe_candidates": recipe_candidates,
    "recipe_forecast": recipe_forecast,
    "benchmark_reruns": benchmark_reruns,
    "benchmark_reruns_paired": benchmark_reruns_paired,
    "recipe_forecast_by_id": recipe_forecast_by_id,
    "make_exps_example": make_exps_example,
    "dvc_cache_costs": dvc_cache_costs,
    "scale_stages": scale_stages,
    "seeds_scale": seeds_scale,
}


# ---- figures outside the docs -------------------------------------------------------------------
# params.yaml, the scripts and the code's comments and docstrings may hold generated figures too
# (the same `<!-- fig ... -->` markers, regenerated with the docs), and no other figure: a measured
# number there is a copy that no rerun updates. Only the prose is read (a Python file's comments
# and docstrings; the comment part of a params.yaml or shell line) and in it only what reads as a
# measurement: a decimal (1.52, 3.3x), a count "N of M", an approximation (~35 s), a ratio (4x).
CODE_GLOBS = (
    "params.yaml",
    "scripts/*.sh",
    "scripts/*.py",
    "draftline/**/*.py",
    "stages/*.py",
    "devtools/*.py",
)
# this module's docstring shows the marker syntax with an example figure
NOT_SCANNED = ("devtools/docs_figures.py",)

FIGURE = re.compile(
    r"(?<![\w.~/#-])(?:"
    r"(?P<count>\d(?:[\d,]*\d)?\s+of\s+(?:the\s+)?\d(?:[\d,]*\d)?)(?!\w|[.,]\d)"  # 0 of 969
    r"|~\s?(?P<approx>\d(?:[\d,]*\d)?(?:\.\d+)?)x?(?!\w|[.,]\d)"  # ~35 (s), ~3x
    r"|(?P<decimal>\d+\.\d+)x?(?!\w|\.\d)"  # 1.52, 3.3x (not a version: 0.9.0)
    r"|(?P<ratio>\d+)x(?!\w)"  # 4x
    r")"
)
# prose that is code or a name, not a measurement: a `code span`, an option's values
# (--targets 2.5 3.0), an assignment (PYTHON_VERSION=3.11, k=3), a version (Python 3.12, vLLM 0.9)
NOT_FIGURES = re.compile(
    r"`[^`\n]*`"
    r"|--[\w-]+(?:[ =][\d.,]+(?![\w.]))+"
    r"|\w+=\S+"
    r"|\b(?:[Pp]ython|vLLM|vllm|Llama|CUDA|torch|transformers|speculators|SGLang|sglang|v)"
    r"\s?\d+(?:\.\d+)+"
)
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.]|\.\d)")


def number_key(value: int | float) -> str:
    """A number as a setting and a figure are compared: 0.30 is 0.3, 1.0 is not 1."""
    return repr(float(value)) if isinstance(value, float) else str(value)


def parse_number(text: str) -> int | float:
    text = text.replace(",", "")
    return float(text) if "." in text else int(text)


def comment_part(line: str) -> str | None:
    """The comment of a shell or YAML line: from a `#` at its start or after a space, outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[i:]
    return None


def prose(path: Path, text: str) -> tuple[list[tuple[int, str]], set[str]]:
    """([(line number, prose)], the numbers the file's code or config sets: settings, not figures)."""
    if path.suffix == ".py":
        return _python_prose(text)
    lines, numbers = [], set()
    for n, line in enumerate(text.splitlines(), 1):
        if n == 1 and line.startswith("#!"):
            continue
        comment = comment_part(line)
        code = line[: len(line) - len(comment or "")]
        numbers.update(number_key(parse_number(x)) for x in NUMBER.findall(code))
        if comment:
            lines.append((n, comment))
    return lines, numbers


def _python_prose(text: str) -> tuple[list[tuple[int, str]], set[str]]:
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = body[0] if body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    docstrings.add((first.value.lineno, first.value.col_offset))
    lines, numbers = [], set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            lines.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and tok.start in docstrings:
            lines += [(tok.start[0] + i, s) for i, s in enumerate(tok.string.splitlines())]
        elif tok.type == tokenize.NUMBER and not tok.string.lower().endswith("j"):
            numbers.add(number_key(ast.literal_eval(tok.string)))  # 1_000, 0x10, 1e-4
    return lines, numbers


def loose_figures(text: str, path: Path, where: str = "") -> list[str]:
    """Each figure in the file's prose that is not a generated one (module comment above)."""
    lines, settings = prose(path, text)
    found = []
    for n, line in lines:
        rest = NOT_FIGURES.sub(" ", VALUE.sub(" ", line))
        for m in FIGURE.finditer(rest):
            number = m["approx"] or m["decimal"] or m["ratio"]
            if number and number_key(parse_number(number)) in settings:
                continue  # a value the code or config itself sets (a count is never one)
            found.append(f"{where}:{n}: {m[0]!r}, a figure that no JSON gives")
    return found


def code_paths(root: Path) -> list[Path]:
    paths = {p for pattern in CODE_GLOBS for p in Path(root).glob(pattern) if p.is_file()}
    return sorted(p for p in paths if str(p.relative_to(root)) not in NOT_SCANNED)


def unsourced(root: Path = ROOT) -> list[str]:
    """Every figure of params.yaml, the scripts and the code's prose that is not a generated one."""
    return [
        line
        for path in code_paths(root)
        for line in loose_figures(path.read_text(), path, str(path.relative_to(root)))
    ]


# ---- rewriting the docs -------------------------------------------------------------------------


def render(text: str, reports: Reports, where: str = "") -> tuple[str, list[str]]:
    """(the text with every figure regenerated, the figures whose text changed)."""
    changed: list[str] = []

    def block(m: re.Match) -> str:
        name = m["name"]
        if name not in FIGURES:
            raise FigureError(f"{where}: unknown figure {name!r} (known: {sorted(FIGURES)})")
        try:
            body = "\n" + FIGURES[name](reports) + "\n"
        except FigureError as err:
            raise FigureError(f"{where}: figure {name}: {err}") from None
        if body != m["body"]:
            changed.append(f"{where}: figure {name}")
        return f"<!-- figures:{name}:begin -->{body}<!-- figures:{name}:end -->"

    def value(m: re.Match) -> str:
        try:
            body = fmt(reports.get(m["file"], m["pointer"]), m["fmt"])
        except FigureError as err:
            raise FigureError(f"{where}: {err}") from None
        if body != m["body"]:
            changed.append(
                f"{where}: {m['file']}#{m['pointer']} is {body}, the doc says {m['body']!r}"
            )
        return m[0][: m.start("body") - m.start()] + body + "<!-- /fig -->"

    out = VALUE.sub(value, BLOCK.sub(block, text))
    rest = VALUE.sub("", BLOCK.sub("", out))
    leftover = STRAY.search(rest)
    if leftover:
        snippet = rest[leftover.start() : leftover.start() + 60].split("\n")[0]
        raise FigureError(f"{where}: a figure marker without its pair: {snippet!r}")
    return out, changed


def doc_paths(root: Path) -> list[Path]:
    return sorted(p for pattern in DOC_GLOBS for p in Path(root).glob(pattern))


def open_reports(root: Path, write: bool, source: str | None = None, rev: str = "HEAD") -> Reports:
    """The reports a run reads: `source` (SOURCES) or by default, the committed ones (in `rev`) for a
    check, the working tree's for a write (module docstring)."""
    source = source or ("worktree" if write else "committed")
    if source not in SOURCES:
        raise FigureError(f"--reports {source}: one of {', '.join(SOURCES)}")
    return Reports(root, rev if source == "committed" else None)


def run(root: Path = ROOT, write: bool = True, reports: Reports | str | None = None) -> list[str]:
    """Regenerate the figures of every doc, params.yaml, script and module under root; return those
    that changed (or would). reports: a Reports, or a source (SOURCES; by default the committed
    reports when write is False, the working tree's when it is True)."""
    if not isinstance(reports, Reports):
        reports = open_reports(root, write, reports)
    changed: list[str] = []
    for path in doc_paths(root) + code_paths(root):
        text = path.read_text()
        new, diffs = render(text, reports, str(path.relative_to(root)))
        changed += diffs
        if write and new != text:
            path.write_text(new)
    return changed


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if a figure differs"
    )
    ap.add_argument("--root", default=str(ROOT))
    ap.add_argument(
        "--reports",
        choices=SOURCES,
        help="read the reports committed in --rev (the default with --check) or the working "
        "tree's (the default without: after a run of one's own)",
    )
    ap.add_argument("--rev", default="HEAD", help="the revision of --reports committed")
    args = ap.parse_args(argv)
    root = Path(args.root)
    try:
        reports = open_reports(root, not args.check, args.reports, args.rev)
    except FigureError as err:
        raise SystemExit(f"error: {err}") from None
    try:
        changed = run(root, write=not args.check, reports=reports)
    except FigureError as err:
        raise SystemExit(f"error: {err} (reading {reports.source})") from None
    loose = unsourced(root)
    for line in changed + loose:
        print(line)
    if loose:  # no regenerating fixes these
        raise SystemExit(
            f"{len(loose)} figure(s) in params.yaml, scripts or comments and docstrings that no "
            "JSON gives: generate each (<!-- fig FILE#POINTER FORMAT -->...<!-- /fig -->) or say "
            "it without the number"
        )
    if args.check and changed:
        fix = "run `make docs-figures`"
        if reports.rev is not None:
            fix += (
                " (it reads the working tree's reports) and commit the docs with the reports they "
                "were generated from"
            )
        raise SystemExit(f"{len(changed)} figure(s) differ from {reports.source}: {fix}")
    if not args.check:
        print(f"docs figures: {len(changed)} rewritten from {reports.source}")


if __name__ == "__main__":
    main(sys.argv[1:])
