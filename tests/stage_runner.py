"""Running the stages' main() one after the other in a temp directory, as dvc.yaml chains them,
for targets other than the default (no dvc, no git: each stage reads ./params.yaml)."""

from __future__ import annotations

import contextlib
import importlib
import json
import random
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def write_params(root: Path, target: dict, **sections) -> None:
    """The repository's params.yaml with `target` and the given sections replaced (merged one level)."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["target"] = target
    # the built-in engine evaluates: these random targets' head sizes are not among those vLLM's
    # CPU attention runs (tests/evaluate/test_vllm.py covers evaluate.engine vllm)
    params["evaluate"]["engine"] = "hf"
    params["evaluate"]["sets"] = []  # the prompts here are written by hand, not by `mix`
    for name, value in sections.items():
        params[name] = {**params.get(name, {}), **value} if isinstance(value, dict) else value
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def mix_in(root: Path):
    """stages/mix.py as DVC runs it, in its own process with root as the working directory (its
    prepared/ and reports/prepare/ inputs there, mixed/ and reports/mix.json written): the
    finished process, its output captured."""
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-P", str(ROOT / "stages/mix.py"), "prepared", "reports/prepare",
         "mixed", "reports/mix.json"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )  # fmt: skip


def run_stage(root: Path, name: str, *args) -> dict | None:
    """stages.<name>.main(*args) with root as the working directory; the report (last arg ending in .json) if any,
    the whole one for a metrics file (its .detail.json beside it)."""
    from draftline.core.io import detail_path

    stage = importlib.import_module(f"stages.{name}")
    with contextlib.chdir(root):
        stage.main(*[str(a) for a in args])
    reports = [
        Path(root, a) for a in args if str(a).endswith(".json") and not str(a).endswith("card.json")
    ]
    if reports and detail_path(reports[-1]).is_file():
        reports.append(detail_path(reports[-1]))
    return json.loads(reports[-1].read_text()) if reports and reports[-1].is_file() else None


def write_prompts(path: Path, conversations: list[dict], prefix: str = "p") -> list[dict]:
    """Prompt rows as `mix` writes them: whole conversations, whose assistant turns regenerate answers again."""
    rows = []
    for k, conv in enumerate(conversations):
        rows.append(
            {
                "id": f"{prefix}{k}",
                "source": "test",
                "messages": conv["messages"],
                "tools": conv.get("tools") or [],
                "prompt_tokens_est": 32,
                "partition": "short",
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def write_regenerated(path: Path, prompts: list[dict], conversations: list[dict]) -> None:
    """Conversations as `regenerate` writes them (here with the corpus' own answers)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row, conv in zip(prompts, conversations, strict=True):
            f.write(
                json.dumps(
                    {
                        "id": row["id"],
                        "messages": conv["messages"],
                        "tools": conv.get("tools") or [],
                    }
                )
                + "\n"
            )


def corpus(n: int, seed: int) -> list[dict]:
    from draftline.targets.corpus import arithmetic, tool_call

    rng = random.Random(seed)
    return [(arithmetic if k % 2 else tool_call)(rng) for k in range(n)]
