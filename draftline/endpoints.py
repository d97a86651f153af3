"""Servers already running elsewhere, for the stages that would otherwise start their own: the
vLLM extraction server of `hidden_states` (hidden_states.vllm.endpoint) and the baseline and
speculative servers of the `vllm` / `sglang` benchmark (benchmark.endpoints). A giant target then
loads once per role, not once per stage run.

Each endpoint is checked before use, because a server of another model or with another
speculative configuration answers without any error:
- it serves the card's target: /v1/models lists it (`id` or vLLM's `root`, the path it loaded), or
  SGLang's /get_server_info `model_path` is it;
- extraction (vLLM): a probe row comes back as a hidden-state file this machine can read, with the
  row's token ids and [L, 4, hidden_size] states (3 aux layers + the last); with
  VLLM_SERVER_DEV_MODE=1 the server's /server_info also shows its speculative_config, whose method
  must be extract_hidden_states and whose layer ids must be the card's aux ids + [N];
- benchmark baseline: not speculative, probed whatever the engine is said to be
  (serving.check_not_speculative);
- benchmark speculative: SGLang's /get_server_info must say EAGLE3 and name the draft being
  benchmarked; vLLM must export spec-decode metrics, and where /server_info is on, its
  speculative_config must be eagle3 with this draft. Without /server_info vLLM does not say which
  draft it runs: the report says so, and a wrong one shows as an acceptance length of ~1.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftline.serving import PreflightError, _request, check_not_speculative


def _json(resp) -> dict | None:
    try:
        value = resp.json()
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def served_model(client, base_url: str, card: dict, attempts: int) -> str:
    """The model id to send in requests; raises unless the endpoint serves the card's target."""
    resp = _request(client, "GET", f"{base_url}/v1/models", attempts)
    models = (_json(resp) or {}).get("data") or []
    target = str(card["model"])
    names = {target, str(Path(target).resolve())} if Path(target).exists() else {target}
    for m in models:
        if m.get("id") in names or m.get("root") in names:
            return m["id"]
    seen = [(m.get("id"), m.get("root")) for m in models]
    raise PreflightError(f"{base_url} serves {seen} (id, root), not the target {target!r} of the card")


def vllm_speculative_config(client, base_url: str, attempts: int) -> dict | None:
    """speculative_config from vLLM's /server_info (only with VLLM_SERVER_DEV_MODE=1); None when unavailable."""
    try:
        resp = _request(client, "GET", f"{base_url}/server_info?config_format=json", attempts)
    except PreflightError:
        return None
    info = _json(resp) if resp.status_code == 200 else None
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


def preflight_extraction(base_url: str, card: dict, aux_layer_ids: list[int], probe_ids: list[int],
                         timeout_s: float = 120, attempts: int = 3, probe_file: bool = True) -> dict:
    """Check an already-running vLLM extraction server (see the module docstring); returns what it saw.
    probe_file False (a Mooncake transfer: the states go to a store, not a file) checks the model
    and, where /server_info is on, the speculative config only."""
    import httpx
    from safetensors import safe_open

    with httpx.Client(timeout=timeout_s) as client:
        model = served_model(client, base_url, card, attempts)
        seen = {"url": base_url, "model": model}
        spec = vllm_speculative_config(client, base_url, attempts)
        want = [*aux_layer_ids, card["num_layers"]]
        if spec is not None:
            layers = ((spec.get("draft_model_config") or {}).get("hf_config") or {}).get("eagle_aux_hidden_state_layer_ids") \
                or spec.get("eagle_aux_hidden_state_layer_ids")
            if spec.get("method") != "extract_hidden_states":
                raise PreflightError(f"{base_url}: speculative_config method {spec.get('method')!r}; extraction needs "
                                     "a server started with method extract_hidden_states")
            if layers is not None and list(layers) != want:
                raise PreflightError(f"{base_url}: extracts layers {list(layers)}, the card needs {want} "
                                     "(aux layer ids + the last layer)")
            seen["speculative_config"] = "checked"
        if not probe_file:
            return seen
        body = {"model": model, "prompt": probe_ids, "max_tokens": 1, "return_token_ids": True}
        resp = _request(client, "POST", f"{base_url}/v1/completions", attempts, json=body)
        answer = _json(resp) or {}
        if resp.status_code != 200:
            raise PreflightError(f"{base_url}: the probe request got HTTP {resp.status_code}: {resp.text[:300]}")
        path = (answer.get("kv_transfer_params") or {}).get("hidden_states_path")
        if not path:
            raise PreflightError(f"{base_url}: the probe's answer has no kv_transfer_params.hidden_states_path: not a "
                                 "server started for extraction (speculative method extract_hidden_states with "
                                 "speculators' file connector)")
        file = Path(path)
        if not file.is_file():
            raise PreflightError(f"{base_url}: writes hidden states to {path}, which this machine cannot read; its "
                                 "hidden_states_path must be on a filesystem shared with this stage")
        try:
            with safe_open(str(file), framework="pt") as f:
                token_ids = f.get_tensor("token_ids").tolist()
                shape = list(f.get_slice("hidden_states").get_shape())
        finally:
            file.unlink(missing_ok=True)
        if token_ids != list(probe_ids):
            raise PreflightError(f"{base_url}: the probe's hidden-state file holds other token ids than were sent")
        if shape != [len(probe_ids), len(want), card["hidden_size"]]:
            raise PreflightError(f"{base_url}: the probe's hidden states have shape {shape}, the card needs "
                                 f"[{len(probe_ids)}, {len(want)}, {card['hidden_size']}] (layers {want})")
        seen["probe_shape"] = shape
    return seen


def preflight_benchmark(engine: str, role: str, base_url: str, card: dict, draft_path: str | None,
                        algorithm: str, timeout_s: float = 60, attempts: int = 3) -> dict:
    """Check an already-running benchmark server: role "baseline" (no draft) or "speculative" (this draft)."""
    import httpx

    with httpx.Client(timeout=timeout_s) as client:
        seen = {"url": base_url, "role": role}
        if engine == "vllm":
            seen["model"] = served_model(client, base_url, card, attempts)
        if role == "baseline":
            seen.update(check_not_speculative(client, base_url, engine, attempts))
            if engine == "sglang":
                _check_sglang_model(seen, base_url, card)
            return seen
        if engine == "sglang":
            resp = _request(client, "GET", f"{base_url}/get_server_info", attempts)
            info = _json(resp) or {}
            seen["model_path"] = info.get("model_path")
            _check_sglang_model(seen, base_url, card)
            if str(info.get("speculative_algorithm") or "").upper() != algorithm.upper():
                raise PreflightError(f"{base_url}: SGLang runs speculative_algorithm {info.get('speculative_algorithm')!r}, "
                                     f"the benchmark needs {algorithm} for an EAGLE-3 draft")
            if _resolved(info.get("speculative_draft_model_path")) != _resolved(draft_path):
                raise PreflightError(f"{base_url}: SGLang runs draft {info.get('speculative_draft_model_path')!r}, "
                                     f"not the one benchmarked ({draft_path})")
            seen["draft"] = "checked"
            return seen
        text = _request(client, "GET", f"{base_url}/metrics", attempts).text
        if "vllm:spec_decode" not in text:
            raise PreflightError(f"{base_url}: no vllm:spec_decode metrics, so it does not run speculative decoding "
                                 "(started without --speculative-config?)")
        spec = vllm_speculative_config(client, base_url, attempts)
        if spec is None:
            seen["draft"] = "unchecked: /server_info needs VLLM_SERVER_DEV_MODE=1"
            return seen
        if str(spec.get("method")).lower() != algorithm.lower():
            raise PreflightError(f"{base_url}: vLLM speculative method {spec.get('method')!r}, the benchmark needs "
                                 f"{algorithm!r} for an EAGLE-3 draft")
        if _resolved(spec.get("model")) != _resolved(draft_path):
            raise PreflightError(f"{base_url}: vLLM runs draft {spec.get('model')!r}, not the one benchmarked ({draft_path})")
        seen["draft"] = "checked"
        return seen


def _resolved(path) -> str | None:
    return str(Path(path).resolve()) if path and Path(path).exists() else (str(path) if path else None)


def _check_sglang_model(seen: dict, base_url: str, card: dict) -> None:
    model_path = seen.get("model_path")
    if model_path is not None and _resolved(model_path) != _resolved(card["model"]):
        raise PreflightError(f"{base_url}: SGLang serves {model_path!r}, not the target {card['model']!r} of the card")
