"""A mix the datasets cannot supply at its weights: what each dataset has and gives, the most
samples the weights allow, and the message that names the numbers."""

from __future__ import annotations

from collections import Counter


def dataset_table(
    pools: dict[str, list[dict]],
    shares: dict[str, float],
    caps: dict[str, int],
    samples: int,
    counts: dict[str, Counter],
    twins: dict[str, int],
) -> dict[str, dict]:
    """Per dataset: its weight share, the train rows the weights ask of it, rows available (after the
    cross-dataset duplicates), rows drawn for eval and dev, twins of those kept out of train, rows
    drawn for train, the realised train share, and whether it fell short of its weight (`counts`:
    each split's rows per dataset). A capped dataset is asked for its share up to its cap; the others
    share the rest by weight; one drawn more than one row short of that ran out (the others filled in)."""
    train_counts, eval_counts, dev_counts = counts["train"], counts["eval"], counts["dev"]
    drawn = sum(train_counts.values())
    capped_rows = sum(train_counts.get(name, 0) for name in pools if name in caps)
    open_share = sum(share for name, share in shares.items() if name not in caps)

    def asked(
        name: str, n: int, capped: int
    ) -> float:  # train rows the weights ask of `name` out of n
        if name in caps:
            return min(caps[name], shares[name] * n)
        return shares[name] / open_share * (n - capped) if open_share else 0.0

    table = {}
    for name in sorted(pools):
        got = train_counts.get(name, 0)
        table[name] = {
            "weight": round(shares[name], 4),
            "wanted_train": round(asked(name, samples, capped_rows)),
            "available": len(pools[name]),
            "train": got,
            "eval": eval_counts.get(name, 0),
            "dev": dev_counts.get(name, 0),
            "twins": twins.get(name, 0),
            "share": round(got / drawn, 4) if drawn else 0.0,
            "capped": name in caps,
            # of the rows drawn, it gave less than its weight asks: the others filled in for it
            "short_of_weight": got < asked(name, drawn, capped_rows) - 1,
        }
    return table


def max_samples_at_weights(table: dict[str, dict]) -> int:
    """The largest `samples` the uncapped datasets supply at their weights (eval, dev and their
    twins aside)."""
    open_rows = {
        name: row for name, row in table.items() if not row["capped"] and row["weight"] > 0
    }
    if not open_rows:
        return 0
    share_sum = sum(row["weight"] for row in open_rows.values())
    return int(
        min(
            (row["available"] - row["eval"] - row["dev"] - row["twins"])
            / (row["weight"] / share_sum)
            for row in open_rows.values()
        )
    )


def shortfall_problems(report: dict) -> list[str]:
    """What the mix could not honour, in words (empty when it supplied everything at the weights)."""
    problems = []
    requested, short = report["requested"], report["shortfall"]
    if short["train"] > 0:
        problems.append(
            f"samples={requested['train']} asks for {requested['train']} train prompts; the datasets "
            f"supply {report['train']['rows']}"
        )
    if short["eval"] > 0:
        problems.append(
            f"mix.eval_samples={requested['eval']} asks for {requested['eval']} eval prompts; the "
            f"datasets supply {report['eval']['rows']}"
        )
    drifted = [name for name, row in report["per_dataset"].items() if row["short_of_weight"]]
    if drifted:
        problems.append(
            f"{', '.join(drifted)} ran out before giving {'its' if len(drifted) == 1 else 'their'} "
            "share of the weights, so the others filled in"
        )
    return problems


def shortfall_table(report: dict) -> str:
    """The per-dataset numbers as an aligned text table."""
    width = max(len("dataset"), *(len(n) for n in report["per_dataset"]))
    lines = [f"  {'dataset':<{width}}  weight  wanted  available  eval  dev  twins  train  share"]
    for name, row in report["per_dataset"].items():
        cap = " (capped)" if row["capped"] else ""
        lines.append(
            f"  {name:<{width}}  {row['weight']:>6.0%}  {row['wanted_train']:>6}  {row['available']:>9}  "
            f"{row['eval']:>4}  {row['dev']:>3}  {row['twins']:>5}  {row['train']:>5}  "
            f"{row['share']:>5.0%}{cap}"
        )
    return "\n".join(lines)
