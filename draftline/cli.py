"""`draftline COMMAND ...`: the tools beside the pipeline's stages, under one command.

    draftline plan --hidden-size 7168 --samples 25000 --tokens-per-sample 4000
    draftline forecast --dvc-exps --targets 2.5 3.0
    draftline export-sglang models/draft models/target/card.json models/draft_sglang
    draftline conversations restore datasets/regenerated --dry-run
    draftline COMMAND --help

Each command is one module's `main(argv)`, which `python -m draftline.<module>` runs as well, run
under entry_point: a DraftlineError is exit status 1 with its message. The stages themselves run
from `dvc.yaml` (`dvc repro`, `python -m stages.<name>`); the developer tools (the docs' figures,
a recipe run's record) are not installed: `python -m devtools.<name>` from the repository.
"""

from __future__ import annotations

import importlib
import sys

from draftline.core.errors import entry_point

# command -> (module whose main(argv) it runs, what it does)
COMMANDS = {
    "plan": (
        "draftline.tools.plan",
        "disk, DVC cache and hashing plan of the hidden states",
    ),
    "forecast": (
        "draftline.tools.forecast",
        "acceptance length forecast from samples vs acceptance",
    ),
    "verdict": (
        "draftline.tools.verdict",
        "the serving verdict again from a recorded sweep: another load, goals or forecast",
    ),
    "export-sglang": (
        "draftline.draft.sglang_export",
        "a copy of the trained draft SGLang can serve",
    ),
    "conversations": (
        "draftline.tools.conversations",
        "superseded regenerated conversations: list them, bring them back",
    ),
    "verify-repro": (
        "draftline.tools.verify_repro",
        "your run against the committed one, each figure against its tolerance",
    ),
    "batch-server": (
        "draftline.engines.batch_server",
        "the greedy batched chat server (backend hf)",
    ),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()]
    return "usage: draftline COMMAND [ARGS...]\n\ncommands:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"draftline: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        raise SystemExit(2)
    module = importlib.import_module(COMMANDS[name][0])
    sys.argv = [f"draftline {name}", *rest]  # argparse's prog in the commands' own messages
    entry_point(module.main)(rest)


if __name__ == "__main__":
    main()
