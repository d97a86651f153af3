"""Preflight of live servers: every check an endpoint passes before the stage relies on it; a
refusal raises PreflightError with a message that says why. The static checks of a saved draft
against the target card are in draftline/draft/preflight.py, against the benchmark's engines in
draftline/benchmark/preflight.py.

Regeneration endpoints (`preflight_regeneration`): the server serves the card's target under the
expected name, its tokenizer and chat template count the probe prompt as the target's do, and it
is not speculative. What the server is gets probed whatever params declare: every engine's
evidence is read (vLLM: `vllm:` metrics and `vllm:spec_decode_*`, which exist only with a
speculative config; SGLang: /get_server_info and its `speculative_algorithm`; `owned_by` of
/v1/models), a speculative one is refused, and so is one that answers as another engine than
declared. A draft attached to the server, or another model, would change the data without any error.

Servers already running elsewhere, for the stages that would otherwise start their own: the vLLM
extraction server of `hidden_states` (hidden_states.vllm.endpoint, `preflight_extraction`) and the
baseline and speculative servers of the `vllm` / `sglang` benchmark (benchmark.endpoints,
`preflight_benchmark`). A giant target then loads once per role, not once per stage run:
- it serves the card's target: /v1/models lists it (`id` or vLLM's `root`, the path it loaded), or
  SGLang's /get_server_info `model_path` is it;
- extraction (vLLM): a probe row comes back as a hidden-state file this machine can read, with the
  row's token ids and [L, 4, hidden_size] states (3 aux layers + the last); with
  VLLM_SERVER_DEV_MODE=1 the server's /server_info also shows its speculative_config, whose method
  must be extract_hidden_states and whose layer ids must be the card's aux ids + [N];
- benchmark baseline: not speculative, probed whatever the engine is said to be
  (check_not_speculative);
- benchmark speculative: SGLang's /get_server_info must say EAGLE3 and name the draft being
  benchmarked; vLLM must export spec-decode metrics, and where /server_info is on, its
  speculative_config must be eagle3 with this draft. Without /server_info vLLM does not say which
  draft it runs: the report says so, and a wrong one shows as an acceptance length of ~1.

What each engine adds (the draft it can be checked for, its exact ids, where it says what it
loaded) is its probe's, draftline/engines/probes.py; the HTTP calls are in
draftline/engines/endpoints.py. Longer than a module here usually is: the three endpoint
preflights share one set of probes (what a server is, its models, its tokenizer's count), and
this docstring is the reference of what each one refuses; split apart, each would restate the
others' rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.config import redact_url
from draftline.engines.endpoints import (
    PROBE_MESSAGES,
    PreflightError,
    ServedTarget,
    answer,
    json_dict,
    listed_models,
    request,
    served_model,
    vllm_speculative_config,
)
from draftline.engines.probes import engine_probe

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.engines.probes import EngineProbe


@dataclass(frozen=True)
class ProbeLimits:
    """How long a preflight waits for each answer, and how many times it asks (1 s, 2 s, ...
    between tries) before it gives up on the endpoint."""

    timeout_s: float
    attempts: int


def check_answers(client, base_url: str, attempts: int) -> None:
    """PreflightError naming the endpoint when nothing answers there at all (any answer, a 404
    included, says a server listens), before the probes that would blame the engine instead."""
    try:
        request(client, "GET", f"{base_url}/health", attempts)
    except PreflightError as err:
        why = str(err).split(" (", 1)[-1].rstrip(")")
        raise PreflightError(
            f"{redact_url(base_url)} does not answer ({why}): is the server up, and is the URL "
            "in regenerate.endpoints / benchmark.endpoints right?"
        ) from None


def probe_engine(client, base_url: str, attempts: int, models: list) -> dict:
    """What the server shows of itself, whatever params say it is: the engines it answers as
    ("vllm", "sglang"), which of them could be checked for speculative decoding, and any sign
    that it decodes speculatively.

    vLLM: `vllm:` metrics on /metrics, where `vllm:spec_decode_*` exist only with
    --speculative-config (vllm/v1/spec_decode/metrics.py); a dev-mode /server_info with its
    vllm_config. SGLang: /get_server_info (newer: /server_info) with `speculative_algorithm`;
    `sglang:` metrics. Both: `owned_by` of /v1/models. transformers serve has none of these and
    no speculative mode."""
    engines, checked, speculative, facts = set(), set(), [], {}
    resp = answer(client, "GET", f"{base_url}/metrics", attempts)
    text = resp.text if resp is not None and resp.status_code == 200 else ""
    if re.search(r"^vllm:", text, re.M):
        engines.add("vllm")
        checked.add("vllm")
    if re.search(r"^sglang:", text, re.M):
        engines.add("sglang")
    if spec := sorted(set(re.findall(r"vllm:spec_decode\w*", text))):
        speculative.append(
            f"vLLM metrics {', '.join(spec)} (they exist only with --speculative-config)"
        )
    for path in ("/get_server_info", "/server_info"):
        resp = answer(client, "GET", f"{base_url}{path}", attempts)
        try:
            info = resp.json() if resp is not None and resp.status_code == 200 else None
        except ValueError:
            info = None
        if isinstance(info, dict) and "speculative_algorithm" in info:
            engines.add("sglang")
            checked.add("sglang")
            facts.update(
                speculative_algorithm=info["speculative_algorithm"],
                model_path=info.get("model_path"),
            )
            if info["speculative_algorithm"]:
                speculative.append(
                    f"SGLang speculative_algorithm={info['speculative_algorithm']} "
                    f"(draft {info.get('speculative_draft_model_path')})"
                )
            break
        if isinstance(info, dict) and "vllm_config" in info:  # vLLM with VLLM_SERVER_DEV_MODE
            engines.add("vllm")
            checked.add("vllm")
            found = re.search(r"speculative_config=([^,)]+)", str(info["vllm_config"]))
            if found and found.group(1).strip() != "None":
                speculative.append(f"vLLM /server_info speculative_config={found.group(1).strip()}")
            break
    for entry in models:
        if isinstance(entry, dict) and entry.get("owned_by") in ("vllm", "sglang"):
            engines.add(entry["owned_by"])
    return {
        "engines": sorted(engines),
        "checked": sorted(checked),
        "speculative": speculative,
        **facts,
    }


def check_engine(base_url: str, declared: str, probe: dict) -> None:
    """Refuse a speculative server whatever was declared; refuse one that answers as another
    engine than declared, or that cannot be checked for a draft as the engine it is."""
    if probe["speculative"]:
        raise PreflightError(
            f"{base_url}: the server runs speculative decoding ({'; '.join(probe['speculative'])}); "
            "it must serve the plain target: start it without a draft"
        )
    if probe["engines"] and declared not in probe["engines"]:
        raise PreflightError(
            f"{base_url} answers as {' and '.join(probe['engines'])}, not {declared} as declared "
            "(regenerate.external_engine or benchmark.engine; for a launched server, another "
            "process holds the port); say what it is so the right checks run"
        )
    unchecked = engine_probe(declared).unchecked
    if unchecked and declared not in probe["checked"]:
        raise PreflightError(
            f"{base_url}: {unchecked}, so it cannot be checked for a draft; check "
            "regenerate.external_engine"
        )


def check_not_speculative(client, base_url: str, engine: str, attempts: int) -> dict:
    """What the server says about speculative decoding, probed whatever `engine` declares
    (probe_engine, check_engine); raises PreflightError when it decodes speculatively, answers as
    another engine, or cannot be checked. Returns vLLM: spec_decode_metrics False; SGLang:
    speculative_algorithm None and its model_path."""
    check_answers(client, base_url, attempts)
    probe = probe_engine(client, base_url, attempts, listed_models(client, base_url, attempts))
    check_engine(redact_url(base_url), engine, probe)
    return engine_probe(engine).plain(probe)


def _check_served_name(shown: str, models: list, model_name: str) -> list:
    """The model ids /v1/models lists; raises PreflightError when they do not include model_name
    (an empty list passes: transformers serve may list none)."""
    served = [m.get("id") for m in models if isinstance(m, dict)]
    if served and model_name not in served:
        raise PreflightError(
            f"{shown} serves {served}, not the target {model_name!r} of the card; "
            "point regenerate at the target's server (or set regenerate.served_model_name)"
        )
    return served


def _check_probe_count(
    client, base_url: str, shown: str, target: ServedTarget, expected: list[int], attempts: int
) -> int:
    """The prompt tokens the server counts for the probe chat request; raises PreflightError unless
    the request succeeds and the count is that of `expected`, the target's own ids."""
    body = {
        "model": target.model_name,
        "messages": PROBE_MESSAGES,
        "max_tokens": 1,
        "temperature": 0.0,
    }
    if target.chat_template_kwargs:
        body["chat_template_kwargs"] = target.chat_template_kwargs
    resp = request(client, "POST", f"{base_url}/v1/chat/completions", attempts, json=body)
    if resp.status_code != 200:
        raise PreflightError(
            f"{shown}: the probe request for model {target.model_name!r} got HTTP {resp.status_code}: "
            f"{resp.text[:300]}"
        )
    try:
        answer = resp.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):  # a web page, say: another service on that port
        raise PreflightError(
            f"{shown}: the probe request got HTTP 200 but no chat completion "
            f"({resp.headers.get('content-type', 'no content type')}: {resp.text[:120]!r}); is the "
            "URL in regenerate.endpoints an OpenAI-compatible server?"
        )
    counted = (answer.get("usage") or {}).get("prompt_tokens")
    if counted != len(expected):
        raise PreflightError(
            f"{shown}: the server counts {counted} prompt tokens for the probe, the target's "
            f"tokenizer and chat template {len(expected)}: it serves another model, tokenizer or "
            "chat template than the card's target"
        )
    return counted


def preflight_regeneration(
    base_url: str,
    engine: str,
    target: ServedTarget,
    api_key: str | None = None,
    limits: ProbeLimits = ProbeLimits(60, 4),
) -> dict:
    """Check one regeneration endpoint before the first request (see the module docstring); returns
    what it saw."""
    import httpx

    shown = redact_url(base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    attempts = limits.attempts
    with httpx.Client(timeout=limits.timeout_s, headers=headers) as client:
        # transformers serve lists only hub-cached models (none for a local path; HTTP 500 without
        # an HF_HUB_CACHE); it is pinned to the model it was started with and answers 400 to any
        # other name: the probe below checks both.
        check_answers(client, base_url, attempts)
        models = listed_models(client, base_url, attempts)
        probe = probe_engine(client, base_url, attempts, models)
        check_engine(shown, engine, probe)
        seen = {
            "url": shown,
            "engine": engine,
            "answers_as": probe["engines"] or [engine],
            **{k: v for k, v in probe.items() if k not in ("engines", "checked", "speculative")},
            "speculative": False,
        }
        seen["served_models"] = _check_served_name(shown, models, target.model_name)
        expected = target.prompt_ids(PROBE_MESSAGES, None)
        seen["probe_prompt_tokens"] = _check_probe_count(
            client, base_url, shown, target, expected, attempts
        )
        if engine_probe(engine).same_ids(client, base_url, target, expected, attempts):
            seen["probe_token_ids"] = "match"
    return seen


def preflight_extraction(
    base_url: str,
    card: TargetCard,
    aux_layer_ids: list[int],
    probe_ids: list[int],
    limits: ProbeLimits = ProbeLimits(120, 3),
    probe_file: bool = True,
) -> dict:
    """Check an already-running vLLM extraction server (see the module docstring); returns what it saw.
    probe_file False (a Mooncake transfer: the states go to a store, not a file) checks the model
    and, where /server_info is on, the speculative config only."""
    import httpx
    from safetensors import safe_open

    attempts = limits.attempts
    with httpx.Client(timeout=limits.timeout_s) as client:
        model = served_model(client, base_url, card, attempts)
        seen = {"url": base_url, "model": model}
        spec = vllm_speculative_config(client, base_url, attempts)
        want = [*aux_layer_ids, card.num_layers]
        if spec is not None:
            layers = ((spec.get("draft_model_config") or {}).get("hf_config") or {}).get(
                "eagle_aux_hidden_state_layer_ids"
            ) or spec.get("eagle_aux_hidden_state_layer_ids")
            if spec.get("method") != "extract_hidden_states":
                raise PreflightError(
                    f"{base_url}: speculative_config method {spec.get('method')!r}; extraction needs "
                    "a server started with method extract_hidden_states"
                )
            if layers is not None and list(layers) != want:
                raise PreflightError(
                    f"{base_url}: extracts layers {list(layers)}, the card needs {want} "
                    "(aux layer ids + the last layer)"
                )
            seen["speculative_config"] = "checked"
        if not probe_file:
            return seen
        body = {"model": model, "prompt": probe_ids, "max_tokens": 1, "return_token_ids": True}
        resp = request(client, "POST", f"{base_url}/v1/completions", attempts, json=body)
        answer = json_dict(resp) or {}
        if resp.status_code != 200:
            raise PreflightError(
                f"{base_url}: the probe request got HTTP {resp.status_code}: {resp.text[:300]}"
            )
        path = (answer.get("kv_transfer_params") or {}).get("hidden_states_path")
        if not path:
            raise PreflightError(
                f"{base_url}: the probe's answer has no kv_transfer_params.hidden_states_path: not a "
                "server started for extraction (speculative method extract_hidden_states with "
                "speculators' file connector)"
            )
        file = Path(path)
        if not file.is_file():
            raise PreflightError(
                f"{base_url}: writes hidden states to {path}, which this machine cannot read; its "
                "hidden_states_path must be on a filesystem shared with this stage"
            )
        try:
            with safe_open(str(file), framework="pt") as f:
                token_ids = f.get_tensor("token_ids").tolist()
                shape = list(f.get_slice("hidden_states").get_shape())
        finally:
            file.unlink(missing_ok=True)
        if token_ids != list(probe_ids):
            raise PreflightError(
                f"{base_url}: the probe's hidden-state file holds other token ids than were sent"
            )
        if shape != [len(probe_ids), len(want), card.hidden_size]:
            raise PreflightError(
                f"{base_url}: the probe's hidden states have shape {shape}, the card needs "
                f"[{len(probe_ids)}, {len(want)}, {card.hidden_size}] (layers {want})"
            )
        seen["probe_shape"] = shape
    return seen


def preflight_benchmark(
    probe: EngineProbe,
    base_url: str,
    card: TargetCard,
    draft_path: str | None,
    algorithm: str,
    limits: ProbeLimits = ProbeLimits(60, 3),
) -> dict:
    """Check an already-running benchmark server of the engine `probe` checks: the baseline
    (draft_path None: no draft) or the speculative one (this draft, run with `algorithm`)."""
    import httpx

    role = "speculative" if draft_path else "baseline"
    attempts = limits.attempts
    with httpx.Client(timeout=limits.timeout_s) as client:
        seen = {"url": base_url, "role": role, **probe.served(client, base_url, card, attempts)}
        if role == "speculative":
            return {
                **seen,
                **probe.check_draft(client, base_url, card, draft_path, algorithm, attempts),
            }
        seen.update(check_not_speculative(client, base_url, probe.name, attempts))
        probe.check_target(seen, base_url, card)
        return seen
