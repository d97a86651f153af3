"""Regeneration's failures, retries and balancing across endpoints, against stubs of vLLM's wire format."""

import json
import time

import regenerate_support
from regenerate_support import (
    prompts,
    run_rows,
)

from draftline.regenerate.client import Endpoint, EndpointPool

# shared fixtures (regenerate_support.py)
stub = regenerate_support.stub


def test_failures_are_recorded_with_reasons_and_retried(tmp_path, stub):
    weather = lambda body: "weather" in json.dumps(body["messages"])  # noqa: E731
    url, handler = stub(
        status_for=lambda body: (
            500 if weather(body) else (400 if "colour" in json.dumps(body["messages"]) else 200)
        )
    )
    rows = prompts(30)
    tally, out, failures, _ = run_rows([url], rows, tmp_path)
    by_reason = {f["id"]: f for f in failures}
    for row in rows:
        text = json.dumps(row["messages"][:2])
        if weather({"messages": row["messages"][:2]}):
            assert (
                by_reason[row["id"]]["reason"] == "http_500"
                and by_reason[row["id"]]["attempts"] == 3
            )  # retried
        elif "colour" in text:
            assert (
                by_reason[row["id"]]["reason"] == "http_400"
                and by_reason[row["id"]]["attempts"] == 1
            )  # not retried
    assert len(failures) == tally.failed == len({f["id"] for f in failures}) > 0
    assert tally.ok == len(out) == len(rows) - tally.failed
    assert tally.retries["http_500"] == 2 * tally.failure_reasons["http_500"]


BROKEN_ANSWERS = {  # a word of the prompt -> what the server answers, and the failure it is
    "weather": (b'{"choices": [{"message": {"content": "cut', "bad_response"),  # not JSON
    "colour": (b'{"object": "error"}', "bad_response"),  # no choices
    "minus": (b'{"choices": []}', "empty_response"),
    "Compute": (
        b'{"choices": [{"message": {"content": "x", "tool_calls": [{"id": "c", "function": {}}]}}]}',
        "bad_response",
    ),
    "add": (b'{"choices": [{"message": {"content": 7}}]}', "bad_response"),
    "plus": (b"[1, 2]", "bad_response"),
}


def test_answers_that_are_not_chat_completions_fail_their_conversation_only(tmp_path, stub):
    def broken(messages):  # the first answer of a conversation decides: it fails there
        text = json.dumps(
            messages[: next(i for i, m in enumerate(messages) if m["role"] == "assistant")]
        )
        return next(
            (answer for word, answer in BROKEN_ANSWERS.items() if word in text), (None, None)
        )

    url, _ = stub(raw_for=lambda body: broken(body["messages"] + [{"role": "assistant"}])[0])
    rows = prompts(60)
    tally, out, failures, _ = run_rows([url], rows, tmp_path)
    expected = {row["id"]: broken(row["messages"])[1] for row in rows if broken(row["messages"])[1]}
    assert {f["id"]: f["reason"] for f in failures} == expected and set(expected.values()) == {
        "bad_response",
        "empty_response",
    }
    assert all(
        f["attempts"] == 3 for f in failures
    )  # retried: a server can send a broken answer once
    assert tally.ok == len(out) == len(rows) - len(expected) > 0
    assert all(
        m["content"] == "ok" for row in out for m in row["messages"] if m["role"] == "assistant"
    )


def test_the_api_key_goes_with_every_request(tmp_path, stub):
    url, handler = stub()
    tally, out, _, _ = run_rows([url], prompts(12), tmp_path, api_key="sk-test-123")
    assert tally.ok == 12 and len(handler.auth) == tally.requests > 0
    assert set(handler.auth) == {"Bearer sk-test-123"}


def test_too_many_failures_stop_the_run_early(tmp_path, stub):
    url, handler = stub(status_for=lambda body: 503)
    tally, out, failures, _ = run_rows(
        [url],
        prompts(40),
        tmp_path,
        partitions={"short": (1, None), "long": (1, None)},
        max_failures=3,
    )
    assert tally.aborted and tally.failed == len(failures) < 10 and not out


def test_endpoints_balanced_by_outstanding_requests():
    a, b, c = (Endpoint(u, None) for u in "abc")
    pool = EndpointPool([a, b, c])
    picked = [pool.acquire() for _ in range(3)]
    assert {e.url for e in picked} == {"a", "b", "c"}  # one each while all are equally busy
    pool.release(b)
    assert pool.acquire() is b  # the least outstanding
    pool.release(a, failed_for_s=60)
    pool.release(c)
    assert pool.acquire() is c  # a rests after its failure although it has fewer outstanding
    a.resting_until = b.resting_until = c.resting_until = time.monotonic() + 60
    assert pool.acquire() is a  # all resting: the least busy anyway


def test_two_endpoints_share_the_work(tmp_path, stub):
    (u1, h1), (u2, h2) = stub(), stub()
    tally, out, _, pool = run_rows([u1, u2], prompts(24), tmp_path)
    assert tally.ok == 24 and len(h1.requests) > 4 and len(h2.requests) > 4
    assert sum(e.requests for e in pool.endpoints) == tally.requests
