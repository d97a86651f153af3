"""Hidden-state formats side by side on the default run: bytes per token of bf16 and fp8 files over
each format's minimum, the fp8 last state's argmax agreement with the target, and the validation
tau_sim of drafts trained on bf16 files, fp8 files and online (the target run on each packed
batch), same params and seed.

    python overhead/hs_format_tradeoffs.py --out reports/overhead/hs_format_tradeoffs.json   # after make repro
    python overhead/hs_format_tradeoffs.py --small --out /tmp/hs_format_tradeoffs.json       # no pipeline outputs needed

Default: the default run's target (models/target), tokenized rows (datasets/tokenized), draft
vocabulary (models/vocab) and `train` params (params.yaml). --small builds its own: the tiny
target with --small-steps training steps, --small-rows generated conversations through the
tokenize and vocab stages, in a temporary directory. Minimum bytes per token: 4 x H x 2 (bf16),
4 x H x 1 + 4 (fp8: the states and their per-token float32 scale). Targets: argmax agreement
>= 0.99, online tau_sim within 0.05 of offline bf16, fp8 bytes <= 1.01 x minimum where the 8-byte
token id and the header are small against 4 x H (H >= ~1000; at the tiny target's H = 128 they
are ~2%; `draftline plan` gives any H). Its figures are bytes, agreement and tau_sim, not
times (the seconds beside them are for information, one format after the other); the load
averages and CPU count are recorded.
"""

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # devtools/ is not installed

from devtools.ab_timing import loadavg, machine_load
from draftline.core.card import TargetCard
from draftline.draft import model as draft_model
from draftline.hidden_states import formats as hs_format
from draftline.hidden_states.batches import BatchJob, extract_batches
from draftline.params import load_params
from draftline.train import data as draft_data
from draftline.train import resume as train_state
from draftline.train import run as training
from draftline.train.config import TrainConfig


def build_small(root: Path, steps: int, rows: int) -> dict:
    """The tiny target (few steps), generated conversations tokenized by the tokenize stage, and the
    vocab stage's draft vocabulary, under root."""
    import yaml

    from draftline.targets.config import TinyTargetConfig
    from draftline.targets.corpus import generate_conversations
    from draftline.targets.model import build_card
    from draftline.targets.tiny import build_tiny_target

    params = yaml.safe_load(Path("params.yaml").read_text())
    build_tiny_target(
        TinyTargetConfig(**{**params["target"]["tiny"], "train_steps": steps}), root / "target"
    )
    card = build_card(str(root / "target"), "tiny", None, params["target"]["aux_layer_ids"], {})
    card.write(root / "card.json")
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    with open(root / "prompts.jsonl", "w") as p, open(root / "conversations.jsonl", "w") as c:
        for k, conv in enumerate(generate_conversations(rows, 11)):
            row = {"id": f"p{k:05d}", "messages": conv["messages"], "tools": conv["tools"]}
            p.write(json.dumps({"id": row["id"]}) + "\n")
            c.write(json.dumps(row) + "\n")
    from stages.tokenize import main as tokenize
    from stages.vocab import main as vocab

    with contextlib.chdir(root):
        tokenize("card.json", "prompts.jsonl", "conversations.jsonl", "tokenized", "tokenize.json")
        vocab("card.json", "tokenized/token_freq.pt", "vocab", "vocab.json")
    return {"card": root / "card.json", "tokenized": root / "tokenized", "vocab": root / "vocab"}


def extract(model, rows, aux, out: Path, storage) -> float:
    out.mkdir(parents=True, exist_ok=True)
    todo = {i: n for i, n in enumerate(rows.with_format(None)["seq_len"])}
    start = time.perf_counter()
    with torch.inference_mode():
        extract_batches(model, rows, todo, BatchJob(aux, out, storage, 4096))
    return time.perf_counter() - start


def argmax_agreement(model, rows, hs_dir: Path, limit: int) -> float:
    """Share of positions where the stored last state, read back (FP8Transfer dequantizes), through
    the target's norm and lm_head gives the target's own argmax."""
    from hs_connectors import FP8Transfer

    transfer = FP8Transfer(hs_dir, dequantize_dtype=torch.float32)
    agree = total = 0
    with torch.inference_mode():
        for i, ids in enumerate(rows.with_format(None)["input_ids"][:limit]):
            last = transfer.get_cached(i)["hidden_states"][:, -1].float()
            ref = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1)
            got = model.lm_head(model.model.norm(last)).argmax(-1)
            agree += int((got == ref).sum())
            total += len(ids)
    return agree / total


def train(card, paths, hs_dir, cfg, online=None) -> dict:
    train_state.seed_everything(cfg.seed)
    model = draft_model.build_draft(card, paths["vocab"], cfg)
    start = time.perf_counter()
    data = draft_data.TrainingData(paths["tokenized"], hs_dir, online)
    result = training.train_draft(model, cfg, data, "cpu")
    return {
        "val_tau_sim": result["best"]["val"]["tau_sim"],
        "best_epoch": result["best"]["epoch"],
        "seconds": round(time.perf_counter() - start, 1),
        "target_forwards_per_epoch": result["target_forwards_per_epoch"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--card", default="models/target/card.json")
    ap.add_argument("--tokenized", default="datasets/tokenized")
    ap.add_argument("--vocab", default="models/vocab")
    ap.add_argument("--epochs", type=int, help="instead of train.epochs")
    ap.add_argument("--argmax-rows", type=int, default=64, help="rows checked for argmax agreement")
    ap.add_argument(
        "--small",
        action="store_true",
        help="build a small target and data instead of the default run's",
    )
    ap.add_argument("--small-steps", type=int, default=150)
    ap.add_argument("--small-rows", type=int, default=120)
    ap.add_argument("--out", default="reports/overhead/hs_format_tradeoffs.json")
    args = ap.parse_args()
    at_start = loadavg()
    torch.set_num_threads(1)  # see DESIGN: the intra-op pool spins on a shared 2-core machine
    from datasets import load_from_disk
    from draftline.targets.model import load_target_model

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        paths = (
            build_small(tmp / "small", args.small_steps, args.small_rows)
            if args.small
            else {
                "card": Path(args.card),
                "tokenized": Path(args.tokenized),
                "vocab": Path(args.vocab),
            }
        )
        card = TargetCard.load(paths["card"])
        cfg = load_params(
            paths["card"].parent / "params.yaml" if args.small else "params.yaml"
        ).train
        cfg = TrainConfig(
            **{
                **cfg.model_dump(),
                "device": "cpu",
                **({"epochs": args.epochs} if args.epochs else {}),
            }
        )
        H, aux = card.hidden_size, card.aux_ids
        model = load_target_model(card, "cpu", torch.float32)
        rows = load_from_disk(str(paths["tokenized"]))
        tokens = sum(rows.with_format(None)["seq_len"])
        result = {
            "hidden_size": H,
            "rows": len(rows),
            "tokens": tokens,
            "small": args.small,
            "epochs": cfg.epochs,
            "formats": {},
        }
        for fmt in hs_format.FORMATS:
            out = tmp / f"hs_{fmt}"
            seconds = extract(model, rows, aux, out, hs_format.storage_dtype(fmt, "bfloat16"))
            written = sum(f.stat().st_size for f in out.glob("hs_*.safetensors"))
            minimum = hs_format.minimum_bytes_per_token(H, fmt)
            result["formats"][fmt] = {
                "bytes_per_token": round(written / tokens, 2),
                "minimum_bytes_per_token": minimum,
                "ratio_to_minimum": round(written / tokens / minimum, 4),
                "content_bytes_per_token": hs_format.bytes_per_token(
                    H, fmt
                ),  # + the int64 token id, no header
                "extract_seconds": round(seconds, 2),
                "argmax_agreement": round(argmax_agreement(model, rows, out, args.argmax_rows), 4),
                "train": train(card, paths, out, cfg),
            }
        online = draft_data.OnlineStates(model, aux, torch.bfloat16)
        result["online"] = {
            "disk_bytes": 0,
            "train": train(card, paths, tmp / "hs_online_none", cfg, online),
        }
        bf16 = result["formats"]["bf16"]["train"]["val_tau_sim"]
        result["tau_sim_fp8_minus_bf16"] = round(
            result["formats"]["fp8"]["train"]["val_tau_sim"] - bf16, 4
        )
        result["tau_sim_online_minus_offline_bf16"] = round(
            result["online"]["train"]["val_tau_sim"] - bf16, 4
        )
        result["note"] = (
            "bytes per token include the int64 token id (8 B) and the safetensors header; at H = 7168 "
            "the fp8 file content is 1.0003 x its minimum (draftline plan)"
        )
        result.update(machine_load(at_start))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
