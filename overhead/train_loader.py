"""Reading hidden states during training: the builtin loop's step with its packs read from disk by
the loader (draftline.train.data.make_loader) against the same step on the same packs already in
memory, at a large target's hidden size.

    python overhead/train_loader.py --out reports/overhead/train_loader.json     # ~3 min on 2 cores
    python overhead/train_loader.py --tiny --out /tmp/train_loader.json          # seconds

Synthetic and self-contained: a random Llama "target" with hidden size H (default 7168, Kimi-K2.5's)
and a small decoder (64-wide MLP, 4 heads of 64, a 512-token vocabulary) gives the card; the draft is
draftline's own (draft_model.build_draft: one decoder layer, its 3H -> H fc, 256 draft tokens);
rows of random token ids and states [L, 4, H] are written as the hidden_states stage writes them
(bf16 hs_{i}.safetensors, 4 x H x 2 bytes a token) with a tokenized Arrow dataset beside them.

Variants, each the loop's step (next pack, TTT forward and loss, backward, clipping, AdamW) on the
same sequence of packs:
  in_memory         the packs collated beforehand (what the loader would hand over)
  read_ahead        read from disk by make_loader with train.loader_workers threads (the default)
  synchronous       read from disk by make_loader with 0 workers: each pack read between steps
They are interleaved step by step, one step of each a round, the order rotating each round, so a
busy neighbour slows all three alike; the read-ahead's reads start when the loop takes a pack, so
their cost falls in its own step. The page cache is dropped (posix_fadvise DONTNEED) after the
in-memory copy is made and before each synchronous read, so the bytes come from the device. The
first round fills the read-ahead (once an epoch in a real run) and is left out of the medians.
Recorded besides the wall-clock step: the time the loop waited for its pack, and the process's CPU
seconds per step (the reading threads' work included). Target: read_ahead / in_memory <= 1.05.

Where the step's time goes: on this CPU the fc's 3H x H matmuls cost ~10 ms a token and the
per-parameter work (gradient, clipping, AdamW over the 154M-parameter fc) ~1 s a step, while
reading a token's 57 KB takes well under 1 ms: the step dwarfs the read at any pack length, and
pack_len only sets how long a step takes. The AdamW is torch's fused one: the default takes ~2 s
a step on that fc here, a fixed cost that would hide the reading further. On a GPU the step is
far shorter against the read, which is what the read-ahead is for.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.ab_timing import drop_page_cache, machine_load  # noqa: E402
from draftline.core.threads import apply_thread_policy  # noqa: E402

VARIANTS = ("read_ahead", "in_memory", "synchronous")


def build_target(root: Path, hidden_size: int):
    """A random Llama with the given hidden size and a tiny decoder, saved with the tiny target's
    tokenizer and chat template, and its card (aux layers 1, 3, 4 of 5)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils.chat_template_utils import render_jinja_template

    from draftline.targets.corpus import generate_conversations
    from draftline.targets.model import build_card
    from draftline.targets.tiny import CHAT_TEMPLATE, train_tokenizer

    texts = [
        render_jinja_template([c["messages"]], tools=c["tools"], chat_template=CHAT_TEMPLATE)[0][0]
        for c in generate_conversations(200, 7)
    ]
    tokenizer = train_tokenizer(texts, 512)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=64,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=4096,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    LlamaForCausalLM(config).save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    return build_card(str(root / "target"), "bench", None, [1, 3, 4], {})


def write_vocab(directory: Path, target_vocab: int, size: int) -> Path:
    import numpy as np

    directory.mkdir()
    np.save(directory / "d2t.npy", np.zeros(size, dtype=np.int64))
    t2d = np.zeros(target_vocab, dtype=bool)
    t2d[:size] = True
    np.save(directory / "t2d.npy", t2d)
    return directory


def write_rows(root: Path, rows: int, row_len: int, hidden_size: int, vocab: int):
    """`rows` rows of `row_len` random tokens: the tokenized Arrow dataset and bf16 state files,
    flushed to the device. Returns (tokenized dir, hs dir)."""
    import torch

    from datasets import Dataset
    from draftline.hidden_states.files import hs_path, save_hidden_states

    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, vocab, (row_len,), generator=g).tolist() for _ in range(rows)]
    dataset = Dataset.from_dict(
        {"input_ids": ids, "loss_mask": [[1] * row_len] * rows, "seq_len": [row_len] * rows}
    )
    dataset.set_format(type="torch", columns=["input_ids", "loss_mask", "seq_len"])
    dataset.save_to_disk(str(root / "tokenized"))
    hs = root / "hs"
    hs.mkdir()
    for i, row in enumerate(ids):
        states = torch.randn(row_len, 4, hidden_size, generator=g)
        save_hidden_states(hs_path(hs, i), row, states, torch.bfloat16)
        fd = os.open(hs_path(hs, i), os.O_RDONLY)
        try:
            os.fsync(fd)  # written back: the page cache can then be dropped
        finally:
            os.close(fd)
    return root / "tokenized", hs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden-size", type=int, default=7168)
    ap.add_argument("--pack-len", type=int, default=64, help="tokens per packed batch")
    ap.add_argument("--rounds", type=int, default=13, help="one step of each variant a round")
    ap.add_argument("--workers", type=int, help="read_ahead's threads (default: the train default)")
    ap.add_argument("--tiny", action="store_true", help="H = 256, 4 rounds: a check")
    ap.add_argument("--out", default="reports/overhead/train_loader.json")
    args = ap.parse_args()
    if args.tiny:
        args.hidden_size, args.pack_len, args.rounds = 256, 32, 4
    policy = apply_thread_policy("train")  # before torch loads, as the train stage
    loadavg_before = [round(x, 2) for x in os.getloadavg()]

    import torch
    from speculators.losses import resolve_loss_config

    from draftline.draft.forward import PackLayout, run_batch
    from draftline.draft.methods import Forward
    from draftline.draft.model import build_draft
    from draftline.hidden_states.files import hs_path
    from draftline.train.config import TrainConfig
    from draftline.train.data import TrainingData, epoch_batches, make_dataset, make_loader
    from draftline.train.resume import seed_everything

    cfg = TrainConfig(pack_len=args.pack_len, device="cpu", val_fraction=0.5)
    workers = cfg.loader_workers if args.workers is None else args.workers
    packs_needed = args.rounds
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="train_loader_") as tmp:
        root = Path(tmp)
        card = build_target(root, args.hidden_size)
        vocab = write_vocab(root / "vocab", card.vocab_size, 256)
        # 2 rows a pack; twice the rows: the val half of the split is never read
        row_len = args.pack_len // 2
        tokenized, hs = write_rows(
            root, 4 * packs_needed, row_len, args.hidden_size, card.vocab_size
        )
        setup_s = time.perf_counter() - started
        train_set = make_dataset(TrainingData(tokenized, hs), "train", 0.5, args.pack_len, "cpu")
        plan = epoch_batches(train_set, args.pack_len, cfg.seed, 0)[:packs_needed]
        if len(plan) < packs_needed:
            raise SystemExit(f"error: {len(plan)} packs, {packs_needed} needed")
        in_memory = list(
            make_loader(train_set, plan, PackLayout(args.pack_len, args.hidden_size), "cpu")
        )
        pack_bytes = sum(hs_path(hs, train_set.start_file_idx + j).stat().st_size for j in plan[0])

        seed_everything(0)
        model = build_draft(card, vocab, cfg)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
        loss_config = resolve_loss_config("kl_div", "eager")
        model.train()

        def step(batch) -> None:
            opt.zero_grad(set_to_none=True)
            _, loss, _ = run_batch(model, batch, "cpu", Forward.for_training(cfg), loss_config)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()

        step(in_memory[0])  # warm-up: allocations, the optimizer state
        files = [[hs_path(hs, train_set.start_file_idx + j) for j in batch] for batch in plan]
        drop_page_cache([f for batch in files for f in batch])  # read once to collate in_memory
        loaders = {
            "in_memory": iter(in_memory),
            "read_ahead": make_loader(
                train_set, plan, PackLayout(args.pack_len, args.hidden_size), "cpu", workers
            ),
            "synchronous": make_loader(
                train_set, plan, PackLayout(args.pack_len, args.hidden_size), "cpu", 0
            ),
        }
        steps, waits, cpus = ({v: [] for v in VARIANTS} for _ in range(3))
        for r in range(args.rounds):
            for variant in VARIANTS[r % 3 :] + VARIANTS[: r % 3]:
                if variant == "synchronous":  # read_ahead read this pack a few steps ago
                    drop_page_cache(files[r])
                began, cpu = time.perf_counter(), time.process_time()
                batch = next(loaders[variant])
                got = time.perf_counter()
                step(batch)
                if r == 0:  # the read-ahead's fill (once an epoch in a real run)
                    continue
                steps[variant].append(time.perf_counter() - began)
                cpus[variant].append(time.process_time() - cpu)  # the reading threads too
                waits[variant].append(got - began)
        del loaders

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 4)

    step_s = {v: median(steps[v]) for v in VARIANTS}
    ratio = round(step_s["read_ahead"] / step_s["in_memory"], 3)
    result = {
        "hidden_size": args.hidden_size,
        "pack_len": args.pack_len,
        "pack_bytes_on_disk": pack_bytes,
        "draft_trainable_parameters": sum(p.numel() for p in params),
        "threads": policy["threads"],
        "loader_workers": workers,
        "rounds": args.rounds,
        "timed_steps_per_variant": len(steps["in_memory"]),
        "page_cache": "dropped before each read from disk (posix_fadvise DONTNEED)",
        "step_s": step_s,
        "wait_for_pack_s": {v: median(waits[v]) for v in VARIANTS},
        "process_cpu_s": {v: median(cpus[v]) for v in VARIANTS},
        "ratio_read_ahead_over_in_memory": ratio,
        "ratio_synchronous_over_in_memory": round(step_s["synchronous"] / step_s["in_memory"], 3),
        "target_ratio": 1.05,
        "meets_target": ratio <= 1.05,
        "loadavg_before": loadavg_before,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        **machine_load(loadavg_before),
        "setup_s": round(setup_s, 1),
        "seconds": round(time.perf_counter() - started, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
