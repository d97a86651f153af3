"""Preflight: every check a server or a draft passes before the stage relies on it; a refusal
raises PreflightError (endpoints) or lists the problems (drafts), with a message that says why.
One family of checks, kept in one file so that what any endpoint or draft must pass reads in one
place (hence longer than 400 lines).

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

Drafts for the benchmark's engines (`preflight_engines`, `check_draft`): the draft's config.json
and its d2t/t2d tensors are read (no weights are loaded), and a configuration that would run but
silently feed the draft the wrong inputs is refused:
- an EAGLE-3 draft served with another algorithm (plain EAGLE passes one hidden state where the
  draft's fc expects three; acceptance collapses to ~1 with no error, SGLang PR #21272);
- aux layer ids or a hidden size that differ from the target card's;
- a draft vocabulary whose d2t/t2d do not fit the target vocabulary.

Aux layer id conventions differ between engines. vLLM's `eagle_aux_hidden_state_layer_ids` (and
the card's) name the hidden state that *enters* decoder layer i (`aux_hidden_states.append(...)`
before `layer(...)` in vllm/model_executor/models/llama.py). SGLang adds one to the ids it reads
from a draft's `eagle_config` ("for the ith layer, it takes the output of the (i-1)th layer",
`set_eagle3_layers_to_capture` in sglang/srt/models/llama.py), so card id = SGLang id + 1.
Without explicit ids both capture the inputs of layers [2, N//2, N-3].
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.checkpoint import SPECULATORS_EAGLE3, DraftFacts, read_draft_facts
from draftline.commands import benchmark_serve_command, draft_path_for

if TYPE_CHECKING:
    from draftline.card import TargetCard
    from draftline.config import BenchmarkConfig


# Varied text (digits, accents, CJK, emoji, code, markup) so that another tokenizer or template
# is very unlikely to give the same count.
PROBE_MESSAGES = [
    {
        "role": "user",
        "content": "Preflight probe: 7 × 8 = 56; naïve café, 東京, 🙂, "
        "`x = [1, 2]`, <b>bold</b> and   spaces.\nDone?",
    }
]


class PreflightError(RuntimeError):
    """An endpoint that must not be used; the message says why."""


# ---- endpoints -----------------------------------------------------------------------------


def _request(client, method: str, url: str, attempts: int, **kwargs):
    """One HTTP call, retried (1 s, 2 s, ...) on connection errors, timeouts, 429 and 5xx."""
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


def _answer(client, method: str, url: str, attempts: int):
    """`_request`, or None when the endpoint never answers (a path this engine does not have)."""
    try:
        return _request(client, method, url, attempts)
    except PreflightError:
        return None


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
    resp = _answer(client, "GET", f"{base_url}/metrics", attempts)
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
        resp = _answer(client, "GET", f"{base_url}{path}", attempts)
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
    if declared in ("vllm", "sglang") and declared not in probe["checked"]:
        how = (
            "/metrics has no vllm: metrics (not vLLM, or started with --disable-log-stats)"
            if declared == "vllm"
            else "/get_server_info has no speculative_algorithm"
        )
        raise PreflightError(
            f"{base_url}: {how}, so it cannot be checked for a draft; check regenerate.external_engine"
        )


def listed_models(client, base_url: str, attempts: int) -> list:
    """The entries of /v1/models ([] when it does not answer with a list)."""
    try:
        resp = _request(client, "GET", f"{base_url}/v1/models", attempts)
        models = resp.json().get("data", []) if resp.status_code == 200 else []
    except (PreflightError, ValueError, AttributeError):
        return []
    return models if isinstance(models, list) else []


def check_not_speculative(client, base_url: str, engine: str, attempts: int) -> dict:
    """What the server says about speculative decoding, probed whatever `engine` declares
    (probe_engine, check_engine); raises PreflightError when it decodes speculatively, answers as
    another engine, or cannot be checked. Returns vLLM: spec_decode_metrics False; SGLang:
    speculative_algorithm None and its model_path."""
    from draftline.config import redact_url

    probe = probe_engine(client, base_url, attempts, listed_models(client, base_url, attempts))
    check_engine(redact_url(base_url), engine, probe)
    if engine == "vllm":
        return {"spec_decode_metrics": False}
    if engine == "sglang":
        return {"speculative_algorithm": None, "model_path": probe.get("model_path")}
    return {}


def preflight_regeneration(
    base_url: str,
    engine: str,
    model_name: str,
    prompt_ids: Callable[[list[dict], list | None], list[int]],
    chat_template_kwargs: dict,
    api_key: str | None = None,
    timeout_s: float = 60,
    attempts: int = 4,
) -> dict:
    """Check one regeneration endpoint before the first request (see the module docstring); returns
    what it saw. prompt_ids(messages, tools): the token ids the target's tokenizer and chat template
    (with chat_template_kwargs) give a conversation's prompt."""
    import httpx

    from draftline.config import redact_url

    shown = redact_url(base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(timeout=timeout_s, headers=headers) as client:
        # transformers serve lists only hub-cached models (none for a local path; HTTP 500 without
        # an HF_HUB_CACHE); it is pinned to the model it was started with and answers 400 to any
        # other name: the probe below checks both.
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

        served = [m.get("id") for m in models if isinstance(m, dict)]
        if served and model_name not in served:
            raise PreflightError(
                f"{shown} serves {served}, not the target {model_name!r} of the card; "
                "point regenerate at the target's server (or set regenerate.served_model_name)"
            )
        seen["served_models"] = served

        expected = prompt_ids(PROBE_MESSAGES, None)
        body = {
            "model": model_name,
            "messages": PROBE_MESSAGES,
            "max_tokens": 1,
            "temperature": 0.0,
        }
        if chat_template_kwargs:
            body["chat_template_kwargs"] = chat_template_kwargs
        resp = _request(client, "POST", f"{base_url}/v1/chat/completions", attempts, json=body)
        if resp.status_code != 200:
            raise PreflightError(
                f"{shown}: the probe request for model {model_name!r} got HTTP {resp.status_code}: "
                f"{resp.text[:300]}"
            )
        counted = (resp.json().get("usage") or {}).get("prompt_tokens")
        if counted != len(expected):
            raise PreflightError(
                f"{shown}: the server counts {counted} prompt tokens for the probe, the target's "
                f"tokenizer and chat template {len(expected)}: it serves another model, tokenizer or "
                "chat template than the card's target"
            )
        seen["probe_prompt_tokens"] = counted

        if engine == "vllm":  # exact ids through vLLM's /tokenize (chat form)
            tok = _request(
                client,
                "POST",
                f"{base_url}/tokenize",
                attempts,
                json={
                    "model": model_name,
                    "messages": PROBE_MESSAGES,
                    "add_generation_prompt": True,
                    **(
                        {"chat_template_kwargs": chat_template_kwargs}
                        if chat_template_kwargs
                        else {}
                    ),
                },
            )
            if tok.status_code == 200:
                if tok.json().get("tokens") != expected:
                    raise PreflightError(
                        f"{shown}: vLLM's /tokenize gives other token ids for the probe than the "
                        "target's tokenizer and chat template"
                    )
                seen["probe_token_ids"] = "match"
    return seen


def _json(resp) -> dict | None:
    try:
        value = resp.json()
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def served_model(client, base_url: str, card: TargetCard, attempts: int) -> str:
    """The model id to send in requests; raises unless the endpoint serves the card's target."""
    resp = _request(client, "GET", f"{base_url}/v1/models", attempts)
    models = (_json(resp) or {}).get("data") or []
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


def preflight_extraction(
    base_url: str,
    card: TargetCard,
    aux_layer_ids: list[int],
    probe_ids: list[int],
    timeout_s: float = 120,
    attempts: int = 3,
    probe_file: bool = True,
) -> dict:
    """Check an already-running vLLM extraction server (see the module docstring); returns what it saw.
    probe_file False (a Mooncake transfer: the states go to a store, not a file) checks the model
    and, where /server_info is on, the speculative config only."""
    import httpx
    from safetensors import safe_open

    with httpx.Client(timeout=timeout_s) as client:
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
        resp = _request(client, "POST", f"{base_url}/v1/completions", attempts, json=body)
        answer = _json(resp) or {}
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
    engine: str,
    role: str,
    base_url: str,
    card: TargetCard,
    draft_path: str | None,
    algorithm: str,
    timeout_s: float = 60,
    attempts: int = 3,
) -> dict:
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
                raise PreflightError(
                    f"{base_url}: SGLang runs speculative_algorithm {info.get('speculative_algorithm')!r}, "
                    f"the benchmark needs {algorithm} for an EAGLE-3 draft"
                )
            if _resolved(info.get("speculative_draft_model_path")) != _resolved(draft_path):
                raise PreflightError(
                    f"{base_url}: SGLang runs draft {info.get('speculative_draft_model_path')!r}, "
                    f"not the one benchmarked ({draft_path})"
                )
            seen["draft"] = "checked"
            return seen
        text = _request(client, "GET", f"{base_url}/metrics", attempts).text
        if "vllm:spec_decode" not in text:
            raise PreflightError(
                f"{base_url}: no vllm:spec_decode metrics, so it does not run speculative decoding "
                "(started without --speculative-config?)"
            )
        spec = vllm_speculative_config(client, base_url, attempts)
        if spec is None:
            seen["draft"] = "unchecked: /server_info needs VLLM_SERVER_DEV_MODE=1"
            return seen
        if str(spec.get("method")).lower() != algorithm.lower():
            raise PreflightError(
                f"{base_url}: vLLM speculative method {spec.get('method')!r}, the benchmark needs "
                f"{algorithm!r} for an EAGLE-3 draft"
            )
        if _resolved(spec.get("model")) != _resolved(draft_path):
            raise PreflightError(
                f"{base_url}: vLLM runs draft {spec.get('model')!r}, not the one benchmarked ({draft_path})"
            )
        seen["draft"] = "checked"
        return seen


def _resolved(path) -> str | None:
    return (
        str(Path(path).resolve()) if path and Path(path).exists() else (str(path) if path else None)
    )


def _check_sglang_model(seen: dict, base_url: str, card: TargetCard) -> None:
    model_path = seen.get("model_path")
    if model_path is not None and _resolved(model_path) != _resolved(card.model):
        raise PreflightError(
            f"{base_url}: SGLang serves {model_path!r}, not the target {card.model!r} of the card"
        )


# ---- drafts and engine settings ------------------------------------------------------------


def engine_aux_ids_as_card(facts: DraftFacts, engine: str, num_layers: int) -> list[int]:
    """The aux layer ids the engine will capture, in the card's (decoder-layer input) convention."""
    if facts.aux_layer_ids is None:
        return [2, num_layers // 2, num_layers - 3]  # both engines' default
    if engine == "sglang" and facts.layout == "eagle":
        return [i + 1 for i in facts.aux_layer_ids]  # SGLang captures the output of layer id
    return list(facts.aux_layer_ids)


def check_draft(card: TargetCard, facts: DraftFacts, engine: str) -> list[str]:
    """Mismatches between a draft and its target that no engine reports; [] when it fits."""
    problems = []
    if facts.algorithm != SPECULATORS_EAGLE3:
        problems.append(f"{facts.path}: not an EAGLE-3 draft (algorithm {facts.algorithm!r})")
    aux = engine_aux_ids_as_card(facts, engine, card.num_layers)
    if sorted(aux) != sorted(card.aux_ids):
        hint = (
            " (SGLang reads eagle_config ids as layer outputs: id = card id - 1)"
            if engine == "sglang"
            else ""
        )
        problems.append(
            f"aux layer ids: the {engine} engine would capture decoder-layer inputs {aux}, "
            f"the target card says {card.aux_ids}{hint}"
        )
    hidden = card.hidden_size
    if facts.target_hidden_size is not None and facts.target_hidden_size != hidden:
        problems.append(
            f"hidden size: the draft expects a target hidden size of {facts.target_hidden_size}, "
            f"the target card says {hidden}"
        )
    if facts.fc_in_features is not None and facts.fc_in_features != 3 * hidden:
        problems.append(
            f"hidden size: the draft's fc takes {facts.fc_in_features} features, EAGLE-3 on this "
            f"target needs 3 x {hidden} = {3 * hidden}"
        )
    problems.extend(check_vocab(card.vocab_size, facts))
    return problems


def check_vocab(target_vocab: int, facts: DraftFacts) -> list[str]:
    """d2t (offsets: target id = i + d2t[i]) and t2d (mask over the target vocab) must agree and fit."""
    problems = []
    if facts.vocab_size is not None and facts.vocab_size != target_vocab:
        problems.append(
            f"vocab: the draft embeds a vocabulary of {facts.vocab_size}, the target has {target_vocab}"
        )
    if facts.d2t is None:
        return problems
    n = len(facts.d2t)
    if facts.draft_vocab_size is not None and facts.draft_vocab_size != n:
        problems.append(f"vocab: draft_vocab_size {facts.draft_vocab_size} but d2t has {n} entries")
    if n > target_vocab:
        problems.append(
            f"vocab: draft vocabulary of {n} is larger than the target's {target_vocab}"
        )
    mapped = [i + off for i, off in enumerate(facts.d2t)]
    outside = [t for t in mapped if not 0 <= t < target_vocab]
    if outside:
        problems.append(
            f"vocab: d2t maps {len(outside)} draft ids outside the target vocabulary [0, {target_vocab}), "
            f"e.g. {outside[:5]}"
        )
    if facts.t2d_len is not None:
        if facts.t2d_len != target_vocab:
            problems.append(
                f"vocab: t2d covers {facts.t2d_len} target ids, the target has {target_vocab}"
            )
        if facts.t2d_count != n:
            problems.append(
                f"vocab: t2d marks {facts.t2d_count} target ids but the draft vocabulary has {n}"
            )
        elif facts.t2d_true is not None and set(mapped) != facts.t2d_true:
            problems.append("vocab: t2d and d2t name different target tokens")
    return problems


def check_engine_settings(engine: str, cfg: BenchmarkConfig, facts: DraftFacts) -> list[str]:
    """The engine's speculative algorithm and checkpoint layout must suit an EAGLE-3 draft."""
    problems = []
    if engine == "vllm":
        if cfg.vllm.method.lower() != "eagle3":
            problems.append(
                f"benchmark.vllm.method: {cfg.vllm.method!r} for an EAGLE-3 draft; it must be 'eagle3' "
                "(vLLM's 'eagle' feeds the draft one hidden state instead of three)"
            )
    elif engine == "sglang":
        if cfg.sglang.algorithm.upper() != "EAGLE3":
            problems.append(
                f"benchmark.sglang.algorithm: {cfg.sglang.algorithm!r} for an EAGLE-3 draft; it must be "
                "'EAGLE3' (with 'EAGLE' the aux hidden states are not captured and acceptance collapses)"
            )
        if facts.layout == "speculators":
            problems.append(
                f"{facts.path} is a speculators checkpoint ({', '.join(facts.architectures) or 'no architectures'}); "
                "SGLang picks the draft class from config.json architectures (LlamaForCausalLMEagle3) and "
                "loads EAGLE-3 drafts in that layout: the benchmark stage exports a draft trained with "
                "train.architecture: eagle3 itself (python -m draftline.sglang_export makes a lasting copy), "
                "or set benchmark.sglang.draft_model_path to such a copy"
            )
    return problems


def preflight_engines(
    card: TargetCard, cfg: BenchmarkConfig, draft_dir: str, sglang_draft: str | None = None
) -> dict:
    """Checks and deployment commands for every benchmark server engine.

    Returns {engine: {"command": str, "problems": [...]}}; the selected engine's problems are
    fatal for the stage, the others' are reported so the deployment command is known to be safe.
    """
    out = {}
    for engine in ("vllm", "sglang"):
        path = draft_path_for(engine, cfg, draft_dir, sglang_draft)
        facts = read_draft_facts(path)
        problems = check_draft(card, facts, engine) + check_engine_settings(engine, cfg, facts)
        out[engine] = {
            "command": shlex.join(benchmark_serve_command(engine, card, cfg, path)),
            "problems": problems,
        }
    return out
