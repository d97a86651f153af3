"""One derivation of every kept output's key, and what a rerun says changed.

Some outputs outlive a rerun of their stage (draftline/core/shaping.py OUTPUTS: regenerated answers,
hidden-state files, tokenized rows, the train loop's state, the probe's pass). Each is kept under a
key that `derive` computes the same way for all of them, from named parts:

- `params`: the stage's value-shaping params, defaults included (the params that only select which
  items are made, or how often state is saved, are left out where the stage's config says so);
- `inputs`: the content digest of each input that shapes values (the target's weights, the draft
  vocabulary, the init draft, the data);
- `code`: the fingerprint of the modules that shape the output (shaping.SHAPES), prose left out;
- `pins`: the versions of the packages that shape its numerics (NUMERIC_PINS installed here, and
  the vLLM environment's pins, CUDA's included, where vLLM computes them);
- `resolved`: what a module decides at run time (device type, compute dtype, token budget, the
  layer ids sent to vLLM), keyed as values so that the module's bookkeeping stays free.

The parts are recorded beside the output (`record`), so a rerun names what changed (`changed`,
`superseded`) instead of only noticing that something did.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
from dataclasses import dataclass
from pathlib import Path

from draftline.core.environment import vllm_pins
from draftline.core.shaping import shaping_fingerprint

ROOT = Path(__file__).resolve().parents[2]

# per kept output: the installed packages whose versions shape its values (numerics, rendering)
NUMERIC_PINS: dict[str, tuple[str, ...]] = {
    "regenerate": ("torch", "transformers", "tokenizers"),
    "hidden_states": ("torch", "transformers", "safetensors"),
    "tokenize": ("transformers", "tokenizers", "jinja2"),
    "train": ("torch", "transformers", "speculators"),
    "probe": ("transformers", "speculators"),
}

# how a part is named when it changed
PART_NAMES = {
    "params": "params",
    "inputs": "inputs",
    "code": "the code that shapes them",
    "pins": "environment pins",
    "resolved": "resolved settings",
}
INPUT_NAMES = {
    "target_weights": "target weights",
    "target": "target",
    "vocab": "draft vocabulary",
    "init": "init draft",
    "data": "data",
    "tokenizer": "tokenizer",
    "chat_template": "chat template",
}
UNRECORDED = "what made them was not recorded"


def installed(packages: tuple[str, ...]) -> dict[str, str | None]:
    """Each package's installed version here (None where it is not installed)."""
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


def pins(output: str, vllm: bool = False, root: Path | None = None) -> dict:
    """The versions that shape `output`'s numerics: NUMERIC_PINS installed here, and with `vllm`
    the vLLM environment's pins (scripts/vllm_env.sh: the CPU and the CUDA build)."""
    out: dict = {"installed": installed(NUMERIC_PINS[output])}
    if vllm:
        out["vllm"] = vllm_pins(ROOT if root is None else Path(root))
    return out


def _sha256(obj) -> str:
    return hashlib.sha256(
        json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str).encode()
    ).hexdigest()


SAMPLED_BLOCKS = 64  # evenly spaced blocks of a .safetensors file's data hashed by weights_digest
BLOCK = 64 << 10
TENSOR_END = 4 << 10  # hashed at both ends of each tensor


def _safetensors_digest(h, fh, size: int) -> None:
    """Feed `h` a .safetensors file's header, its tensors' ends and evenly spaced blocks of its
    data (see weights_digest)."""
    head = fh.read(8)
    n = int.from_bytes(head, "little") if len(head) == 8 else 0
    header = fh.read(min(n, max(0, size - 8))) if n else b""
    h.update(head + header)
    start = 8 + len(header)
    spans = []
    try:
        tensors = json.loads(header)
    except ValueError:  # not a readable header: the blocks alone
        tensors = {}
    for info in tensors.values() if isinstance(tensors, dict) else ():
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        ok = isinstance(offsets, list) and len(offsets) == 2
        if ok and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]:
            a, b = start + offsets[0], start + offsets[1]
            spans += [(a, min(b, a + TENSOR_END)), (max(a, b - TENSOR_END), b)]
    data = max(0, size - start)
    step = max(0, data - BLOCK) / max(1, SAMPLED_BLOCKS - 1)
    spans += [(start + int(k * step), start + int(k * step) + BLOCK) for k in range(SAMPLED_BLOCKS)]
    for a, b in sorted(set(spans)):
        fh.seek(a)
        h.update(fh.read(max(0, min(b, size) - a)))


def weights_digest(model: str) -> str | None:
    """A digest of the weight files (and config.json) of a local model: changes when it is
    retrained, fine-tuned, re-quantized or edited. None for a hub id (model + revision name it).

    Every file's name and size. A .bin/.pt file or config.json: its whole content. A .safetensors
    file: its header (every tensor's name, dtype, shape and offsets), the first and last 4 KiB of
    each tensor, and 64 evenly spaced 64 KiB blocks of its data; a file of up to 4 MiB of data is
    thereby read whole. Hashing a whole checkpoint costs minutes per hundred GB at every run of the
    stage; this costs 4 MiB plus 8 KiB per tensor, whatever the size. What it sees: a retrain
    changes nearly every value (the spaced blocks), a fine-tune of some tensors changes each of
    them throughout (their ends), a re-quantization or resize changes the header. What it can miss:
    an edit confined to a few bytes no block covers, which no training makes."""
    root = Path(model)
    if not root.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(
        p
        for p in root.iterdir()
        if p.suffix in {".safetensors", ".bin", ".pt"} or p.name == "config.json"
    ):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}\n".encode())
        with open(f, "rb") as fh:
            if f.suffix == ".safetensors":
                _safetensors_digest(h, fh, size)
            else:
                h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()


@dataclass(frozen=True)
class Derivation:
    """A kept output's key and the named parts it is computed from."""

    output: str
    parts: dict

    @property
    def key(self) -> str:
        return _sha256({"output": self.output, **self.parts})

    def record(self) -> dict:
        """What is written beside the output: the key and its parts (plain JSON)."""
        return {"key": self.key, "parts": json.loads(json.dumps(self.parts, default=str))}

    def changed(self, recorded: dict | None) -> list[str]:
        """What differs between `recorded` (a `record()` read back) and these parts, each named:
        ["target weights", "params (train.lr)", ...]; [] when the keys match."""
        if not isinstance(recorded, dict) or not isinstance(recorded.get("parts"), dict):
            return [UNRECORDED]
        if recorded.get("key") == self.key:
            return []
        now, then = self.record()["parts"], recorded["parts"]
        out = []
        for part in sorted(set(now) | set(then)):
            a, b = then.get(part), now.get(part)
            if a == b:
                continue
            if (
                isinstance(a, dict)
                and isinstance(b, dict)
                and part in ("inputs", "params", "resolved", "pins")
            ):
                fields = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                if part == "inputs":
                    out += [INPUT_NAMES.get(f, f) for f in fields]
                    continue
                out.append(f"{PART_NAMES[part]} ({', '.join(_leaves(a, b, fields))})")
            else:
                out.append(PART_NAMES.get(part, part))
        return out or ["the key's parts"]


def _leaves(a: dict, b: dict, fields: list[str]) -> list[str]:
    """Dotted names of what differs under `fields`, one level down where both sides are dicts."""
    names = []
    for f in fields:
        x, y = a.get(f), b.get(f)
        if isinstance(x, dict) and isinstance(y, dict):
            sub = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            names += [f"{f}.{k}" for k in sub]
        else:
            names.append(f)
    return names


def derive(
    output: str,
    *,
    params: dict,
    inputs: dict,
    resolved: dict | None = None,
    vllm: bool = False,
    code: str | None = None,
) -> Derivation:
    """The key of `output` (an OUTPUTS name of draftline/core/shaping.py) from its parts (see the
    module docstring); `code` defaults to the fingerprint of SHAPES[output]."""
    parts = {
        "params": params,
        "inputs": inputs,
        "code": shaping_fingerprint(output) if code is None else code,
        "pins": pins(output, vllm),
        "resolved": resolved or {},
    }
    return Derivation(output, json.loads(json.dumps(parts, default=str)))


def superseded(changed: list[str], n: int, unit: str, verb: str = "superseded") -> str:
    """What a rerun says: "target weights changed: 1,212 answers superseded"."""
    if changed == [UNRECORDED]:
        return f"{UNRECORDED}: {n:,} {unit} {verb}"
    return f"{', '.join(changed) or 'nothing'} changed: {n:,} {unit} {verb}"
