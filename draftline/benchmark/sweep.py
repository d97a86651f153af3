"""The benchmark's measurements, typed: a `Level` per load (requests in flight) and the `Sweep` of
them, as every engine gives them (draftline/benchmark/server.py for the served engines,
draftline/benchmark/hf.py for the built-in one), the lossless gate judges them
(draftline/benchmark/lossless.py) and the verdict decides on them (draftline/benchmark/verdict.py).
They become JSON at one edge (`Sweep.to_json`, the detail report's `levels`) and come back from
it (`levels_from`, for `draftline verdict` on a recorded sweep).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftline.benchmark.lossless import tally


@dataclass
class Level:
    """One load's measurements: the baseline server's summary; each k's summary with its
    acceptance and paired ratios; the lossless verdicts of each k's outputs; each compared draft's
    summaries by k (benchmark.compare); each free method's summary at its k (benchmark.free: its
    `k`, acceptance and paired ratios against the same baseline passes)."""

    baseline: dict
    speculative: dict[int, dict]
    verdicts: dict[int, list[str]] = field(default_factory=dict)
    compare: dict[str, dict[int, dict]] = field(default_factory=dict)
    free: dict[str, dict] = field(default_factory=dict)

    def to_json(self, decided: dict) -> dict:
        """The level as the detail report keeps it: the baseline, then each k with its speedup,
        interval (`decided`: the decision at this load) and the tally of its outputs' verdicts,
        and the drafts compared."""
        out = {"baseline": self.baseline}
        for k, spec in self.speculative.items():
            iv = decided["by_k"][k]
            out[f"k{k}"] = {
                "speedup": iv["speedup"],
                "speedup_low": iv["low"],
                "speedup_high": iv["high"],
                **spec,
                "output_verdicts": tally(self.verdicts[k]),
            }
        if self.compare:
            out["compare"] = {
                name: {f"k{k}": spec for k, spec in by_k.items()}
                for name, by_k in self.compare.items()
            }
        if self.free:
            out["free"] = self.free
        return out


@dataclass
class Sweep:
    """A benchmark's measurements: a Level per load, the acceptance length per k over every load
    and the design that ran (the layout of its passes), for a served engine each server's command and the warnings."""

    levels: dict[int, Level]
    acceptance_by_k: dict[int, float | None]
    design: dict | None = None
    serve_commands: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def to_json(self, decided: dict[int, dict]) -> dict:
        """The detail report's measurements: the acceptance per k and each level by load
        ("c<load>"), with the decision at each load (`decided`) beside its ks."""
        return {
            "acceptance_by_k": {str(k): a for k, a in sorted(self.acceptance_by_k.items())},
            "levels": {f"c{c}": self.levels[c].to_json(decided[c]) for c in sorted(self.levels)},
        }


def levels_from(detail: dict) -> dict[int, Level]:
    """The levels of a detail report (Sweep.to_json's `levels`), without the lossless verdicts
    (the report keeps their tally only)."""
    levels = {}
    for name, level in detail["levels"].items():
        levels[int(name[1:])] = Level(
            baseline=level["baseline"],
            speculative={int(key[1:]): v for key, v in level.items() if key.startswith("k")},
            compare={
                draft: {int(key[1:]): v for key, v in by_k.items()}
                for draft, by_k in level.get("compare", {}).items()
            },
            free=level.get("free", {}),
        )
    return levels
