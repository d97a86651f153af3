"""Stage `target`: target.model resolved into models/target (draftline/targets/source.py).

    python -m stages.target models/target

Writes card.json and meta.json into the directory (and the model itself for `tiny` and a GGUF
target); a target that cannot be had fails here, saying why.
"""

import sys
from pathlib import Path

from draftline.core.config import stage_sections
from draftline.core.errors import entry_point
from draftline.core.threads import apply_thread_policy
from draftline.targets.config import TargetConfig


@entry_point
def main(out_dir: str) -> None:
    params = stage_sections(target=TargetConfig)
    apply_thread_policy("target")  # before torch loads: draftline/core/threads.py
    from draftline.targets.source import Paths, run

    card = run(params, Paths(Path(out_dir)))
    print(
        f"target: {card.architecture} {card.num_layers} layers, hidden {card.hidden_size}, "
        f"vocab {card.vocab_size}, aux layers {card.aux_ids}; verifier tensors {card.verifier_tensors}"
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
