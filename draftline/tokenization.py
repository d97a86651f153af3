"""Tokenizing regenerated conversations into the speculators Arrow layout, with token frequencies.

Rows are append-only: conversations come ordered by the regenerate run that wrote them, then by
prompt order within a run (draftline.conversation_store.run_of), restricted to the prompts of
train.jsonl. A rerun that fills prompts which failed before, or that grows `samples`, appends their
rows after every existing one, so hidden-state file hs_{i} stays row i and only the new rows are
extracted (ordering by prompt alone would shift every row after a filled gap; by finish order, two
runs of the same data would differ). A conversation gives one row, or several when the chat
template rewrites earlier turns (see draftline/chat.py). Columns: `id` (prompt id), `part` (row
within the conversation), `input_ids`, `loss_mask`, `seq_len`. token_freq.pt counts trainable
tokens only (speculators' save_token_frequency_distribution).

Rows longer than tokenize.max_length are cut (their tails lost). When more than
tokenize.max_truncated_share of them were, the report says so and the stage fails naming
tokenize.max_length: cut rows look small, so the hidden-state disk estimate and every row after
this stage would describe the cut data, not the answers the target gave.
Each assistant turn's tokens are compared with the server's own: the token ids regenerate recorded
for it (vLLM, SGLang and the hf server return them) and its usage.completion_tokens; the report
counts per dataset source how many turns re-tokenize to exactly the ids the target generated.
`tokenize.assistant_ids: server` trains on the server's ids instead (draftline/chat.py splices
them between the template's tokens); turns without recorded ids keep their re-tokenized span.
"""

from __future__ import annotations

import math
import shutil
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from draftline.card import TargetCard
    from draftline.config import TokenizeConfig


class TokenizeError(Exception):
    """The conversations cannot become a dataset (no row left, a token id outside the vocabulary)."""


def generation_eos_ids(card: TargetCard):
    """The eos ids generation stops on (a list for Llama 3.x), or None without a generation config."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(card.model, revision=card.revision).eos_token_id
    except OSError:
        return None


def pin_fingerprint(dataset_dir: Path) -> None:
    """save_to_disk records a random `_fingerprint`; replace it by a hash of the Arrow data, so
    identical rows give a byte-identical directory and DVC keeps the stages after this one cached."""
    import hashlib
    import json

    h = hashlib.sha256()
    for f in sorted(dataset_dir.glob("data-*.arrow")):
        with open(f, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
    state_path = dataset_dir / "state.json"
    state = json.loads(state_path.read_text())
    state["_fingerprint"] = h.hexdigest()[:16]
    state_path.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")


def server_turns(regeneration: dict) -> list | None:
    """What the server said of each assistant turn of a line (draftline/regeneration.py records
    `completion_token_ids` and `turn_completion_tokens` per turn); None for a line written before
    they were recorded."""
    from draftline.chat import ServerTurn

    ids = regeneration.get("completion_token_ids")
    counts = regeneration.get("turn_completion_tokens")
    if not isinstance(ids, list) and not isinstance(counts, list):
        return None
    ids = ids if isinstance(ids, list) else []
    counts = counts if isinstance(counts, list) else []
    return [
        ServerTurn(
            ids[k] if k < len(ids) and isinstance(ids[k], list) else None,
            counts[k] if k < len(counts) and isinstance(counts[k], int) else None,
        )
        for k in range(max(len(ids), len(counts)))
    ]


TURN_COUNTS = (
    "assistant_turns",
    "no_server_ids",  # the line records no ids for the turn (an older line, or an engine without)
    "server_ids",
    "retokenized_equal_server_ids",
    "retokenized_differ_from_server_ids",
    "server_ids_without_end_of_turn",  # completed with the template's end-of-turn token
    "prefilled",  # span starts inside a pre-filled generation prompt: never spliced
    "spliced",  # assistant_ids: server, the server's ids are the turn's tokens
    "with_usage",
    "retokenized_count_differs_from_usage",
    "server_ids_count_differs_from_usage",
)


def count_turn(counts: dict, check: dict) -> None:
    """Adds one check_turn result (draftline/chat.py) to `counts` (keys: TURN_COUNTS)."""
    counts["assistant_turns"] += 1
    counts["prefilled"] += check["prefilled"]
    counts["spliced"] += check["spliced"]
    if check["server_ids"]:
        counts["server_ids"] += 1
        counts["retokenized_equal_server_ids"] += check["equal"]
        counts["retokenized_differ_from_server_ids"] += not check["equal"]
        counts["server_ids_without_end_of_turn"] += check["end_of_turn_added"]
    else:
        counts["no_server_ids"] += 1
    usage = check["usage_completion_tokens"]
    if usage is not None:
        counts["with_usage"] += 1
        counts["retokenized_count_differs_from_usage"] += check["retokenized_tokens"] != usage
        if check["server_ids"]:
            counts["server_ids_count_differs_from_usage"] += check["server_tokens"] != usage


def row_order(
    prompts_path: str, regenerated_path: str
) -> tuple[dict[str, dict], list[str], int, int]:
    """(prompt id -> its first regenerated line, the ids to tokenize in row order, prompts in
    train.jsonl, unreadable regenerated lines)."""
    from draftline.conversation_store import run_of
    from draftline.io import read_jsonl, read_jsonl_tolerant

    regenerated_rows, bad_lines = read_jsonl_tolerant(regenerated_path)
    regenerated = {}  # prompt id -> its first line
    for row in regenerated_rows:
        regenerated.setdefault(row["id"], row)
    prompt_ids = [row["id"] for row in read_jsonl(prompts_path)]
    position = {pid: i for i, pid in enumerate(prompt_ids)}
    order = sorted(
        (pid for pid in regenerated if pid in position),
        key=lambda pid: (run_of(regenerated[pid]), position[pid]),
    )
    return regenerated, order, len(prompt_ids), bad_lines


def tokenize_dataset(
    card: TargetCard, prompts_path: str, regenerated_path: str, out_dir: str, cfg: TokenizeConfig
) -> dict:
    """Tokenize the regenerated conversations into `out_dir` (the Arrow dataset, token_freq.pt,
    meta.json), replacing what was there; the report. TokenizeError when no row comes out or a
    token id falls outside the target vocabulary."""
    from datasets.arrow_writer import ArrowWriter
    from jinja2 import TemplateError
    from rich.progress import track
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    from datasets import Dataset, Features, List, Value, load_from_disk
    from draftline.chat import (
        TemplateMismatch,
        end_of_turn_tokens,
        mark_length_cut,
        tokenize_conversation,
    )
    from draftline.config import output_shaping
    from draftline.io import read_json, write_meta
    from draftline.target import card_tokenizer

    # render with the template arguments the server got (enable_thinking...), as regenerate recorded them
    regen_meta = Path(regenerated_path).parent / "meta.json"
    regen_params = read_json(regen_meta).get("params") or {} if regen_meta.exists() else {}
    template_kwargs = regen_params.get("chat_template_kwargs") or {}
    tokenizer = card_tokenizer(card)
    stops = end_of_turn_tokens(tokenizer, generation_eos_ids(card))
    regenerated, order, prompts, bad_lines = row_order(prompts_path, regenerated_path)

    out = Path(out_dir)
    if (
        out.exists()
    ):  # a rerun replaces the dataset whole (no stale shards, no reused token_freq.pt)
        shutil.rmtree(out)
    building = out.with_name(f".{out.name}.building.arrow")
    features = Features(
        {
            "id": Value("string"),
            "part": Value("int64"),
            "input_ids": List(Value("int64")),
            "loss_mask": List(Value("int64")),
            "seq_len": Value("int64"),
        }
    )
    skipped = {"template_mismatch": 0, "template_error": 0, "no_trainable_tokens": 0}
    conversations = rows = split = truncated = tokens = trainable = longest = whole = 0
    lengths = []  # every row's tokens before the cut (rows dropped as untrained included)
    turn_counts: dict[str, Counter] = {}  # source -> TURN_COUNTS
    differing = []  # the first few turns whose re-tokenized span differs from the server's ids
    with ArrowWriter(features=features, path=str(building)) as writer:
        for pid in track(order, description="tokenize"):
            row = regenerated[pid]
            regeneration = row.get("regeneration") or {}
            messages = mark_length_cut(row["messages"], regeneration.get("finish_reasons"))
            try:
                parts = tokenize_conversation(
                    tokenizer,
                    messages,
                    row.get("tools"),
                    cfg.max_length,
                    stops,
                    template_kwargs,
                    server_turns(regeneration),
                    cfg.assistant_ids == "server",
                )
            except TemplateMismatch:
                skipped["template_mismatch"] += 1
                continue
            except (
                TemplateError
            ):  # the template refuses the conversation (e.g. two parallel tool calls)
                skipped["template_error"] += 1
                continue
            lengths += [p["length"] for p in parts]
            by_source = turn_counts.setdefault(str(row.get("source") or "?"), Counter())
            for check in (c for p in parts for c in p["checks"]):
                count_turn(by_source, check)
                if check.get("first_difference") is not None and len(differing) < 5:
                    differing.append(
                        {
                            "id": pid,
                            "message": check["message"],
                            "first_difference": check["first_difference"],
                            "retokenized": tokenizer.convert_ids_to_tokens(
                                check["retokenized_around"]
                            ),
                            "server": tokenizer.convert_ids_to_tokens(check["server_around"]),
                        }
                    )
            kept = [p for p in parts if any(p["loss_mask"])]  # truncation can leave a row untrained
            skipped["no_trainable_tokens"] += len(parts) - len(kept)
            for k, p in enumerate(kept):
                if max(p["input_ids"]) >= card.vocab_size:
                    raise TokenizeError(
                        f"conversation {pid}: token id {max(p['input_ids'])} is outside the "
                        f"target vocabulary ({card.vocab_size}); tokenizer and model disagree"
                    )
                writer.write(
                    {
                        "id": pid,
                        "part": k,
                        "input_ids": p["input_ids"],
                        "loss_mask": p["loss_mask"],
                        "seq_len": len(p["input_ids"]),
                    }
                )
                truncated += p["truncated"]
                whole += p["whole"]
                tokens += len(p["input_ids"])
                trainable += sum(p["loss_mask"])
                longest = max(longest, len(p["input_ids"]))
            conversations += bool(kept)
            split += len(kept) > 1
            rows += len(kept)
        writer.finalize()
    if not rows:
        building.unlink()
        cut = sum(n > cfg.max_length for n in lengths)
        raise TokenizeError(
            f"tokenize produced no rows from {regenerated_path} (skipped: {skipped})"
            + (
                f"; {cut} of {len(lengths)} rows were longer than tokenize.max_length "
                f"{cfg.max_length}, which left them no trainable token: raise it"
                if cut
                else ""
            )
        )

    dataset = Dataset.from_file(str(building))
    dataset.set_format(
        type="torch", columns=["input_ids", "loss_mask", "seq_len"], output_all_columns=True
    )
    dataset.save_to_disk(str(out))
    del dataset
    building.unlink()
    pin_fingerprint(out)
    save_token_frequency_distribution(load_from_disk(str(out)), out / "token_freq.pt")
    write_meta(
        out,
        "tokenize",
        output_shaping(cfg),  # max_truncated_share decides whether the stage passes, not the rows
        chat_template_sha256=card.chat_template_sha256,
        end_of_turn_tokens=stops,
        chat_template_kwargs=template_kwargs,
    )
    totals = Counter()
    for counts in turn_counts.values():
        totals.update(counts)
    return {
        "conversations": conversations,
        "rows": rows,
        "split_conversations": split,  # the template rewrote earlier turns: more than one row
        "missing_regenerations": prompts - len(order),
        "unreadable_regenerated_lines": bad_lines,
        "skipped": skipped,
        "tokens": tokens,
        "trainable_tokens": trainable,
        "trainable_fraction": round(trainable / tokens, 4),
        "truncated": truncated,
        # rows whose segment-wise tokens differed from the row tokenized at once (see draftline/chat.py)
        "rows_tokenized_whole": whole,
        "max_length": cfg.max_length,
        "longest_row": longest,
        "end_of_turn_tokens": stops,
        "check": truncation_check(lengths, cfg.max_length, cfg.max_truncated_share),
        # each assistant turn's re-tokenized span against the server's own token ids and
        # usage.completion_tokens, as regenerate recorded them (docs/regeneration.md)
        "server_token_ids": {
            "assistant_ids": cfg.assistant_ids,
            **{k: totals[k] for k in TURN_COUNTS},
            "by_source": {
                source: {k: counts[k] for k in TURN_COUNTS}
                for source, counts in sorted(turn_counts.items())
            },
            "first_differences": differing,
        },
    }


def truncation_check(lengths: list[int], max_length: int, max_share: float) -> dict:
    """reports/tokenize.json's `check`: the share of rows cut at max_length (`lengths`: each row's
    tokens before the cut) against tokenize.max_truncated_share, the longest row before the cut,
    and the max_length that would cut at most that share."""
    cut = sum(n > max_length for n in lengths)
    share = cut / len(lengths) if lengths else 0.0
    ordered = sorted(lengths)
    keep = min(len(ordered) - 1, math.ceil((1 - max_share) * len(ordered)) - 1)
    return {
        "param": "tokenize.max_truncated_share",
        "rows": len(lengths),
        "truncated": cut,
        "share": round(share, 4),
        "threshold": max_share,
        "verdict": "fail" if share > max_share else "pass",
        "longest_before_cut": ordered[-1] if ordered else 0,
        "max_length_for_threshold": ordered[max(keep, 0)] if ordered else max_length,
    }


def truncation_error(report: dict) -> str | None:
    """The stage's error when more rows were cut than tokenize.max_truncated_share."""
    check = report["check"]
    if check["verdict"] != "fail":
        return None
    return (
        f"error: {check['truncated']} of {check['rows']} rows ({check['share']:.1%}) were longer "
        f"than tokenize.max_length {report['max_length']} and cut (the longest had "
        f"{check['longest_before_cut']} tokens), more than tokenize.max_truncated_share "
        f"{check['threshold']}: their tails are lost and the hidden-state disk estimate counts "
        f"only what is left. Raise tokenize.max_length (to at least the longest context "
        f"regenerate allows, regenerate.short/long.max_context; {check['max_length_for_threshold']} "
        f"would cut at most {check['threshold']:.0%} of these rows), or raise "
        "tokenize.max_truncated_share (1.0 turns the check off)."
    )
