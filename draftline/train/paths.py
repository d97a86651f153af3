"""The train stage's paths, and the job its run hands a backend: the types the run
(draftline/train/run.py) and the speculators hand-off (draftline/train/speculators.py) share,
kept apart from both so that either imports them without the other (and without torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Paths:
    """The train stage's command line."""

    card: Path  # models/target/card.json
    vocab: Path  # models/vocab
    tokenized: Path  # datasets/tokenized
    hs: Path  # datasets/hidden_states
    out: Path  # models/draft
    report: Path  # reports/train.json: the metrics (the whole report in train.detail.json)
    state: Path  # models/draft_checkpoints: resume state

    @property
    def live(self) -> Path:
        """reports/train: dvclive's per-epoch metrics and plots, beside the report."""
        return self.report.with_suffix("")

    @property
    def inputs(self) -> TrainPaths:
        return TrainPaths(vocab=self.vocab, tokenized=self.tokenized, hs=self.hs, state=self.state)


@dataclass(frozen=True)
class TrainPaths:
    """The train stage's inputs and its resume-state directory (models/draft_checkpoints)."""

    vocab: Path
    tokenized: Path
    hs: Path
    state: Path


@dataclass(frozen=True)
class TrainJob:
    """One train run as its backend gets it: the paths; train.init prepared as a speculators-format
    directory (None: a new draft); what the hidden_states stage recorded (`source`,
    draftline/train/data.py hidden_states_source); the fingerprints of the data and of train.init,
    which a resume state of the builtin loop must match."""

    paths: TrainPaths
    init_dir: Path | None
    source: dict
    data_sha256: str
    init_sha256: str | None
