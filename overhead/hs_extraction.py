"""Hidden-state extraction overhead: our stage's path vs a bare forward loop on the same batches.

    python overhead/hs_extraction.py --out reports/overhead/hs_extraction.json

A randomly initialised ~100M-parameter Llama on CPU. "ours" is draftline.hidden.extract (hooks,
bf16 safetensors files written atomically, one per row); "bare" is `model(input_ids,
output_hidden_states=True)` over the same token-budget batches, writing nothing. Also reports the
bytes written per token over the minimum 4 x H x 2 (bf16). Targets: ratio <= 1.10, bytes 1.00.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from datasets import Dataset
from draftline import hidden


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=24)
    ap.add_argument("--seq", type=int, default=384)
    ap.add_argument("--token-budget", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--tiny", action="store_true", help="a 2-layer model, to check the benchmark still runs"
    )
    ap.add_argument("--out", default="reports/overhead/hs_extraction.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    size = (
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4)
        if args.tiny
        else dict(hidden_size=640, intermediate_size=1792, num_hidden_layers=12)
    )  # ~97M parameters
    config = LlamaConfig(
        vocab_size=32000,
        num_attention_heads=8 if args.tiny else 10,
        num_key_value_heads=4 if args.tiny else 5,
        max_position_embeddings=4096,
        **size,
    )
    model = LlamaForCausalLM(config).eval()
    params = sum(p.numel() for p in model.parameters())
    aux = [1, 2, 3] if args.tiny else [2, 6, 9]
    gen = torch.Generator().manual_seed(1)
    lengths = [args.seq - (i * 7) % 96 for i in range(args.rows)]  # varied lengths, as real rows
    ids = [torch.randint(0, 32000, (n,), generator=gen).tolist() for n in lengths]
    rows = Dataset.from_dict({"input_ids": ids})
    todo = {i: len(x) for i, x in enumerate(ids)}
    batches = hidden.token_budget_batches(todo, args.token_budget)
    tokens = sum(lengths)

    def bare():
        with torch.inference_mode():
            for batch in batches:
                seqs = [ids[i] for i in batch]
                longest = max(map(len, seqs))
                x = torch.zeros(len(seqs), longest, dtype=torch.long)
                m = torch.zeros_like(x)
                for b, s in enumerate(seqs):
                    x[b, : len(s)] = torch.tensor(s)
                    m[b, : len(s)] = 1
                model(input_ids=x, attention_mask=m, output_hidden_states=True)

    def ours(out: Path):
        with torch.inference_mode():
            hidden.extract(model, rows, todo, aux, out, torch.bfloat16, args.token_budget)

    bare()  # warm-up
    times = {"ours": [], "bare": []}
    written = 0
    for _ in range(args.repeats):  # interleaved, so machine noise hits both alike
        start = time.perf_counter()
        bare()
        times["bare"].append(time.perf_counter() - start)
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            ours(Path(tmp))
            times["ours"].append(time.perf_counter() - start)
            written = sum(f.stat().st_size for f in Path(tmp).glob("hs_*.safetensors"))
    med = {k: statistics.median(v) for k, v in times.items()}
    minimum = tokens * 4 * config.hidden_size * 2
    result = {
        "model_parameters": params,
        "rows": args.rows,
        "tokens": tokens,
        "ours_s": round(med["ours"], 3),
        "bare_s": round(med["bare"], 3),
        "ratio_ours_over_bare": round(med["ours"] / med["bare"], 3),
        "target_ratio": 1.10,
        "ours_tokens_per_s": round(tokens / med["ours"], 1),
        "bytes_written": written,
        "bytes_minimum_4xHx2": minimum,
        "bytes_ratio": round(written / minimum, 4),
        "all_times_s": {k: [round(t, 3) for t in v] for k, v in times.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
