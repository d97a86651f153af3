"""The weighted, prefix-stable mix of prepared datasets into eval and train prompts.

One merged sequence decides both splits. Each dataset's rows are ordered by a seeded hash of their
id; the j-th row of dataset d gets the key (j + 0.5) / w_d (weights normalized to sum 1), ties
broken by dataset name, and merging by key interleaves the datasets in proportion to their
weights; a dataset that runs out just stops contributing. The first `eval_samples` rows of the
sequence are eval, the next `samples` rows are train. The sequence does not depend on `samples`,
so train for samples=N is the first N rows of train for samples=M > N, and eval never moves.

A cap stops a dataset from giving more than `cap` train rows: past it, its rows are skipped in the
sequence and the others fill in. Skipping never reorders what is left, so caps stay prefix-stable
(and eval, taken before any skipping, does not move).

Weights are relative (normalized); a weight of 0 leaves its dataset out entirely.

Eval is held out by content, not only by id: greedy regeneration gives a train twin of an eval
prompt the eval prompt's answer, so a twin in train measures recall, not the draft. The user
messages of a prompt's first turn (before the first assistant turn; a system prompt or tools do not
make the same question new) are normalized (Unicode NFKC, lower case, runs of whitespace
collapsed). Prompts whose normalized user messages are equal are *exact twins*; equal once every
run of digits is replaced by 0, *template twins* ("What is 16 * 6?" and "What is 23 * 4?"). The
eval sets (`evaluate.sets`: whole datasets that are only evaluated) are held out first, then eval
and dev are drawn, from the datasets `mix.holdout_from` names (every one when null). Train rows
are drawn after them, skipping every exact twin of a held-out prompt and, with `mix.holdout:
template` (the default), every template twin too (each dataset's next row takes a skipped row's
place, so the weights hold); skipped rows are counted in the report (`holdout`: over each dataset's
whole remainder, whatever `samples` draws), and the mix fails when the share of eval prompts (or of
an eval set's) that keep a template twin in train exceeds `mix.max_template_twin_share`.
Near-twins beyond templates (draftline/data/holdout.py) are counted per held-out split and set,
and the mix fails above `mix.max_near_twin_share`. An eval set assembled from paragraphs (a
builtin such as pydoc_long, whose prompts are pieces of one document) is held out piece by piece
too: a train row that carries any of its paragraphs word for word, in any turn, is skipped like a
twin, before eval and dev are drawn (`holdout.pieces` counts them). The skip depends only on
what is held out, which does not depend on `samples`, so train stays prefix-stable. When eval and dev come from
some datasets only, train is numbered from every dataset's first row after them, so its shares
are the weights.

When the datasets cannot supply `samples` (or `eval_samples`), or a dataset runs out so that the
others fill in and the shares drift from the weights, the report says so per dataset
(`per_dataset`, `shortfall`, `weights_honoured`) and `shortfall_problems` words it: the stage fails
on it unless `mix.allow_shortfall` says to train on what there is.

Rows need only "id", "source" (optionally "source_detail"), "prompt_tokens_est" and either "messages"+"tools" or their
precomputed content "digest" and hold-out "twin_keys": the mix stage passes such light rows and reads the full records of
the chosen ones afterwards, so a million prepared rows cost megabytes, not gigabytes
(``light_rows``, ``full_records``; ``mix_prepared`` runs the whole mix over the prepared files).
"""

from __future__ import annotations

import heapq
import json
import math
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from draftline.core.io import file_sha256, read_json, text_sha256, write_jsonl, write_meta
from draftline.data.config import check_weights, held_out_by_pieces, train_datasets
from draftline.data.formats import content_hash
from draftline.data.holdout import (
    HOLDOUT_RULES,
    PieceIndex,
    holdout_problem,
    holdout_report,
    near_twin_problem,
    near_twins,
    pieces_problem,
    pieces_report,
    twin_keys,
    without_eval_twins,
    without_pieces,
)
from draftline.data.shortfall import (
    dataset_table,
    max_samples_at_weights,
    shortfall_problems,
    shortfall_table,
)

if TYPE_CHECKING:
    from draftline.data.config import MixConfig


@dataclass(frozen=True)
class Holdout:
    """How the held-out prompts are chosen and kept out of train: the twin rule ("exact" /
    "template"), the datasets eval and dev are drawn from (None: every one, mix.holdout_from), and
    the eval sets' rows (evaluate.sets: name -> light rows), held out like eval before anything
    is drawn, and the pieces of those held out piece by piece (None: no such set)."""

    rule: str = "template"
    sources: tuple[str, ...] | None = None
    sets: dict[str, list[dict]] = field(default_factory=dict)
    pieces: PieceIndex | None = None


def drop_cross_duplicates(
    pools: dict[str, list[dict]],
) -> tuple[dict[str, list[dict]], dict[str, dict[str, int]]]:
    """Keep each conversation (messages+tools) once, in the first dataset by name.

    Returns the kept rows and, per dataset, how many of its rows were copies of which earlier dataset's
    ({"sharegpt": {"messages": 72}}: 72 sharegpt rows dropped, already in messages).
    """
    first_seen, kept, copies = {}, {}, {}
    for name in sorted(pools):
        kept[name], copies[name] = [], Counter()
        for row in pools[name]:
            digest = row.get("digest") or content_hash(row["messages"], row["tools"])
            if digest in first_seen:
                copies[name][first_seen[digest]] += 1
            else:
                first_seen[digest] = name
                kept[name].append(row)
    return kept, {name: dict(sorted(c.items())) for name, c in copies.items()}


def make_ids_unique(pools: dict[str, list[dict]]) -> tuple[dict[str, list[dict]], int]:
    """Rename an id already used by an earlier dataset (name order) to "<source>/<id>"; count renames.

    Ids are unique within a prepared dataset, but two hub datasets can both number their rows 0, 1, ...
    and downstream stages key their records by id.
    """
    taken, out, renamed = set(), {}, 0
    for name in sorted(pools):
        out[name] = []
        for row in pools[name]:
            if row["id"] in taken:
                row, renamed = {**row, "id": f"{name}/{row['id']}"}, renamed + 1
            out[name].append(row)
        taken |= {row["id"] for row in out[name]}
    return out, renamed


def seeded_order(rows: list[dict], source: str, seed: int) -> list[dict]:
    """Rows in the order of sha256(seed:source:id): a shuffle that is stable as rows come and go."""
    return sorted(rows, key=lambda row: text_sha256(f"{seed}:{source}:{row['id']}"))


def keyed(rows: list[dict], name: str, share: float, start: int = 0) -> Iterator[tuple]:
    """(key, name, j, row) for row j of one dataset (counting from `start`); key (j + 0.5) / share
    rises by 1/share per row."""
    return (((j + 0.5) / share, name, j, row) for j, row in enumerate(rows, start))


def merge_by_weight(
    ordered: dict[str, list[dict]],
    weights: dict[str, float],
    starts: dict[str, int] | None = None,
) -> Iterator[dict]:
    """The merged sequence of all datasets' ordered rows, smallest key first, ties by dataset name;
    `starts` numbers a dataset's rows from where an earlier part of the sequence left it."""
    total = sum(weights[name] for name in ordered)
    starts = starts or {}
    streams = [
        keyed(ordered[name], name, weights[name] / total, starts.get(name, 0))
        for name in sorted(ordered)
        if weights[name] > 0
    ]
    for *_, row in heapq.merge(*streams):  # (key, name, j) is unique, so rows are never compared
        yield row


def tag_partition(rows: list[dict], long_threshold_tokens: int) -> list[dict]:
    """Each row with "partition": "long" when its prompt estimate exceeds the threshold, else "short"."""
    return [
        {
            **row,
            "partition": "long" if row["prompt_tokens_est"] > long_threshold_tokens else "short",
        }
        for row in rows
    ]


def split_counts(rows: list[dict]) -> dict:
    counts = {
        "rows": len(rows),
        "by_source": dict(sorted(Counter(r["source"] for r in rows).items())),
        "by_partition": {p: sum(r["partition"] == p for r in rows) for p in ("short", "long")},
    }
    if any(r.get("source_detail") for r in rows):  # a row's own upstream source, inside its dataset
        counts["by_source_detail"] = {
            name: dict(
                sorted(
                    Counter(
                        r.get("source_detail") or "?" for r in rows if r["source"] == name
                    ).items()
                )
            )
            for name in sorted({r["source"] for r in rows if r.get("source_detail")})
        }
    return counts


def under_caps(rows: Iterator[dict], caps: dict[str, int]) -> Iterator[dict]:
    """The rows, skipping those of a dataset that already gave its cap (by "source")."""
    given = Counter()
    for row in rows:
        if given[row["source"]] < caps.get(row["source"], math.inf):
            given[row["source"]] += 1
            yield row


def next_rows(
    ordered: dict[str, list[dict]], weights: dict[str, float], starts: dict[str, int], n: int
) -> tuple[list[dict], dict[str, int]]:
    """The next n rows of the merged sequence of `ordered` (numbered from `starts`), and how many
    of each dataset's rows they took: always a prefix of its list."""
    rows = list(islice(merge_by_weight(ordered, weights, starts), n))
    taken = {id(row) for row in rows}
    return rows, {name: sum(id(row) in taken for row in part) for name, part in ordered.items()}


@dataclass
class HeldOut:
    """Eval and dev, drawn off the front of the merged sequence, and what they left for train."""

    eval: list[dict]
    dev: list[dict]
    ordered: dict[str, list[dict]]  # each dataset's rows after eval and dev, their twins skipped
    starts: dict[str, int]  # rows each dataset gave eval and dev: train's numbering goes on from it
    skipped: dict[str, Counter]  # per dataset, its rows skipped as twins ("exact" / "template")


def hold_out(
    ordered: dict[str, list[dict]],
    weights: dict[str, float],
    eval_samples: int,
    dev_samples: int,
    holdout: Holdout,
) -> HeldOut:
    """Eval, then dev (when dev_samples), from the seeded-order rows of each dataset of
    holdout.sources, skipping in what is left every twin (rule holdout.rule) of the prompts held
    out so far, the eval sets' first, and every row that carries a piece of holdout.pieces."""
    # Each split takes a prefix of what is left of every dataset it draws from; what follows it is
    # merged on, numbered from where the split left each dataset, less the twins of the prompts
    # held out so far: with no twin skipped this is the one merged sequence continued, and a
    # skipped twin's place goes to its own dataset's next row (shares hold).
    skipped = {name: Counter() for name in ordered}
    starts = dict.fromkeys(ordered, 0)
    held: list[dict] = [row for rows in holdout.sets.values() for row in rows]
    sources = set(ordered if holdout.sources is None else holdout.sources)

    def without_twins(counts: dict[str, int]) -> dict[str, list[dict]]:
        return {
            name: list(without_eval_twins(part[counts[name] :], held, holdout.rule, skipped[name]))
            for name, part in ordered.items()
        }

    def take(n: int) -> list[dict]:
        nonlocal ordered
        drawn = {name: part for name, part in ordered.items() if name in sources}
        rows, counts = next_rows(drawn, weights, starts, n)
        held.extend(rows)
        for name in ordered:
            starts[name] += counts.get(name, 0)
        ordered = without_twins({name: counts.get(name, 0) for name in ordered})
        return rows

    if holdout.pieces is not None:
        ordered = {
            name: list(without_pieces(part, holdout.pieces, skipped[name]))
            for name, part in ordered.items()
        }
    if held:
        ordered = without_twins(dict.fromkeys(ordered, 0))
    eval_rows = take(eval_samples)
    dev = take(dev_samples) if dev_samples else []
    if holdout.sources is not None:
        # eval and dev came from some datasets only: train is a sequence of its own, numbered
        # from 0 in every dataset, so that its shares are the weights
        starts = dict.fromkeys(starts, 0)
    return HeldOut(eval_rows, dev, ordered, starts, skipped)


@dataclass
class Drawn:
    """What mix_splits drew and set aside on the way, as its report counts it."""

    requested: dict[str, int]  # rows asked of each split (train: `samples`)
    splits: dict[str, list[dict]]  # train, eval, dev
    skipped: dict[str, Counter]  # per dataset, its rows skipped as twins of held-out prompts
    copies: dict[str, dict[str, int]]  # per dataset, its copies of an earlier dataset's rows
    renamed: int  # ids renamed to be unique across datasets


def mix_splits(
    pools: dict[str, list[dict]],
    cfg: MixConfig,
    samples: int,
    seed: int,
    sets: dict[str, list[dict]] | None = None,
    pieces: PieceIndex | None = None,
) -> tuple[dict[str, list[dict]], dict]:
    """({"train", "eval", "dev"}: rows, report) from prepared records per dataset, by params.mix,
    `samples` and `seed`, the eval sets' rows (`sets`: evaluate.sets, name -> rows) held out of
    train first, and with them every row carrying one of `pieces` (the paragraphs of the sets
    held out piece by piece); see the module docstring for the rule.

    Fewer rows than requested is not an error here: everything is taken, and the report has the
    numbers per dataset for the stage to decide (`shortfall_problems`). A train split left empty
    (every row went to eval and dev) or a cap naming no dataset raises ValueError.
    """
    weights, caps = cfg.weights, cfg.caps
    eval_samples, dev_samples = cfg.eval_samples, cfg.dev_samples
    long_threshold_tokens = cfg.long_threshold_tokens
    sources = None if cfg.holdout_from is None else tuple(cfg.holdout_from)
    holdout = Holdout(cfg.holdout, sources, sets or {}, pieces)
    if holdout.rule not in HOLDOUT_RULES:
        raise ValueError(f"mix.holdout must be one of {HOLDOUT_RULES}, not {holdout.rule!r}")
    if unknown := sorted(set(caps) - set(pools)):
        raise ValueError(
            f"mix.caps names unknown datasets {unknown}; datasets: {', '.join(sorted(pools))}"
        )
    if holdout.sources is not None and (unknown := sorted(set(holdout.sources) - set(pools))):
        raise ValueError(
            f"mix.holdout_from names {unknown}, not datasets that give train prompts; they are: "
            f"{', '.join(sorted(pools))}"
        )
    pools = {name: rows for name, rows in pools.items() if weights[name] > 0}
    pools, copies = drop_cross_duplicates(pools)
    pools, renamed = make_ids_unique(pools)
    ordered = {name: seeded_order(rows, name, seed) for name, rows in pools.items()}
    held = hold_out(ordered, weights, eval_samples, dev_samples, holdout)
    sequence = merge_by_weight(held.ordered, weights, held.starts)
    train = tag_partition(list(islice(under_caps(sequence, caps), samples)), long_threshold_tokens)
    eval_rows = tag_partition(held.eval, long_threshold_tokens)
    dev = tag_partition(held.dev, long_threshold_tokens)
    if not train:
        raise ValueError(
            f"mix: no rows left for train; {len(eval_rows)} rows went to eval and {len(dev)} to "
            f"dev (eval_samples={eval_samples}, dev_samples={dev_samples})"
        )
    splits = {"train": train, "eval": eval_rows, "dev": dev}
    requested = {"train": samples, "eval": eval_samples, "dev": dev_samples}
    drawn = Drawn(requested, splits, held.skipped, copies, renamed)
    return splits, mix_report(pools, cfg, holdout, drawn)


def mix_report(
    pools: dict[str, list[dict]], cfg: MixConfig, holdout: Holdout, drawn: Drawn
) -> dict:
    """mix_splits' report: what was asked and drawn per split, per dataset, the duplicates
    dropped, ids renamed and the hold-out's twins."""
    weights, caps = cfg.weights, cfg.caps
    requested, splits, skipped = drawn.requested, drawn.splits, drawn.skipped
    copies, renamed = drawn.copies, drawn.renamed
    train, eval_rows, dev = splits["train"], splits["eval"], splits["dev"]
    total = sum(weights[name] for name in pools)
    train_counts = Counter(row["source"] for row in train)
    per_dataset = dataset_table(
        pools,
        {name: weights[name] / total for name in pools},
        caps,
        requested["train"],
        {
            "train": train_counts,
            "eval": Counter(row["source"] for row in eval_rows),
            "dev": Counter(row["source"] for row in dev),
        },
        {name: sum(c.values()) for name, c in skipped.items()},
    )
    report = {
        "requested": requested,
        "weights": {name: weights[name] / total for name in sorted(pools)},
        "available": {name: len(rows) for name, rows in sorted(pools.items())},
        "train": split_counts(train),
        "eval": split_counts(eval_rows),
        "dev": split_counts(dev),
        "caps": {name: caps[name] for name in sorted(caps) if name in pools},
        "capped": sorted(
            name for name in pools if name in caps and train_counts.get(name, 0) >= caps[name]
        ),
        "duplicates_dropped": {
            "total": sum(n for c in copies.values() for n in c.values()),
            "by_source": {name: sum(c.values()) for name, c in copies.items()},
            "copies_of": {name: c for name, c in copies.items() if c},
        },
        "ids_renamed": renamed,
        "holdout": holdout_report(holdout.rule, splits, skipped, holdout.sets),
        "shortfall": {split: requested[split] - len(splits[split]) for split in requested},
        "per_dataset": per_dataset,
        "weights_honoured": all(not row["short_of_weight"] for row in per_dataset.values()),
        "max_samples_at_weights": max_samples_at_weights(per_dataset),
    }
    if holdout.pieces is not None:
        report["holdout"]["pieces"] = pieces_report(holdout.pieces, train, skipped)
    return report


# ---- the prepared files: light rows in, full records of the chosen rows out ----------------------


def light_rows(path: Path, pieces: PieceIndex | None = None) -> list[dict]:
    """What mixing needs of each prepared record, plus the byte offset of its line (the full record
    is read back only if it is chosen). Hashes as ints and names interned, to keep each row small (a
    row per prepared record is what the seeded order over all of them needs); a record that
    carries one of `pieces` is marked with the held-out prompt's key ("piece_of")."""
    rows, offset = [], 0
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                keys = twin_keys(record["messages"], record["tools"])
                detail = record.get("source_detail")
                rows.append(
                    {
                        "id": record["id"],
                        "source": sys.intern(record["source"])
                        if isinstance(record.get("source"), str)
                        else record.get("source"),
                        "offset": offset,
                        **({"source_detail": sys.intern(str(detail))} if detail else {}),
                        "prompt_tokens_est": record["prompt_tokens_est"],
                        "digest": int(content_hash(record["messages"], record["tools"]), 16),
                        "twin_keys": (int(keys["exact"], 16), int(keys["template"], 16)),
                    }
                )
                if pieces is not None and (held := pieces.found(record["messages"])):
                    rows[-1]["piece_of"] = held
            offset += len(line)
    return rows


def full_records(rows: list[dict], paths: dict[str, Path]) -> Iterator[dict]:
    """The chosen light rows as full records, keeping the mixed id (it may have been renamed) and partition."""
    with ExitStack() as stack:
        files = {name: stack.enter_context(open(path, "rb")) for name, path in paths.items()}
        for row in rows:
            f = files[row["source"]]
            f.seek(row["offset"])
            yield {**json.loads(f.readline()), "id": row["id"], "partition": row["partition"]}


@dataclass
class Mixed:
    """The mix of the prepared files: the chosen light rows, the report, and what the rows came from."""

    train: list[dict]
    eval: list[dict]
    dev: list[dict]
    report: dict
    paths: dict[str, Path]  # dataset -> its prepared file (full_records reads the chosen rows back)
    inputs: dict[str, str]  # dataset -> sha256 of its prepared file
    shortfall: str | None  # the accepted shortfall, worded (mix.allow_shortfall), or None
    sets: dict[str, list[dict]] = field(default_factory=dict)  # each eval set's rows, held out


def read_pools(
    names: list[str], prepared_dir: Path, prepare_reports: Path, pieces: PieceIndex | None = None
) -> tuple[dict[str, list[dict]], dict[str, Path], dict[str, str], dict[str, dict]]:
    """(light rows, file, sha256, prepare figures) of each dataset's prepared file, its rows
    marked where they carry one of `pieces`. ValueError for a missing or mislabelled file."""
    pools, paths, inputs, prepared = {}, {}, {}, {}
    for name in sorted(names):
        path, report = prepared_dir / f"{name}.jsonl", prepare_reports / f"{name}.json"
        if not path.is_file() or not report.is_file():
            raise ValueError(
                f"{path} or {report} not found; run `python -m stages.prepare {name} ...` first"
            )
        pools[name], paths[name] = light_rows(path, pieces), path
        # A file from another dataset (renamed, stale) would silently mislabel the mix.
        if strays := sorted({row.get("source") for row in pools[name]} - {name}, key=str):
            raise ValueError(f"{path} holds rows of source {strays}, expected only {name!r}")
        inputs[name] = file_sha256(path)
        stats = read_json(report)
        prepared[name] = {
            key: stats.get(key)
            for key in ("rows_read", "rows_kept", "dropped", "resolved_revision")
        }
        if "builtin_source" in stats:  # what a builtin's rows were made from (its text's version)
            prepared[name]["builtin_source"] = stats["builtin_source"]
    return pools, paths, inputs, prepared


class EvalSets(NamedTuple):
    names: list[str]  # evaluate.sets: whole datasets held out before anything is drawn
    by_pieces: tuple[
        str, ...
    ] = ()  # of those, the ones held out piece by piece too (held_out_by_pieces)


def mix_prepared(
    names: list[str],
    sets: EvalSets,
    paths: Paths,
    cfg: MixConfig,
    samples: int,
    seed: int,
) -> Mixed:
    """Mix the prepared files of the datasets `names` (paths.prepared/<name>.jsonl, with the prepare
    report paths.prepare_reports/<name>.json) by `cfg`, the eval sets `sets` (prepared the same way)
    held out of train, those of sets.by_pieces piece by piece. ValueError for a missing or
    mislabelled file, a mix that cannot be drawn, a hold-out that does not hold, or a shortfall
    that mix.allow_shortfall does not accept."""
    # the sets first: the pieces of those held out piece by piece mark the train rows as read
    set_pools, files, inputs, prepared = read_pools(
        sets.names, paths.prepared, paths.prepare_reports
    )
    set_rows = {
        name: tag_partition(set_pools[name], cfg.long_threshold_tokens) for name in sets.names
    }
    pieces = None
    if sets.by_pieces:
        pieces = PieceIndex(
            {name: list(full_records(set_rows[name], files)) for name in sets.by_pieces}
        )
    pools, *found = read_pools(names, paths.prepared, paths.prepare_reports, pieces)
    # by dataset name, as one read of every file gives them
    files, inputs, prepared = (
        dict(sorted({**mine, **theirs}.items()))
        for mine, theirs in zip((files, inputs, prepared), found)
    )
    splits, report = mix_splits(pools, cfg, samples, seed, set_rows, pieces)
    train, eval_rows = splits["train"], splits["eval"]
    if problem := holdout_problem(report["holdout"], cfg.max_template_twin_share):
        raise ValueError(problem)
    if problem := pieces_problem(report["holdout"]):
        raise ValueError(problem)
    held = {"eval": eval_rows, "dev": splits["dev"], **set_rows}
    near = near_twins(
        {group: list(full_records(rows, files)) for group, rows in held.items()},
        full_records(train, files),
        cfg.near_twin_jaccard,
    )
    report["holdout"]["near_twins"] = near
    report["holdout"]["near_twin_jaccard"] = cfg.near_twin_jaccard
    report["holdout"]["max_near_twin_share"] = cfg.max_near_twin_share
    if problem := near_twin_problem(near, cfg.max_near_twin_share, cfg.near_twin_jaccard):
        raise ValueError(problem)
    report["allow_shortfall"] = cfg.allow_shortfall
    shortfall = None
    if problems := shortfall_problems(report):
        shortfall = (
            f"{'; '.join(problems)}.\n{shortfall_table(report)}\n"
            f"(available: rows left after cross-dataset duplicates; eval takes {len(eval_rows)} of them "
            "first, then dev; twins: rows kept out of train as twins of eval and dev prompts, "
            "mix.holdout)"
        )
        if not cfg.allow_shortfall:
            raise ValueError(
                f"mix: {shortfall}\nLower `samples` (at most {report['max_samples_at_weights']} "
                "keeps the weights), add data or change mix.weights / mix.caps, or set "
                "mix.allow_shortfall: true to train on the rows there are at the shares above."
            )
    reasons = sum((Counter(p["dropped"]) for p in prepared.values()), Counter())
    reasons["duplicate_across_datasets"] = report["duplicates_dropped"]["total"]
    report["prepare"] = prepared
    report["dropped_by_reason"] = dict(sorted((+reasons).items(), key=lambda kv: (-kv[1], kv[0])))
    return Mixed(train, eval_rows, splits["dev"], report, files, inputs, shortfall, set_rows)


class Paths(NamedTuple):
    prepared: Path  # datasets/prepared: <name>.jsonl of each dataset
    prepare_reports: Path  # reports/prepare: <name>.json of each dataset (its drop counts)
    out: Path  # datasets/prompts: train.jsonl, eval.jsonl, dev.jsonl, meta.json


def run(params, paths: Paths) -> Mixed:
    """Stage `mix`: the prepared datasets mixed by params.mix into paths.out (train, eval and dev
    prompts as full records, each eval set's under sets/, meta.json); the mix, whose report the
    stage writes. ValueError as mix_prepared, or for mix.weights that do not name the datasets."""
    sets = list(params.evaluate.sets)
    check_weights(params.datasets, params.mix, sets)
    by_pieces = [name for name in sets if held_out_by_pieces(params.datasets[name])]
    mixed = mix_prepared(
        train_datasets(params.datasets, sets),
        EvalSets(sets, tuple(by_pieces)),
        paths,
        params.mix,
        params.samples,
        params.seed,
    )
    for split in ("train", "eval", "dev"):
        write_jsonl(paths.out / f"{split}.jsonl", full_records(getattr(mixed, split), mixed.paths))
    (paths.out / "sets").mkdir(parents=True, exist_ok=True)
    for stale in (paths.out / "sets").glob("*.jsonl"):
        if stale.stem not in mixed.sets:
            stale.unlink()
    for name, rows in mixed.sets.items():
        write_jsonl(paths.out / "sets" / f"{name}.jsonl", full_records(rows, mixed.paths))
    write_meta(
        paths.out,
        "mix",
        {"samples": params.samples, "seed": params.seed, "mix": params.mix.model_dump()},
        inputs=mixed.inputs,
        counts={"train": len(mixed.train), "eval": len(mixed.eval), "dev": len(mixed.dev)},
    )
    return mixed
