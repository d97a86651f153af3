"""Eval held out by content: the keys by which a prompt is a twin of another (its first turn's user
messages exactly, or as a template with digits masked), near-twins beyond templates (MinHash LSH
over their words), and how many of each the mix kept out of train or found left in it.

Both keys read the user messages of the first turn only: a system prompt or a tool list does not
make the same question new (the bundled templated sets ask one question under many system
prompts). Near-twins: prompts whose word sets (the same user text, digits masked) have a Jaccard
similarity of at least `mix.near_twin_jaccard`, e.g. a template with its names changed. They are
found by datasketch's MinHash LSH, which indexes the held-out prompts and queries each train
prompt: a cost linear in train that fits 100k-row mixes (overhead/near_twins.py measures it against
rapidfuzz's all-pairs scoring, whose cost grows with held-out x train), each candidate then
checked by its exact Jaccard. Near-twins are counted and refused above `mix.max_near_twin_share`,
not skipped: a template family that near-twins the held-out prompts would otherwise drain its
dataset from train unseen; the refusal names the prompts, and `mix.holdout_from` chooses datasets
whose prompts can be held out."""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from draftline.core.io import text_sha256

if TYPE_CHECKING:
    from collections.abc import Iterable


HOLDOUT_RULES = ("exact", "template")


def first_assistant(messages: list[dict]) -> int:
    return next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))


def first_turn_text(messages: list[dict], tools: list | None) -> str:
    """The normalized first turn: roles and contents before the first assistant turn, and the tools
    (NFKC, lower case, whitespace runs collapsed to one space)."""
    canonical = json.dumps(
        {
            "turn": [
                [m["role"], m.get("content") or ""] for m in messages[: first_assistant(messages)]
            ],
            "tools": tools,
        },
        sort_keys=True,
        ensure_ascii=False,
    )
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", canonical).lower()).strip()


def twin_keys(messages: list[dict], tools: list | None) -> dict[str, str]:
    """The hold-out keys of a prompt, 16 hex each: `exact`, its first turn's user messages
    normalized (a system prompt or a tool list does not make the same question new), and
    `template`, the same with every run of digits replaced by 0. `tools` is not read: kept for
    the callers' signature."""
    text = first_turn_text(user_turns(messages), None)
    return {
        "exact": text_sha256(text)[:16],
        "template": text_sha256(re.sub(r"\d+", "0", text))[:16],
    }


def user_turns(messages: list[dict]) -> list[dict]:
    """The user messages of the first turn (before the first assistant turn)."""
    return [m for m in messages[: first_assistant(messages)] if m["role"] == "user"]


def near_words(messages: list[dict]) -> frozenset[str]:
    """The word set near-twins compare: the first turn's user text normalized, digits masked."""
    text = " ".join(m.get("content") or "" for m in user_turns(messages))
    text = unicodedata.normalize("NFKC", text).lower()
    return frozenset(re.findall(r"\w+", re.sub(r"\d+", "0", text)))


def row_twin_keys(row: dict) -> dict:
    """A row's hold-out keys: precomputed by light_rows (two ints), else computed from its messages
    and tools."""
    keys = row.get("twin_keys")
    if isinstance(keys, tuple):
        return {"exact": keys[0], "template": keys[1]}
    return keys or twin_keys(row["messages"], row.get("tools"))


def without_eval_twins(
    rows: Iterator[dict], eval_rows: list[dict], rule: str, counts: Counter
) -> Iterator[dict]:
    """The rows, skipping exact twins of eval prompts and, with rule "template", template twins;
    `counts` gets "exact" / "template" per skipped row (a row that is both counts as exact)."""
    exact = {row_twin_keys(r)["exact"] for r in eval_rows}
    template = {row_twin_keys(r)["template"] for r in eval_rows}
    for row in rows:
        keys = row_twin_keys(row)
        if keys["exact"] in exact:
            counts["exact"] += 1
        elif rule == "template" and keys["template"] in template:
            counts["template"] += 1
        else:
            yield row


def twin_overlap(train: list[dict], eval_rows: list[dict]) -> dict[str, int]:
    """Eval prompts with an exact / a template twin among the train rows."""
    exact = {row_twin_keys(r)["exact"] for r in train}
    template = {row_twin_keys(r)["template"] for r in train}
    return {
        "exact": sum(row_twin_keys(r)["exact"] in exact for r in eval_rows),
        "template": sum(row_twin_keys(r)["template"] in template for r in eval_rows),
    }


def holdout_report(
    rule: str,
    splits: dict[str, list[dict]],
    skipped: dict[str, Counter],
    sets: dict[str, list[dict]] | None = None,
) -> dict:
    """The report's `holdout`: the rule, the train rows skipped as twins, and the eval and dev
    prompts (and each eval set's) that keep a twin in train (or eval in dev)."""
    train, eval_rows, dev = splits["train"], splits["eval"], splits["dev"]
    skipped_total = sum(skipped.values(), Counter())
    return {
        "rule": rule,
        "train_rows_skipped": {
            "exact": skipped_total["exact"],
            "template": skipped_total["template"],
        },
        "eval_with_twin_in_train": twin_overlap(train, eval_rows),
        "dev_with_twin_in_train": twin_overlap(train, dev),
        "eval_with_twin_in_dev": twin_overlap(dev, eval_rows),
        "eval": len(eval_rows),
        "dev": len(dev),
        "sets": {
            name: {"prompts": len(rows), "with_twin_in_train": twin_overlap(train, rows)}
            for name, rows in sorted((sets or {}).items())
        },
    }


def holdout_problem(holdout: dict, max_template_twin_share: float) -> str | None:
    """Why the held-out eval or dev split is not held out (twins left in train, or eval twins in
    dev), or None; records each split's template twin share in `holdout`."""
    holdout["max_template_twin_share"] = max_template_twin_share
    problems = []
    for split, other, key, share_key in (
        ("eval", "train", "eval_with_twin_in_train", "template_twin_share"),
        ("dev", "train", "dev_with_twin_in_train", "dev_template_twin_share"),
        ("eval", "dev", "eval_with_twin_in_dev", "eval_dev_template_twin_share"),
    ):
        overlap, n = holdout[key], holdout[split]
        share = overlap["template"] / n if n else 0.0
        holdout[share_key] = round(share, 4)
        if overlap["exact"]:
            problems.append(
                f"{overlap['exact']} {split} prompts have an exact twin in {other} (a bug: twins "
                "are skipped)"
            )
        elif share > max_template_twin_share:
            problems.append(
                f"{overlap['template']} of {n} {split} prompts ({share:.0%}) share a template "
                f"(digits masked) with a {other} prompt, above "
                f"mix.max_template_twin_share={max_template_twin_share}"
            )
    for name, found in holdout.get("sets", {}).items():
        overlap, n = found["with_twin_in_train"], found["prompts"]
        share = overlap["template"] / n if n else 0.0
        found["template_twin_share"] = round(share, 4)
        if overlap["exact"] or share > max_template_twin_share:
            problems.append(
                f"{overlap['template']} of {n} prompts of the eval set {name} share a template "
                f"(digits masked) with a train prompt ({overlap['exact']} exactly)"
            )
    if not problems:
        return None
    return (
        f"mix: {'; '.join(problems)}. A held-out split that repeats the templates it is compared "
        "with measures recall: set mix.holdout: template (skips them) or raise the share."
    )


# ---- near-twins beyond templates ------------------------------------------------------------

NEAR_PERMUTATIONS = 64  # MinHash permutations: LSH bands at the threshold from these
LSH_SLACK = 0.15  # the index is queried this far below the Jaccard threshold (recall)


def jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def _minhash(words: frozenset[str]):
    from datasketch import MinHash

    sketch = MinHash(num_perm=NEAR_PERMUTATIONS, seed=1)
    sketch.update_batch([w.encode() for w in sorted(words)])
    return sketch


class NearTwinIndex:
    """The held-out prompts (key -> messages) in a MinHash LSH index; `near(messages)` gives the
    held-out keys whose word sets have a Jaccard similarity of at least `threshold` with a prompt's,
    each with that similarity (exact, not the sketch's estimate)."""

    def __init__(self, held: dict[str, list[dict]], threshold: float):
        from datasketch import MinHashLSH

        self.threshold = threshold
        self.words = {key: near_words(messages) for key, messages in held.items()}
        # candidates below the threshold too (LSH_SLACK): the sketch's estimate misses some pairs
        # just above it, and every candidate is checked by its exact Jaccard anyway
        lsh_threshold = max(0.05, threshold - LSH_SLACK)
        self.lsh = MinHashLSH(threshold=lsh_threshold, num_perm=NEAR_PERMUTATIONS)
        for key, words in self.words.items():
            if words:
                self.lsh.insert(key, _minhash(words))

    def near(self, messages: list[dict]) -> list[tuple[str, float]]:
        words = near_words(messages)
        if not words or not self.words:
            return []
        found = ((key, jaccard(words, self.words[key])) for key in self.lsh.query(_minhash(words)))
        return sorted((key, round(j, 4)) for key, j in found if j >= self.threshold)


def near_twins(
    held: dict[str, list[dict]], train: Iterable[dict], threshold: float
) -> dict[str, dict]:
    """Per held-out group (eval, dev, each eval set: rows with id and messages): its prompts with a
    near-twin among the train records, {"prompts", "with_near_twin", "examples": up to five
    {held, train, jaccard}}."""
    index = NearTwinIndex(
        {f"{group}\0{row['id']}": row["messages"] for group, rows in held.items() for row in rows},
        threshold,
    )
    found: dict[str, dict[str, tuple[str, float]]] = {group: {} for group in held}
    for record in train:
        for key, similarity in index.near(record["messages"]):
            group, held_id = key.split("\0", 1)
            best = found[group].get(held_id)
            if best is None or similarity > best[1]:
                found[group][held_id] = (record["id"], similarity)
    return {
        group: {
            "prompts": len(held[group]),
            "with_near_twin": len(found[group]),
            "examples": [
                {"held": held_id, "train": train_id, "jaccard": similarity}
                for held_id, (train_id, similarity) in sorted(found[group].items())[:5]
            ],
        }
        for group in held
    }


def near_twin_problem(near: dict[str, dict], max_share: float, threshold: float) -> str | None:
    """Why a held-out group keeps too many near-twins in train (above max_share), or None."""
    problems = []
    for group, found in near.items():
        share = found["with_near_twin"] / found["prompts"] if found["prompts"] else 0.0
        found["share"] = round(share, 4)
        if share > max_share:
            first = found["examples"][0]
            problems.append(
                f"{found['with_near_twin']} of {found['prompts']} {group} prompts ({share:.0%}) "
                f"have a near-twin in train (e.g. {first['held']} ~ {first['train']}, Jaccard "
                f"{first['jaccard']})"
            )
    if not problems:
        return None
    return (
        f"mix: {'; '.join(problems)}: word sets at least mix.near_twin_jaccard={threshold} alike, "
        f"above mix.max_near_twin_share={max_share}. Hold out prompts from datasets whose prompts "
        "are not variations of each other (mix.holdout_from), or raise the share"
    )


# ---- pieces: eval sets assembled from paragraphs -------------------------------------------

# A piece is a paragraph of this many words at least. Shorter paragraphs (a heading, a "Changed in
# version" note, a grammar line) are phrases many texts share, not the document: holding them out
# would drain train of rows that carry nothing of the eval set.
PIECE_MIN_WORDS = 8
PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


def piece_words(text: str) -> tuple[str, ...]:
    """Text as pieces compare it: its words (NFKC, lower case), so line wrapping, spacing and
    punctuation do not hide a copy."""
    return tuple(re.findall(r"\w+", unicodedata.normalize("NFKC", text).lower()))


def pieces_of(messages: list[dict]) -> list[tuple[str, ...]]:
    """The pieces of a held-out prompt: every paragraph of every user turn (a history carries its
    document in later turns too) of at least PIECE_MIN_WORDS words."""
    return [
        words
        for m in messages
        if m["role"] == "user"
        for paragraph in PARAGRAPH_BREAK.split(m.get("content") or "")
        if len(words := piece_words(paragraph)) >= PIECE_MIN_WORDS
    ]


class PieceIndex:
    """The pieces of held-out prompts (group -> rows with id and messages), indexed by their first
    PIECE_MIN_WORDS words; `found(messages)` says which held-out prompt ("group/id") one of whose
    pieces a conversation carries, word for word, in a system, user or tool turn (its assistant
    turns are written anew by regeneration). A cost linear in the train text."""

    def __init__(self, held: dict[str, list[dict]]):
        self.anchors: dict[tuple[str, ...], list[tuple[tuple[str, ...], str]]] = {}
        self.counts: dict[str, int] = {}  # group -> its distinct pieces
        for group, rows in sorted(held.items()):
            distinct = set()
            for row in rows:
                for words in pieces_of(row["messages"]):
                    distinct.add(words)
                    self.anchors.setdefault(words[:PIECE_MIN_WORDS], []).append(
                        (words, f"{group}/{row['id']}")
                    )
            self.counts[group] = len(distinct)

    def found(self, messages: list[dict]) -> str | None:
        for m in messages:
            if m["role"] == "assistant":
                continue
            words = piece_words(m.get("content") or "")
            for i in range(len(words) - PIECE_MIN_WORDS + 1):
                for piece, key in self.anchors.get(words[i : i + PIECE_MIN_WORDS], ()):
                    if words[i : i + len(piece)] == piece:
                        return key
        return None


def row_piece(row: dict, pieces: PieceIndex) -> str | None:
    """The held-out prompt one of whose pieces a row carries: marked by light_rows (a row without
    its messages), else found in its messages."""
    if "messages" not in row:
        return row.get("piece_of")
    return pieces.found(row["messages"])


def without_pieces(rows: Iterator[dict], pieces: PieceIndex, counts: Counter) -> Iterator[dict]:
    """The rows, skipping those that carry a held-out piece; `counts` gets "piece" per skipped row."""
    for row in rows:
        if row_piece(row, pieces) is None:
            yield row
        else:
            counts["piece"] += 1


def pieces_report(pieces: PieceIndex, train: list[dict], skipped: dict[str, Counter]) -> dict:
    """The report's `holdout.pieces`: the pieces per set, the train rows skipped for carrying one
    and the train rows that still do (0 unless skipping is broken)."""
    return {
        "min_words": PIECE_MIN_WORDS,
        "sets": dict(pieces.counts),
        "train_rows_skipped": sum(c["piece"] for c in skipped.values()),
        "train_rows_with_piece": sum(row_piece(row, pieces) is not None for row in train),
    }


def pieces_problem(holdout: dict) -> str | None:
    """Why a set held out piece by piece still has a piece in train, or None."""
    found = holdout.get("pieces", {}).get("train_rows_with_piece", 0)
    if not found:
        return None
    return (
        f"mix: {found} train prompts carry a paragraph of an eval set held out piece by piece "
        f"({', '.join(holdout['pieces']['sets'])}): a bug, such rows are skipped"
    )
