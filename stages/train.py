"""Stage `train`: the EAGLE-3 draft (speculators' Eagle3DraftModel), from scratch or fine-tuned.

    python -m stages.train models/target/card.json models/vocab datasets/tokenized \
        datasets/hidden_states models/draft reports/train.json models/draft_checkpoints

Small CPU variant: `dvc exp run -S train.epochs=1 -S train.pack_len=1024`.

models/draft is a persist output too: it is replaced only once a run has trained its successor.
backend builtin: our loop on CPU (float32) or one GPU (bf16 autocast). Its resume state lives in
models/draft_checkpoints/, a `persist: true` output: DVC neither deletes it before a run nor
loses it when a run dies, so a killed `dvc repro` continues from the last saved step. A finished
run leaves only last_run.json there. backend speculators: runs `torchrun -m speculators.train`
(command in reports/train/command.txt) with its checkpoints in models/draft_checkpoints/speculators
(speculators resumes from them itself), then keeps the epoch with the best validation tau_sim.

Writes models/draft/ in speculators format (loads with Eagle3DraftModel.from_pretrained; vLLM serves
it with "method": "eagle3") plus meta.json; per-epoch loss, per-position accuracy and tau_sim go
to dvclive (reports/train/, see `dvc plots show`). The kept weights are those of the epoch with
the best validation tau_sim, not the lowest loss.
"""

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from draftline.card import TargetCard
from draftline.config import stage_params
from draftline.threads import apply_thread_policy


def refuse_own_output_as_init(init: str | None, out_dir: Path) -> None:
    if init is None:
        return
    init_path, out = Path(init).resolve(), out_dir.resolve()
    if init_path == out or out in init_path.parents:
        raise SystemExit(f"error: train.init: {init} is this stage's own output, which a train run replaces; "
                         "copy a previous draft elsewhere (e.g. models/init/) and point to it")


def epoch_logger(live):
    def log(record):
        for split in ("train", "val"):
            if record.get(split) is None:
                continue
            live.log_metric(f"{split}/loss", record[split]["loss"])
            live.log_metric(f"{split}/tau_sim", record[split]["tau_sim"])
            for k, acc in enumerate(record[split]["position_accuracy"]):
                live.log_metric(f"{split}/position_accuracy/acc_{k}", acc)
        live.next_step()
        val = record["val"]
        print(f"epoch {record['epoch']}: val loss {val['loss']:.4f}  tau_sim {val['tau_sim']:.3f}  "
              f"acc {val['position_accuracy']}", flush=True)
    return log


PROGRESS_EVERY_S = 30.0


def step_reporter(every_s: float = PROGRESS_EVERY_S, clock=time.monotonic, out=print):
    """progress(p) for train_draft: a line at the first step, then every `every_s` seconds and at the
    last step of each epoch: steps, tokens/s and the ETA of the epoch and of the run (a CPU epoch
    can take minutes; the per-epoch line alone left the log silent that long)."""
    seen = {"last": None, "first_step": 0}

    def progress(p: dict) -> None:
        now = clock()
        if seen["last"] is None:
            seen["first_step"] = p["step"] - 1  # a resumed run times its own steps only
        elif now - seen["last"] < every_s and p["epoch_step"] < p["epoch_steps"]:
            return
        seen["last"] = now
        per_step = p["seconds"] / max(p["step"] - seen["first_step"], 1)
        tokens_per_s = p["tokens"] / p["seconds"] if p["seconds"] > 0 else 0.0
        out(f"train: epoch {p['epoch'] + 1}/{p['epochs']} step {p['epoch_step']}/{p['epoch_steps']} "
            f"(step {p['step']} of {p['total_steps']}), {tokens_per_s:,.0f} tok/s, "
            f"epoch ETA {clock_text(per_step * (p['epoch_steps'] - p['epoch_step']))}, "
            f"run ETA {clock_text(per_step * (p['total_steps'] - p['step']))} (validation aside)", flush=True)

    return progress


def clock_text(seconds: float) -> str:
    minutes, sec = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{sec:02d}"


def online_states(card, source: dict, device: str):
    """hidden_states.mode online: the target on the train device (float32 on CPU, bf16 on a GPU, as
    extraction computes), the aux ids and the storage dtype of the format the states would have."""
    import torch

    from draftline import draft, hs_format
    from draftline.target import load_target_model

    target = load_target_model(card, device, torch.float32 if device == "cpu" else torch.bfloat16)
    target.eval()
    target.requires_grad_(False)
    storage = hs_format.storage_dtype(source["format"], (source.get("params") or {}).get("dtype", "bfloat16"))
    return draft.OnlineStates(target, card["aux_layer_ids"], storage)


def run_builtin(cfg, card, paths, init_dir, data_sha, init_sha, log, source: dict):
    from draftline import draft
    from draftline.config import resolve_device

    device = resolve_device(cfg.device)
    fingerprint = draft.run_fingerprint(cfg.model_dump(), card, data_sha, init_sha, device)
    attn = "eager" if device == "cpu" else "simple_flex_attention"
    shape = dict(speculative_tokens=cfg.speculative_tokens, train_embeddings=cfg.train_embeddings,
                 train_lm_head=cfg.train_lm_head)
    # before seeding: loading the target must not move the RNG the draft is built and trained with
    online = online_states(card, source, device) if source["mode"] == "online" else None
    draft.seed_everything(cfg.seed)
    if init_dir is None:
        model = draft.build_draft(card, paths["vocab"], cfg.num_layers, cfg.ttt_steps, attn, **shape,
                                  architecture=cfg.architecture or "speculators")
        notes = []
    else:
        model, notes = draft.load_init_draft(init_dir, card, paths["vocab"], cfg.num_layers, cfg.ttt_steps, attn, **shape,
                                             remap_aux=cfg.init_remap_aux_layers, remap_vocab=cfg.init_remap_vocab,
                                             architecture=cfg.architecture)
        for note in notes:
            print(f"train.init remap: {note}")
    result = draft.train_draft(model, cfg, paths["tokenized"], paths["hs"], device,
                               state_dir=paths["state"], fingerprint=fingerprint, log=log, online=online,
                               progress=step_reporter())
    return model, result, notes


def online_vllm(card, paths, source: dict) -> tuple:
    """hidden_states.mode online with backend speculators: (a function port -> the `vllm serve`
    command to launch, or None for an external endpoint; the /v1 endpoint of an external server,
    or the base URL to launch on, port 0 = a free one chosen at start; the staging directory of
    the file/fp8 transfer)."""
    from draftline.commands import vllm_extract_command
    from draftline.servers import server_url

    online, params = source["online"], source.get("params") or {}
    transfer = online.get("transfer") or ("fp8" if source["format"] == "fp8" else "file")
    # default staging in the train stage's own state dir: files under datasets/hidden_states would
    # change the hidden_states stage's output behind DVC's back
    staging = None if transfer == "mooncake" else Path(online.get("staging_dir") or paths["state"] / "online_staging").resolve()
    if online.get("endpoint"):
        return None, online["endpoint"], staging
    from datasets import load_from_disk

    v = params.get("vllm") or {}
    longest = max(load_from_disk(str(paths["tokenized"])).with_format(None)["seq_len"])
    host = v.get("host") or "127.0.0.1"

    def serve(port: int) -> list[str]:
        return vllm_extract_command(v.get("python") or sys.executable, card["model"], card.get("revision"),
                                    card["aux_layer_ids"], card["num_layers"], staging, host, port,
                                    params.get("dtype", "bfloat16"), v.get("tensor_parallel_size", 1),
                                    v.get("max_model_len") or longest + 1, v.get("gpu_memory_utilization", 0.9),
                                    v.get("extra_args", []), transfer=transfer, mooncake=online.get("mooncake"),
                                    trust_remote_code=card.get("trust_remote_code", False))
    return serve, server_url(host, v.get("port")), staging


def run_speculators(cfg, card, paths, init_dir, log, live_dir: Path, source: dict):
    import torch

    from draftline import draft

    nproc = cfg.gpus or torch.cuda.device_count()
    if nproc < 1:
        raise SystemExit("error: train.backend: speculators needs CUDA GPUs (none visible); use backend builtin")
    notes = []
    if init_dir is not None:  # checked and re-targeted (verifier, aux ids, vocab remaps) as in the builtin loop
        model, notes = draft.load_init_draft(init_dir, card, paths["vocab"], cfg.num_layers, cfg.ttt_steps,
                                             speculative_tokens=cfg.speculative_tokens, train_embeddings=cfg.train_embeddings,
                                             remap_aux=cfg.init_remap_aux_layers, remap_vocab=cfg.init_remap_vocab,
                                             architecture=cfg.architecture)
        init_dir = paths["state"] / "init_retargeted"
        model.save_pretrained(init_dir)
    architecture = cfg.architecture or (draft.architecture_of(model.config) if init_dir is not None else "speculators")
    if architecture is None:
        raise SystemExit("error: train.init has norms speculators' train CLI cannot set (fc_norm, or a mix of "
                         f"{sorted(draft.ARCHITECTURES['eagle3'])}); fine-tune it with train.backend: builtin")
    save_path = paths["state"] / "speculators"
    serve, endpoint, staging = online_vllm(card, paths, source) if source["mode"] == "online" else (None, None, None)
    if serve is None and endpoint:  # a running extraction server: checked before the trainers ask it for states
        from datasets import load_from_disk

        from draftline.preflight import PreflightError, preflight_extraction

        online = source["online"]
        probe = load_from_disk(str(paths["tokenized"])).with_format(None)[0]["input_ids"]
        try:
            seen = preflight_extraction(endpoint.removesuffix("/v1"), card, card["aux_layer_ids"], probe,
                                        online.get("request_timeout_s", 600), online.get("max_retries", 3) + 1,
                                        probe_file=(online.get("transfer") or "file") != "mooncake")
        except PreflightError as err:
            raise SystemExit(f"error: hidden_states.online.endpoint: {err}") from None
        print(f"train: using the running extraction server {endpoint} (preflight: {seen})")
    try:
        verifier = draft.verifier_for_speculators(card, paths["state"] / "verifier_view")
    except draft.InitMismatch as err:
        raise SystemExit(f"error: {err}") from None
    live_dir.mkdir(parents=True, exist_ok=True)
    launched = []
    with contextlib.ExitStack() as stack:
        if serve is not None:  # the extraction server the trainers ask for states, stopped after
            import os

            from draftline.servers import ManagedServer, startup_timeout_s

            def launch(port: int) -> list[str]:  # hidden_states.vllm.port, else a free port chosen at start
                launched.append(serve(port))
                print("train: launching", " ".join(launched[-1]), flush=True)
                return launched[-1]

            if staging is not None:
                staging.mkdir(parents=True, exist_ok=True)
            limit, why = startup_timeout_s((source.get("params") or {}).get("vllm", {}).get("startup_timeout_s"),
                                           card["model"], card.get("revision"))
            print(f"train: extraction server start-up limit {limit:.0f}s: {why}", flush=True)
            base_url = stack.enter_context(ManagedServer(launch, dict(os.environ), endpoint, live_dir / "vllm.log",
                                                         limit, say=print))
            endpoint = f"{base_url}/v1"
        hs_args = draft.speculators_hidden_states_args(paths["hs"], source["format"], source.get("online") if endpoint else None,
                                                       endpoint, staging)
        cmd = draft.speculators_train_command(cfg, card, paths["vocab"], paths["tokenized"], paths["hs"],
                                              save_path, live_dir / "speculators", nproc, init_dir, architecture, hs_args,
                                              verifier)
        (live_dir / "command.txt").write_text("\n".join(" ".join(c) for c in (launched[-1:] + [cmd]) if c) + "\n")
        print(" ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            raise SystemExit(f"error: speculators train failed; command in {live_dir / 'command.txt'}")
    online = online_states(card, source, "cuda") if source["mode"] == "online" else None
    model, result = draft.best_speculators_epoch(save_path, cfg, card, paths["tokenized"], paths["hs"], "cuda", log, online)
    model.config.speculators_config = draft.speculators_config(card, cfg.speculative_tokens or cfg.ttt_steps)  # the target, not the view
    return model, result, notes


def main(card_path: str, vocab_dir: str, tokenized_dir: str, hs_dir: str, out_dir: str, report_path: str,
         state_dir: str = "models/draft_checkpoints") -> None:
    params = stage_params()
    apply_thread_policy("train")  # before torch loads: draftline/threads.py
    cfg = params.train
    refuse_own_output_as_init(cfg.init, Path(out_dir))
    from dvclive import Live

    from draftline import draft
    from draftline.io import read_json, write_meta, write_metrics

    card = TargetCard.load(card_path)
    paths = {"vocab": Path(vocab_dir), "tokenized": Path(tokenized_dir), "hs": Path(hs_dir), "state": Path(state_dir)}
    paths["state"].mkdir(parents=True, exist_ok=True)
    try:
        draft.check_hidden_states(paths["hs"], card)
        init_dir = draft.prepare_init(cfg.init, card, cfg.init_convert, paths["state"]) if cfg.init else None
    except (draft.InitMismatch, draft.DataMismatch) as err:
        raise SystemExit(f"error: {err}") from None
    source = draft.hidden_states_source(paths["hs"])
    data_sha = draft.training_data_sha256(paths["tokenized"], paths["hs"])
    init_sha = draft.dir_sha256(Path(cfg.init)) if cfg.init else None

    live_dir = Path(report_path).with_suffix("")
    with Live(dir=str(live_dir), save_dvc_exp=False, dvcyaml=None) as live:
        try:
            if cfg.backend == "speculators":
                model, result, notes = run_speculators(cfg, card, paths, init_dir, epoch_logger(live), live_dir, source)
            else:
                model, result, notes = run_builtin(cfg, card, paths, init_dir, data_sha, init_sha, epoch_logger(live), source)
        except draft.InitMismatch as err:
            raise SystemExit(f"error: {err}") from None

    # models/draft is a persist output: the last draft stays until this one is written and
    # checked beside it, then replaces it whole (a failed or refused run leaves it in place).
    out = Path(out_dir)
    staged = out.with_name(f".{out.name}.new")
    shutil.rmtree(staged, ignore_errors=True)
    vllm_fields = draft.save_draft(model, staged)
    best = result["best"]
    write_meta(staged, "train", cfg.model_dump(), target=card["model"], target_revision=card.get("revision"),
               data_sha256=data_sha, init=cfg.init, init_sha256=init_sha, init_remaps=notes,
               best_epoch=best["epoch"], vllm_speculator=vllm_fields,
               hidden_states={"mode": source["mode"], "format": source["format"]})
    shutil.rmtree(out, ignore_errors=True)
    os.replace(staged, out)
    write_metrics(report_path, {
        "best_epoch": best["epoch"],
        "val_tau_sim": best["val"]["tau_sim"],
        "val_position_accuracy": best["val"]["position_accuracy"],
        "val_loss": round(best["val"]["loss"], 5),
        "train_loss": round(best["train"]["loss"], 5) if best.get("train") else None,
        "epochs": cfg.epochs,
        "steps": result.get("steps"),
        "step_seconds": result.get("step_seconds"),
        "resumed_at": result.get("resumed_at"),
        "init": cfg.init,
        "hidden_states_mode": source["mode"],
        "hidden_states_format": source["format"],
        "target_forwards_per_epoch": result.get("target_forwards_per_epoch", 0),
    }, ["val_tau_sim", "val_loss"])
    if cfg.backend == "builtin":
        draft.finish_state(paths["state"], {"data_sha256": data_sha, "steps": result["steps"], "best_epoch": best["epoch"]})


if __name__ == "__main__":
    main(*sys.argv[1:])
