"""The spot-check of kept hidden-state files: before a rerun trusts the files it keeps, the target
loaded for this run recomputes a few of them and the stored values must agree.

A file is kept because the directory's key matches (draftline/hidden_states/resume.py `derivation`)
and the file itself checks out (its header, shape, dtype and token ids). What neither sees: the
values. So with backend hf, before any row is extracted, `resume.verify_sample`
kept rows (chosen by a fixed seed) are captured again, one row per forward, and compared with their
files after the stored dtype's rounding: each value within TOLERANCE_ULPS ulps of the stored dtype
(batch make-ups round fp32 states a little differently; another target differs by far more). A
mismatch stops the stage before any file is written, naming the row, the largest difference and the
user's choice. Not run, and said so in the report: backend vllm (the states come from a server),
format fp8 (per-token scales), nothing kept. A rerun with nothing to extract loads the target
for the check all the same (the stage reran because something it depends on changed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from draftline.hidden_states.capture import capture

# computed in float32, stored values may differ from a recomputation (one row alone, not in the
# batch it was made in) by this many units in the last place of the stored dtype: a rounding flip
TOLERANCE_ULPS = 2
ULP = {torch.float32: 2.0**-23, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
# computed in bfloat16 or float16, another batch make-up moves single values by tens of ulps (a
# row recomputed alone against the batch it was made in: test_resumed_extraction_is_byte_identical_
# to_an_uninterrupted_one): there the row as a whole must agree, ||stored - recomputed|| within
# this share of ||recomputed||; another target misses by far more
TOLERANCE_RELATIVE_L2 = 0.05


class StatesMismatch(RuntimeError):
    pass


@dataclass
class StatesCheck:
    sample: int
    checked: list[int] = field(default_factory=list)
    largest_gap: float = 0.0  # the largest difference seen (row_gap), in `unit`
    tolerance: float | None = None
    unit: str | None = None
    not_run: str | None = None

    def as_dict(self) -> dict:
        return {
            "sample": self.sample,
            "checked": len(self.checked),
            "largest_gap": round(self.largest_gap, 4),
            "tolerance": self.tolerance,
            "unit": self.unit,
            "not_run": self.not_run,
        }


@dataclass(frozen=True)
class Kept:
    """The kept files: their rows (the tokenized dataset), indices, directory and how they were
    captured and stored."""

    rows: object
    indices: list[int]
    out: object
    aux_ids: list[int]
    store_dtype: torch.dtype


def row_gap(stored: torch.Tensor, fresh: torch.Tensor, store_dtype, compute_dtype) -> float:
    """How far a stored row is from its recomputation, in the unit its tolerance is in (see
    TOLERANCE_ULPS, TOLERANCE_RELATIVE_L2)."""
    if compute_dtype == torch.float32:
        # in units of the stored dtype's spacing at each value (values near zero: at a thousandth
        # of the row's largest, where a recomputation's absolute error is of that order)
        scale = fresh.abs().clamp_min(1e-3 * float(fresh.abs().max()) + 1e-30)
        return float(((stored - fresh).abs() / (scale * ULP[store_dtype])).max())
    return float((stored - fresh).norm() / fresh.norm().clamp_min(1e-30))


def check_kept_states(model, kept: Kept, n: int) -> StatesCheck:
    """Recompute up to n of the kept rows and compare with their files (module docstring);
    StatesMismatch at the first row beyond the tolerance."""
    from safetensors.torch import load_file

    from draftline.hidden_states.files import hs_path

    rows, out, aux_ids, store_dtype = kept.rows, kept.out, kept.aux_ids, kept.store_dtype
    result = StatesCheck(n)
    if n == 0:
        result.not_run = "resume.verify_sample is 0"
        return result
    if store_dtype not in ULP:
        result.not_run = f"stored dtype {store_dtype} has per-token scales"
        return result
    chosen = sorted(random.Random(0).sample(kept.indices, min(n, len(kept.indices))))
    if not chosen:
        result.not_run = "no file kept"
        return result
    compute_dtype = next(model.parameters()).dtype
    exact = compute_dtype == torch.float32
    tolerance = result.tolerance = TOLERANCE_ULPS if exact else TOLERANCE_RELATIVE_L2
    unit = f"ulps of {store_dtype}" if exact else f"relative L2 (computed in {compute_dtype})"
    result.unit = unit
    table = rows.with_format(None)
    for i in chosen:
        ids = table[i]["input_ids"]
        (fresh,) = capture(model, [ids], aux_ids)
        fresh = fresh.to(store_dtype).float().cpu()
        stored = load_file(str(hs_path(out, i)))["hidden_states"].float()
        gap = row_gap(stored, fresh, store_dtype, compute_dtype)
        result.largest_gap = max(result.largest_gap, gap)
        if gap > tolerance:
            raise StatesMismatch(
                f"error: the spot-check of kept hidden-state files failed: row {i} "
                f"({hs_path(out, i).name}) differs from the target loaded now by {gap:.3g} "
                f"{unit} (tolerance {tolerance}). "
                "The kept files and the target disagree: its weights or the code changed in a way "
                "their key does not see. Nothing was written. Rerun fresh (move "
                "datasets/hidden_states aside) or keep them as they are (resume.verify_sample: 0)"
            )
        result.checked.append(i)
    return result
