"""`draftline conversations migrate`: a regenerated-conversations directory of the format before
settings were recorded per line, rewritten once into today's.

Lines of those runs carry only a fingerprint of their settings, and that fingerprint had the
engine in it (`backend`, `external_engine`, `extra_args`, now provenance, never compared). A line's
settings are recovered where its fingerprint is proven: by the params given (hashed again with
the engine fields in them, as those runs hashed them), or by the meta.json beside the lines (its
params, hashed again, give its fingerprint). A proven line gets the settings and engine record it
would have had (`settings_from` says which proved it), in conversations.jsonl and in
superseded.jsonl; an unproven one in conversations.jsonl moves to superseded.jsonl as
`unrecorded_settings` (never deleted: `draftline conversations restore --reason
unrecorded_settings` brings it back). After it, the stage reads the directory as it read it
before the migration (draftline/regenerate/store.py refuses the old format).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.io import read_json
from draftline.regenerate import store
from draftline.regenerate.settings import (
    DERIVED,
    Wanted,
    answer_shaping_args,
    fingerprint,
    plain,
    predates_settings,
    regeneration_settings,
    wanted_settings,
)

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.regenerate.config import RegenerateConfig

# Output-shaping before the engine became provenance: lines of those runs have a fingerprint of
# the settings with these fields in it, and no `settings` record.
LEGACY_ENGINE_SHAPING = ("backend", "external_engine", "extra_args")


def proven_settings(
    cfg: RegenerateConfig, card: TargetCard, directory: Path
) -> dict[str, tuple[dict, str]]:
    """Fingerprint -> (the settings that give it, what proves them: "params" or "meta.json") of
    the old-format lines that can be read: the fingerprint the params give with the engine fields
    still in it, and the one of the meta.json in `directory` (its params, hashed again, must give
    its fingerprint)."""
    settings = plain(regeneration_settings(cfg, card))
    # the old format recorded neither the launch arguments nor the weights, code and pins: the
    # lines it proves are taken as made by today's (the migration is run by whoever made them)
    legacy = {k: v for k, v in settings.items() if k not in ("answer_shaping_args", *DERIVED)}
    legacy.update(plain(cfg.model_dump(include=set(LEGACY_ENGINE_SHAPING))))
    known = {fingerprint(legacy): ({**settings, **legacy}, "params")}
    meta_path = Path(directory) / "meta.json"
    try:
        meta = read_json(meta_path) if meta_path.is_file() else {}
    except (OSError, ValueError):
        meta = {}
    params = meta.get("params") if isinstance(meta, dict) else None
    if isinstance(params, dict) and isinstance(meta.get("fingerprint"), str):
        old = {
            "model": meta.get("target"),
            "revision": card.revision,
            "chat_template_sha256": meta.get("chat_template_sha256"),
            **params,
        }
        if fingerprint(old) == meta["fingerprint"]:
            old["answer_shaping_args"] = answer_shaping_args(old.get("extra_args") or [])
            old.update({k: settings[k] for k in DERIVED})
            known.setdefault(meta["fingerprint"], (old, "meta.json"))
    return known


def recorded(row, wanted: Wanted, known: dict[str, tuple[dict, str]]) -> dict | None:
    """What an old-format line's `regeneration` record gains: its settings, its engine and what
    proved them; {} for a line not of the old format, None for an old one not proven."""
    regen = row.get("regeneration") if isinstance(row, dict) else None
    if not isinstance(regen, dict) or not predates_settings(regen):
        return {}
    if regen["fingerprint"] not in known:
        return None
    settings, source = known[regen["fingerprint"]]
    return {
        "settings": {k: settings[k] for k in wanted.settings if k in settings},
        "engine": {k: settings[k] for k in LEGACY_ENGINE_SHAPING if k in settings},
        "settings_from": source,
    }


def migrate(
    directory: Path, cfg: RegenerateConfig, card: TargetCard, dry_run: bool = False
) -> dict:
    """Rewrites the old-format lines of directory's conversations.jsonl and superseded.jsonl (see
    the module docstring; `cfg`: the regenerate params, `card` the target's card); the counts:
    `upgraded` and `unrecorded_settings` (moved aside) in conversations.jsonl,
    `superseded_upgraded` in superseded.jsonl. A directory without old-format lines is left as
    it is."""
    directory = Path(directory)
    wanted = wanted_settings(cfg, card)
    known = proven_settings(cfg, card, directory)
    counts = store.complete_records(
        directory / "conversations.jsonl", lambda row: recorded(row, wanted, known), dry_run
    )
    return {**{k: counts[k] for k in MIGRATED}, "dry_run": dry_run}


MIGRATED = ("upgraded", "unrecorded_settings", "superseded_upgraded")
