"""Each engine's own checks of a live server, one registered class each: what says a server
declared as it can be checked for a draft, what its plain (baseline) server shows, the exact
prompt ids it can give back, the model it serves and the draft it runs. The preflights
(draftline/engines/preflight.py) ask `engine_probe(name)` for regenerate.external_engine and
benchmark.engine alike, and compare no engine's name; draftline/benchmark/engines.py's served
engines each hold theirs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from draftline.core.config import redact_url
from draftline.engines.endpoints import (
    PROBE_MESSAGES,
    PreflightError,
    ServedTarget,
    json_dict,
    request,
    resolved,
    served_model,
    vllm_speculative_config,
)

if TYPE_CHECKING:
    from draftline.core.card import TargetCard


class EngineProbe(Protocol):
    """What a server of one engine is checked with beyond what every server shows
    (draftline/engines/preflight.py `probe_engine`)."""

    name: str
    # why a server declared as this engine, that did not show itself as one, cannot be checked
    # for a draft (None: the engine has no speculative mode to check)
    unchecked: str | None

    def plain(self, probe: dict) -> dict:
        """What a server that passed as not speculative showed of it (probe_engine's facts)."""

    def same_ids(
        self, client, base_url: str, target: ServedTarget, expected: list[int], attempts: int
    ) -> bool:
        """True when the server gave back the probe's exact ids and they are `expected`, False
        when it cannot say; PreflightError when they differ."""

    def served(self, client, base_url: str, card: TargetCard, attempts: int) -> dict:
        """The model id the server answers to, where the engine lists it by what it loaded."""

    def check_target(self, seen: dict, base_url: str, card: TargetCard) -> None:
        """PreflightError when what the server said it loaded (seen) is not the card's target."""

    def check_draft(
        self,
        client,
        base_url: str,
        card: TargetCard,
        draft_path: str,
        algorithm: str,
        attempts: int,
    ) -> dict:
        """What the speculative server runs; PreflightError unless it is this draft, run with
        `algorithm`."""


class Vllm:
    name = "vllm"
    unchecked = "/metrics has no vllm: metrics (not vLLM, or started with --disable-log-stats)"

    def plain(self, probe: dict) -> dict:
        return {"spec_decode_metrics": False}

    def same_ids(
        self, client, base_url: str, target: ServedTarget, expected: list[int], attempts: int
    ) -> bool:
        """Exact ids through vLLM's /tokenize (chat form); False when it does not answer 200."""
        kwargs = target.chat_template_kwargs
        tok = request(
            client,
            "POST",
            f"{base_url}/tokenize",
            attempts,
            json={
                "model": target.model_name,
                "messages": PROBE_MESSAGES,
                "add_generation_prompt": True,
                **({"chat_template_kwargs": kwargs} if kwargs else {}),
            },
        )
        if tok.status_code != 200:
            return False
        if tok.json().get("tokens") != expected:
            raise PreflightError(
                f"{redact_url(base_url)}: vLLM's /tokenize gives other token ids for the probe than the "
                "target's tokenizer and chat template"
            )
        return True

    def served(self, client, base_url: str, card: TargetCard, attempts: int) -> dict:
        return {"model": served_model(client, base_url, card, attempts)}

    def check_target(self, seen: dict, base_url: str, card: TargetCard) -> None:
        """served() checked it already."""

    def check_draft(
        self,
        client,
        base_url: str,
        card: TargetCard,
        draft_path: str,
        algorithm: str,
        attempts: int,
    ) -> dict:
        """spec-decode metrics on /metrics; the method and draft of /server_info where it is on
        (without it vLLM does not say which draft it runs)."""
        text = request(client, "GET", f"{base_url}/metrics", attempts).text
        if "vllm:spec_decode" not in text:
            raise PreflightError(
                f"{base_url}: no vllm:spec_decode metrics, so it does not run speculative decoding "
                "(started without --speculative-config?)"
            )
        spec = vllm_speculative_config(client, base_url, attempts)
        if spec is None:
            return {"draft": "unchecked: /server_info needs VLLM_SERVER_DEV_MODE=1"}
        if str(spec.get("method")).lower() != algorithm.lower():
            raise PreflightError(
                f"{base_url}: vLLM speculative method {spec.get('method')!r}, the benchmark needs "
                f"{algorithm!r} for an EAGLE-3 draft"
            )
        if resolved(spec.get("model")) != resolved(draft_path):
            raise PreflightError(
                f"{base_url}: vLLM runs draft {spec.get('model')!r}, not the one benchmarked ({draft_path})"
            )
        return {"draft": "checked"}


class Sglang:
    name = "sglang"
    unchecked = "/get_server_info has no speculative_algorithm"

    def plain(self, probe: dict) -> dict:
        return {"speculative_algorithm": None, "model_path": probe.get("model_path")}

    def same_ids(
        self, client, base_url: str, target: ServedTarget, expected: list[int], attempts: int
    ) -> bool:
        return False

    def served(self, client, base_url: str, card: TargetCard, attempts: int) -> dict:
        """Nothing yet: its /get_server_info says what it loaded (check_target)."""
        return {}

    def check_target(self, seen: dict, base_url: str, card: TargetCard) -> None:
        model_path = seen.get("model_path")
        if model_path is not None and resolved(model_path) != resolved(card.model):
            raise PreflightError(
                f"{base_url}: SGLang serves {model_path!r}, not the target {card.model!r} of the card"
            )

    def check_draft(
        self,
        client,
        base_url: str,
        card: TargetCard,
        draft_path: str,
        algorithm: str,
        attempts: int,
    ) -> dict:
        """/get_server_info: the target, the algorithm and the draft it runs."""
        info = json_dict(request(client, "GET", f"{base_url}/get_server_info", attempts)) or {}
        seen = {"model_path": info.get("model_path")}
        self.check_target(seen, base_url, card)
        if str(info.get("speculative_algorithm") or "").upper() != algorithm.upper():
            raise PreflightError(
                f"{base_url}: SGLang runs speculative_algorithm {info.get('speculative_algorithm')!r}, "
                f"the benchmark needs {algorithm} for an EAGLE-3 draft"
            )
        if resolved(info.get("speculative_draft_model_path")) != resolved(draft_path):
            raise PreflightError(
                f"{base_url}: SGLang runs draft {info.get('speculative_draft_model_path')!r}, "
                f"not the one benchmarked ({draft_path})"
            )
        return {**seen, "draft": "checked"}


class Plain:
    """An engine with no speculative mode (transformers serve, the built-in batched server):
    nothing beyond what every server shows."""

    unchecked = None

    def __init__(self, name: str):
        self.name = name

    def plain(self, probe: dict) -> dict:
        return {}

    def same_ids(
        self, client, base_url: str, target: ServedTarget, expected: list[int], attempts: int
    ) -> bool:
        return False

    def served(self, client, base_url: str, card: TargetCard, attempts: int) -> dict:
        return {}

    def check_target(self, seen: dict, base_url: str, card: TargetCard) -> None:
        """The probe request's prompt count checks it (preflight_regeneration)."""

    def check_draft(
        self,
        client,
        base_url: str,
        card: TargetCard,
        draft_path: str,
        algorithm: str,
        attempts: int,
    ) -> dict:
        raise PreflightError(f"{base_url}: {self.name} runs no draft to benchmark")


# every engine a stage reaches as a server (regenerate.external_engine, benchmark.engine)
PROBES: dict[str, EngineProbe] = {
    p.name: p for p in (Vllm(), Sglang(), Plain("transformers"), Plain("hf"))
}


def engine_probe(name: str) -> EngineProbe:
    """The probe of the engine `name` (the params schemas allow only these)."""
    return PROBES[name]
