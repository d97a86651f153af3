"""The timed passes of a server sweep and how a speculative pass is paired with the baseline.

A pass is one server at one load for at least benchmark.min_pass_s; its tokens/s is the output
tokens of its successful requests over its wall time. Pairing (draftline/benchmark/server.py
names the designs):
- side by side: each speculative pass with the baseline pass at the same load nearest it in time
  (the same round, a few passes away);
- sequential: each speculative pass with the baseline interpolated to its time, in log tokens/s,
  between the baseline's mean before the speculative servers and after them; the log of the
  after/before ratio is the drift that widens the interval (draftline/benchmark/intervals.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Pass:
    server: str  # baseline, k<k>, <compare name>:k<k>
    c: int
    round: int
    start: float  # wall-clock seconds
    end: float
    results: list
    wall_s: float
    idle_cpu: dict  # {other server: CPU cores' worth of time it took during this pass}

    @property
    def tokens_per_s(self) -> float:
        tokens = sum(r.output_tokens for r in self.results if r.ok)
        return tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def middle(self) -> float:
        return (self.start + self.end) / 2


@dataclass
class ServerRun:
    """One server's passes over the sweep (and, for vLLM, its spec-decode counters by load)."""

    name: str
    k: int | None
    draft: str | None
    command: str = ""
    passes: list[Pass] = field(default_factory=list)
    counters: dict = field(default_factory=dict)

    def at(self, c: int) -> list[Pass]:
        return [p for p in self.passes if p.c == c]

    def results(self, c: int) -> list:
        return [r for p in self.at(c) for r in p.results]

    def summary(self, c: int) -> dict:
        """All passes at load c as one: tokens/s over their summed wall time, latencies over all
        their requests, every pass's tokens/s beside it."""
        from draftline.benchmark.loadgen import summarize_load

        passes = self.at(c)
        return {
            **summarize_load(self.results(c), sum(p.wall_s for p in passes)),
            "passes": len(passes),
            "runs_tokens_per_s": [round(p.tokens_per_s, 2) for p in passes],
            "runs_seconds": [round(p.wall_s, 3) for p in passes],
        }


def pair_side_by_side(passes: list[Pass]) -> dict[tuple[str, int], dict]:
    """{(server, c): {"paired_speedups": [...]}}: each speculative pass over the baseline pass at
    the same load nearest it in time."""
    out: dict[tuple[str, int], dict] = {}
    for p in passes:
        if p.server == "baseline":
            continue
        bases = [b for b in passes if b.server == "baseline" and b.c == p.c and b.tokens_per_s > 0]
        if not bases:
            continue
        base = min(bases, key=lambda b: abs(b.middle - p.middle))
        entry = out.setdefault((p.server, p.c), {"paired_speedups": []})
        entry["paired_speedups"].append(round(p.tokens_per_s / base.tokens_per_s, 4))
    return out


def pair_sequential(passes: list[Pass]) -> dict[tuple[str, int], dict]:
    """{(server, c): {"paired_speedups": [...], "drift_log": log(after / before)}}: each
    speculative pass over the baseline interpolated to its time between the baseline's passes
    before the speculative servers and after them (the same load)."""
    out: dict[tuple[str, int], dict] = {}
    spec = [p for p in passes if p.server != "baseline"]
    if not spec:
        return out
    first_spec = min(p.start for p in spec)
    for c in sorted({p.c for p in passes}):
        base = [b for b in passes if b.server == "baseline" and b.c == c and b.tokens_per_s > 0]
        before = [b for b in base if b.end <= first_spec]
        after = [b for b in base if b.start > first_spec]
        if not before:
            continue
        t0, y0 = (
            _mean([b.middle for b in before]),
            _mean([math.log(b.tokens_per_s) for b in before]),
        )
        t1, y1 = (
            (_mean([b.middle for b in after]), _mean([math.log(b.tokens_per_s) for b in after]))
            if after
            else (t0, y0)
        )
        for p in (p for p in spec if p.c == c):
            share = (p.middle - t0) / (t1 - t0) if t1 != t0 else 0.0
            base_log = y0 + min(max(share, 0.0), 1.0) * (y1 - y0)
            entry = out.setdefault(
                (p.server, c), {"paired_speedups": [], "drift_log": round(y1 - y0, 6)}
            )
            entry["paired_speedups"].append(round(p.tokens_per_s / math.exp(base_log), 4))
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
