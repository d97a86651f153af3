"""datasets/sources.yaml for a `dvc exp run` that adds datasets with -S: dvc.yaml's prepare stage
iterates over the datasets with the source dep this file lists for each, and DVC resolves it
before it applies the -S, so a dataset the run adds must be listed first
(scripts/recipe_smollm2.sh runs it before such a run):

    python -m devtools.exp_sources datasets/sources.yaml -S '++datasets.long_docs={builtin: pydoc_long}' ...

Every -S '[+|++]datasets.<name>...=<yaml value>' of the arguments is applied to params.yaml's
`datasets` (the others, and stage names, are passed over), each dataset validated as the stage
would, and the sources file written from the result.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from pydantic import TypeAdapter

from draftline.data.config import Datasets
from draftline.data.workspace import write_sources


def with_datasets(params: dict, args: list[str]) -> dict:
    """params with every -S of `args` that sets a key under `datasets.` applied (Hydra's
    grammar as `dvc exp run -S` takes it; the + and ++ prefixes both set the key)."""
    for flag, setting in zip(args, args[1:]):
        if flag != "-S" or "=" not in setting:
            continue
        key, value = setting.split("=", 1)
        key = key.lstrip("+")
        if not key.startswith("datasets."):
            continue
        node = params
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return params


def main(sources: str, *args: str) -> None:
    params = with_datasets(yaml.safe_load(Path("params.yaml").read_text()), list(args))
    datasets = TypeAdapter(Datasets).validate_python(params.get("datasets") or {})
    count = write_sources(datasets, sources)
    print(f"exp_sources: {count} datasets -> {sources}")


if __name__ == "__main__":
    main(*sys.argv[1:])
