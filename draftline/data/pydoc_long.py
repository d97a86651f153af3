"""The built-in source `pydoc_long`: long-context eval prompts cut from the Python Language
Reference that ships inside CPython (`pydoc_data.topics`: topic name -> that topic's text, what
`help("assert")` prints; about 465,000 characters on Python 3.11).

Why this text: the bundled eval prompts are a few hundred tokens each, and acceptance at 4k-8k
tokens of context needs long, coherent, real prose. The reference is installed with every Python
(no hub download, nothing fetched at run time), is technical English with code in it, and no
train set of this project is made from it. It is not a benchmark anyone tunes on (HumanEval and
its kin stay out: reserved).

Two kinds of rows, in the canonical messages format (OpenAI `messages`, read by prepare like any
other source):

- `document`: one user turn, a run of whole paragraphs (one or more consecutive topics, starting
  at a section heading) followed by a question about the section it starts with;
- `history`: the same kind of run cut into parts at paragraph boundaries, one part per user turn
  with a short assistant acknowledgement after each, ending on a user turn with the question.

Every row carries `decode: "history"`: evaluate decodes it from its whole history up to the last
user turn (draftline/evaluate/prompts.py `eval_prompt_ids`), not from its first turn.

Lengths are estimated tokens, characters / 4 over every message (prepare's estimate,
draftline/data/formats.py); a row of length L fills between FILL x L and L, so it lies in the
bucket (L/2, L] of a doubling series. The target's tokenizer gives other counts (the evaluate
stage measures them). The row for (kind, length, i) starts at the i-th section heading of a
seeded order that prefers runs not overlapping another row of that kind and length; the same
Python, settings and seed give byte-identical rows. The text changes between Python versions, so
`reference_facts` (the version and a hash of the text) goes into the prepare report.

Rows come interleaved (every length and kind, then again): a prefix of the set, as
`evaluate.prompts` takes, covers every length.

`part: train` cuts rows to train on instead (long rows for a draft that should see long
context), from what an eval build leaves: the build named in `held_out` (its settings, as an eval
set of this source is given them) is made first, every section its rows touch (from the heading a
row starts at to the next heading after its last paragraph) is taken out of the reference, and
the train rows are cut, by the same rules, from the sections left, in topic-name order as before.
No train row shares a paragraph, or a section, with a row of that eval build, nor with a row of
any eval build it covers: rows are prefix-stable in `per_length` and each (kind, length) is cut on
its own, so the same seed and turn_tokens with a subset of its lengths and kinds and no more rows
per length give a subset of its rows. Train rows carry no `decode` (it is an eval setting), and
their ids start with `train-`. Without `part` (or with `part: eval`) the rows are those above,
byte for byte.
"""

from __future__ import annotations

import bisect
import json
import platform
import re
from collections.abc import Iterator
from functools import cache
from typing import Literal, NamedTuple

from pydantic import model_validator

from draftline.core.config import Section, shaping
from draftline.core.errors import DraftlineError
from draftline.core.io import text_sha256
from draftline.data.holdout import PIECE_MIN_WORDS, piece_words

# a row's `decode`: evaluate decodes its whole history up to the last user turn as the prompt
# (draftline/evaluate/prompts.py eval_prompt_ids), not its first turn; draftline/data/formats.py keeps it
DECODE_HISTORY = "history"

SOURCE = "pydoc_data.topics"  # the module the text comes from
KINDS = ("document", "history")
MIN_LENGTH = 128  # tokens: below, a row holds little more than its heading and question
FILL = 0.8  # a row of length L is at least this share of L (estimated tokens)
CHARS_PER_TOKEN = 4  # prepare's estimate (formats.prompt_tokens_est)

PARTS = ("eval", "train")  # build.part: prompts to evaluate, or rows to train on
TRAIN_ID = "train-"  # the ids of a train part's rows start with it

PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
# a section heading: its title over a line of one repeated mark (*** a topic, === a section, ...)
HEADING = re.compile(r"\A(?P<title>[^\n]+)\n([*=\-~^])\2{2,}\Z")

# the question a row ends on; `title` is the heading its run of paragraphs starts with
QUESTIONS = (
    "Summarise what the text above says in the section titled '{title}'.",
    "Explain, in your own words, what the section titled '{title}' above says.",
    "What are the main points the text above makes in the section titled '{title}'?",
    "Using only the text above, describe what the section titled '{title}' covers and how it "
    "behaves.",
)
# a train part's questions and history turns, worded apart from the eval rows' so that no
# paragraph of a train row equals one of theirs (the mix holds eval sets out piece by piece:
# draftline/data/holdout.py, any paragraph of PIECE_MIN_WORDS words)
TRAIN_QUESTIONS = (
    "Give a short summary of the part headed '{title}' in the documentation above.",
    "Briefly, what does the part headed '{title}' explain?",
    "List the key points made under the heading '{title}'.",
    "Based on the documentation above, what is '{title}' about and how does it work?",
)


class PydocLongError(DraftlineError, ValueError):
    """Rows that cannot be cut from the reference as asked: the build key, and what the text
    holds instead (ValueError: prepare reports it as a dataset that cannot be read)."""


class PydocLongBuild(Section):
    """The rows a `builtin: pydoc_long` build cuts: their lengths, kinds, count and seed."""

    # prompt lengths, estimated tokens (characters / 4); each row fills 80-100% of its length
    lengths: list[int] = shaping([512, 1024, 2048, 4096, 8192], min_length=1)
    per_length: int = shaping(4, ge=1)  # rows of each kind at each length
    # document: one user turn, the text then its question; history: the text in parts over user
    # turns, each acknowledged by a short assistant turn, then the question
    kinds: list[Literal["document", "history"]] = shaping(["document", "history"], min_length=1)
    # history rows: the estimated tokens of reference text one user turn carries (2 turns at least)
    turn_tokens: int = shaping(1024, ge=64)
    seed: int = shaping(0)  # which sections the rows start at, and which question each asks

    @model_validator(mode="after")
    def _distinct_and_long_enough(self):
        if short := sorted(n for n in self.lengths if n < MIN_LENGTH):
            raise ValueError(
                f"lengths: {short} below {MIN_LENGTH} tokens (a heading and a question)"
            )
        if len(set(self.lengths)) != len(self.lengths) or len(set(self.kinds)) != len(self.kinds):
            raise ValueError(f"lengths {self.lengths} and kinds {self.kinds} name each one once")
        return self


class PydocLongConfig(PydocLongBuild):
    """datasets.<name>.build of a `builtin: pydoc_long` dataset (draftline/data/pydoc_long.py)."""

    # eval: prompts to evaluate (an eval set, named in evaluate.sets); train: rows to train on, cut
    # from the sections the eval build `held_out` leaves (none shares a paragraph with its rows)
    part: Literal["eval", "train"] = shaping("eval")
    # part train: the settings of the eval build it stays clear of, as that eval set is given them
    # (the keys above; {}: the defaults)
    held_out: PydocLongBuild | None = shaping(None)

    @model_validator(mode="after")
    def _held_out_with_train(self):
        if self.part == "train" and self.held_out is None:
            raise ValueError(
                "held_out: part train needs the settings of the eval build it stays clear of "
                "(e.g. held_out: {lengths: [512, 1024], per_length: 2}; {}: the defaults)"
            )
        if self.part == "eval" and self.held_out is not None:
            raise ValueError("held_out: only with part: train (an eval build is what is held out)")
        return self


class Reference(NamedTuple):
    """The text rows are cut from: every topic's paragraphs, in topic-name order."""

    python: str  # the interpreter's version: the text changes between versions
    sha256: str  # of the topics (name -> text, as JSON with sorted keys)
    characters: int
    paragraphs: list[str]
    headings: list[int]  # indices of the paragraphs that are section headings


@cache
def reference() -> Reference:
    """The reference of the running Python."""
    from pydoc_data.topics import topics

    paragraphs = [
        part.strip("\n").rstrip()
        for name in sorted(topics)
        for part in PARAGRAPH_BREAK.split(topics[name])
        if part.strip()
    ]
    return Reference(
        platform.python_version(),
        text_sha256(json.dumps(topics, sort_keys=True, ensure_ascii=False)),
        sum(len(text) for text in topics.values()),
        paragraphs,
        [i for i, text in enumerate(paragraphs) if HEADING.match(text)],
    )


def reference_facts(ref: Reference | None = None) -> dict:
    """What the rows were cut from, for the prepare report: the module, Python's version, the
    text's size and hash (another Python gives other text, so other rows)."""
    ref = ref or reference()
    return {
        "module": SOURCE,
        "python": ref.python,
        "characters": ref.characters,
        "paragraphs": len(ref.paragraphs),
        "sha256": ref.sha256,
    }


# ---- one row -------------------------------------------------------------------------------


def _pick(seed: int, kind: str, length: int, start: int) -> str:
    """The seeded hash that orders a (kind, length)'s candidate starts and picks their question."""
    return text_sha256(f"{seed}:{kind}:{length}:{start}")


def question(seed: int, kind: str, length: int, start: int, title: str, train: bool = False) -> str:
    asks = TRAIN_QUESTIONS if train else QUESTIONS
    return asks[int(_pick(seed, kind, length, start), 16) % len(asks)].format(title=title)


def turns_of(length: int, turn_tokens: int) -> int:
    """User turns carrying text in a history row of `length` tokens (2 at least)."""
    return max(2, round(length / turn_tokens))


def split_parts(paragraphs: list[str], parts: int) -> list[list[str]]:
    """`paragraphs` in `parts` consecutive groups (each one paragraph at least) of about equal
    characters, cut at paragraph boundaries."""
    total, run, cuts = sum(map(len, paragraphs)), 0, []
    for i, text in enumerate(paragraphs[:-1]):
        run += len(text)
        left = parts - 1 - len(cuts)  # cuts still to make
        if not left:
            break
        if run >= total * (len(cuts) + 1) / parts or len(paragraphs) - (i + 1) == left:
            cuts.append(i + 1)
    bounds = [0, *cuts, len(paragraphs)]
    return [paragraphs[a:b] for a, b in zip(bounds, bounds[1:])]


def document_messages(paragraphs: list[str], ask: str) -> list[dict]:
    return [{"role": "user", "content": "\n\n".join([*paragraphs, ask])}]


def history_messages(
    paragraphs: list[str], ask: str, parts: int, train: bool = False
) -> list[dict]:
    """The user turns carrying the parts, each acknowledged, then the question (a train part's
    worded apart: TRAIN_QUESTIONS)."""
    messages = []
    for k, part in enumerate(split_parts(paragraphs, parts), 1):
        if train:
            intro = (
                f"Here is some Python documentation, sent over {parts} messages; my question "
                f"follows the last one.\n\nMessage 1 of {parts}:"
                if k == 1
                else f"Message {k} of {parts}:"
            )
            ack = f"Received message {k} of {parts}."
        else:
            intro = (
                f"I will paste a section of the Python Language Reference in {parts} parts, then "
                f"ask a question about it.\n\nPart 1 of {parts}:"
                if k == 1
                else f"Part {k} of {parts}:"
            )
            ack = f"Got part {k} of {parts}."
        messages += [
            {"role": "user", "content": "\n\n".join([intro, *part])},
            {"role": "assistant", "content": ack},
        ]
    last = "That is all of it." if train else "That was the last part."
    return [*messages, {"role": "user", "content": f"{last} {ask}"}]


def prompt_chars(messages: list[dict]) -> int:
    return sum(len(m["content"]) for m in messages)


class Job(NamedTuple):
    """The rows of one kind at one length."""

    kind: str
    length: int
    count: int
    cfg: PydocLongBuild
    train: bool = False  # a train part's row: its questions and turns worded apart


def candidate(ref: Reference, job: Job, start: int, cum: list[int]) -> tuple[int, list] | None:
    """(end, messages) of the row starting at heading `start`: the most whole paragraphs from it
    whose row fits `job.length`, or None when that row fills less than FILL of it. `cum[i]`: the
    characters of the paragraphs before i, each with its 2-character break."""
    budget = job.length * CHARS_PER_TOKEN
    title = HEADING.match(ref.paragraphs[start]).group("title").strip()
    ask = question(job.cfg.seed, job.kind, job.length, start, title, job.train)
    parts = turns_of(job.length, job.cfg.turn_tokens)

    def messages_of(paragraphs: list[str]) -> list[dict]:
        if job.kind == "document":
            return document_messages(paragraphs, ask)
        return history_messages(paragraphs, ask, parts, job.train)

    # the question, the turns' wrappers and a break before each part's text: paragraphs
    # start..end-1 joined by blank lines take cum[end] - cum[start] - 2 characters beside them
    overhead = prompt_chars(messages_of([""] * (parts if job.kind == "history" else 1)))
    end = bisect.bisect_right(cum, cum[start] + budget - overhead + 2) - 1
    while end > start:  # a history's parts drop breaks, so the first try fits; checked anyway
        if job.kind == "history" and end - start < parts:
            return None
        messages = messages_of(ref.paragraphs[start:end])
        if prompt_chars(messages) <= budget:
            break
        end -= 1
    else:
        return None
    if prompt_chars(messages) < FILL * budget:
        return None
    return end, messages


def runs_of(ref: Reference, job: Job) -> list[tuple[int, int, list[dict]]]:
    """(start, end, messages) of `job.count` rows, paragraphs start..end-1: their starts in the
    seeded order, those whose runs overlap no row taken before first. PydocLongError when the
    reference has too few."""
    cum = [0]
    for text in ref.paragraphs:
        cum.append(cum[-1] + len(text) + 2)
    if job.length * CHARS_PER_TOKEN > cum[-1]:
        raise PydocLongError(
            f"build.lengths: {job.length} tokens is longer than the whole source: {SOURCE} of "
            f"Python {ref.python} holds {cum[-1]} characters in {len(ref.paragraphs)} paragraphs, "
            f"about {cum[-1] // CHARS_PER_TOKEN} tokens"
        )
    order = sorted(ref.headings, key=lambda s: _pick(job.cfg.seed, job.kind, job.length, s))
    found = [(s, got) for s in order if (got := candidate(ref, job, s, cum)) is not None]
    if len(found) < job.count:
        raise PydocLongError(
            f"build.per_length: {job.count} {job.kind} rows of {job.length} tokens asked, but "
            f"only {len(found)} sections of {SOURCE} (Python {ref.python}) start a run of whole "
            f"paragraphs that fills {FILL:.0%}-100% of it; lower per_length or change the length"
        )
    spans = []  # (start, end) of the runs taken so far that overlap no other
    for s, (end, _) in found:
        if len(spans) < job.count and all(end <= a or s >= b for a, b in spans):
            spans.append((s, end))
    first = {s for s, _ in spans}
    ranked = [(s, *got) for s, got in found if s in first]
    ranked += [(s, *got) for s, got in found if s not in first]
    return ranked[: job.count]


def rows_of(ref: Reference, job: Job) -> list[list[dict]]:
    """The messages of `job.count` rows (runs_of)."""
    return [messages for _, _, messages in runs_of(ref, job)]


def jobs(cfg: PydocLongBuild, train: bool = False) -> list[Job]:
    return [
        Job(kind, length, cfg.per_length, cfg, train)
        for length in cfg.lengths
        for kind in cfg.kinds
    ]


def sections(ref: Reference) -> list[range]:
    """The reference's sections, in order: each heading up to the next (what comes before the
    first heading is a section of its own)."""
    bounds = sorted({0, *ref.headings, len(ref.paragraphs)})
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def held_sections(ref: Reference, held_out: PydocLongBuild) -> set[int]:
    """The paragraphs of every section a row of the eval build `held_out` touches (from the
    heading its run starts at to the next heading after its last paragraph), and of every other
    section that repeats one of their paragraphs word for word: the reference repeats text across
    topics (`compound` holds what `for` and `if` hold)."""
    touched = set()
    for job in jobs(held_out):
        for start, end, _ in runs_of(ref, job):
            touched.update(range(start, end))
    held, pieces = set(), set()
    for section in sections(ref):
        if touched.intersection(section):
            held.update(section)
            pieces.update(piece_of(ref.paragraphs[i]) for i in section)
    pieces.discard(None)
    for section in sections(ref):
        if any(piece_of(ref.paragraphs[i]) in pieces for i in section):
            held.update(section)
    return held


def piece_of(paragraph: str) -> tuple[str, ...] | None:
    """A paragraph's words where the mix's piece holdout would match them (PIECE_MIN_WORDS
    words at least, draftline/data/holdout.py), else None."""
    words = piece_words(paragraph)
    return words if len(words) >= PIECE_MIN_WORDS else None


def train_reference(ref: Reference, held_out: PydocLongBuild) -> Reference:
    """The reference less the sections held_sections holds for `held_out`, what is left in the
    same order: what a train part's rows are cut from."""
    held = held_sections(ref, held_out)
    kept = [text for i, text in enumerate(ref.paragraphs) if i not in held]
    return ref._replace(
        paragraphs=kept, headings=[i for i, text in enumerate(kept) if HEADING.match(text)]
    )


def build_rows(cfg: PydocLongConfig, ref: Reference | None = None) -> Iterator[dict]:
    """Every row (OpenAI messages; `source`: kind-length, kept as each record's source_detail;
    an eval part's decoded from its whole history, evaluate's `decode`), interleaved: row i of
    every length and kind, then row i + 1; a train part's cut from train_reference. PydocLongError
    as rows_of, before any row is given."""
    ref = ref or reference()
    train = cfg.part == "train"
    if train:
        ref = train_reference(ref, cfg.held_out)
    made = {(job.kind, job.length): rows_of(ref, job) for job in jobs(cfg, train)}
    for i in range(cfg.per_length):
        for length in cfg.lengths:
            for kind in cfg.kinds:
                if train:
                    yield {
                        "id": f"{TRAIN_ID}{kind}-{length}-{i}",
                        "source": f"{kind}-{length}",
                        "messages": made[kind, length][i],
                    }
                    continue
                yield {
                    "id": f"{kind}-{length}-{i}",
                    "source": f"{kind}-{length}",
                    "decode": DECODE_HISTORY,
                    "messages": made[kind, length][i],
                }
