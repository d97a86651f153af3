"""Hidden-state extraction overhead: our stage's path vs a bare forward loop on the same batches.

    python overhead/hs_extraction.py --out reports/overhead/hs_extraction.json
    python overhead/hs_extraction.py --tiny --rows 3 --seq 40 --rounds 1 --out /tmp/hs.json   # a check that it runs

A randomly initialised ~100M-parameter Llama on CPU. Both sides run the same model work: one
forward per token-budget batch, right-padded, logits of the last position only
(`logits_to_keep=1`), no KV cache. "ours" is draftline.hidden_states.batches.extract_batches: forward pre-hooks that keep
the 3 aux states and the last pre-norm state, stacked to [L, 4, H], cast to bf16 and written as one
safetensors file per row (atomic rename), plus the extraction plan file; "bare" is the same forward
with `output_hidden_states=True`, writing nothing: ours minus our code, so the ratio ours / bare
is what our code adds to the target's forward (capture, copy, cast, files). The sides alternate
round by round (devtools/ab_timing.py), medians per side, both under the hidden_states stage's
thread policy (draftline/core/threads.py); the load averages and CPU count are recorded. Also reports
the bytes written per token over the minimum 4 x H x 2 (bf16). Targets: ratio <= 1.10, bytes 1.00.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # devtools/ is not installed

from devtools.ab_timing import alternate, loadavg, machine_load, medians
from draftline.core.threads import apply_thread_policy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=24)
    ap.add_argument("--seq", type=int, default=384)
    ap.add_argument("--token-budget", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of each side")
    ap.add_argument(
        "--tiny", action="store_true", help="a 2-layer model, to check the benchmark still runs"
    )
    ap.add_argument("--out", default="reports/overhead/hs_extraction.json")
    args = ap.parse_args()
    at_start = loadavg()
    # both sides under the stage's thread policy, set before torch loads
    threads = apply_thread_policy("hidden_states")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from datasets import Dataset
    from draftline.hidden_states.batches import BatchJob, extract_batches, token_budget_batches

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
    batches = token_budget_batches(todo, args.token_budget)  # the batches extract_batches makes
    tokens = sum(lengths)
    written = []

    def bare() -> float:
        """The forward capture runs (same batches, padding, logits_to_keep, no cache),
        its states from output_hidden_states, nothing kept or written."""
        start = time.perf_counter()
        with torch.inference_mode():
            for batch in batches:
                seqs = [ids[i] for i in batch]
                longest = max(map(len, seqs))
                x = torch.zeros(len(seqs), longest, dtype=torch.long)
                m = torch.zeros_like(x)
                for b, s in enumerate(seqs):
                    x[b, : len(s)] = torch.tensor(s)
                    m[b, : len(s)] = 1
                model(
                    input_ids=x,
                    attention_mask=m,
                    logits_to_keep=1,
                    use_cache=False,
                    output_hidden_states=True,
                )
        return time.perf_counter() - start

    def ours() -> float:
        with tempfile.TemporaryDirectory() as tmp:  # made and removed outside the timed part
            start = time.perf_counter()
            with torch.inference_mode():
                job = BatchJob(aux, Path(tmp), torch.bfloat16, args.token_budget)
                extract_batches(model, rows, todo, job)
            seconds = time.perf_counter() - start
            written.append(sum(f.stat().st_size for f in Path(tmp).glob("hs_*.safetensors")))
        return seconds

    bare()  # warm-up, untimed
    times = alternate({"ours": ours, "bare": bare}, args.rounds)
    med = medians(times)
    minimum = tokens * 4 * config.hidden_size * 2
    result = {
        "model_parameters": params,
        "rows": args.rows,
        "tokens": tokens,
        "bare_work": "the same forward: logits_to_keep=1, use_cache=False, output_hidden_states",
        "rounds": args.rounds,
        "ours_s": round(med["ours"], 3),
        "bare_s": round(med["bare"], 3),
        "ratio_ours_over_bare": round(med["ours"] / med["bare"], 3),
        "target_ratio": 1.10,
        "ours_tokens_per_s": round(tokens / med["ours"], 1),
        "bytes_written": written[-1],
        "bytes_minimum_4xHx2": minimum,
        "bytes_ratio": round(written[-1] / minimum, 4),
        "all_times_s": {k: [round(t, 3) for t in v] for k, v in times.items()},
        "threads": threads,
        **machine_load(at_start),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
