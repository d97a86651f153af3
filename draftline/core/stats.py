"""Student's t quantiles, shared by the benchmark's speedup intervals
(draftline/benchmark/intervals.py) and evaluate's acceptance intervals over prompts
(draftline/evaluate/context.py)."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=4096)  # the benchmark's looks ask the same few quantiles many times
def t_quantile(p: float, dof: int) -> float:
    """The p quantile of Student's t at dof degrees of freedom (scipy)."""
    from scipy.stats import t

    return float(t.ppf(p, dof))
