"""Write the bundled real-chat sample, datasets/samples/chitchat.jsonl, from chitchat-dataset.

    pip download chitchat-dataset==0.9.0 --no-deps -d /tmp/cc
    python scripts/make_chitchat_sample.py /tmp/cc/chitchat_dataset-0.9.0-py3-none-any.whl datasets/samples

SOURCE is the package's wheel, its dataset.json, or `installed` (after `pip install
chitchat-dataset==0.9.0`; not a project dependency: the written file is committed). From a wheel
or an installed package the package's own licence is copied beside the sample
(LICENSE-chitchat); a bare dataset.json has none. A third argument sets the number of rows
(default ROWS), for small trials; a fourth the rows of the eval set written beside it,
chitchat_eval.jsonl (default EVAL_ROWS, 0: none): the conversations the same rule keeps after the
first ROWS, so none of them is in chitchat.jsonl or a near duplicate of a row there (rule 5).

chitchat-dataset (MIT, BYU PCC lab's Chit-Chat Challenge, 2018) holds 7,168 conversations between
two people, typed in a chat window: {uuid: {"messages": [[{"text", "sender", "timestamp"}, ...],
...]}}, each inner list one speaker's consecutive lines (the speakers alternate). Rows are ShareGPT
{"id": "chitchat-<uuid>", "conversations": [{"from": "human"|"gpt", "value"}]}, the selection rule:

1. conversations in the order of sha256(f"{SEED}:{uuid}"), the first ROWS that pass are kept;
2. a turn is one speaker's lines joined by newlines;
3. the row starts at the first substantive turn: at least MIN_WORDS words, MIN_CONTENT_WORDS of them
   not small talk (GREETING_WORDS, letters repeated for emphasis folded: "hellooo" is "hello") -
   most chats open with "hello?" / "hi is anyone there?" / "how are you", which say nothing;
4. that turn's speaker is the user, the other the assistant, alternating, in whole exchanges (a row
   ends on the other speaker's reply: regenerate rewrites it, scripts/gpu_check.py trains on it as
   it is); at most MAX_USER_TURNS exchanges; the row ends before a turn over MAX_TURN_CHARS or one
   that takes it over MAX_ROW_CHARS (the tiny target's tokenizer, which never saw such text, spends
   many more tokens a character on it than on its own corpus); a conversation left without one
   exchange is skipped;
5. near duplicates removed: a row is skipped when its first turn's word set (lower case, digits
   as 0) is equal to, or has a Jaccard similarity of at least NEAR_JACCARD with, a kept row's (chats
   often open with the conversation's suggested topic, the same for many of them).
"""

import hashlib
import json
import re
import sys
import unicodedata
import zipfile
from pathlib import Path

ROWS = 600
EVAL_ROWS = 40  # the rows after them, chitchat_eval.jsonl: an eval set (evaluate.sets)
SEED = 0
MIN_WORDS, MIN_CONTENT_WORDS = 4, 2
MAX_USER_TURNS = 2
MAX_TURN_CHARS, MAX_ROW_CHARS = 240, 400
NEAR_JACCARD = 0.7
DATASET_MEMBER = "chitchat_dataset/dataset.json"
# Words of greetings and how-are-you small talk (folded as in `fold`).
GREETING_WORDS = frozenset(
    """hello hi hey heya hiya howdy yo sup hola greetings there anyone anybody someone somebody here
    home you u ya is are am it its it's i i'm im me how how's hows what what's whats up going doing
    good great fine well ok okay alright morning afternoon evening night day today again oh hm hmm
    man dude and about not much too also so thanks thank yes yeah yep yup no nope haha lol nice cool
    wow glad meet to chat chatting the a this my name world we our partner has been have do
    did was your any body knock""".split()
)


def fold(word: str) -> str:
    """A word with runs of a repeated letter folded to one ("hellooo", "hello" -> "helo")."""
    return re.sub(r"(.)\1+", r"\1", word)


FOLDED_GREETINGS = frozenset(fold(w) for w in GREETING_WORDS)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", unicodedata.normalize("NFKC", text).lower())


def substantive(text: str) -> bool:
    found = words(text)
    content = [w for w in found if fold(w.strip("'")) not in FOLDED_GREETINGS]
    return len(found) >= MIN_WORDS and len(content) >= MIN_CONTENT_WORDS


def turn_text(lines: list[dict]) -> str:
    return "\n".join(t for line in lines if (t := " ".join(line["text"].split())))


def conversation_row(uuid: str, conversation: dict) -> dict | None:
    """The ShareGPT row of one conversation by the rule above, or None when it gives no exchange."""
    turns = [turn_text(lines) for lines in conversation["messages"]]
    start = next((i for i, t in enumerate(turns) if substantive(t)), None)
    if start is None or len(turns[start]) > MAX_TURN_CHARS:
        return None
    row, chars, users = [], 0, 0
    for k, text in enumerate(turns[start:]):
        role = "human" if k % 2 == 0 else "gpt"
        users += role == "human"
        if (
            not text
            or len(text) > MAX_TURN_CHARS
            or chars + len(text) > MAX_ROW_CHARS
            or users > MAX_USER_TURNS
        ):
            break
        row.append({"from": role, "value": text})
        chars += len(text)
    if len(row) % 2:  # whole exchanges only: a reply stands in where no answer is regenerated
        row.pop()
    return {"id": f"chitchat-{uuid}", "conversations": row} if row else None


def near_key(row: dict) -> frozenset[str]:
    return frozenset(re.sub(r"\d+", "0", w) for w in words(row["conversations"][0]["value"]))


def is_near_duplicate(key: frozenset[str], kept: list[frozenset[str]]) -> bool:
    return any(len(key & other) >= NEAR_JACCARD * len(key | other) for other in kept)


def select_rows(dataset: dict, rows: int, seed: int = SEED) -> list[dict]:
    """The first `rows` conversations in seeded order that give a row, near duplicates skipped."""
    order = sorted(dataset, key=lambda uuid: hashlib.sha256(f"{seed}:{uuid}".encode()).hexdigest())
    out, kept = [], []
    for uuid in order:
        row = conversation_row(uuid, dataset[uuid])
        if row is None or is_near_duplicate(key := near_key(row), kept):
            continue
        out.append(row)
        kept.append(key)
        if len(out) == rows:
            return out
    raise SystemExit(f"error: only {len(out)} conversations pass the rule, asked for {rows}")


def read_source(source: str) -> tuple[dict, str | None]:
    """(dataset, the package's licence text or None) from a wheel, a dataset.json or `installed`."""
    if source == "installed":
        from importlib.metadata import distribution
        from importlib.resources import files

        text = files("chitchat_dataset").joinpath("dataset.json").read_text()
        return json.loads(text), distribution("chitchat-dataset").read_text("LICENSE")
    if source.endswith(".whl"):
        with zipfile.ZipFile(source) as wheel:
            licence = next(n for n in wheel.namelist() if n.endswith(".dist-info/LICENSE"))
            return json.loads(wheel.read(DATASET_MEMBER)), wheel.read(licence).decode()
    with open(source) as f:
        return json.load(f), None


def write_rows(path: Path, rows: list[dict]) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    turns = sum(len(row["conversations"]) for row in rows)
    print(f"{path}: {len(rows)} conversations, {turns} turns")


def main(
    source: str,
    out_dir: str = "datasets/samples",
    rows: str = str(ROWS),
    eval_rows: str = str(EVAL_ROWS),
) -> None:
    dataset, licence = read_source(source)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    selected = select_rows(dataset, int(rows) + int(eval_rows))
    write_rows(out / "chitchat.jsonl", selected[: int(rows)])
    if int(eval_rows):
        write_rows(out / "chitchat_eval.jsonl", selected[int(rows) :])
    if licence is not None:
        (out / "LICENSE-chitchat").write_text(licence)
        print(f"{out / 'LICENSE-chitchat'}: the package's licence")


if __name__ == "__main__":
    main(*sys.argv[1:])
