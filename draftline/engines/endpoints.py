"""Asking a live server, for the preflights (draftline/engines/preflight.py) and the engines'
probes (draftline/engines/probes.py): one HTTP call retried, what /v1/models lists, what vLLM's
/server_info says of its speculative config, the probe conversation and the target it must count
as, and the error that refuses an endpoint.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.errors import DraftlineError

if TYPE_CHECKING:
    from draftline.core.card import TargetCard


# Varied text (digits, accents, CJK, emoji, code, markup) so that another tokenizer or template
# is very unlikely to give the same count.
PROBE_MESSAGES = [
    {
        "role": "user",
        "content": "Preflight probe: 7 × 8 = 56; naïve café, 東京, 🙂, "
        "`x = [1, 2]`, <b>bold</b> and   spaces.\nDone?",
    }
]


@dataclass(frozen=True)
class ServedTarget:
    """The target a regeneration endpoint must serve: the name requests give it, and the prompt ids
    its own tokenizer and chat template give a conversation, prompt_ids(messages, tools)."""

    model_name: str
    prompt_ids: Callable[[list[dict], list | None], list[int]]
    chat_template_kwargs: dict = field(default_factory=dict)


class PreflightError(DraftlineError, RuntimeError):
    """An endpoint that must not be used; the message says why."""


def request(client, method: str, url: str, attempts: int, **kwargs):
    """One HTTP call, retried (1 s, 2 s, ...) on connection errors, timeouts, 429 and 5xx."""
    # httpx loads on first use: importing this module stays light
    import httpx

    for attempt in range(attempts):
        try:
            resp = client.request(method, url, **kwargs)
            if resp.status_code != 429 and resp.status_code < 500:
                return resp
            error = f"HTTP {resp.status_code}"
        except httpx.HTTPError as err:
            error = f"{type(err).__name__}: {err}"
        if attempt + 1 < attempts:
            time.sleep(min(2**attempt, 10))
    raise PreflightError(f"{url}: no answer after {attempts} attempts ({error})")


def answer(client, method: str, url: str, attempts: int):
    """`request`, or None when the endpoint never answers (a path this engine does not have)."""
    try:
        return request(client, method, url, attempts)
    except PreflightError:
        return None


def listed_models(client, base_url: str, attempts: int) -> list:
    """The entries of /v1/models ([] when it does not answer with a list)."""
    try:
        resp = request(client, "GET", f"{base_url}/v1/models", attempts)
        models = resp.json().get("data", []) if resp.status_code == 200 else []
    except (PreflightError, ValueError, AttributeError):
        return []
    return models if isinstance(models, list) else []


def json_dict(resp) -> dict | None:
    """The answer's JSON object (None: not JSON, or not an object)."""
    try:
        value = resp.json()
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def served_model(client, base_url: str, card: TargetCard, attempts: int) -> str:
    """The model id to send in requests; raises unless the endpoint serves the card's target."""
    resp = request(client, "GET", f"{base_url}/v1/models", attempts)
    models = (json_dict(resp) or {}).get("data") or []
    target = str(card.model)
    names = {target, str(Path(target).resolve())} if Path(target).exists() else {target}
    for m in models:
        if m.get("id") in names or m.get("root") in names:
            return m["id"]
    seen = [(m.get("id"), m.get("root")) for m in models]
    raise PreflightError(
        f"{base_url} serves {seen} (id, root), not the target {target!r} of the card"
    )


def vllm_speculative_config(client, base_url: str, attempts: int) -> dict | None:
    """speculative_config from vLLM's /server_info (only with VLLM_SERVER_DEV_MODE=1); None when unavailable."""
    try:
        resp = request(client, "GET", f"{base_url}/server_info?config_format=json", attempts)
    except PreflightError:
        return None
    info = json_dict(resp) if resp.status_code == 200 else None
    if info is None or "vllm_config" not in info:
        return None
    config = info["vllm_config"]
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            return None
    spec = config.get("speculative_config") if isinstance(config, dict) else None
    return spec if isinstance(spec, dict) else {"method": None}


def resolved(path) -> str | None:
    """A path as this machine resolves it (as given where it does not exist here), to compare
    what a server loaded with what params name."""
    return (
        str(Path(path).resolve()) if path and Path(path).exists() else (str(path) if path else None)
    )
