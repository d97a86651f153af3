"""Serving engines for the benchmark: preflight checks, serve commands, server-side acceptance.

Preflight reads the draft's config.json and its d2t/t2d tensors (no weights are loaded) and refuses
a configuration that would run but silently feed the draft the wrong inputs:
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

Server-side acceptance:
- vLLM (vllm/v1/spec_decode/metrics.py, SpecDecodingProm): Prometheus counters
  `vllm:spec_decode_num_drafts`, `vllm:spec_decode_num_draft_tokens`,
  `vllm:spec_decode_num_accepted_tokens`, `vllm:spec_decode_num_accepted_tokens_per_pos`
  (label `position`), exported with a `_total` suffix and labels model_name/engine. Mean
  acceptance length = 1 + accepted / drafts; per-position rate = accepted_per_pos / drafts.
- SGLang (TokenizerManager, meta_info of each finished request): `completion_tokens`,
  `spec_verify_ct`; acceptance length = completion_tokens / spec_verify_ct (SGLang's own
  `spec_accept_length`); newer versions add `spec_accept_histogram` (verify steps by number of
  accepted drafts), from which per-position rates follow.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from draftline.checkpoint import DraftFacts, read_draft_facts

SPECULATORS_EAGLE3 = "eagle3"


def engine_aux_ids_as_card(facts: DraftFacts, engine: str, num_layers: int) -> list[int]:
    """The aux layer ids the engine will capture, in the card's (decoder-layer input) convention."""
    if facts.aux_layer_ids is None:
        return [2, num_layers // 2, num_layers - 3]  # both engines' default
    if engine == "sglang" and facts.layout == "eagle":
        return [i + 1 for i in facts.aux_layer_ids]  # SGLang captures the output of layer id
    return list(facts.aux_layer_ids)


def check_draft(card: dict, facts: DraftFacts, engine: str) -> list[str]:
    """Mismatches between a draft and its target that no engine reports; [] when it fits."""
    problems = []
    if facts.algorithm != SPECULATORS_EAGLE3:
        problems.append(f"{facts.path}: not an EAGLE-3 draft (algorithm {facts.algorithm!r})")
    aux = engine_aux_ids_as_card(facts, engine, card["num_layers"])
    if sorted(aux) != sorted(card["aux_layer_ids"]):
        hint = " (SGLang reads eagle_config ids as layer outputs: id = card id - 1)" if engine == "sglang" else ""
        problems.append(f"aux layer ids: the {engine} engine would capture decoder-layer inputs {aux}, "
                        f"the target card says {card['aux_layer_ids']}{hint}")
    hidden = card["hidden_size"]
    if facts.target_hidden_size is not None and facts.target_hidden_size != hidden:
        problems.append(f"hidden size: the draft expects a target hidden size of {facts.target_hidden_size}, "
                        f"the target card says {hidden}")
    if facts.fc_in_features is not None and facts.fc_in_features != 3 * hidden:
        problems.append(f"hidden size: the draft's fc takes {facts.fc_in_features} features, EAGLE-3 on this "
                        f"target needs 3 x {hidden} = {3 * hidden}")
    problems.extend(check_vocab(card["vocab_size"], facts))
    return problems


def check_vocab(target_vocab: int, facts: DraftFacts) -> list[str]:
    """d2t (offsets: target id = i + d2t[i]) and t2d (mask over the target vocab) must agree and fit."""
    problems = []
    if facts.vocab_size is not None and facts.vocab_size != target_vocab:
        problems.append(f"vocab: the draft embeds a vocabulary of {facts.vocab_size}, the target has {target_vocab}")
    if facts.d2t is None:
        return problems
    n = len(facts.d2t)
    if facts.draft_vocab_size is not None and facts.draft_vocab_size != n:
        problems.append(f"vocab: draft_vocab_size {facts.draft_vocab_size} but d2t has {n} entries")
    if n > target_vocab:
        problems.append(f"vocab: draft vocabulary of {n} is larger than the target's {target_vocab}")
    mapped = [i + off for i, off in enumerate(facts.d2t)]
    outside = [t for t in mapped if not 0 <= t < target_vocab]
    if outside:
        problems.append(f"vocab: d2t maps {len(outside)} draft ids outside the target vocabulary [0, {target_vocab}), "
                        f"e.g. {outside[:5]}")
    if facts.t2d_len is not None:
        if facts.t2d_len != target_vocab:
            problems.append(f"vocab: t2d covers {facts.t2d_len} target ids, the target has {target_vocab}")
        if facts.t2d_count != n:
            problems.append(f"vocab: t2d marks {facts.t2d_count} target ids but the draft vocabulary has {n}")
        elif facts.t2d_true is not None and set(mapped) != facts.t2d_true:
            problems.append("vocab: t2d and d2t name different target tokens")
    return problems


def check_engine_settings(engine: str, cfg, facts: DraftFacts) -> list[str]:
    """The engine's speculative algorithm and checkpoint layout must suit an EAGLE-3 draft."""
    problems = []
    if engine == "vllm":
        if cfg.vllm.method.lower() != "eagle3":
            problems.append(f"benchmark.vllm.method: {cfg.vllm.method!r} for an EAGLE-3 draft; it must be 'eagle3' "
                            "(vLLM's 'eagle' feeds the draft one hidden state instead of three)")
    elif engine == "sglang":
        if cfg.sglang.algorithm.upper() != "EAGLE3":
            problems.append(f"benchmark.sglang.algorithm: {cfg.sglang.algorithm!r} for an EAGLE-3 draft; it must be "
                            "'EAGLE3' (with 'EAGLE' the aux hidden states are not captured and acceptance collapses)")
        if facts.layout == "speculators":
            problems.append(f"{facts.path} is a speculators checkpoint ({', '.join(facts.architectures) or 'no architectures'}); "
                            "SGLang picks the draft class from config.json architectures (LlamaForCausalLMEagle3) and "
                            "loads EAGLE-3 drafts in that layout: the benchmark stage exports a draft trained with "
                            "train.architecture: eagle3 itself (python -m draftline.sglang_export makes a lasting copy), "
                            "or set benchmark.sglang.draft_model_path to such a copy")
    return problems


def sglang_steps(cfg) -> tuple[int, int, int]:
    """(num_steps, eagle_topk, num_draft_tokens); a chain (topk 1) verifies num_steps + 1 tokens."""
    steps = cfg.sglang.num_steps or cfg.k
    topk = cfg.sglang.eagle_topk
    draft_tokens = cfg.sglang.num_draft_tokens or (steps + 1 if topk == 1 else steps * topk + 1)
    return steps, topk, draft_tokens


def serve_command(engine: str, card: dict, cfg, draft_path: str | None, port: int | None = None) -> list[str]:
    """The server command line; draft_path None gives the non-speculative baseline. `port` (else
    benchmark.port); with neither, no --port: the engine's default (the deployment command)."""
    host, port = cfg.host, cfg.port if port is None else port
    revision = ["--revision", card["revision"]] if card.get("revision") else []
    revision += ["--trust-remote-code"] if card.get("trust_remote_code") else []
    model = str(Path(card["model"]).resolve()) if Path(card["model"]).exists() else card["model"]  # hub id or local dir
    where = ["--host", host] + (["--port", str(port)] if port else [])
    if engine == "vllm":
        cmd = [*cfg.vllm.launcher, model, *revision, *where, *cfg.vllm.args]
        if draft_path:
            spec = {"method": cfg.vllm.method, "model": draft_path, "num_speculative_tokens": cfg.k, **cfg.vllm.speculative_config}
            cmd += ["--speculative-config", json.dumps(spec)]
        return cmd
    if engine == "sglang":
        cmd = [*cfg.sglang.launcher, "--model-path", model, *revision, *where, *cfg.sglang.args]
        if draft_path:
            steps, topk, draft_tokens = sglang_steps(cfg)
            cmd += ["--speculative-algorithm", cfg.sglang.algorithm, "--speculative-draft-model-path", draft_path,
                    "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
                    "--speculative-num-draft-tokens", str(draft_tokens)]
        return cmd
    raise ValueError(f"benchmark.engine: no server command for engine {engine!r}")


def draft_path_for(engine: str, cfg, draft_dir: str, sglang_draft: str | None = None) -> str:
    """The draft directory an engine serves: for SGLang benchmark.sglang.draft_model_path, else the
    stage's export of the draft (sglang_draft), else the draft itself (refused by check_engine_settings)."""
    if engine == "sglang" and (cfg.sglang.draft_model_path or sglang_draft):
        return str(Path(cfg.sglang.draft_model_path or sglang_draft).resolve())
    return str(Path(draft_dir).resolve())


def preflight(card: dict, cfg, draft_dir: str, sglang_draft: str | None = None) -> dict:
    """Checks and deployment commands for every server engine.

    Returns {engine: {"command": str, "problems": [...]}}; the selected engine's problems are
    fatal for the stage, the others' are reported so the deployment command is known to be safe.
    """
    out = {}
    for engine in ("vllm", "sglang"):
        path = draft_path_for(engine, cfg, draft_dir, sglang_draft)
        facts = read_draft_facts(path)
        problems = check_draft(card, facts, engine) + check_engine_settings(engine, cfg, facts)
        out[engine] = {"command": shlex.join(serve_command(engine, card, cfg, path)), "problems": problems}
    return out


# ---- server-side acceptance ----------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of a Prometheus text exposition: (name, labels, value); comments skipped."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(m.group(2) or "")}
        try:
            samples.append((m.group(1), labels, float(m.group(3))))
        except ValueError:
            continue
    return samples


def vllm_spec_counters(metrics_text: str) -> dict | None:
    """Summed spec-decode counters (all engines) from vLLM's /metrics; None when there are none."""
    base = "vllm:spec_decode_num_"
    totals = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0}
    per_pos: dict[int, float] = {}
    found = False
    for name, labels, value in parse_prometheus(metrics_text):
        if not name.startswith(base) or name.endswith("_created"):
            continue
        key = name[len(base):].removesuffix("_total")
        if key == "accepted_tokens_per_pos":
            pos = int(labels.get("position", 0))
            per_pos[pos] = per_pos.get(pos, 0.0) + value
            found = True
        elif key in totals:
            totals[key] += value
            found = True
    if not found:
        return None
    return {**totals, "accepted_per_pos": per_pos}


def vllm_acceptance(before: dict | None, after: dict | None) -> dict | None:
    """Acceptance between two counter snapshots (vLLM's own formulas)."""
    if after is None:
        return None
    before = before or {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0, "accepted_per_pos": {}}
    drafts = after["drafts"] - before["drafts"]
    accepted = after["accepted_tokens"] - before["accepted_tokens"]
    draft_tokens = after["draft_tokens"] - before["draft_tokens"]
    if drafts <= 0:
        return {"drafts": 0}
    positions = sorted(after["accepted_per_pos"])
    return {
        "drafts": int(drafts),
        "acceptance_length": round(1 + accepted / drafts, 4),
        "draft_acceptance_rate": round(accepted / draft_tokens, 4) if draft_tokens else None,
        "position_acceptance": {str(p + 1): round((after["accepted_per_pos"][p] - before["accepted_per_pos"].get(p, 0.0)) / drafts, 4)
                                for p in positions},
    }


def sglang_acceptance(meta_infos: list[dict]) -> dict | None:
    """Acceptance over finished SGLang requests' meta_info; None when none carries spec counters."""
    with_spec = [m for m in meta_infos if m.get("spec_verify_ct")]
    if not with_spec:
        return None
    tokens = sum(int(m.get("completion_tokens", 0)) for m in with_spec)
    verifies = sum(int(m["spec_verify_ct"]) for m in with_spec)
    out = {"drafts": verifies, "acceptance_length": round(tokens / verifies, 4)}
    histograms = [m["spec_accept_histogram"] for m in with_spec if m.get("spec_accept_histogram")]
    if histograms:  # hist[a] = verify steps that accepted a draft tokens
        width = max(len(h) for h in histograms)
        hist = [sum(h[a] for h in histograms if a < len(h)) for a in range(width)]
        steps = sum(hist)
        out["position_acceptance"] = {str(p): round(sum(hist[p:]) / steps, 4) for p in range(1, width)}
    return out
