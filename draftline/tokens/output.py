"""The tokenized output on disk: its Arrow layout, the shards and their frequencies as they are
written, and the files a finished run publishes (the previous output a rerun may keep:
draftline/tokens/previous.py). The code here shapes the files a rerun keeps: it is in their key
(draftline/core/shaping.py)."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from pathlib import Path

from draftline.core.errors import DraftlineError
from draftline.core.io import atomic_path, write_json


class TokenizeError(DraftlineError):
    """The conversations cannot become a dataset (no row left, a token id outside the vocabulary)."""


SHARD_CONVERSATIONS = 2048  # conversations per Arrow file

INDEX = "conversations.jsonl"  # per conversation, in row order: its hash and what it gave

FEATURES = {
    "id": "string",
    "part": "int64",
    "input_ids": ["int64"],
    "loss_mask": ["int64"],
    "seq_len": "int64",
}


def features():
    # datasets loads on first use: importing this module stays light
    from datasets import Features, List, Value

    return Features(
        {
            name: List(Value(kind[0])) if isinstance(kind, list) else Value(kind)
            for name, kind in FEATURES.items()
        }
    )


def short_sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def token_frequencies(out: Path, shards: list[dict]) -> dict[int, int]:
    """Trainable-token counts over every shard, keyed in the order speculators'
    save_token_frequency_distribution inserts them (by first row, then id): the same file."""
    import numpy as np

    ids, counts, first, base = [], [], [], 0
    for shard in shards:
        found, n, row = np.load(out / shard["freq"])
        ids.append(found)
        counts.append(n)
        first.append(row + base)
        base += shard["rows"]
    if not ids:
        return {}
    ids, counts, first = np.concatenate(ids), np.concatenate(counts), np.concatenate(first)
    order = np.lexsort((first, ids))  # by id, then first row: a unique id's first row is first
    ids, counts, first = ids[order], counts[order], first[order]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    total = np.add.reduceat(counts, starts)
    unique, earliest = ids[starts], first[starts]
    order = np.lexsort((unique, earliest))
    return dict(zip(unique[order].tolist(), total[order].tolist()))


# ---- writing shards ---------------------------------------------------------------------------


class ShardWriter:
    """Arrow files of at most `per_shard` conversations, each with the frequencies of its
    trainable tokens (.freq.npy: token ids, counts and first row, [3, n] int64), named by what they
    hold; written beside the output under a temporary name, renamed once complete."""

    def __init__(
        self, out: Path, key_sha: str, vocab_size: int, per_shard: int, per_write: int
    ) -> None:
        """`per_shard` conversations a shard (SHARD_CONVERSATIONS); their rows written every
        `per_write` conversations (one record batch)."""
        self.out, self.key_sha, self.vocab_size = out, key_sha, vocab_size
        self.per_shard, self.per_write = per_shard, per_write
        self.schema = features().arrow_schema
        self.shards: list[dict] = []
        self.pending: list = []  # tables not yet written (one record batch per flush)
        self.pending_conversations = 0
        self.writer = None

    def _open(self):
        import numpy as np
        import pyarrow as pa

        self.tmp = self.out / f".shard-{len(self.shards):05d}.arrow.tmp"
        self.sink = pa.OSFile(str(self.tmp), "wb")
        self.writer = pa.ipc.new_stream(self.sink, self.schema)
        self.digest = hashlib.sha256(self.key_sha.encode())
        self.conversations = self.rows = 0
        self.counts = np.zeros(self.vocab_size, dtype=np.int64)
        self.first = np.full(self.vocab_size, -1, dtype=np.int64)

    def add(self, key: tuple[str, str], table) -> None:
        """One conversation's rows (a table of the schema, possibly empty)."""
        if self.writer is None:
            self._open()
        self.digest.update(f"{key[0]}\0{key[1]}\n".encode())
        self.conversations += 1
        if table.num_rows:
            self.pending.append(table)
        self.pending_conversations += 1
        if self.pending_conversations >= self.per_write:
            self.flush()
        if self.conversations >= self.per_shard:
            self.close_shard()

    def flush(self) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        self.pending_conversations = 0
        if not self.pending:
            return
        table = pa.concat_tables(self.pending).combine_chunks()
        self.pending = []
        self.writer.write_table(table)
        ids = table.column("input_ids").chunk(0)
        mask = table.column("loss_mask").chunk(0).flatten().to_numpy().astype(bool)
        tokens = ids.flatten().to_numpy()[mask]
        self.counts += np.bincount(tokens, minlength=self.vocab_size)
        unseen = self.first[tokens] < 0
        if unseen.any():  # tokens are in row order: a token's first index is in its first row
            rows = pc.list_parent_indices(ids).to_numpy()[mask][unseen] + self.rows
            found, first = np.unique(tokens[unseen], return_index=True)
            self.first[found] = rows[first]
        self.rows += table.num_rows

    def close_shard(self) -> None:
        import numpy as np

        if self.writer is None:
            return
        self.flush()
        self.writer.close()
        self.sink.close()
        tag = self.digest.hexdigest()[:12]
        name = f"data-{len(self.shards):05d}-{tag}"
        os.replace(self.tmp, self.out / f"{name}.arrow")
        ids = np.flatnonzero(self.counts)
        freq = np.stack([ids, self.counts[ids], self.first[ids]])
        with atomic_path(self.out / f"{name}.freq.npy") as tmp, open(tmp, "wb") as f:
            np.save(f, freq)
        self.shards.append(
            {
                "file": f"{name}.arrow",
                "conversations": self.conversations,
                "rows": self.rows,
                "bytes": (self.out / f"{name}.arrow").stat().st_size,
                "freq": f"{name}.freq.npy",
            }
        )
        self.writer = None

    def keep(self, shard: dict) -> None:
        """A shard of the previous output, unchanged."""
        self.shards.append(shard)


# ---- one batch of conversations ---------------------------------------------------------------


def rows_table(rows: list[dict], schema, vocab_size: int):
    """The rows as one Arrow table (ids through numpy: a nested list converts several times slower).
    TokenizeError for a token id outside the target vocabulary."""
    import numpy as np
    import pyarrow as pa

    lengths = np.fromiter((len(row["input_ids"]) for row in rows), dtype=np.int64, count=len(rows))
    ends = np.cumsum(lengths)
    offsets = pa.array(np.concatenate([[0], ends]).astype(np.int32))

    def lists(name: str):
        flat = np.fromiter(
            itertools.chain.from_iterable(row[name] for row in rows),
            dtype=np.int64,
            count=int(lengths.sum()),
        )
        if name == "input_ids" and flat.size and (flat.max() >= vocab_size or flat.min() < 0):
            at = int(np.flatnonzero((flat >= vocab_size) | (flat < 0))[0])
            raise TokenizeError(
                f"error: conversation {rows[int(np.searchsorted(ends, at, side='right'))]['id']}: token "
                f"id {flat[at]} is outside the target vocabulary ({vocab_size}); tokenizer and "
                "model disagree"
            )
        return pa.ListArray.from_arrays(offsets, pa.array(flat), type=schema.field(name).type)

    return pa.table(
        {
            "id": pa.array([row["id"] for row in rows], pa.string()),
            "part": pa.array([row["part"] for row in rows], pa.int64()),
            "input_ids": lists("input_ids"),
            "loss_mask": lists("loss_mask"),
            "seq_len": pa.array(lengths),
        },
        schema=schema,
    )


def save_frequencies(freq: dict[int, int], path: Path) -> None:
    """torch.save under the file's own name (torch names the archive inside after it: the bytes
    equal speculators' file), through a temporary directory and a rename."""
    import tempfile

    import torch

    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".freq-") as tmp:
        torch.save(freq, Path(tmp) / path.name)
        os.replace(Path(tmp) / path.name, path)


def write_dataset_files(out: Path, shards: list[dict], fingerprint: str) -> None:
    """state.json and dataset_info.json as Dataset.save_to_disk writes them, torch format set
    (input_ids, loss_mask, seq_len as tensors, id and part as they are)."""
    write_json(
        out / "dataset_info.json",
        {
            "citation": "",
            "description": "",
            "features": features().to_dict(),
            "homepage": "",
            "license": "",
        },
    )
    write_json(
        out / "state.json",
        {
            "_data_files": [{"filename": s["file"]} for s in shards],
            "_fingerprint": fingerprint,  # of the index: identical rows, identical fingerprint
            "_format_columns": ["input_ids", "loss_mask", "seq_len"],
            "_format_kwargs": {},
            "_format_type": "torch",
            "_output_all_columns": True,
            "_split": None,
        },
    )
