"""Stable row identity: prompts that failed to regenerate and are filled by a later run, and a grown
`samples`, append tokenized rows after the existing ones, so the hidden_states stage extracts
exactly the new rows and leaves every earlier file untouched.

Real regeneration client against a stub server that fails some prompts (fault injection), then
the real tokenize and hidden_states stages on the random target."""

import asyncio
import contextlib
import json
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

from stubs import StubHandler

from draftline.regenerate.client import RetryPolicy, close_pool, open_pool
from draftline.regenerate.replay import ReplayJob, Sampling, regenerate_all
from draftline.regenerate.store import load_finished, set_aside_superseded
from draftline.targets.corpus import generate_conversations

PARAMS = """\
samples: 10
datasets:
  d: {path: d.jsonl, format: openai}
mix:
  weights: {d: 1.0}
tokenize: {max_length: 256}
hidden_states: {device: cpu, dtype: bfloat16, token_budget: 1024}
"""


class FlakyServer(StubHandler):
    """Chat completions answering "ok."; 500 for the prompts whose first user turn is in `failing`."""

    failing: set = set()

    def do_GET(self):
        self._json({"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        first_user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        if first_user in self.failing:
            return self._json({"object": "error", "message": "overloaded", "code": 500}, 500)
        self._json(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "ok."},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
            }
        )


def regenerate(url: str, rows: list[dict], root: Path) -> None:
    """What the regenerate stage does: keep the finished lines, send only the missing prompts."""
    out = root / "regenerated" / "conversations.jsonl"
    finished = load_finished(out, {r["id"]: r for r in rows}, "f")
    set_aside_superseded(finished)
    todo = [r for r in rows if r["id"] not in finished.done]
    tags = {"fingerprint": "f", "run": finished.counts["last_run"] + 1}

    async def go():
        pool = open_pool([url], None)
        try:
            job = ReplayJob(
                "m",
                Sampling(8, 0.0, 1.0, 0),
                RetryPolicy(1, 0.01, 0.02, 5),
                {"short": (4, None), "long": (1, None)},
                tags,
            )
            await regenerate_all(pool, job, todo, out, root / "failures.jsonl")
        finally:
            await close_pool(pool)

    asyncio.run(go())
    with open(root / "prompts.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({"id": r["id"]}) + "\n")


def tokenize_and_extract(root: Path) -> dict:
    from stages.hidden_states import main as hidden_states
    from stages.tokenize import main as tokenize

    with contextlib.chdir(root):
        tokenize(
            "card.json",
            "prompts.jsonl",
            "regenerated/conversations.jsonl",
            "tokenized",
            "tokenize.json",
        )
        hidden_states("card.json", "tokenized", "hs", "hs.json")
    return json.loads((root / "hs.json").read_text())


def stamps(root: Path) -> dict[str, tuple[int, int]]:
    return {
        f.name: (f.stat().st_ino, f.stat().st_mtime_ns)
        for f in (root / "hs").glob("hs_*.safetensors")
    }


def test_filled_failures_and_grown_samples_extract_exactly_the_new_rows(tmp_path, random_target):
    from datasets import load_from_disk

    (tmp_path / "params.yaml").write_text(PARAMS)
    (tmp_path / "card.json").write_text(json.dumps(random_target.to_dict()))
    (tmp_path / "regenerated").mkdir()
    convs = [
        {"id": f"p{k:03d}", "partition": "short", **c}
        for k, c in enumerate(generate_conversations(40, 3))
    ]
    first_user = {
        c["id"]: next(m["content"] for m in c["messages"] if m["role"] == "user") for c in convs
    }
    failing_ids = {"p003", "p011", "p017", "p024"}  # in the middle of the first 30 prompts

    handler = type("Flaky", (FlakyServer,), {"failing": {first_user[i] for i in failing_ids}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        regenerate(url, convs[:30], tmp_path)
        first = tokenize_and_extract(tmp_path)
        assert first["extracted_now"] == 30 - len(failing_ids) and first["reused"] == 0
        before = stamps(tmp_path)

        handler.failing = set()  # the server recovered: the rerun fills the failed prompts
        regenerate(url, convs[:30], tmp_path)
        filled = tokenize_and_extract(tmp_path)
        ids = load_from_disk(str(tmp_path / "tokenized")).with_format(None)["id"]
        assert set(ids[-len(failing_ids) :]) == failing_ids  # appended after every existing row
        assert filled["extracted_now"] == len(failing_ids) and filled["reused"] == 30 - len(
            failing_ids
        )
        assert len(stamps(tmp_path)) == 30
        assert {
            k: v for k, v in stamps(tmp_path).items() if k in before
        } == before  # not one earlier file rewritten

        before = stamps(tmp_path)
        regenerate(url, convs, tmp_path)  # samples grown from 30 to 40
        grown = tokenize_and_extract(tmp_path)
        assert grown["extracted_now"] == 10 and grown["reused"] == 30
        assert {k: v for k, v in stamps(tmp_path).items() if k in before} == before
        assert len(stamps(tmp_path)) == 40
    finally:
        server.shutdown()
