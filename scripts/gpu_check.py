"""The GPU check: every CUDA path of the pipeline, run for real on one GPU, summed up in one JSON.

    bash scripts/gpu_check.sh                                  # CUDA host: install what is missing, then this
    python scripts/gpu_check.py --device cpu --out /tmp/gpu_check.json   # the CPU dry run (tests/test_gpu_check.py)

Runs the stages directly, each with its command in dvc.yaml (`python -m stages.<name> <paths>`,
no DVC), in a work directory with its own params.yaml (the repository's, with the overrides of PROFILES for the device):

  target (tiny, trained on the device; or a copy of models/target when present) -> prepare, mix
  (the bundled samples) -> tokenize -> vocab -> hidden_states (hf, bf16) -> train (builtin: bf16
  autocast, flex attention, fused loss on CUDA) -> evaluate (bf16, near-tie rule) -> benchmark (hf,
  device_map auto); then the VARIANTS: train with backend speculators (`torchrun -m
  speculators.train`, one GPU, one epoch); hidden_states + train with format fp8; and with mode online

There is no regenerate stage (it needs a server): the bundled samples' own answers, made by the
generator the tiny target learned from, stand in for the regenerated ones. Checks beside the
stages, as in the CPU tests: the stored last hidden state through the target's norm and lm_head
gives the target's argmax (near-ties of the stored dtype counted); each trained draft loads with
Eagle3DraftModel.from_pretrained; evaluate found the speculative output equal to greedy on every
prompt (near-ties counted). A stage that fails is recorded with its first error and the next one
runs; one whose input is missing is recorded as skipped. Each stage has a time limit within
--budget-s, so the whole check ends in time.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the checks use the library of this checkout, as the stages do

# Overrides of params.yaml per device. cuda: the default tiny target and data, on the GPU.
# cpu: the dry run, a few tiny steps of every stage (tests/test_gpu_check.py runs it).
PROFILES = {
    "cuda": {
        "target.tiny.device": "cuda",
        "hidden_states.device": "cuda",
        "hidden_states.dtype": "bfloat16",
        "train.device": "cuda",
        "evaluate.engine": "hf",  # the GPU paths of the built-in engine (no vLLM wheel on the bare host)
        "evaluate.device": "cuda",
        "evaluate.dtype": "bfloat16",
        "benchmark.engine": "hf",
        "benchmark.dtype": "bfloat16",
        "benchmark.device_map": "auto",  # the loader path of a target spread over GPUs (accelerate)
    },
    "cpu": {
        "samples": 40,
        "target.aux_layer_ids": [1, 2, 3],
        "target.tiny": {
            "layers": 4,
            "hidden_size": 64,
            "heads": 4,
            "kv_heads": 2,
            "intermediate_size": 128,
            "vocab_size": 320,
            "corpus_conversations": 300,
            "train_steps": 20,
            "batch_size": 8,
            "seq_len": 64,
            "device": "cpu",
        },
        "mix.eval_samples": 3,
        # rows of the 320-token tokenizer run past 256 tokens: at 256 too many were cut, which the
        # tokenize stage refuses (tokenize.max_truncated_share)
        "tokenize.max_length": 512,
        "vocab.draft_vocab_size": 128,
        "hidden_states.device": "cpu",
        "train.device": "cpu",
        "train.epochs": 1,
        "train.pack_len": 512,
        "evaluate.engine": "hf",  # head_dim 16: not a size vLLM's CPU attention runs
        "evaluate.device": "cpu",
        "evaluate.dtype": "bfloat16",
        "evaluate.max_new_tokens": 12,
        "benchmark.engine": "hf",
        "benchmark.device": "cpu",
        "benchmark.prompts": 2,
        "benchmark.warmup": 0,
        "benchmark.repeats": 1,
        "benchmark.max_new_tokens": 12,
    },
}
# Runs beside the main one, each in a directory of the work directory named after it, with its own
# params.yaml (the main one with these overrides) and outputs, and links to the main run's inputs:
# name -> (overrides, linked paths).
VARIANTS = {
    # speculators' trainer through the train.backend: speculators hand-off (torchrun, one GPU)
    "speculators": (
        {
            "train.backend": "speculators",
            "train.gpus": 1,
            "train.epochs": 1,
            "train.num_workers": 2,
        },
        ["models/target", "models/vocab", "datasets/tokenized", "datasets/hidden_states"],
    ),
    # states stored in hs-connectors' FP8 layout, read back by the trainer through FP8Transfer
    "fp8": (
        {"hidden_states.format": "fp8", "train.epochs": 1},
        ["models/target", "models/vocab", "datasets/tokenized"],
    ),
    # no stored states: the trainer runs the target on every packed batch
    "online": (
        {"hidden_states.mode": "online", "train.epochs": 1},
        ["models/target", "models/vocab", "datasets/tokenized"],
    ),
}
# Seconds each stage may take at most on the GPU (the dry run shares --budget-s alone).
STAGE_LIMITS = {
    "target": 150,
    "tokenize": 60,
    "hidden_states": 120,
    "train": 240,
    "evaluate": 150,
    "benchmark": 150,
    "train_speculators": 240,
    "hidden_states_fp8": 90,
    "train_fp8": 180,
    "hidden_states_online": 60,
    "train_online": 180,
}


@dataclass
class Stage:
    name: str
    argv: list[str]  # python -m stages.<module> <paths>, relative to the work directory
    needs: list[str] = field(default_factory=list)  # files or directories an earlier stage writes
    cwd: str = "."  # relative to the work directory (its params.yaml is the one read); `needs` are relative to it
    cuda_only: bool = False


# The stages of dvc.yaml the check runs, in order, each with dvc.yaml's own command. Not run:
# check_params (the check's params are validated before: test_the_check_params_validate), probe
# and regenerate (they need a server) and evaluate@dev (evaluate@eval's path again).
DVC_STAGES = (
    "target",
    "prepare",
    "mix",
    "tokenize",
    "vocab",
    "hidden_states",
    "train",
    "evaluate",
    "benchmark",
)
# What the check writes itself instead of a stage: the regenerated conversations (stand_in_regenerated).
STAND_INS = ("datasets/regenerated",)
# The variants' runs: (name, the dvc.yaml stage, the variant's directory, CUDA only).
VARIANT_RUNS = (
    ("train_speculators", "train", "speculators", True),
    ("hidden_states_fp8", "hidden_states", "fp8", False),
    ("train_fp8", "train", "fp8", False),
    ("hidden_states_online", "hidden_states", "online", False),
    ("train_online", "train", "online", False),
)


# A foreach stage over fixed items in dvc.yaml: the one item the check runs
FOREACH_ITEM = {"evaluate": "eval"}  # dev is the same path on other prompts


def fill(text: str, key: str | None, item: dict | None = None) -> str:
    """A foreach template with `${key}` and `${item.<field>}` filled in."""
    if key is not None:
        text = text.replace("${key}", key)
    for field_name, value in (item or {}).items():
        text = text.replace("${item." + field_name + "}", str(value))
    return text


def dvc_command(spec: dict, key: str | None = None, item: dict | None = None) -> list[str]:
    """A dvc.yaml stage's `python -m stages.<name> ...` as argv after `-m`; a foreach stage for
    the item `key`, without DVC's wiring of the dataset's source (`--source-dep`, optional)."""
    cmd = fill(spec["cmd"], key, item)
    argv = shlex.split(cmd)
    if "--source-dep" in argv:
        del argv[argv.index("--source-dep") : argv.index("--source-dep") + 2]
    if argv[:2] != ["python", "-m"] or "${" in cmd.split("--source-dep")[0]:
        raise ValueError(f"dvc.yaml: not a `python -m stages.<name>` command: {spec['cmd']!r}")
    return argv[2:]


def dvc_paths(entries: list, key: str | None, item: dict | None = None) -> list[str]:
    paths = [e if isinstance(e, str) else next(iter(e)) for e in entries]
    return [fill(p, key, item) for p in paths]


def pipeline(datasets: list[str], repo: Path = REPO) -> list[Stage]:
    """Every stage the check runs, in order, from dvc.yaml: its command, and as `needs` the deps
    an earlier stage of the check writes. The variants come last: when the time budget runs
    short, they are what is skipped."""
    specs = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]
    written, stages = list(STAND_INS), []
    for name in DVC_STAGES:
        spec = specs[name]
        if name in FOREACH_ITEM:
            key = FOREACH_ITEM[name]
            runs = [(name, spec["do"], key, spec["foreach"][key])]
        elif "foreach" in spec:
            runs = [(f"{name}@{d}", spec["do"], d, None) for d in datasets]
        else:
            runs = [(name, spec, None, None)]
        for label, stage, key, item in runs:
            needs = [
                dep
                for dep in dvc_paths(stage.get("deps", []), key, item)
                if any(
                    dep == w or w.startswith(dep + "/") or dep.startswith(w + "/") for w in written
                )
            ]
            stages.append(Stage(label, dvc_command(stage, key, item), needs))
            written += dvc_paths(stage.get("outs", []) + stage.get("metrics", []), key, item)
    by_name = {stage.name: stage for stage in stages}
    stages += [
        Stage(label, by_name[name].argv, by_name[name].needs, cwd=cwd, cuda_only=cuda)
        for label, name, cwd, cuda in VARIANT_RUNS
    ]
    return stages


# ---------------------------------------------------------------- the work directory


def set_key(params: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        params = params.setdefault(key, {})
    if isinstance(value, dict) and isinstance(params.get(leaf), dict):
        params[leaf] = {**params[leaf], **value}
    else:
        params[leaf] = value


def check_params(repo: Path, device: str) -> dict:
    """The repository's params.yaml with the device's overrides; local dataset paths made absolute."""
    params = yaml.safe_load((repo / "params.yaml").read_text())
    for key, value in PROFILES[device].items():
        set_key(params, key, value)
    for spec in params["datasets"].values():
        if "path" in spec and (repo / spec["path"]).exists():
            spec["path"] = str((repo / spec["path"]).resolve())
    return params


def write_params(directory: Path, params: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def prepare_work(work: Path, repo: Path, device: str, target: str) -> tuple[dict, str]:
    """A fresh work directory with params.yaml; returns (params, how the target is obtained)."""
    if work.exists():
        shutil.rmtree(work)
    params = check_params(repo, device)
    write_params(work, params)
    for name, (overrides, links) in VARIANTS.items():
        variant = copy.deepcopy(params)
        for key, value in overrides.items():
            set_key(variant, key, value)
        write_params(work / name, variant)
        # The card names the target by a path relative to the work directory ("models/target"),
        # which a variant's stages (and torchrun's workers) resolve from their own directory.
        for rel in links:
            (work / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / name / rel).symlink_to(
                Path("../" * len(Path(rel).parts) + rel), target_is_directory=True
            )
    source = target
    if target == "auto":
        source = (
            str(repo / "models" / "target")
            if (repo / "models" / "target" / "card.json").is_file()
            else "build"
        )
    if (
        source != "build"
    ):  # a built target: its card names the model "models/target", relative to the work directory
        if not (Path(source) / "card.json").is_file():
            raise SystemExit(
                f"error: --target {source}: no card.json there (run the target stage first)"
            )
        shutil.copytree(source, work / "models" / "target")
    return params, source


def stand_in_regenerated(work: Path) -> int:
    """The bundled samples' own answers as the regenerated conversations (no server runs here)."""
    src = work / "datasets" / "prompts" / "train.jsonl"
    dst = work / "datasets" / "regenerated" / "conversations.jsonl"
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return sum(1 for line in src.read_text().splitlines() if line.strip())


# ---------------------------------------------------------------- running one stage


def first_error(log: str) -> str:
    """The stage's own `error:` line and the exception that ended the first traceback (under
    torchrun the trainer's own, before the stage reports the failure); else the last line."""
    lines = [re.sub(r"^\[rank\d+\]:\s?", "", line.rstrip()) for line in log.splitlines()]
    stated = next((line.strip() for line in lines if line.startswith("error:")), None)
    exception = None
    if "Traceback (most recent call last):" in lines:
        for line in lines[lines.index("Traceback (most recent call last):") + 1 :]:
            if line and not line.startswith((" ", "\t")):
                exception = line.strip()
                break
    found = [x for x in (stated, exception) if x]
    if not found:
        found = [next((line.strip() for line in reversed(lines) if line.strip()), "no output")]
    return (
        found[0]
        if len(found) == 1 or found[1] in found[0]
        else f"{found[0]} (first exception: {found[1]})"
    )[:2000]


def run_stage(stage: Stage, work: Path, env: dict, limit_s: float, log_dir: Path) -> dict:
    cwd = work / stage.cwd
    cmd = [sys.executable, "-m", *stage.argv]
    log_path = log_dir / f"{stage.name.replace('@', '_')}.log"
    record = {"name": stage.name, "command": " ".join(cmd[1:]), "log": str(log_path)}
    began = time.perf_counter()
    with open(log_path, "w") as log:
        # its own process group: a stage past its limit goes with every process it started (torchrun's workers)
        # DVC_STAGE as DVC sets it: the stage leaves its run record (timings) in reports/machine/
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=dict(env, DVC_STAGE=stage.name),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    record["seconds"] = round(time.perf_counter() - began, 2)
    if code == 0:
        record["status"] = "ok"
    else:
        record["status"] = "failed"
        text = log_path.read_text(errors="replace")
        record["error"] = f"timed out after {limit_s:.0f} s" if code is None else first_error(text)
        record["exit_code"] = code
    return record


def read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def run_facts(sub: Path, stage: Stage, report: str) -> dict:
    """The figures of the stage's run kept out of its hashed report (timings), from its run
    record (draftline/core/machine.py)."""
    record = read(sub / "reports" / "machine" / f"{stage.name}.json")
    return (record.get("run_facts") or {}).get(report) or {}


def stage_numbers(stage: Stage, work: Path, seconds: float) -> dict:
    """tokens/s, acceptance length and speedup, from the reports the stage wrote."""
    sub = work / stage.cwd
    reports, module = sub / "reports", stage.argv[0]
    if module == "stages.target":
        card = read(sub / "models" / "target" / "card.json")
        return {
            k: v
            for k, v in (card.get("tiny_training") or {}).items()
            if k in ("final_train_loss", "train_steps")
        }
    if module == "stages.tokenize":
        rep = read(reports / "tokenize.json")
        return {"rows": rep.get("rows"), "tokens": rep.get("tokens")}
    if module == "stages.hidden_states":
        rep = read(reports / "hidden_states.json")
        return {
            "tokens_per_s": run_facts(sub, stage, "hidden_states.json").get("tokens_per_s"),
            "tokens": rep.get("tokens_extracted_now"),
            "mode": rep.get("mode"),
            "format": rep.get("format"),
            "bytes_per_token": rep.get("bytes_per_token"),
        }
    if module == "stages.train":
        rep = read(reports / "train.detail.json")  # the metrics file has the headline only
        out = {
            "val_tau_sim": rep.get("val_tau_sim"),
            "best_epoch": rep.get("best_epoch"),
            "steps": rep.get("steps"),
            "step_seconds": run_facts(sub, stage, "train.detail.json").get("step_seconds"),
            "hidden_states": rep.get("hidden_states_format"),
            "hidden_states_mode": rep.get("hidden_states_mode"),
        }
        tokens = read(work / "reports" / "tokenize.json").get("tokens")
        epochs = yaml.safe_load((sub / "params.yaml").read_text())["train"]["epochs"]
        if (
            tokens and seconds
        ):  # whole stage wall time: data loading, compilation and validation included
            out["tokens_per_s"] = round(tokens * epochs / seconds, 1)
        return out
    if module == "stages.evaluate":
        rep = read(reports / "acceptance.detail.json")
        out = {
            k: rep.get(k)
            for k in (
                "acceptance_length",
                "tau_sim",
                "prompts",
                "lossless_checked_prompts",
                "near_tie_divergences",
                "near_tie_share",
            )
        }
        if rep.get("generated_tokens") and seconds:
            out["tokens_per_s"] = round(
                rep["generated_tokens"] / seconds, 1
            )  # wall time, greedy and speculative
        return out
    if module == "stages.benchmark":
        rep = read(reports / "benchmark.detail.json")
        return {
            k: rep.get(k)
            for k in (
                "baseline_tokens_per_s",
                "speculative_tokens_per_s",
                "speedup",
                "acceptance_length",
                "outputs_identical",
                "device",
            )
        }
    return {}


# ---------------------------------------------------------------- correctness checks


def check_last_state(sub: Path, device: str, rows: int = 8) -> dict:
    """The stored last hidden state, read back as the trainer reads it, through the target's norm
    and lm_head gives the target's own argmax. bf16: every disagreement must be a near-tie flip
    (a runner-up of the target's whose logit is within the stored dtype's tie tolerance of the
    argmax's: draftline.evaluate.acceptance.near_tie_flip, the rule evaluate applies). fp8 rounds coarser:
    away from such flips the argmax must hold on at least 99% of the positions (as
    tests/hidden_states/test_hidden.py asks)."""
    import torch
    from safetensors.torch import load_file

    from draftline.core.card import TargetCard
    from draftline.core.config import TIE_TOLERANCE
    from draftline.evaluate.acceptance import near_tie_flip
    from draftline.hidden_states import capture
    from draftline.hidden_states import formats as hs_format
    from draftline.targets.model import load_target_model

    card = TargetCard.load(sub / "models" / "target" / "card.json")
    hs_dir = sub / "datasets" / "hidden_states"
    cfg = yaml.safe_load((sub / "params.yaml").read_text())["hidden_states"]
    fmt, stored_dtype = cfg.get("format", "bf16"), cfg["dtype"]
    tolerance = TIE_TOLERANCE[stored_dtype]
    compute = (
        capture.DTYPES[stored_dtype] if device == "cuda" else torch.float32
    )  # as the stage computed them
    model = load_target_model(card, device, compute)
    norm = capture.decoder_parts(model)[1]
    positions = mismatches = near_ties = clear = 0
    files = sorted(hs_dir.glob("hs_*.safetensors"), key=lambda p: int(p.stem.split("_")[1]))[:rows]
    if not files:
        raise FileNotFoundError(f"no hidden-state files in {hs_dir}")
    with torch.no_grad():
        for path in files:
            data = load_file(str(path))
            ids = data["token_ids"].to(device).unsqueeze(0)  # (1, L)
            ref = model(input_ids=ids).logits[0].float()  # (L, V)
            last = hs_format.decode(data, torch.float32)[:, 3].to(
                device, compute
            )  # (L, H), pre-norm
            ours = model.lm_head(norm(last)).float()
            best = ref.max(dim=-1)
            chosen = ours.argmax(-1)  # (L,)
            chosen_gap = best.values - ref.gather(-1, chosen[:, None])[:, 0]
            flip = near_tie_flip(chosen, best.indices, chosen_gap, tolerance)  # (L,)
            differ = chosen != best.indices
            top2 = ref.topk(2, dim=-1).values
            gap = top2[:, 0] - top2[:, 1]
            positions += ids.shape[1]
            clear += int((gap > tolerance).sum())
            near_ties += int(flip.sum())
            mismatches += int((differ & ~flip).sum())
    passed = mismatches == 0 if fmt == "bf16" else mismatches <= 0.01 * clear
    return {
        "passed": passed,
        "format": fmt,
        "rows": len(files),
        "positions": positions,
        "mismatches": mismatches,
        "near_ties": near_ties,
        "near_tie_share": round(near_ties / positions, 4),
        "tie_tolerance": tolerance,
        "stored_dtype": hs_format.storage_name(fmt, stored_dtype),
    }


def check_draft_loads(draft_dir: Path, card_path: Path) -> dict:
    """speculators' from_pretrained (the class its config names) takes the saved draft as it is,
    for our target's aux layers."""
    from speculators.model import SpeculatorModel

    from draftline.core.card import TargetCard

    card = TargetCard.load(card_path)

    model = SpeculatorModel.from_pretrained(str(draft_dir))
    aux = list(
        getattr(model.config, "eagle_aux_hidden_state_layer_ids", None)
        or model.config.aux_hidden_state_layer_ids
    )
    problems = [] if aux == card.aux_ids else [f"aux layer ids {aux} != card {card.aux_ids}"]
    return {
        "passed": not problems,
        "class": type(model).__name__,
        "draft_vocab_size": model.config.draft_vocab_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "problems": problems,
    }


def check_methods(sub: Path, device: str) -> dict:
    """P-EAGLE and DFlash (train.method) through the builtin loop on this device, on the train
    stage's own data: one epoch each (flex attention and bf16 autocast on CUDA, as train runs
    them), a finite loss, and the saved draft loaded back by speculators' from_pretrained."""
    import math

    from speculators.model import SpeculatorModel

    from draftline.core.card import TargetCard
    from draftline.draft.model import build_draft, save_draft
    from draftline.train.config import TrainConfig
    from draftline.train.data import TrainingData
    from draftline.train.resume import seed_everything
    from draftline.train.run import train_draft

    params = yaml.safe_load((sub / "params.yaml").read_text())["train"]
    card = TargetCard.load(sub / "models" / "target" / "card.json")
    data = TrainingData(sub / "datasets" / "tokenized", sub / "datasets" / "hidden_states")
    attn = "eager" if device == "cpu" else "simple_flex_attention"
    results, problems = {}, []
    for method in ("peagle", "dflash"):
        # the methods' defaults on a GPU; fewer sampled anchors in the CPU dry run, where a dense
        # mask over DFlash's 512 blocks makes a step the slowest of the run
        anchors = {} if device != "cpu" else {"max_anchors": 64}
        cfg = TrainConfig(
            method=method,
            epochs=1,
            device=device,
            pack_len=params.get("pack_len", 2048),
            peagle=anchors,
            dflash=anchors,
        )
        seed_everything(0)
        model = build_draft(card, sub / "models" / "vocab", cfg, attn).to(device)
        started = time.perf_counter()
        result = train_draft(model, cfg, data, device)
        val = result["history"][-1]["val"]
        out = sub / "models" / f"draft_{method}"
        fields = save_draft(model, out)
        loaded = SpeculatorModel.from_pretrained(str(out))
        results[method] = {
            "seconds": round(time.perf_counter() - started, 1),
            "val_loss": val["loss"],
            "val_tau_sim": val["tau_sim"],
            "loaded_class": type(loaded).__name__,
            "vllm": {k: fields[k] for k in ("vllm_method", "parallel_drafting")},
        }
        if not math.isfinite(val["loss"]):
            problems.append(f"{method}: val loss {val['loss']}")
        if type(loaded).__name__ != type(model).__name__:
            problems.append(f"{method}: from_pretrained gave {type(loaded).__name__}")
    return {"passed": not problems, "methods": results, "problems": problems}


def check_lossless(work: Path) -> dict:
    """evaluate fails on any divergence from greedy that is not a near-tie flip, and past
    evaluate.max_near_tie_share of them; its report says how many prompts were equal to greedy
    token for token and how many were excused as near-ties (draftline.evaluate.acceptance.lossless_summary)."""
    rep = read(work / "reports" / "acceptance.detail.json")
    if not rep:
        raise FileNotFoundError("reports/acceptance.detail.json missing: evaluate did not finish")
    near = rep["near_tie_divergences"]
    passed = rep["lossless_checked_prompts"] + near == rep["prompts"] > 0
    return {
        "passed": passed,
        "prompts": rep["prompts"],
        "checked": rep["lossless_checked_prompts"],
        "near_tie_divergences": near,
        "near_tie_share": rep.get("near_tie_share"),
    }


def run_check(name: str, fn, *args) -> dict:
    began = time.perf_counter()
    try:
        result = fn(*args)
    except Exception as err:  # a broken check is a finding, not the end of the run
        result = {"passed": False, "error": f"{type(err).__name__}: {err}"[:2000]}
    result["seconds"] = round(time.perf_counter() - began, 2)
    print(f"gpu_check: check {name}: {'passed' if result['passed'] else 'FAILED'}", flush=True)
    return {"name": name, **result}


# ---------------------------------------------------------------- the run


def environment(device: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    info = {
        "machine": platform.node(),
        "python": platform.python_version(),
        "device": device,
        "versions": {},
        "c_compiler": shutil.which("cc") or shutil.which("gcc"),
    }  # Triton builds its launcher with it (flex attention, fused loss)
    for dist in (
        "torch",
        "triton",
        "transformers",
        "speculators",
        "hs-connectors",
        "datasets",
        "dvclive",
        "safetensors",
        "pyarrow",
    ):
        try:
            info["versions"][dist] = version(dist)
        except PackageNotFoundError:
            info["versions"][dist] = None
    try:
        import torch

        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
            info["cuda"] = torch.version.cuda
    except Exception as err:  # recorded: the stages will say more
        info["torch_error"] = f"{type(err).__name__}: {err}"
    return info


def write_report(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument(
        "--out", default=str(REPO / "reports" / "gpu_check.json"), help="the JSON written"
    )
    parser.add_argument(
        "--work",
        default=None,
        help="work directory (replaced); default: a fresh one under the temp dir",
    )
    parser.add_argument(
        "--target",
        default="auto",
        help="auto (models/target when it has a card, else build), build, or a directory",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=540,
        help="the whole check stops starting stages past this",
    )
    parser.add_argument(
        "--installed",
        default=None,
        help="file listing what gpu_check.sh installed (recorded in the JSON)",
    )
    args = parser.parse_args(argv)
    args.out = str(Path(args.out).resolve())  # before the run moves into the work directory

    began = time.perf_counter()
    work = Path(
        args.work or Path(os.environ.get("TMPDIR", "/tmp")) / f"draftline-gpu-check-{args.device}"
    ).resolve()
    params, target_source = prepare_work(work, REPO, args.device, args.target)
    log_dir = work / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    os.chdir(work)  # the checks load the card's target path ("models/target") as the stages do
    os.environ["HF_HUB_OFFLINE"] = "1"  # local paths only: never wait on the hub
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        PATH=os.pathsep.join(
            [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
        ),  # torchrun beside python
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    if args.device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")  # torch's thread pool spins on a busy small host
    report = {
        "environment": environment(args.device),
        "work": str(work),
        "target": target_source,
        "installed": Path(args.installed).read_text().split() if args.installed else [],
        "stages": [],
        "checks": [],
    }
    print(
        f"gpu_check: {args.device} on {report['environment']['machine']}, work directory {work}",
        flush=True,
    )
    if args.device == "cuda" and not report["environment"].get("cuda_available"):
        report.update(passed=False, failed=["environment"], error="no CUDA device visible to torch")
        write_report(Path(args.out), report)
        raise SystemExit(
            f"error: --device cuda but torch sees no CUDA device; report in {args.out}"
        )

    def remaining() -> float:
        return args.budget_s - (time.perf_counter() - began)

    for stage in pipeline(list(params["datasets"])):
        if stage.name == "target" and target_source != "build":
            report["stages"].append(
                {"name": "target", "status": "reused", "source": target_source, "seconds": 0.0}
            )
            continue
        if stage.name == "tokenize" and (work / "datasets" / "prompts" / "train.jsonl").is_file():
            report["regenerated_stand_in"] = {
                "conversations": stand_in_regenerated(work),
                "source": "the bundled samples' answers (no regeneration server runs here)",
            }
        missing = [p for p in stage.needs if not (work / stage.cwd / p).exists()]
        if stage.cuda_only and args.device != "cuda":
            record = {
                "name": stage.name,
                "status": "skipped",
                "reason": "needs a CUDA GPU (train.backend speculators)",
            }
        elif missing:
            record = {
                "name": stage.name,
                "status": "skipped",
                "reason": f"input missing (an earlier stage failed): {missing[0]}",
            }
        elif remaining() < 10:
            record = {
                "name": stage.name,
                "status": "skipped",
                "reason": f"time budget of {args.budget_s:.0f} s spent",
            }
        else:
            limit = (
                min(STAGE_LIMITS.get(stage.name, 60), remaining())
                if args.device == "cuda"
                else remaining()
            )
            print(f"gpu_check: {stage.name} (at most {limit:.0f} s)", flush=True)
            record = run_stage(stage, work, env, limit, log_dir)
            if record["status"] == "ok":
                record.update(
                    {
                        k: v
                        for k, v in stage_numbers(stage, work, record["seconds"]).items()
                        if v is not None
                    }
                )
            else:
                print(f"gpu_check: {stage.name} failed: {record['error']}", flush=True)
        report["stages"].append(record)
        if record["status"] not in ("ok", "reused"):
            continue
        sub, module = work / stage.cwd, stage.argv[0]
        suffix = "" if stage.cwd == "." else f"_{stage.cwd}"
        mode = yaml.safe_load((sub / "params.yaml").read_text())["hidden_states"].get(
            "mode", "offline"
        )
        if module == "stages.hidden_states" and mode == "offline":
            report["checks"].append(
                run_check(
                    f"last_state_reproduces_target_argmax{suffix}",
                    check_last_state,
                    sub,
                    args.device,
                )
            )
        if module == "stages.train":
            report["checks"].append(
                run_check(
                    f"draft_loads_with_from_pretrained{suffix}",
                    check_draft_loads,
                    sub / "models" / "draft",
                    work / "models" / "target" / "card.json",
                )
            )
            if stage.cwd == ".":  # the methods on the main variant's data, once
                report["checks"].append(
                    run_check("methods_train_and_load", check_methods, sub, args.device)
                )
        if module == "stages.evaluate":
            report["checks"].append(run_check("speculative_equals_greedy", check_lossless, work))

    report["total_seconds"] = round(time.perf_counter() - began, 1)
    failed = [s["name"] for s in report["stages"] if s["status"] == "failed"]
    failed += [c["name"] for c in report["checks"] if not c["passed"]]
    skipped = [s["name"] for s in report["stages"] if s["status"] == "skipped"]
    report["passed"] = not failed and all(
        s["status"] in ("ok", "reused") or s.get("reason", "").startswith("needs a CUDA")
        for s in report["stages"]
    )
    report["failed"], report["skipped"] = failed, skipped
    by_name = {s["name"]: s for s in report["stages"]}
    report["summary"] = {  # the headline numbers; each stage's record has the rest
        "acceptance_length": by_name.get("evaluate", {}).get("acceptance_length"),
        "speedup": by_name.get("benchmark", {}).get("speedup"),
        "hidden_states_tokens_per_s": by_name.get("hidden_states", {}).get("tokens_per_s"),
        "train_tokens_per_s": by_name.get("train", {}).get("tokens_per_s"),
        "total_seconds": report["total_seconds"],
    }
    out = Path(args.out)
    write_report(out, report)
    print(
        f"gpu_check: {'passed' if report['passed'] else 'FAILED'} in {report['total_seconds']} s; "
        f"failed {failed or 'none'}, skipped {skipped or 'none'}; {out}",
        flush=True,
    )
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
