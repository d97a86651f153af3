"""`draftline conversations restore`: superseded conversations brought back by hand.

    draftline conversations restore datasets/regenerated [--dry-run]
    draftline conversations restore datasets/regenerated --reason stale_settings [--id p1 ...]

The first does what the regenerate stage does before sending (moves stale lines out, matching ones
back); the second brings the chosen lines back whatever settings made them, accepted for the
current ones (`regeneration.accepted_for`), in place of the line that holds their id. The rules:
draftline/regenerate/store.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from draftline.core.card import TargetCard
from draftline.core.config import stage_sections
from draftline.regenerate.config import RegenerateConfig
from draftline.regenerate.settings import wanted_settings
from draftline.regenerate.store import read_prompts, restore


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="draftline conversations",
        description="Bring superseded conversations back (datasets/regenerated/superseded.jsonl).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser(
        "restore",
        help="without --reason/--id: the lines that match the current settings; with them: "
        "the chosen lines, accepted for the current settings",
    )
    cmd.add_argument("directory", nargs="?", default="datasets/regenerated")
    cmd.add_argument("--params", default="params.yaml")
    cmd.add_argument("--card", default="models/target/card.json")
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
    args = parser.parse_args(argv)

    cfg = stage_sections(args.params, regenerate=RegenerateConfig).regenerate
    card = TargetCard.load(args.card)
    prompts = {row["id"]: row for row in read_prompts(args.prompts)}
    directory = Path(args.directory)
    result = restore(
        directory,
        prompts,
        wanted_settings(cfg, card, directory),
        args.reason,
        args.ids,
        args.dry_run,
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
