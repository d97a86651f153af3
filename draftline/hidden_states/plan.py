"""The hidden-state plan before the spend: tokens, bytes per token of each format, total disk for
offline bf16 / offline fp8 / online, free disk where the states would go, and the target forwards
online mode costs per epoch (`draftline plan` prints it). No model download, no GPU, no torch.

Tokens come from the tokenized data when it is there; else from the mixed prompts (about 4
characters a token, as the prepare filter counts, plus regenerate.max_tokens per assistant turn,
capped at tokenize.max_length); else samples x tokenize.max_length, an upper bound. The hidden
size comes from models/target/card.json, or --hidden-size.

DVC's share: `datasets/hidden_states` is a DVC output, so DVC hashes every new byte once when the
stage commits, and with cache.type copy (what `reflink,copy`, the project's .dvc/config, falls back
to on a filesystem without reflink, e.g. ext4) its cache holds a second copy of every byte. The
hashing and copy rates are this machine's, measured by overhead/dvc_hashing.py
(reports/overhead/dvc_hashing.json); --hash-gbps and --cache-type plan for another host.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from draftline.hidden_states.formats import bytes_per_token, minimum_bytes_per_token

CHARS_PER_TOKEN = 4  # the prepare stage's prompt-length estimate
HASHING_REPORT = "reports/overhead/dvc_hashing.json"  # overhead/dvc_hashing.py: DVC's rates here
LINK_TYPES = ("reflink", "hardlink", "symlink", "copy")  # DVC's cache.type values


def estimate_row_tokens(prompt: dict, max_tokens: int, max_length: int) -> int:
    """A mixed prompt's tokenized length before regeneration: its text at ~4 characters a token,
    each assistant turn at most max_tokens, the row at most max_length."""
    messages = prompt.get("messages") or []
    chars = sum(len(str(m.get("content") or "")) for m in messages if m.get("role") != "assistant")
    chars += len(json.dumps(prompt["tools"])) if prompt.get("tools") else 0
    answers = max(1, sum(m.get("role") == "assistant" for m in messages))
    return min(max_length, math.ceil(chars / CHARS_PER_TOKEN) + answers * max_tokens)


def free_bytes(path: Path) -> int:
    """Free space of the filesystem `path` is (or would be) on."""
    path = Path(path).resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def packed_forwards(tokens: int, pack_len: int) -> int:
    """Packed batches of pack_len tokens that hold `tokens` (packing rarely fills them all: a floor)."""
    return math.ceil(tokens / pack_len)


@dataclass(frozen=True)
class PlanSettings:
    """The params a plan reads: hidden_states.dtype and disk_margin, train.pack_len, val_fraction
    and epochs (online mode's forwards). The defaults are the params' own."""

    dtype_name: str = "bfloat16"
    pack_len: int = 1024
    val_fraction: float = 0.1
    epochs: int = 1
    margin: float = 1.1


def make_plan(
    tokens: int,
    rows: int,
    hidden_size: int,
    settings: PlanSettings | None = None,
    *,
    free: int | None = None,
    source: str = "",
) -> dict:
    """Disk of each mode and what online costs instead. Bytes are the files' content (states,
    fp8 scales, int64 token ids); headers add a few hundred bytes a file."""
    settings = settings or PlanSettings()
    dtype_name, pack_len, margin = settings.dtype_name, settings.pack_len, settings.margin
    val_fraction, epochs = settings.val_fraction, settings.epochs
    val_tokens = round(tokens * val_fraction)
    modes = {}
    for fmt in ("bf16", "fp8"):
        per_token = bytes_per_token(hidden_size, fmt, dtype_name)
        total = tokens * per_token
        modes[f"offline_{fmt}"] = {
            "bytes_per_token": per_token,
            "minimum_bytes_per_token": minimum_bytes_per_token(hidden_size, fmt, dtype_name),
            "total_bytes": total,
            "fits": None if free is None else free >= total * margin,
        }
    forwards = packed_forwards(tokens - val_tokens, pack_len) + packed_forwards(
        val_tokens, pack_len
    )
    modes["online"] = {
        "bytes_per_token": 0,
        "total_bytes": 0,
        "fits": True,
        # train + validation batches, each one target forward of up to pack_len tokens
        "target_forwards_per_epoch": forwards,
        "target_tokens_per_epoch": tokens,
        "target_forwards_total": forwards * epochs,
    }
    return {
        "tokens": tokens,
        "rows": rows,
        "tokens_from": source,
        "hidden_size": hidden_size,
        "free_bytes": free,
        "disk_margin": margin,
        "pack_len": pack_len,
        "epochs": epochs,
        "modes": modes,
    }


def dvc_cache_types(dvc_dir: Path) -> list[str]:
    """cache.type as DVC reads it (.dvc/config, config.local, the user's and the system's);
    DVC's own default for a local cache when none is set."""
    # DVC loads on first use: the stage's disk refusal uses this module without the DVC share
    from dvc.config import Config

    types = Config(dvc_dir=str(dvc_dir) if Path(dvc_dir).is_dir() else None)["cache"].get("type")
    return list(types or ["reflink", "copy"])


def link_type(types: list[str], directory: Path) -> str:
    """The first of `types` that works on the filesystem of `directory` (or its nearest existing
    parent), tried as DVC tries them: reflink needs a filesystem that clones (XFS made with
    reflink=1, Btrfs, APFS; not ext4), a hardlink one that has them."""
    # DVC loads on first use: the stage's disk refusal uses this module without the DVC share
    from dvc_objects.fs.system import reflink

    where = Path(directory).resolve()
    while not where.is_dir():
        where = where.parent
    for kind in types:
        if kind in ("symlink", "copy"):
            return kind
        try:
            with tempfile.TemporaryDirectory(dir=where, prefix=".link_probe") as tmp:
                src, dst = Path(tmp, "src"), Path(tmp, "dst")
                src.write_bytes(b"x")
                reflink(src, dst) if kind == "reflink" else os.link(src, dst)
                return kind
        except OSError:  # not on this filesystem (or not writable here: not known)
            continue
    return "copy"


def hours(n_bytes: int, gbps: float | None) -> float | None:
    """Time to stream n_bytes at gbps GB/s (10^9 bytes), in hours; None without a rate."""
    return None if not gbps else n_bytes / (gbps * 1e9) / 3600


def dvc_costs(state_bytes: int, link: str, rates: dict) -> dict:
    """What DVC adds to `state_bytes` of hidden states committed as the stage's persist output.
    cache: a second copy of every byte with `copy`, none with a link. Hashing: every new byte once,
    at commit. copy: the bytes into the cache at commit. With hardlink/symlink, every rerun of the
    stage (a resume, `samples` grown, a changed dep) first copies each committed file back out of
    the cache (DVC unprotects persist outputs: dvc/stage/__init__.py, remove_outs) and then hashes
    the copies again: those bytes twice on disk until the commit links them back."""
    relinked = link in ("hardlink", "symlink")
    hash_h = hours(state_bytes, rates.get("hash_gbps"))
    return {
        "cache_bytes": state_bytes if link == "copy" else 0,
        "hash_hours": hash_h,
        "copy_hours": hours(state_bytes, rates.get("copy_gbps")) if link == "copy" else 0.0,
        "rerun_copy_bytes": state_bytes if relinked else 0,
        "rerun_hours": _sum(hours(state_bytes, rates.get("unprotect_gbps")), hash_h)
        if relinked
        else 0.0,
    }


def _sum(*parts: float | None) -> float | None:
    return None if None in parts else sum(parts)


def hashing_rates(report: Path) -> dict:
    """DVC's measured rates (GB/s) from overhead/dvc_hashing.py's JSON; {} when there is none."""
    if not Path(report).is_file():
        return {}
    r = json.loads(Path(report).read_text())
    return {
        "hash_gbps": r["dvc_hash_cold_gbps"],  # files not in the page cache, as at terabytes
        "copy_gbps": r["copy"]["commit_gbps"],
        "unprotect_gbps": r["hardlink"]["unprotect_gbps"],  # the copy back; then hashed again
        "from": f"{report} ({r['cpu_count']} cores, {r['filesystem'] or 'unknown filesystem'}, "
        f"load {r['loadavg_before'][0]:.1f})",
    }


def add_dvc(plan: dict, types: list[str], link: str, rates: dict) -> dict:
    """The plan with DVC's cache and hashing costs of each offline mode (plan["dvc"])."""
    free, margin = plan["free_bytes"], plan["disk_margin"]
    modes = {}
    for name, mode in plan["modes"].items():
        if name == "online":
            continue
        costs = dvc_costs(mode["total_bytes"], link, rates)
        disk = mode["total_bytes"] + costs["cache_bytes"] + costs["rerun_copy_bytes"]
        costs["disk_bytes"] = disk  # peak: the states, the cache, the copies a rerun makes
        costs["fits"] = None if free is None else free >= disk * margin
        modes[name] = costs
    gbps = rates.get("hash_gbps")
    plan["dvc"] = {
        "cache_type": types,
        "link": link,
        "hash_gbps": gbps,
        "hash_hours_per_tb": hours(10**12, gbps),
        "rates": rates,
        "modes": modes,
    }
    return plan


def cheaper_modes(plan: dict, current: str) -> list[str]:
    """The modes that would fit, as params to set, for the stage's refusal message."""
    out = []
    for name, mode in plan["modes"].items():
        if name == current or not mode["fits"]:
            continue
        if name == "online":
            out.append(
                f"hidden_states.mode: online (no files; the target runs during training, "
                f"~{mode['target_forwards_per_epoch']:,} forwards of <= {plan['pack_len']} tokens per epoch "
                f"at train.pack_len {plan['pack_len']})"
            )
        else:
            out.append(
                f"hidden_states.format: {name.removeprefix('offline_')} ({mode['total_bytes'] / 1e9:,.1f} GB)"
            )
    return out


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{n:,.0f} B"
        n /= 1000
    return str(n)


def render(plan: dict) -> str:
    free = plan["free_bytes"]
    lines = [
        f"tokens: {plan['tokens']:,} in {plan['rows']:,} rows ({plan['tokens_from']}); hidden size {plan['hidden_size']}",
        f"free disk: {human(free) if free is not None else 'unknown'} (needed: total x disk_margin {plan['disk_margin']})",
        "",
        "| mode | bytes/token | / format minimum | total disk | fits |",
        "|---|---|---|---|---|",
    ]
    for name, mode in plan["modes"].items():
        if name == "online":
            continue
        ratio = mode["bytes_per_token"] / mode["minimum_bytes_per_token"]
        fits = "?" if mode["fits"] is None else ("yes" if mode["fits"] else "no")
        lines.append(
            f"| {name.replace('_', ' ')} | {mode['bytes_per_token']:,} | {ratio:.4f} | {human(mode['total_bytes'])} | {fits} |"
        )
    online = plan["modes"]["online"]
    lines.append("| online | 0 | - | 0 B | yes |")
    lines += [
        "",
        f"online: {online['target_forwards_per_epoch']:,} target forwards per epoch (packed batches of <= "
        f"{plan['pack_len']} tokens, train + validation), {online['target_tokens_per_epoch']:,} tokens through the "
        f"target per epoch, {online['target_forwards_total']:,} over {plan['epochs']} epochs",
    ]
    if "dvc" in plan:
        lines += ["", *render_dvc(plan)]
    if "length" in plan:
        lines += ["", *render_length(plan["length"])]
    return "\n".join(lines)


def _hours(h: float | None) -> str:
    return "? (no rate)" if h is None else f"{h:,.1f} h"


def render_dvc(plan: dict) -> list[str]:
    dvc = plan["dvc"]
    link, rates = dvc["link"], dvc["rates"]
    lines = [
        f"DVC: cache.type {','.join(dvc['cache_type'])} -> {link} here "
        + {
            "copy": "(the cache holds a second copy of every byte)",
            "reflink": "(the cache shares the files' blocks: no second copy)",
        }.get(link, "(links: no second copy, but every rerun copies the files back first)"),
        "",
        "| mode | DVC cache | peak disk | fits | hashing at commit | copy into the cache | each rerun (unprotect + rehash) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in dvc["modes"].items():
        fits = "?" if m["fits"] is None else ("yes" if m["fits"] else "no")
        rerun = (
            f"{_hours(m['rerun_hours'])}, +{human(m['rerun_copy_bytes'])}"
            if m["rerun_copy_bytes"]
            else "0"
        )
        lines.append(
            f"| {name.replace('_', ' ')} | {human(m['cache_bytes'])} | {human(m['disk_bytes'])} | {fits} "
            f"| {_hours(m['hash_hours'])} | {_hours(m['copy_hours'])} | {rerun} |"
        )
    if dvc["hash_gbps"]:
        lines.append(
            f"hashing: {dvc['hash_gbps']:.3f} GB/s, {dvc['hash_hours_per_tb']:.2f} h per TB "
            f"({rates.get('hash_from') or 'measured: ' + rates['from'] + ', files not in the page cache'})"
        )
    else:
        lines.append(f"hashing: no measured rate ({HASHING_REPORT} missing; --hash-gbps)")
    return lines


# ---- training for length -------------------------------------------------------------------


def length_plan(
    max_length: int,
    pack_len: int,
    draft_positions: int | None,
    served_limit: int | None,
    longest_before_cut: int | None = None,
    truncated_share: float | None = None,
) -> dict:
    """What training rows of up to `max_length` tokens (tokenize.max_length) needs, and what the
    current settings leave untrained: a row is cut at tokenize.max_length, then again at the end
    of its pack (train.pack_len: speculators' collate cuts it), and the draft's rotary positions
    stop at its max_position_embeddings (the target's, copied into the draft's layer config).
    `served_limit`: the longest context the target serves; `longest_before_cut` /
    `truncated_share`: the tokenize stage's report, where there is one. Each finding says the
    setting that lifts it."""
    trained = min(max_length, pack_len)
    findings = []
    if pack_len < max_length:
        findings.append(
            f"train.pack_len {pack_len} < tokenize.max_length {max_length}: rows are cut again at "
            f"{pack_len} tokens when packed; raise train.pack_len to at least {max_length} (a "
            "pack's attention grows with the square of its length: fewer rows fit a pack, each "
            "step costs more)"
        )
    if draft_positions is not None and max_length > draft_positions:
        findings.append(
            f"tokenize.max_length {max_length} > the draft's {draft_positions} positions "
            "(max_position_embeddings): positions past it are not defined for the draft; stay "
            "within the target's own limit"
        )
    if served_limit is not None and trained < served_limit:
        findings.append(
            f"the target serves up to {served_limit:,} tokens, the draft trains on at most "
            f"{trained:,}: positions past {trained:,} are untrained (evaluate's by_context and "
            "trained_length say how acceptance holds there)"
        )
    if longest_before_cut is not None and longest_before_cut <= max_length:
        findings.append(
            f"no row reaches tokenize.max_length {max_length} (the longest is "
            f"{longest_before_cut:,} before any cut): longer rows need longer prompts (multi-turn, "
            "documents) and regenerate.max_tokens, not a larger max_length alone"
        )
    return {
        "max_length": max_length,
        "pack_len": pack_len,
        "trained_positions": trained,
        "draft_positions": draft_positions,
        "served_limit": served_limit,
        "longest_row_before_cut": longest_before_cut,
        "truncated_share": truncated_share,
        "findings": findings,
    }


def render_length(length: dict) -> list[str]:
    lines = [
        f"length: rows up to {length['max_length']:,} tokens (tokenize.max_length), packs of "
        f"{length['pack_len']:,} (train.pack_len): the draft trains on positions < "
        f"{length['trained_positions']:,}"
        + (f"; the target serves {length['served_limit']:,}" if length["served_limit"] else "")
    ]
    lines += [f"  - {finding}" for finding in length["findings"]]
    return lines
