"""The probe stage's work: what would fail only after regeneration, tried before it starts.

- **train.init against the card** (`check_init_fits`): the checks the train stage makes when it
  loads the checkpoint (draftline/draft/pretrained.py: hidden size, target vocabulary, decoder layers vs
  train.num_layers, aux layer ids unless train.init_remap_aux_layers, its norms vs
  train.architecture or what the speculators CLI can set), on the config training will see
  (an EAGLE/SpecForge checkpoint as speculators' converter builds it) without loading weights;
  its d2t / t2d against the target vocabulary (draftline/draft/preflight.py `check_vocab`); and
  its draft vocabulary size against vocab.draft_vocab_size when it is not remapped. Seconds.
- **vLLM extraction of this target** (`probe_extraction`), when a vLLM path is configured:
  hidden_states.backend vllm (offline) runs the hidden_states stage's own path
  (draftline/hidden_states/extract.py `run_vllm`: `vllm serve` with extract_hidden_states, or
  hidden_states.vllm.endpoint after its preflight, then speculators' generate-offline-data) on one
  short chat prompt and checks the file it leaves: the prompt's token ids and [L, 4, H] states.
  hidden_states.mode online with train.backend speculators starts the server the train stage
  would (draftline/hidden_states/online_server.py, or hidden_states.online.endpoint) and
  sends it the same probe the trainers' server is checked with (draftline/engines/preflight.py
  `preflight_extraction`; with the Mooncake transfer only the model and, where shown, the
  speculative config are checked: the states go to the store). It costs one start of the server
  (a giant target: its full load), so a pass is recorded under a key of the card, the
  settings and the code that decide it (`extraction_key`) and not repeated while they stay the
  same; hidden_states.vllm.probe: false skips it. The probing itself is
  draftline/probe/extraction.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from draftline.core.card import TargetCard
from draftline.core.derivation import pins
from draftline.core.io import read_json, write_json
from draftline.core.shaping import CODE_CHANGED, shaping_fingerprint
from draftline.draft.checkpoint import architecture_of, read_draft_facts
from draftline.draft.init_checks import InitMismatch, init_weights_problem, read_init_config
from draftline.draft.preflight import check_vocab
from draftline.engines.config import vllm_engine
from draftline.probe.extraction import ProbeFailed, probe_offline, probe_online, probe_prompt_ids

if TYPE_CHECKING:
    from draftline.hidden_states.config import HiddenStatesConfig
    from draftline.train.config import TrainConfig

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- train.init against the card


def check_init_config(cfg: TrainConfig, card: TargetCard, config) -> tuple[list[str], str | None]:
    """(remaps allowed, architecture): the checks of a train.init config against the card and
    train.*: shapes and aux ids (check_init_target), norms vs train.architecture, and norms the
    speculators CLI can set when that is the backend."""
    # these load torch on first use: the probe stays light until a check needs them
    from draftline.draft.pretrained import check_architecture, check_init_target

    remaps = check_init_target(config, card, cfg.num_layers, cfg.init_remap_aux_layers)
    check_architecture(config, cfg.architecture)
    architecture = cfg.architecture or architecture_of(config)
    if cfg.backend == "speculators" and architecture is None:
        raise InitMismatch(
            "train.init: its norms (fc_norm, or a mix of norm_before_residual / norm_before_fc / "
            "norm_output) are ones speculators' train CLI cannot set; fine-tune it with "
            "train.backend: builtin"
        )
    return remaps, architecture


def check_init_fits(cfg: TrainConfig, card: TargetCard, draft_vocab_size: int) -> dict:
    """What the train stage would refuse about train.init, found now; raises InitMismatch naming the
    param to change. A hub id's config is fetched and checked first, its weights (in which d2t
    lives; train needs them anyway) only once that passes. Returns what was checked."""
    from draftline.draft.pretrained import fetch_init_config, init_config, resolve_init

    if not Path(cfg.init).is_dir():
        config_only = fetch_init_config(cfg.init)
        check_init_config(cfg, card, init_config(config_only, card, cfg.init_convert)[0])
    path = resolve_init(cfg.init)
    read_init_config(path)  # its config, then its weights, named before anything reads them
    if problem := init_weights_problem(path):
        raise InitMismatch(f"train.init: {problem}")
    config, init_d2t = init_config(path, card, cfg.init_convert)
    remaps, architecture = check_init_config(cfg, card, config)
    facts = read_draft_facts(path)
    problems = check_vocab(card.vocab_size, facts)
    if problems:
        raise InitMismatch("train.init: " + "; ".join(problems))
    theirs = len(init_d2t) if init_d2t is not None else card.vocab_size
    if init_d2t is None and config.draft_vocab_size != card.vocab_size:
        raise InitMismatch(
            f"train.init: its config says a draft vocabulary of {config.draft_vocab_size} tokens "
            "but it has no d2t to map them to target tokens"
        )
    warnings = []
    if not cfg.init_remap_vocab:
        if theirs != draft_vocab_size:
            raise InitMismatch(
                f"train.init: its draft vocabulary has {theirs} tokens, vocab.draft_vocab_size is "
                f"{draft_vocab_size}; the train stage needs the same vocabulary: set "
                "train.init_remap_vocab: true (lm_head rows matched by target token id) or "
                f"vocab.draft_vocab_size: {theirs}"
            )
        if theirs < card.vocab_size:
            warnings.append(
                f"train.init has its own draft vocabulary ({theirs} of {card.vocab_size} tokens); "
                "the vocab stage picks ours from the regenerated data, and the train stage stops "
                "unless they are the same tokens: set train.init_remap_vocab: true to match them"
            )
    else:
        remaps.append(f"vocab remapped at train: {theirs} -> {draft_vocab_size} tokens")
    return {
        "path": str(path),
        "layout": facts.layout,
        "hidden_size": config.transformer_layer_config.hidden_size,
        "target_vocab_size": config.transformer_layer_config.vocab_size,
        "draft_vocab_size": theirs,
        "num_layers": config.transformer_layer_config.num_hidden_layers,
        "aux_layer_ids": list(config.eagle_aux_hidden_state_layer_ids or []) or None,
        "architecture": architecture,
        "remaps": remaps,
        "warnings": warnings,
    }


# ---------------------------------------------------------------- vLLM extraction


def extraction_path(hs: HiddenStatesConfig, train_backend: str) -> str | None:
    """Which vLLM path will extract the states: offline (hidden_states.backend vllm), online (mode
    online with train.backend speculators), or None (none: the target runs in-process)."""
    if hs.mode == "offline" and hs.backend == "vllm":
        return "offline"
    if hs.mode == "online" and train_backend == "speculators":
        return "online"
    return None


# where and how fast the work runs: a change to one of these never decides whether extraction works
KEY_SKIPS = {
    "vllm": {
        "host",
        "port",
        "concurrency",
        "request_timeout_s",
        "max_retries",
        "startup_timeout_s",
        "probe",
    },
    "online": {"request_timeout_s", "max_retries"},
}


def extraction_key(card: TargetCard, hs: HiddenStatesConfig, path: str) -> str:
    """sha256 of what decides whether `path` extracts this target: the card, the format and dtype,
    the vLLM settings (interpreter, endpoint, parallelism, memory, context length, extra arguments),
    online the transfer, and the code that runs and checks the extraction (SHAPES["probe"] of
    draftline/core/shaping.py). The interpreter is engines.vllm.python of ./params.yaml, resolved
    (the one every vLLM launch of the run reads: draftline/engines/config.py vllm_engine)."""
    settings = {
        "code": shaping_fingerprint("probe"),
        # what the vLLM path runs with: the vLLM environment's pins (CPU and CUDA builds) and the
        # packages here that shape the check (draftline/core/derivation.py)
        "pins": pins("probe", vllm=True),
        # ...and the interpreter that has vLLM: another one is another vLLM, whatever the pins of
        # the project's vLLM environment say
        "interpreter": vllm_engine().resolved_python(),
        "path": path,
        "format": hs.format,
        "dtype": hs.dtype,
        "vllm": {k: v for k, v in hs.vllm.model_dump().items() if k not in KEY_SKIPS["vllm"]},
    }
    if path == "online":
        online = hs.online.model_dump()
        settings["online"] = {k: v for k, v in online.items() if k not in KEY_SKIPS["online"]}
    blob = json.dumps({"card": card.to_dict(), "settings": settings}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def probe_extraction(
    hs: HiddenStatesConfig,
    train: TrainConfig,
    card: TargetCard,
    previous: dict | None,
    log_path: Path,
) -> dict:
    """The extraction part of the report: skipped (no vLLM path, or hidden_states.vllm.probe
    false), passed before under the same key (previous: the last report's extraction part), or
    probed now. Raises ProbeFailed."""
    path = extraction_path(hs, train.backend)
    if path is None:
        return {"path": None, "probed": False, "why": "no vLLM extraction configured"}
    if not hs.vllm.probe:
        return {"path": path, "probed": False, "why": "hidden_states.vllm.probe: false"}
    key, code = extraction_key(card, hs, path), shaping_fingerprint("probe")
    if previous and previous.get("key") == key and previous.get("passed"):
        log.info(f"probe: vLLM extraction ({path}) passed before for this card and these settings")
        return {**previous, "probed": False, "why": "passed before with the same key"}
    if previous and previous.get("passed") and previous.get("shaping_code") not in (None, code):
        log.info(f"probe: vLLM extraction passed before, but {CODE_CHANGED}: probing again")
    ids = probe_prompt_ids(card)
    log.info(f"probe: one {len(ids)}-token row through the {path} vLLM extraction path")
    with tempfile.TemporaryDirectory(prefix="draftline_probe_") as tmp:
        run = probe_offline if path == "offline" else probe_online
        seen = run(hs, card, ids, Path(tmp), log_path)
    # shaping_code: the code's share of the key, so that a rerun can say why it probes again
    return {
        "path": path,
        "probed": True,
        "key": key,
        "shaping_code": code,
        "passed": True,
        "seen": seen,
    }


STAMP = "train.init and vLLM extraction fit the target: checked by stages/probe.py.\n"


class Paths(NamedTuple):
    card: Path  # models/target/card.json
    report: Path  # reports/probe.json: what was checked; the extraction pass's key
    stamp: Path  # reports/probe_passed.txt: the same text for every pass


def run(params, paths: Paths) -> dict:
    """Stage `probe`: train.init checked against the card, and one row extracted through the
    configured vLLM path (once per card and settings); the report, written to paths.report, whose
    `error` says what failed. The stamp is written when nothing did."""
    card = TargetCard.load(paths.card)
    previous = read_json(paths.report) if paths.report.exists() else {}
    # a refusal of train.init keeps the last extraction pass: fixing it must not re-probe vLLM
    report = {"init": None, "extraction": previous.get("extraction"), "error": None}
    try:
        if params.train.init:
            report["init"] = check_init_fits(params.train, card, params.vocab.draft_vocab_size)
            for warning in report["init"]["warnings"]:
                log.warning(f"probe: warning: {warning}")
        report["extraction"] = probe_extraction(
            params.hidden_states,
            params.train,
            card,
            previous.get("extraction"),
            paths.report.with_suffix(".vllm.log"),
        )
    except InitMismatch as err:
        report["error"] = str(err)
    except ProbeFailed as err:
        report["extraction"] = None
        report["error"] = (
            f"hidden_states: vLLM could not extract this target's states: {err}\n(the server "
            "command and its log are above; a GPU held by another server, e.g. a kept-running "
            "regeneration server, fails this too; hidden_states.vllm.probe: false skips the probe)"
        )
    write_json(paths.report, report)
    if not report["error"] and (not paths.stamp.exists() or paths.stamp.read_text() != STAMP):
        paths.stamp.parent.mkdir(parents=True, exist_ok=True)
        paths.stamp.write_text(STAMP)
    return report
