"""Near-twin search at scale: held-out prompts against 100k train prompts, the way `mix` does it
(MinHash LSH, datasketch: draftline/data/holdout.near_twins) against the all-pairs baseline
(rapidfuzz's C++ `process.cdist`, token-set ratio, both cores).

    python overhead/near_twins.py --train 100000 --held 1000 --out reports/overhead/near_twins.json

Prompts are generated: templated sentences over a 5,000-word vocabulary, 8-60 words each. A share
of the held-out prompts is planted in train as near-twins (a few words replaced, names and numbers
changed), the rest have none: recall and false hits are counted for both. The all-pairs baseline's
cost grows with held-out x train, so it is timed on a slice of the held-out prompts
(`--baseline-held`) and its per-prompt time scaled to all of them (marked `extrapolated`); LSH runs
on all. Both in one run, one after the other; the load averages are recorded.
"""

import argparse
import json
import random
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # devtools/ is not installed

from devtools.ab_timing import loadavg, machine_load
from draftline.data.holdout import NearTwinIndex, jaccard, near_words

THRESHOLD = 0.7  # mix.near_twin_jaccard's default


def prompt(words: list[str]) -> dict:
    return {"messages": [{"role": "user", "content": " ".join(words)}]}


def make_rows(train_n: int, held_n: int, planted_share: float, seed: int = 0):
    """(train rows, held-out rows, held ids planted as near-twins in train)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = [a + b + c for a in letters for b in letters for c in letters[:8]][:5000]
    held, train, planted = [], [], set()
    for i in range(held_n):
        words = rng.choices(vocab, k=rng.randint(8, 60))
        held.append({"id": f"h{i}", **prompt(words)})
        if i < planted_share * held_n:
            twin = list(words)
            for j in rng.sample(range(len(twin)), max(1, len(twin) // 10)):
                twin[j] = rng.choice(vocab)  # about a tenth of the words changed
            train.append({"id": f"t-twin{i}", **prompt(twin)})
            planted.add(f"h{i}")
    while len(train) < train_n:
        words = rng.choices(vocab, k=rng.randint(8, 60))
        train.append({"id": f"t{len(train)}", **prompt(words)})
    rng.shuffle(train)
    return train, held, planted


def true_near(held: list[dict], train: list[dict], planted: set[str]) -> set[str]:
    """The planted held-out prompts whose twin is at least THRESHOLD alike (exact Jaccard)."""
    by_id = {row["id"]: row for row in train}
    return {
        h["id"]
        for h in held
        if h["id"] in planted
        and jaccard(
            near_words(h["messages"]), near_words(by_id[f"t-twin{h['id'][1:]}"]["messages"])
        )
        >= THRESHOLD
    }


def run_lsh(train, held) -> tuple[set[str], float]:
    """`mix`'s own search (holdout.NearTwinIndex, which near_twins runs): the held-out ids found
    with a near-twin in train, and the seconds it took."""
    start = time.perf_counter()
    index = NearTwinIndex({h["id"]: h["messages"] for h in held}, THRESHOLD)
    found = {key for row in train for key, _ in index.near(row["messages"])}
    return found, time.perf_counter() - start


def run_allpairs(train, held, score_cutoff: float) -> tuple[set[str], float]:
    import numpy as np
    from rapidfuzz import fuzz, process

    def text(row):
        return " ".join(sorted(near_words(row["messages"])))

    start = time.perf_counter()
    scores = process.cdist(
        [text(h) for h in held],
        [text(t) for t in train],
        scorer=fuzz.token_set_ratio,
        score_cutoff=score_cutoff,
        dtype=np.uint8,
        workers=-1,
    )
    seconds = time.perf_counter() - start
    return {h["id"] for h, row in zip(held, scores) if row.any()}, seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", type=int, default=100_000)
    ap.add_argument("--held", type=int, default=1000)
    ap.add_argument("--baseline-held", type=int, default=50)
    ap.add_argument("--planted-share", type=float, default=0.2)
    ap.add_argument("--out", default="reports/overhead/near_twins.json")
    args = ap.parse_args()
    at_start = loadavg()
    train, held, planted = make_rows(args.train, args.held, args.planted_share)
    truth = true_near(held, train, planted)

    found, lsh_s = run_lsh(train, held)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sliced = held[: args.baseline_held]
    pairs_found, pairs_s = run_allpairs(train, sliced, 100 * THRESHOLD)
    sliced_truth = {h["id"] for h in sliced} & truth
    result = {
        "train_prompts": args.train,
        "held_out_prompts": args.held,
        "planted_near_twins": len(truth),
        "threshold_jaccard": THRESHOLD,
        "lsh": {
            "library": "datasketch MinHashLSH",
            "seconds": round(lsh_s, 2),
            "held_out_with_near_twin": len(found),
            "recall": round(len(found & truth) / len(truth), 4) if truth else None,
            "false_hits": len(found - truth),
            "max_rss_mb": round(rss_mb),
        },
        "all_pairs": {
            "library": "rapidfuzz process.cdist token_set_ratio",
            "held_out_timed": len(sliced),
            "seconds_timed": round(pairs_s, 2),
            "seconds_extrapolated": round(pairs_s * args.held / len(sliced), 1),
            "recall_on_slice": round(len(pairs_found & sliced_truth) / len(sliced_truth), 4)
            if sliced_truth
            else None,
            "false_hits_on_slice": len(pairs_found - sliced_truth),
        },
    }
    result["all_pairs_over_lsh"] = round(
        result["all_pairs"]["seconds_extrapolated"] / max(lsh_s, 1e-9), 1
    )
    result.update(machine_load(at_start))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
