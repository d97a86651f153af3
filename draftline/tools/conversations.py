"""`draftline conversations`: the regenerated conversations by hand.

    draftline conversations restore datasets/regenerated [--dry-run]
    draftline conversations restore datasets/regenerated --reason stale_settings [--id p1 ...]
    draftline conversations migrate datasets/regenerated [--dry-run]

`restore` without --reason/--id does what the regenerate stage does before sending (moves stale
lines out, matching ones back); with them it brings the chosen lines back whatever settings made
them, accepted for the current ones (`regeneration.accepted_for`), in place of the line that
holds their id. The rules: draftline/regenerate/store.py. `migrate` rewrites, once, a directory
of the format before settings were recorded per line (draftline/regenerate/migrate.py), which the
stage refuses until then. Each prints its counts as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from draftline.core.card import TargetCard
from draftline.core.config import stage_sections
from draftline.core.errors import entry_point
from draftline.regenerate.config import RegenerateConfig
from draftline.regenerate.migrate import migrate
from draftline.regenerate.settings import wanted_settings
from draftline.regenerate.store import read_prompts, restore

# by name: `python -m draftline.tools.conversations` runs this module as __main__, a logger
# nothing sets up
log = logging.getLogger("draftline.tools.conversations")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftline conversations",
        description="Bring superseded conversations back (datasets/regenerated/superseded.jsonl), "
        "or migrate a directory of the format before settings were recorded per line.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser(
        "restore",
        help="without --reason/--id: the lines that match the current settings; with them: "
        "the chosen lines, accepted for the current settings",
    )
    mig = sub.add_parser(
        "migrate",
        help="record the settings of lines that carry only their fingerprint (proven by the "
        "params or the meta.json beside them); unproven ones move to superseded.jsonl",
    )
    for p in (cmd, mig):
        p.add_argument("directory", nargs="?", default="datasets/regenerated")
        p.add_argument("--params", default="params.yaml")
        p.add_argument("--card", default="models/target/card.json")
    cmd.add_argument("--prompts", default="datasets/prompts/train.jsonl")
    cmd.add_argument(
        "--reason",
        action="append",
        choices=(
            "stale_settings",
            "unrecorded_settings",
            "stale_prompt",
            "duplicate",
            "replaced",
            "bad_line",
        ),
    )
    cmd.add_argument("--id", action="append", dest="ids")
    cmd.add_argument("--dry-run", action="store_true", help="count, move nothing")
    mig.add_argument("--dry-run", action="store_true", help="count, rewrite nothing")
    return parser


@entry_point
def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    cfg = stage_sections(args.params, regenerate=RegenerateConfig).regenerate
    card = TargetCard.load(args.card)
    directory = Path(args.directory)
    if args.command == "migrate":
        result = migrate(directory, cfg, card, args.dry_run)
    else:
        prompts = {row["id"]: row for row in read_prompts(args.prompts)}
        result = restore(
            directory,
            prompts,
            wanted_settings(cfg, card),
            args.reason,
            args.ids,
            args.dry_run,
        )
    log.info(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
