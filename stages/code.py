"""Stage `code`: the fingerprint of each stage's code, which every other stage depends on.

    python -m stages.code reports/code

Writes reports/code/<stage>.json for each stage module (draftline/core/code.py says what a
fingerprint covers). It runs on any edit under draftline/ or stages/ in about a second; a stage
reruns only when its own file changed, that is, when the code it runs does something else.
"""

import json
import sys
from pathlib import Path

from draftline.core.code import stage_fingerprint, stage_names
from draftline.core.errors import entry_point
from draftline.core.threads import apply_thread_policy

ROOT = Path(__file__).resolve().parents[1]


@entry_point
def main(out_dir: str) -> None:
    apply_thread_policy("code")  # draftline/core/threads.py
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = stage_names(ROOT)
    for stale in set(out.glob("*.json")) - {out / f"{n}.json" for n in names}:
        stale.unlink()
    for name in names:
        text = json.dumps(stage_fingerprint(ROOT, name), indent=1, sort_keys=True) + "\n"
        path = out / f"{name}.json"
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
    print(f"code: fingerprints of {len(names)} stages in {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
