"""Stage `compare_drafts`: the content of each draft benchmark.compare serves beside this run's
(draftline/benchmark/compare_drafts.py).

    python -m stages.compare_drafts reports/compare_drafts.json

Always changed: it hashes the drafts on every `dvc repro`, and `benchmark` reruns only when one of
them changed.
"""

import sys
from pathlib import Path

from draftline.benchmark.compare_drafts import Paths, run
from draftline.benchmark.config import BenchmarkConfig
from draftline.core.config import stage_sections
from draftline.core.errors import entry_point


@entry_point
def main(out: str) -> None:
    params = stage_sections(benchmark=BenchmarkConfig)
    drafts = run(params, Paths(Path(out)))
    print(f"compare_drafts: {len(drafts)} draft(s) to serve beside this run's in {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
