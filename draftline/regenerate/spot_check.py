"""The spot-check of kept answers: before a rerun trusts the conversations it keeps, the server
that answers now scores a few of them teacher-forced.

A kept line is kept because its recorded settings match today's (draftline/regenerate/settings.py:
the target and its weights, the code, the pins). What a key cannot see is the server itself: an
`external` endpoint kept running on another model, a launched engine that computes otherwise.
So `resume.verify_sample` kept conversations (chosen by `seed`, 0 turns the check off) have their
first answer scored by the server: the prompt as the server builds it plus the answer's recorded
token ids, sent as one prompt with `prompt_logprobs` (vLLM's /v1/completions; the built-in batch
server answers the same request). Every answer token must be the server's top pick, or within
`resume.verify_margin` nats of it (a near tie: engines and batch make-ups round differently).

A mismatch stops the stage before anything is moved or sent, naming the conversation, the token
and the gap, and the user's choice: rerun fresh, or keep them (resume.verify_sample: 0). It does
not redo them by itself: the side that changed may be the wrong one (a server on another model).
Engines that cannot score a prompt (SGLang, transformers serve) are skipped, and the report says so.
"""

from __future__ import annotations

import json
import logging
import random
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

# the engines whose servers answer /v1/completions with prompt_logprobs: the batch server (hf), vLLM
SCORES_PROMPTS = ("hf", "vllm")


class SpotCheckFailed(RuntimeError):
    pass


@dataclass
class SpotCheck:
    """What the check did, as the report records it."""

    sample: int
    checked: list[str] = field(default_factory=list)
    tokens: int = 0
    near_ties: int = 0  # answer tokens not the top pick but within the margin
    skipped: dict[str, int] = field(default_factory=dict)
    not_run: str | None = None

    def as_dict(self) -> dict:
        return {
            "sample": self.sample,
            "checked": len(self.checked),
            "tokens": self.tokens,
            "near_ties": self.near_ties,
            "skipped": self.skipped,
            "not_run": self.not_run,
        }


def sample_kept(path: Path, done: set[str], n: int, seed: int) -> list[dict]:
    """Up to n kept lines of conversations.jsonl (ids in `done`), chosen by `seed`, file order."""
    if n <= 0 or not done or not Path(path).exists():
        return []
    chosen = set(random.Random(seed).sample(sorted(done), min(n, len(done))))
    rows = []
    with open(path, "rb") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and row.get("id") in chosen:
                chosen.discard(row["id"])
                rows.append(row)
    return rows


def first_answer(row: dict) -> tuple[list[dict], list[int]] | None:
    """(the messages before the first assistant turn, that turn's recorded token ids), or None
    where the line records no token ids."""
    messages = row.get("messages") or []
    turn = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    ids = (row.get("regeneration") or {}).get("completion_token_ids") or []
    if turn is None or not ids or not isinstance(ids[0], list) or not ids[0]:
        return None
    return messages[:turn], ids[0]


def score(url: str, model: str, ids: list[int], api_key: str | None, timeout: float) -> list:
    """The server's prompt_logprobs of `ids` (one entry per token, the first None)."""
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
    body["prompt_logprobs"] = 1
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(
        url.rstrip("/") + "/v1/completions", json.dumps(body).encode(), headers
    )
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.loads(resp.read())["choices"][0]["prompt_logprobs"]


def gap_at(entry: dict, token: int) -> tuple[float, int]:
    """(nats the server's top pick is above `token` at this position, the top pick's id)."""
    top_id, top = min(entry.items(), key=lambda kv: kv[1].get("rank", 1 << 30))
    mine = entry.get(str(token))
    if mine is None:  # not even listed: below the top-k the server was asked for
        return float("inf"), int(top_id)
    return max(0.0, top["logprob"] - mine["logprob"]), int(top_id)


@dataclass(frozen=True)
class Scorer:
    """How the kept answers are scored: the server and what its prompts are built with."""

    url: str
    model: str
    api_key: str | None
    prompt_ids: object  # (messages, tools) -> the prompt's token ids as the server builds them
    timeout_s: float = 120.0


def spot_check(
    rows: list[dict], scorer: Scorer, margin: float, sample: int, tokenizer=None
) -> SpotCheck:
    """Score each row's first answer (see the module docstring); SpotCheckFailed at the first
    token beyond `margin`. `tokenizer` only names the tokens in the message."""
    result = SpotCheck(sample)
    for row in rows:
        found = first_answer(row)
        if found is None:
            result.skipped["no recorded token ids"] = (
                result.skipped.get("no recorded token ids", 0) + 1
            )
            continue
        messages, answer = found
        prompt = list(scorer.prompt_ids(messages, row.get("tools")))
        try:
            scored = score(
                scorer.url, scorer.model, prompt + answer, scorer.api_key, scorer.timeout_s
            )
        except (urllib.error.URLError, OSError, KeyError, ValueError) as err:
            raise SpotCheckFailed(
                f"error: resume.verify_sample: {scorer.url} did not score a kept answer "
                f"({type(err).__name__}: {err}); set resume.verify_sample: 0 to keep the "
                "conversations unchecked"
            ) from None
        for pos, token in enumerate(answer):
            entry = scored[len(prompt) + pos]
            gap, top = gap_at(entry, token)
            result.tokens += 1
            if gap == 0.0:
                continue
            if gap <= margin:
                result.near_ties += 1
                continue
            name = token_namer(tokenizer)
            raise SpotCheckFailed(
                f"error: the spot-check of kept conversations failed: {row['id']}, first "
                f"answer, token {pos}: the kept token {name(token)} is {gap:.3g} nats below the "
                f"server's pick {name(top)} (resume.verify_margin {margin}). {DISAGREE}"
            )
        result.checked.append(row["id"])
    return result


DISAGREE = (
    "The kept answers and the server answering now disagree: the target changed without its "
    "files changing, or the server runs another model or computes otherwise. Nothing was moved "
    "or sent. Check the server; then rerun fresh (move datasets/regenerated aside) or keep the "
    "conversations as they are (resume.verify_sample: 0)"
)


def token_namer(tokenizer):
    """A token id as the error names it: with its text where the tokenizer is at hand."""

    def name(i: int) -> str:
        return f"{i} ({tokenizer.decode([i])!r})" if tokenizer is not None else str(i)

    return name
