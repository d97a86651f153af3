"""What every params section shares: the section base, the kind of each field, loading a section
of params.yaml with errors that name the dotted key, and the checks every value passes.

Every section is a pydantic model with ``extra="forbid"``: an unknown key or a bad value fails
before any stage does work. Each field says its kind where it is declared (`shaping` or
`operational`). Output-shaping: a change makes a different output, so the field is in the stage's
fingerprint or resume identity (`output_shaping(section)`) and old outputs are not reused.
Operational: where, how fast and by which engine the work runs; a change never redoes work.
Near a leaf of the project: of the project it imports core/errors.py alone (ParamsError's base),
which imports only core/log.py (tests/core/test_config_leaf.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticUndefined

from draftline.core.errors import DraftlineError

KINDS = ("shaping", "operational")


def shaping(default: Any = PydanticUndefined, **constraints) -> Any:
    """A field whose value shapes the stage's output (pydantic's Field, with its kind)."""
    return Field(default, json_schema_extra={"kind": "shaping"}, **constraints)


def operational(default: Any = PydanticUndefined, **constraints) -> Any:
    """A field that says where, how fast or by which engine the work runs, never what it makes."""
    return Field(default, json_schema_extra={"kind": "operational"}, **constraints)


def kind_of(section: type[BaseModel], name: str) -> str | None:
    """A field's kind as declared (None when it declares none: tests/core/test_config.py)."""
    extra = section.model_fields[name].json_schema_extra
    return extra.get("kind") if isinstance(extra, dict) else None


def output_shaping(section: Section) -> dict:
    """`section.model_dump()` without its operational fields, at every depth: what a fingerprint
    or a meta.json records."""
    return {
        name: _shaping_value(getattr(section, name))
        for name in type(section).model_fields
        if kind_of(type(section), name) != "operational"
    }


def resolve_device(choice: str) -> str:
    """A device param (auto, cpu, cuda) as the device to use: auto is cuda when one is available."""
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: cuda requested but no CUDA device is available")
    return choice


def _port(value: int | None) -> int | None:
    """A fixed port, or None (also given as 0): a free port chosen when the server starts."""
    if value in (None, 0):
        return None
    if not 1024 <= value <= 65535:
        raise ValueError(
            "a port in [1024, 65535], or null (or 0) for a free port chosen when the server starts"
        )
    return value


# null/0 = a free port picked at start, so two pipelines on one host (or `dvc queue start -j 2`) never collide
Port = Annotated[int | None, AfterValidator(_port)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResumeConfig(Section):
    """params.yaml `resume`: how a rerun checks the work it keeps before trusting it
    (operational: a change never reruns a stage)."""

    # kept units spot-checked before a rerun trusts them (regenerate: conversations scored by the
    # server answering now, draftline/regenerate/spot_check.py; tokenize: conversations tokenized
    # again, draftline/tokens/previous.py; hidden_states: files recomputed by the loaded target,
    # draftline/hidden_states/spot_check.py); 0 turns the check off
    verify_sample: int = operational(8, ge=0)
    # nats: a kept token the scorer ranks below its top pick by at most this is a near tie
    verify_margin: float = operational(0.1, gt=0)


class TargetPlacement(Section):
    """Where the built-in decoder runs the target (evaluate, and benchmark with engine hf)."""

    device: Literal["auto", "cpu", "cuda"] = shaping("auto")
    # spread a target larger than one GPU over all of them ("auto", "balanced", ...); null = on `device`
    device_map: str | None = operational(None)
    # the target's weights. float32: the speculative output must equal the greedy one token for
    # token. 16-bit: verifying k+1 tokens in one forward rounds differently from one token at a
    # time, so a divergence where the target's top two logits were within tie_tolerance is counted
    dtype: Literal["float32", "bfloat16", "float16"] = shaping("float32")

    @model_validator(mode="after")
    def _device_map_needs_gpus(self):
        if self.device_map is not None and self.device == "cpu":
            raise ValueError(
                "device_map spreads the target over GPUs; it does not apply with device: cpu"
            )
        return self

    def resolved_device(self) -> str:
        return "cuda" if self.device_map is not None else resolve_device(self.device)


# Logit gap under which a 16-bit target may order its top two tokens either way (see TargetPlacement).
TIE_TOLERANCE = {"float32": 0.0, "float16": 0.1, "bfloat16": 0.5}


def _shaping_value(value):
    if isinstance(value, Section):
        return output_shaping(value)
    if isinstance(value, dict):
        return {k: _shaping_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_shaping_value(v) for v in value]
    return value


class ParamsError(DraftlineError, ValueError):
    """A params.yaml that does not validate; the message names every bad key."""


# A URL carrying a secret: user:password@host, or a query parameter named like one.
URL_USERINFO = re.compile(
    r"\b(?:https?|wss?)://[^/?#\s@]+@|\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#\s@:]*:[^/?#\s@]*@"
)

SECRET_PARAM = (
    r"[a-z0-9_-]*(?:key|token|secret|password|passwd|pwd|auth|sig|signature|credential)s?"
)

URL_SECRET_QUERY = re.compile(rf"://\S*[?&#]{SECRET_PARAM}=", re.IGNORECASE)


def credential_problems(raw, key: str = "") -> list[str]:
    """Dotted keys whose value is a URL with credentials in it. Params are written into dvc.lock,
    meta.json files and reports (and pushed to git and DVC remotes), so a secret must not be one."""
    if isinstance(raw, dict):
        return [
            p
            for k, v in raw.items()
            for p in credential_problems(v, f"{key}.{k}" if key else str(k))
        ]
    if isinstance(raw, list):
        return [p for i, v in enumerate(raw) for p in credential_problems(v, f"{key}.{i}")]
    if isinstance(raw, str) and (URL_USERINFO.search(raw) or URL_SECRET_QUERY.search(raw)):
        return [
            f"  {key}: a URL with credentials in it ({redact_url(raw)}); params are recorded in dvc.lock, "
            "meta.json and reports: put the secret in an environment variable and name it in "
            "regenerate.api_key_env (endpoints), or use the tool's own credential store"
        ]
    return []


def redact_url(text: str) -> str:
    """`text` with the user:password of URLs and the values of secret-looking query parameters masked."""
    text = re.sub(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#\s@]*@", r"\1***@", text)
    return re.sub(rf"([?&#]{SECRET_PARAM}=)[^&#\s]*", r"\1***", text, flags=re.IGNORECASE)


def load_sections(path: str | Path = "params.yaml", **types) -> dict[str, Any]:
    """The keys of params.yaml named in `types`, each validated as its type (a section model, or
    any type pydantic validates: `samples=int`, or a (type, default) pair: `seed=(int, 0)`); a
    missing key takes a section's defaults, a pair's default, or fails. Raises ParamsError naming every bad dotted key."""
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise ParamsError(f"error: {path}: top level must be a mapping")
    lines, values = [], {}
    for key, spec in types.items():
        kind, default = spec if isinstance(spec, tuple) else (spec, _default(spec))
        value = raw.get(key, default)
        lines += credential_problems(value, key) if value is not PydanticUndefined else []
        try:
            if value is PydanticUndefined:
                raise _missing(key)
            values[key] = TypeAdapter(kind).validate_python(value)
        except ValidationError as err:
            for e in err.errors():
                dotted = ".".join([key, *(str(p) for p in e["loc"])])
                lines.append(f"  {dotted}: {redact_url(e['msg'])}")
    if lines:
        raise ParamsError("error: invalid params.yaml:\n" + "\n".join(lines))
    return values


def stage_sections(path: str | Path = "params.yaml", **types) -> SimpleNamespace:
    """load_sections for a stage's main(), each key an attribute (`params.tokenize`); a ParamsError
    is the stage's exit (core/errors.entry_point)."""
    return SimpleNamespace(**load_sections(path, **types))


def _default(kind):
    return {} if isinstance(kind, type) and issubclass(kind, BaseModel) else PydanticUndefined


def _missing(key: str) -> ValidationError:
    return ValidationError.from_exception_data(key, [{"type": "missing", "loc": (), "input": {}}])
