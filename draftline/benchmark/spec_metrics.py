"""The engines' speculative-decoding counters, read from the servers: acceptance as each engine reports it.

- vLLM (vllm/v1/spec_decode/metrics.py, SpecDecodingProm): Prometheus counters
  `vllm:spec_decode_num_drafts`, `vllm:spec_decode_num_draft_tokens`,
  `vllm:spec_decode_num_accepted_tokens`, `vllm:spec_decode_num_accepted_tokens_per_pos`
  (label `position`), exported with a `_total` suffix and labels model_name/engine. Mean
  acceptance length = 1 + accepted / drafts; per-position rate = accepted_per_pos / drafts. The
  scheduler counts a step's accepted tokens before it cuts the output at a stop, so tokens
  accepted past eos / max_tokens count: the evaluate stage's `acceptance_length`.
- SGLang (TokenizerManager, meta_info of each finished request): `completion_tokens`,
  `spec_verify_ct`; acceptance length = completion_tokens / spec_verify_ct (SGLang's own
  `spec_accept_length`): tokens emitted per verification, cut at the stop, with the prefill's
  first token in completion_tokens (the evaluate stage's `tokens_per_step` counts without it);
  newer versions add `spec_accept_histogram` (verify steps by number of accepted drafts), from
  which per-position rates follow. docs/evaluation.md compares the counts.
"""

from __future__ import annotations

import re

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of a Prometheus text exposition: (name, labels, value); comments skipped."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = {
            k: v.replace('\\"', '"').replace("\\\\", "\\")
            for k, v in _LABEL.findall(m.group(2) or "")
        }
        try:
            samples.append((m.group(1), labels, float(m.group(3))))
        except ValueError:
            continue
    return samples


def vllm_spec_counters(metrics_text: str) -> dict | None:
    """Summed spec-decode counters (all engines) from vLLM's /metrics; None when there are none."""
    base = "vllm:spec_decode_num_"
    totals = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0}
    per_pos: dict[int, float] = {}
    found = False
    for name, labels, value in parse_prometheus(metrics_text):
        if not name.startswith(base) or name.endswith("_created"):
            continue
        key = name[len(base) :].removesuffix("_total")
        if key == "accepted_tokens_per_pos":
            pos = int(labels.get("position", 0))
            per_pos[pos] = per_pos.get(pos, 0.0) + value
            found = True
        elif key in totals:
            totals[key] += value
            found = True
    if not found:
        return None
    return {**totals, "accepted_per_pos": per_pos}


def counter_delta(before: dict | None, after: dict) -> dict:
    """The counters gained between two snapshots (before None: all of after)."""
    before = before or {
        "drafts": 0.0,
        "draft_tokens": 0.0,
        "accepted_tokens": 0.0,
        "accepted_per_pos": {},
    }
    return {
        **{key: after[key] - before[key] for key in ("drafts", "draft_tokens", "accepted_tokens")},
        "accepted_per_pos": {
            p: v - before["accepted_per_pos"].get(p, 0.0)
            for p, v in after["accepted_per_pos"].items()
        },
    }


def add_counters(a: dict | None, b: dict | None) -> dict | None:
    """Two counter deltas summed (None counts as nothing)."""
    if a is None or b is None:
        return b if a is None else a
    return {
        **{key: a[key] + b[key] for key in ("drafts", "draft_tokens", "accepted_tokens")},
        "accepted_per_pos": {
            p: a["accepted_per_pos"].get(p, 0.0) + b["accepted_per_pos"].get(p, 0.0)
            for p in {*a["accepted_per_pos"], *b["accepted_per_pos"]}
        },
    }


def vllm_acceptance(before: dict | None, after: dict | None) -> dict | None:
    """Acceptance between two counter snapshots (vLLM's own formulas)."""
    if after is None:
        return None
    before = before or {
        "drafts": 0.0,
        "draft_tokens": 0.0,
        "accepted_tokens": 0.0,
        "accepted_per_pos": {},
    }
    drafts = after["drafts"] - before["drafts"]
    accepted = after["accepted_tokens"] - before["accepted_tokens"]
    draft_tokens = after["draft_tokens"] - before["draft_tokens"]
    if drafts <= 0:
        return {"drafts": 0}
    positions = sorted(after["accepted_per_pos"])
    return {
        "drafts": int(drafts),
        "acceptance_length": round(1 + accepted / drafts, 4),
        "draft_acceptance_rate": round(accepted / draft_tokens, 4) if draft_tokens else None,
        "position_acceptance": {
            str(p + 1): round(
                (after["accepted_per_pos"][p] - before["accepted_per_pos"].get(p, 0.0)) / drafts, 4
            )
            for p in positions
        },
    }


def sglang_acceptance(meta_infos: list[dict]) -> dict | None:
    """Acceptance over finished SGLang requests' meta_info; None when none carries spec counters."""
    with_spec = [m for m in meta_infos if m.get("spec_verify_ct")]
    if not with_spec:
        return None
    tokens = sum(int(m.get("completion_tokens", 0)) for m in with_spec)
    verifies = sum(int(m["spec_verify_ct"]) for m in with_spec)
    out = {"drafts": verifies, "acceptance_length": round(tokens / verifies, 4)}
    histograms = [m["spec_accept_histogram"] for m in with_spec if m.get("spec_accept_histogram")]
    if histograms:  # hist[a] = verify steps that accepted a draft tokens
        width = max(len(h) for h in histograms)
        hist = [sum(h[a] for h in histograms if a < len(h)) for a in range(width)]
        steps = sum(hist)
        out["position_acceptance"] = {
            str(p): round(sum(hist[p:]) / steps, 4) for p in range(1, width)
        }
    return out
