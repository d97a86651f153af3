"""Tokenizing regenerated conversations into the speculators Arrow layout, with token frequencies.

Rows are append-only: conversations come ordered by the regenerate run that wrote them, then by
prompt order within a run (draftline/tokens/lines.py), restricted to the prompts of
train.jsonl. A rerun that fills prompts which failed before, or that grows `samples`, appends their
rows after every existing one, so hidden-state file hs_{i} stays row i and only the new rows are
extracted (ordering by prompt alone would shift every row after a filled gap; by finish order, two
runs of the same data would differ). A conversation gives one row, or several when the chat
template rewrites earlier turns (see draftline/tokens/chat.py). Columns: `id` (prompt id), `part` (row
within the conversation), `input_ids`, `loss_mask`, `seq_len`. token_freq.pt counts trainable
tokens only (speculators' save_token_frequency_distribution).

Rows longer than tokenize.max_length are cut (their tails lost). When more than
tokenize.max_truncated_share of them were, the report says so and the stage fails naming
tokenize.max_length: cut rows look small, so the hidden-state disk estimate and every row after
this stage would describe the cut data, not the answers the target gave.
Each assistant turn's tokens are compared with the server's own: the token ids regenerate recorded
for it (vLLM, SGLang and the hf server return them) and its usage.completion_tokens; the report
counts per dataset source how many turns re-tokenize to exactly the ids the target generated.
`tokenize.assistant_ids: server` trains on the server's ids instead (draftline/tokens/chat.py splices
them between the template's tokens); turns without recorded ids keep their re-tokenized span.

Streamed, and incremental. The regenerated file is read twice, a line at a time: once for each
conversation's id, run, place and a hash of its line, once (by seeking) for the conversations to
tokenize, BATCH_CONVERSATIONS at a time through one batched tokenizer call (draftline/tokens/chat.py,
tokenize_rows). Rows go to Arrow shards of SHARD_CONVERSATIONS conversations as they come; each
shard carries the frequencies of its trainable tokens, and conversations.jsonl (named by its
hash) what each conversation gave, so the report and token_freq.pt are rebuilt from them without
reading a row. What a run holds in memory: one batch, the shard being written (frequency arrays
of the vocabulary's size), and per conversation its id and hash: 100k conversations of 4k tokens
(6 GB of rows) need the same memory as 1k, bar those ids and hashes. The output persists: see
tokenize_dataset for what a rerun keeps. Before it keeps rows, resume.verify_sample of their
conversations are tokenized again and must give them (check_kept_rows: the key can miss what
shapes a row, and says nothing of a file edited in place).

This module is the run around the rows, not what they hold: what a conversation gives is
draftline/tokens/rows.py (over draftline/tokens/chat.py), the shards and their frequencies
draftline/tokens/output.py; those are in the rows' key (draftline/core/shaping.py), this one is not.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

from draftline.core.card import TargetCard
from draftline.core.config import output_shaping
from draftline.core.derivation import Derivation, derive
from draftline.core.io import file_sha256, read_json, text_sha256, write_meta
from draftline.tokens.chat import end_of_turn_tokens
from draftline.tokens.lines import Line, regenerated_lines
from draftline.tokens.output import (
    INDEX,
    SHARD_CONVERSATIONS,
    ShardWriter,
    TokenizeError,
    rows_table,
    save_frequencies,
    short_sha,
    token_frequencies,
    write_dataset_files,
)
from draftline.tokens.previous import (
    Previous,
    RowsCheck,
    kept_prefix,
    mismatch_message,
    previous_output,
    rows_difference,
    sample_kept,
)
from draftline.tokens.report import index_report, no_rows_message
from draftline.tokens.rows import plan_batch, tokenize_batch

if TYPE_CHECKING:
    from draftline.tokens.config import TokenizeConfig


def generation_eos_ids(card: TargetCard):
    """The eos ids generation stops on (a list for Llama 3.x), or None without a generation config."""
    # transformers, rich and jinja2 load on first use: importing this module stays light
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(card.model, revision=card.revision).eos_token_id
    except OSError:
        return None


BATCH_CONVERSATIONS = 64  # conversations tokenized in one batched call


def tokenizer_sha256(tokenizer) -> str:
    """The tokenizer's whole definition (vocabulary, merges, added tokens, pipeline)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = (
        backend.to_str()
        if backend is not None
        else json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    )
    return hashlib.sha256(text.encode()).hexdigest()


def template_source(tokenizer) -> str:
    """The chat template the tokenizer renders with, as the card hashes it (draftline/targets/
    model.py build_card: named templates joined in a stable order)."""
    template = tokenizer.chat_template
    if template is not None and not isinstance(template, str):
        template = "\n".join(f"{k}:{v}" for k, v in sorted(dict(template).items()))
    return template or ""


def template_special_tokens(tokenizer) -> dict:
    """The special tokens the chat template may read, by name: apply_chat_template passes each as
    a variable (Llama 3's template starts with bos_token), and they are set in
    tokenizer_config.json, not in the definition tokenizer_sha256 hashes. A name the template only
    mentions counts too: a key that holds too much costs a retokenization, one that holds too
    little keeps wrong rows."""
    source = template_source(tokenizer)
    return {
        name: value
        for name, value in sorted(tokenizer.special_tokens_map.items())
        if re.search(rf"\b{re.escape(name)}\b", source)
    }


def rows_derivation(
    card: TargetCard, tokenizer, cfg: TokenizeConfig, template_kwargs: dict, stops: list[str]
) -> Derivation:
    """Everything the rows of a conversation depend on besides its line, as every kept output's
    key is derived (draftline/core/derivation.py): the shaping tokenize params, the tokenizer and
    the template it renders with (and what they read), the code that shapes the rows
    (SHAPES["tokenize"], prose left out) and the pins of transformers, tokenizers and jinja2. A
    previous output made under another key is tokenized again whole.
    tests/tokens/test_rows_key.py changes each of them in turn and checks that wherever the rows
    change, this key does."""
    shaping = output_shaping(cfg)
    shaping.pop("max_truncated_share", None)  # decides whether the stage passes, not the rows
    inputs = {
        "tokenizer": tokenizer_sha256(tokenizer),
        # the template the tokenizer renders with: the card's value while the card and the
        # tokenizer's files agree, the files' where the card was not made again after an edit
        "chat_template": text_sha256(template_source(tokenizer)),
        "vocab_size": card.vocab_size,
        "chat_template_kwargs": template_kwargs,
        "end_of_turn_tokens": stops,
        # the special tokens the template reads (bos_token...), and whether they are matched
        "template_special_tokens": template_special_tokens(tokenizer),
        "split_special_tokens": bool(
            getattr(getattr(tokenizer, "backend_tokenizer", None), "encode_special_tokens", False)
        ),
    }
    return derive("tokenize", params=shaping, inputs=inputs)


def rows_key(
    card: TargetCard, tokenizer, cfg: TokenizeConfig, template_kwargs: dict, stops: list[str]
) -> dict:
    """rows_derivation's record: what meta.json holds as `key` (its short sha as `key_sha256`)."""
    return rows_derivation(card, tokenizer, cfg, template_kwargs, stops).record()


# ---- the stage's work -------------------------------------------------------------------------


def recorded_template_kwargs(regenerated_path: str) -> dict:
    """The chat template arguments the server got (enable_thinking...), as regenerate recorded
    them in its meta.json: the conversations are rendered with them."""
    regen_meta = Path(regenerated_path).parent / "meta.json"
    regen_params = read_json(regen_meta).get("params") or {} if regen_meta.exists() else {}
    return regen_params.get("chat_template_kwargs") or {}


def start_output(out: Path, prev: Previous | None, key_sha: str, kept: int, vocab_size: int):
    """A ShardWriter holding the previous output's first `kept` shards: the output directory made
    ready, a previous output with nothing to keep and partial files gone."""
    if prev is None and out.exists():  # nothing to keep: no stale shard survives
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    for stray in out.glob(".*.tmp"):  # a killed run's partial files
        stray.unlink()
    writer = ShardWriter(out, key_sha, vocab_size, SHARD_CONVERSATIONS, BATCH_CONVERSATIONS)
    for shard in prev.shards[:kept] if prev else []:
        writer.keep(shard)
    return writer


class Reuse:
    """The previous output's conversations after the first `start` (those of its kept shards), by
    (id, sha256): an unchanged one's rows are copied from the previous shards, not tokenized again."""

    def __init__(self, out: Path, prev: Previous | None, start: int):
        self.out, self.prev, self.start = out, prev, start
        self.reusable = {}  # (id, sha256) -> its position in the previous output
        if prev is not None:
            self.reusable = {key: i for i, key in enumerate(prev.keys) if i >= start}
        self.mapped: dict = {}  # the previous shard rows are copied from (one at a time:
        # its pages count in this process's memory while mapped)

    def rows(self, i: int):
        """The rows of the previous output's i-th conversation (a slice of its shard's table)."""
        import pyarrow as pa

        prev, mapped = self.prev, self.mapped
        k = prev.shard_of[i]
        if k not in mapped:
            mapped.clear()
            mapped[k] = pa.ipc.open_stream(pa.memory_map(str(self.out / prev.shards[k]["file"])))
            mapped[k] = mapped[k].read_all()
        return mapped[k].slice(prev.row_start[i], json.loads(prev.lines[i])["rows"])

    def kept(self, lines: list[Line]) -> list[tuple[Line, int]]:
        """(line, its position in the previous output) of each conversation whose rows this run
        keeps: those of the kept shards (the first `start`), then those copied."""
        out = list(zip(lines[: self.start], range(self.start)))  # kept_prefix: the same keys
        for line in lines[self.start :]:
            i = self.reusable.get((line.id, line.sha256))
            if i is not None:
                out.append((line, i))
        return out


@dataclass
class BatchFiles:
    """What a batch of conversations passes through: the lines to tokenize read from the
    regenerated file, then every conversation's rows (tokenized or copied) written to the shards
    and its entry to the index, in line order."""

    source: BinaryIO  # the regenerated file
    index: BinaryIO  # the new index, being written
    writer: ShardWriter
    reuse: Reuse
    counts: Counter  # conversations_ and rows_ copied and tokenized
    tokenizer: object
    stops: list[str]
    template_kwargs: dict
    vocab_size: int

    def read(self, batch: list[Line]) -> tuple[list, list]:
        """(line, row) of each conversation of the batch to tokenize, and their plans."""
        fresh = []
        for line in batch:
            if (line.id, line.sha256) not in self.reuse.reusable:
                self.source.seek(line.offset)
                fresh.append((line, json.loads(self.source.read(line.size))))
        return fresh, plan_batch(self.tokenizer, fresh, self.stops, self.template_kwargs)

    def write(self, batch: list[Line], made: list[tuple[dict, list[dict]]]) -> None:
        """The batch's rows and index entries: tokenize_batch's (`made`) for the lines read, the
        previous output's for the others."""
        reusable, counts = self.reuse.reusable, self.counts
        made = iter(made)
        fresh = []
        for line in batch:
            if (line.id, line.sha256) not in reusable:
                fresh.append(next(made))
        table = rows_table(
            [row for _, rows in fresh for row in rows], self.writer.schema, self.vocab_size
        )
        fresh, at = iter(fresh), 0
        for line in batch:
            i = reusable.get((line.id, line.sha256))
            if i is not None:
                rows, raw = self.reuse.rows(i), self.reuse.prev.lines[i]
                counts["conversations_copied"] += 1
                counts["rows_copied"] += rows.num_rows
            else:
                entry, made_rows = next(fresh)
                rows, at = table.slice(at, len(made_rows)), at + len(made_rows)
                raw = (json.dumps(entry, ensure_ascii=False) + "\n").encode()
                counts["conversations_tokenized"] += 1
                counts["rows_tokenized"] += len(made_rows)
            self.writer.add((line.id, line.sha256), rows)
            self.index.write(raw)


@dataclass(frozen=True)
class Rendering:
    """What makes a conversation's rows now, besides its line (the spot-check's view of a run)."""

    tokenizer: object
    stops: list[str]
    template_kwargs: dict
    card: TargetCard
    cfg: TokenizeConfig


def check_kept_rows(
    reuse: Reuse, lines: list[Line], n: int, regenerated_path: str, rendering: Rendering
) -> RowsCheck:
    """Up to n of the conversations whose rows this run keeps (draftline/tokens/previous.py:
    sample_kept) tokenized again as a fresh run would, their rows compared with those kept;
    TokenizeError at the first that differs. Reads only: it runs before anything is written."""
    result = RowsCheck(n)
    if n == 0:
        result.not_run = "resume.verify_sample is 0"
        return result
    chosen = sample_kept(reuse.kept(lines), n)
    if not chosen:
        result.not_run = "no rows kept from a previous output"
        return result
    batch = []
    with open(regenerated_path, "rb") as source:
        for line, _ in chosen:
            source.seek(line.offset)
            batch.append((line, json.loads(source.read(line.size))))
    tok = rendering.tokenizer
    plans = plan_batch(tok, batch, rendering.stops, rendering.template_kwargs)
    made = tokenize_batch(tok, batch, plans, rendering.card, rendering.cfg)
    for (line, i), (_, now) in zip(chosen, made):
        difference = rows_difference(reuse.rows(i).to_pylist(), now, tok)
        if difference is not None:
            raise TokenizeError(mismatch_message(line.id, difference, reuse.out))
        result.checked += 1
        result.rows += len(now)
    reuse.mapped.clear()
    return result


def run_batches(
    batches: list[list[Line]],
    files: BatchFiles,
    worker: ThreadPoolExecutor,
    card: TargetCard,
    cfg: TokenizeConfig,
    advance,
) -> None:
    """Every batch read, tokenized on `worker` (tokenize_batch) and written, in order; `advance`
    gets the conversations of each batch written."""
    # A pipeline: while the worker tokenizes batch k (the tokenizer runs outside the GIL),
    # this thread writes batch k-1 and reads and renders batch k+1; batch k+1 is handed to
    # the worker before batch k-1 is written, so the worker never waits on a write.
    running = None  # (batch, future)
    for batch in [*batches, None]:
        planned = files.read(batch) if batch is not None else None
        finished = None
        if running is not None:
            done, future = running
            finished = done, future.result()
        running = None
        if planned is not None:
            fresh, plans = planned
            running = batch, worker.submit(tokenize_batch, files.tokenizer, fresh, plans, card, cfg)
        if finished is not None:
            files.write(*finished)
            advance(len(finished[0]))


def tokenize_dataset(
    card: TargetCard,
    prompts_path: str,
    regenerated_path: str,
    out_dir: str,
    cfg: TokenizeConfig,
    verify_sample: int = 8,
) -> dict:
    """Tokenize the regenerated conversations into `out_dir` (Arrow shards in the layout
    `datasets.load_from_disk` reads, token_freq.pt, conversations.jsonl, meta.json); the report.
    TokenizeError when no row comes out, a token id falls outside the target vocabulary, or a kept
    conversation tokenized again does not give its kept rows (verify_sample of them, from
    resume.verify_sample: check_kept_rows; the report's `spot_check`).

    The output persists across runs: a conversation whose line is unchanged, under the same key
    (rows_key), keeps its rows. The shards that hold only the first conversations of the new
    order stay untouched (growing `samples` appends shards of the new rows); the rows of later
    unchanged conversations are copied into new shards; only new or changed lines are tokenized.
    meta.json is written last and names the files of the output: a killed run leaves the
    previous one whole (its files are removed only after the new meta.json is in place)."""
    from rich.progress import Progress

    # bound at call time: tests replace target.card_tokenizer
    from draftline.targets.model import card_tokenizer

    template_kwargs = recorded_template_kwargs(regenerated_path)
    tokenizer = card_tokenizer(card)
    stops = end_of_turn_tokens(tokenizer, generation_eos_ids(card))
    lines, prompts, bad_lines = regenerated_lines(prompts_path, regenerated_path)
    key = rows_key(card, tokenizer, cfg, template_kwargs, stops)
    key_sha = short_sha(key)

    out = Path(out_dir)
    prev, why_all = previous_output(out, key)
    kept = kept_prefix(prev, lines)
    start = sum(s["conversations"] for s in prev.shards[:kept]) if prev else 0
    reuse = Reuse(out, prev, start)
    rendering = Rendering(tokenizer, stops, template_kwargs, card, cfg)
    checked = check_kept_rows(reuse, lines, verify_sample, regenerated_path, rendering)
    writer = start_output(out, prev, key_sha, kept, card.vocab_size)
    counts = Counter()
    todo = lines[start:]
    batches = [
        todo[at : at + BATCH_CONVERSATIONS] for at in range(0, len(todo), BATCH_CONVERSATIONS)
    ]
    index_tmp = out / f".{INDEX}.tmp"
    with (
        open(index_tmp, "wb") as index,
        open(regenerated_path, "rb") as source,
        ThreadPoolExecutor(1) as worker,
        Progress(transient=True) as progress,
    ):
        for raw in prev.lines[:start] if prev else []:
            index.write(raw)
        task = progress.add_task("tokenize", total=len(todo))
        files = BatchFiles(
            source, index, writer, reuse, counts, tokenizer, stops, template_kwargs, card.vocab_size
        )
        run_batches(batches, files, worker, card, cfg, lambda n: progress.advance(task, n))
        writer.close_shard()
    reuse.mapped.clear()
    counts["conversations_kept"] = start
    counts["rows_kept"] = sum(s["rows"] for s in writer.shards[:kept])
    report = index_report(index_tmp, cfg, prompts - len(lines), bad_lines, stops)
    lengths = report.pop("_lengths")
    if not report["rows"]:
        raise TokenizeError(
            "error: " + no_rows_message(report, lengths, regenerated_path, cfg.max_length)
        )

    publish_output(
        out,
        index_tmp,
        writer.shards,
        cfg,
        chat_template_sha256=card.chat_template_sha256,
        end_of_turn_tokens=stops,
        chat_template_kwargs=template_kwargs,
        key_sha256=key_sha,
        key=key,
    )
    report["incremental"] = incremental_report(why_all, counts, kept, len(writer.shards))
    report["spot_check"] = checked.as_dict()  # kept conversations tokenized again and compared
    return report


def publish_output(
    out: Path, index_tmp: Path, shards: list[dict], cfg: TokenizeConfig, **meta
) -> None:
    """The index named by its hash, the dataset files, token_freq.pt, then meta.json (`meta`:
    write_meta's fields besides the index and shards), and only then the previous output's files
    no longer named removed: a killed run leaves the previous output whole."""
    digest = file_sha256(index_tmp)[:16]
    index_name = f"conversations-{digest}.jsonl"
    os.replace(index_tmp, out / index_name)
    write_dataset_files(out, shards, digest)
    freq = token_frequencies(out, shards)
    save_frequencies(freq, out / "token_freq.pt")
    write_meta(
        out,
        "tokenize",
        output_shaping(cfg),  # max_truncated_share decides whether the stage passes, not the rows
        **meta,
        index=index_name,
        shards=shards,
    )
    named = {"meta.json", "state.json", "dataset_info.json", "token_freq.pt", index_name}
    named |= {name for s in shards for name in (s["file"], s["freq"])}
    for path in out.iterdir():  # the previous output's files no longer named
        if path.name not in named and path.is_file():
            path.unlink()


def incremental_report(why_all: str, counts: Counter, kept: int, shards: int) -> dict:
    """The report's `incremental`: why every row was tokenized again (None when some were kept),
    the conversations and rows kept, copied and tokenized, the shards kept and written."""
    return {
        "all_tokenized_because": why_all or None,
        # kept: in shards left as they were; copied: into new shards from the previous output's
        **{
            f"{what}_{how}": counts[f"{what}_{how}"]
            for how in ("kept", "copied", "tokenized")
            for what in ("conversations", "rows")
        },
        "shards_kept": kept,
        "shards_written": shards - kept,
    }


class Paths(NamedTuple):
    card: Path  # models/target/card.json
    prompts: Path  # datasets/prompts/train.jsonl: which conversations, in which order
    regenerated: Path  # datasets/regenerated/conversations.jsonl
    out: Path  # datasets/tokenized


def run(params, paths: Paths) -> dict:
    """Stage `tokenize`: the regenerated conversations tokenized by params.tokenize into
    paths.out, params.resume.verify_sample kept conversations checked first; the report
    (truncation_error says whether it fails). TokenizeError as tokenize_dataset."""
    card = TargetCard.load(paths.card)
    verify = getattr(params, "resume", None)
    sample = verify.verify_sample if verify is not None else 8
    args = str(paths.prompts), str(paths.regenerated), str(paths.out), params.tokenize
    return tokenize_dataset(card, *args, verify_sample=sample)
