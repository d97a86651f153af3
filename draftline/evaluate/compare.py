"""Acceptance users can compare: every eval set (the held-out split and each `evaluate.sets` set)
measured for every draft (this run's, the one it started from, `evaluate.compare`'s), side by side,
by the same engine on the same prompts.

A set's rows come from `mix` (datasets/prompts/sets/<name>.jsonl: held out from train by content
like the split). A row with later user turns (MT-Bench) is asked turn by turn: the prompt of turn
t is the conversation so far with the target's own greedy replies, as a served model sees it. The
held-out split is asked as the headline asks it, first turns only, for every draft.
The engine is the built-in one, whose figures the parity gate holds equal to vLLM's on the split;
where the built-in engine cannot hold the target (evaluate.vllm.parity false) vLLM measures each
(set, draft) pair, first turns only.

A draft that does not fit the target (aux layer ids, hidden size, vocabulary, d2t/t2d) is refused
before anything is measured, by the preflight's own checks (draftline/draft/preflight.py)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.errors import DraftlineError
from draftline.core.io import read_jsonl
from draftline.data.pydoc_long import DECODE_HISTORY
from draftline.draft.checkpoint import load_draft, read_draft_facts
from draftline.draft.init_checks import InitMismatch
from draftline.draft.methods import chain
from draftline.draft.preflight import check_draft
from draftline.draft.pretrained import prepare_init
from draftline.evaluate.acceptance import (
    EvaluationTally,
    acceptance_summary,
    evaluate_prompt,
    load_models,
    lossless_summary,
    simulated_acceptance,
)
from draftline.evaluate.context import by_context
from draftline.evaluate.lookup import free_acceptance
from draftline.evaluate.paired import per_prompt_acceptance
from draftline.tokens.chat import chat_prompt_ids, first_turn_prompt

if TYPE_CHECKING:
    from draftline.core.card import TargetCard
    from draftline.evaluate.config import EvaluateConfig

HELD_OUT = "heldout"  # the held-out split's row in the table (datasets/prompts/eval.jsonl)
TRAINED, INIT = "trained", "init"

log = logging.getLogger(__name__)


class CompareError(DraftlineError, ValueError):
    """An eval set or a draft to compare that cannot be measured: what, and which param."""


class DraftRefused(CompareError):
    """A draft to compare that cannot be measured on this target: the mismatches, named."""


def set_rows(sets_dir: Path, names: list[str], limit: int | None) -> dict[str, list[dict]]:
    """Each eval set's rows as `mix` wrote them (up to `limit` each); CompareError for a set that
    `mix` did not write (run it again) or that holds no row."""
    rows = {}
    for name in names:
        path = sets_dir / f"{name}.jsonl"
        if not path.is_file():
            raise CompareError(f"{path} not found: evaluate.sets names {name!r}; run `mix` again")
        rows[name] = list(read_jsonl(path))[:limit]
        if not rows[name]:
            raise CompareError(
                f"{path}: the eval set {name!r} has no prompt left after the hold-out"
            )
    return rows


def resolve_draft(name: str, source: str, card: TargetCard, convert: dict, work: Path) -> Path:
    """A draft to compare as a speculators-format directory (a hub id fetched, an EAGLE/SpecForge
    checkpoint converted into `work`), refused (DraftRefused) unless it fits the target."""
    try:
        path = prepare_init(source, card, convert, work / name)
    except InitMismatch as err:  # its checks speak of train.init: say which draft it is
        what = str(err).removeprefix("train.init: ")
        raise DraftRefused(f"evaluate.compare {name} ({source}): {what}") from None
    if problems := check_draft(card, read_draft_facts(path), "vllm"):
        raise DraftRefused(
            f"evaluate.compare {name} ({source}) does not fit the target {card.model}: "
            + "; ".join(problems)
        )
    return path


def resolve_drafts(
    cfg: EvaluateConfig, card: TargetCard, init: str | None, init_convert: dict, work: Path
) -> dict[str, Path]:
    """The drafts to measure beside this run's, as speculators-format directories: train.init as
    "init" when fine-tuning (and evaluate.compare_init), then evaluate.compare's; each checked
    against the target first (DraftRefused), so a mismatch stops the stage before it measures."""
    sources = {}
    if init is not None and cfg.compare_init:
        sources[INIT] = (init, init_convert)
    sources.update({name: (source, {}) for name, source in cfg.compare.items()})
    return {
        name: resolve_draft(name, source, card, convert, work)
        for name, (source, convert) in sources.items()
    }


def turn_prompts(models, row: dict, replies: list[list[int]]) -> list[int]:
    """Token ids of the row's next turn: its first-turn prompt, then each earlier reply of the
    target (`replies`, decoded) and the user turn that followed it."""
    users = [m for m in row["messages"] if m["role"] == "user"]
    messages = first_turn_prompt(row)
    for reply, user in zip(replies, users[1:]):
        text = models.tokenizer.decode(reply, skip_special_tokens=True)
        messages = [*messages, {"role": "assistant", "content": text}, user]
    return chat_prompt_ids(models.tokenizer, messages, row.get("tools"), {})


def measure_rows(
    models,
    cfg: EvaluateConfig,
    aux_ids: list[int],
    rows: list[dict],
    first_turns: bool = False,
    free: dict | None = None,
) -> dict:
    """One draft on one set: every user turn of every row (first_turns: each row's first, as the
    headline asks the held-out split) decoded speculatively and greedily (the lossless check),
    acceptance length, tokens per step, per position and tau_sim, and each row's own acceptance
    (its turns pooled: draftline/evaluate/paired.py pairs drafts over them); with `free`
    (benchmark.free), those methods replayed over the same greedy outputs
    (draftline/evaluate/lookup.py)."""
    tally = EvaluationTally()
    row_of: dict[str, str] = {}  # each turn asked -> its row
    for row in rows:
        # a long history is one prompt, decoded whole (eval_prompt_ids), not asked turn by turn
        whole = row.get("decode") == DECODE_HISTORY
        turns = 1 if whole or first_turns else sum(m["role"] == "user" for m in row["messages"])
        replies: list[list[int]] = []
        for turn in range(turns):
            asked = row if turn == 0 else {**row, "id": f"{row['id']}#turn{turn + 1}"}
            row_of[asked["id"]] = row["id"]
            if turn:
                asked["prompt_ids"] = turn_prompts(models, row, replies)
            evaluate_prompt(models, cfg, aux_ids, asked, tally)
            replies.append(tally.greedy[asked["id"]])
    real = acceptance_summary(tally.rounds, cfg.k, tally.emitted)
    lossless = lossless_summary(
        tally.verdicts, models.tie_tolerance, cfg.dtype, cfg.max_near_tie_share
    )
    return {
        "acceptance_length": real["acceptance_length"],
        "tokens_per_step": real["tokens_per_step"],
        "position_acceptance": real["position_acceptance"],
        "tau_sim": simulated_acceptance(tally.sums, chain(cfg.k))["tau_sim"],
        "prompts": len(rows),
        "turns": len(tally.verdicts),
        "rounds": real["rounds"],
        "lossless_checked_prompts": lossless["lossless_checked_prompts"],
        "by_context": by_context(
            tally.steps, cfg.context_buckets, cfg.confidence, "verification step context"
        ),
        "per_prompt": per_prompt_acceptance(tally.steps, row_of.__getitem__),
        **({"free": free_acceptance(free, tally.prompt_ids, tally.greedy, cfg.k)} if free else {}),
    }


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What to measure: the sets' rows (the held-out split first) and the drafts (name -> its
    speculators-format directory), this run's draft first; `free` (benchmark.free): the methods
    that need no draft, replayed over the target's greedy outputs of each set."""

    sets: dict[str, list[dict]]
    drafts: dict[str, Path]
    free: dict = dataclasses.field(default_factory=dict)


def compare_builtin(
    cfg: EvaluateConfig, card: TargetCard, comparison: Comparison, known: dict
) -> dict:
    """{set: {draft: figures}} by the built-in engine, the target loaded once; `known` ({set:
    {draft: figures}}) is taken as measured."""
    models = load_models(cfg, card, comparison.drafts[TRAINED])
    results = {name: dict(known.get(name, {})) for name in comparison.sets}
    for draft_name, path in comparison.drafts.items():
        todo = {s: rows for s, rows in comparison.sets.items() if draft_name not in results[s]}
        if todo and draft_name != TRAINED:
            models = dataclasses.replace(models, draft=load_draft(path, card, models.device))
        for set_name, rows in todo.items():
            log.info(f"evaluate: draft {draft_name} on {set_name} ({len(rows)} prompts)")
            # the split as the headline measured this run's draft on it: first turns only, so
            # every draft is measured on the same prompts there too
            # the greedy outputs are the target's, the same whichever draft: replayed once
            free = comparison.free if draft_name == TRAINED else None
            results[set_name][draft_name] = measure_rows(
                models, cfg, card.aux_ids, rows, set_name == HELD_OUT, free
            )
    return {
        name: {draft: row[draft] for draft in comparison.drafts} for name, row in results.items()
    }


def compare_vllm(cfg: EvaluateConfig, card: TargetCard, comparison: Comparison, engine) -> dict:
    """{set: {draft: figures}} by vLLM alone (each row's eval prompt; no tau_sim): one run per pair."""
    from draftline.evaluate.prompts import eval_prompt_ids
    from draftline.evaluate.vllm_engine import evaluate_with_vllm
    from draftline.targets.model import card_tokenizer

    tokenizer = card_tokenizer(card)
    results: dict[str, dict] = {name: {} for name in comparison.sets}
    for draft_name, path in comparison.drafts.items():
        for set_name, rows in comparison.sets.items():
            prompts = {row["id"]: eval_prompt_ids(tokenizer, row) for row in rows}
            vllm = evaluate_with_vllm(cfg, card, path, prompts, None, engine)
            results[set_name][draft_name] = {
                key: vllm[key]
                for key in ("acceptance_length", "position_acceptance", "rounds", "by_context")
                if key in vllm
            } | {"tokens_per_step": None, "tau_sim": None, "prompts": len(rows)}
    return results


def gains(results: dict) -> dict:
    """Per set: the trained draft's acceptance length over the one it started from (init)."""
    return {
        name: round(row[TRAINED]["acceptance_length"] - row[INIT]["acceptance_length"], 4)
        for name, row in results.items()
        if INIT in row and TRAINED in row
    }


def free_columns(results: dict) -> list[str]:
    """The benchmark.free methods any set's trained-draft row replayed (the table's columns)."""
    names: list[str] = []
    for row in results.values():
        for name, f in ((row.get(TRAINED) or {}).get("free") or {}).items():
            if f.get("replayed") and name not in names:
                names.append(name)
    return names


def sets_table(results: dict, engine: str, k: int) -> str:
    """The set x draft table (markdown): acceptance length, tokens per step in brackets, and the
    gain over init when there is one; a set's prompts, with its turns where rows have several."""
    drafts = list(next(iter(results.values())))
    gain = gains(results)
    free = free_columns(results)
    header = [
        "set",
        "prompts",
        *drafts,
        *(f"{name} (no draft)" for name in free),
        *(["gain over init"] if gain else []),
    ]
    lines = [
        f"Acceptance length (tokens per step) at k = {k}, per eval set and draft; engine: {engine}."
        + (
            " No draft: replayed over the target's greedy outputs (draftline/evaluate/lookup.py)."
            if free
            else ""
        ),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for name, row in results.items():
        first = next(iter(row.values()))
        turns = first.get("turns") or first["prompts"]
        prompts = str(first["prompts"]) + (f" ({turns} turns)" if turns != first["prompts"] else "")
        cells = [name, prompts]
        for draft in drafts:
            r = row[draft]
            tps = "" if r["tokens_per_step"] is None else f" ({r['tokens_per_step']:.2f})"
            cells.append(f"{r['acceptance_length']:.3f}{tps}")
        for name in free:
            f = ((row.get(TRAINED) or {}).get("free") or {}).get(name) or {}
            cells.append(
                f"{f['acceptance_length']:.3f} ({f['tokens_per_step']:.2f})"
                if f.get("replayed")
                else "—"
            )
        if gain:
            cells.append(f"{gain[name]:+.3f}" if name in gain else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
