"""The regeneration preflight against the engines' wire formats."""

import json

import pytest
import regenerate_support
import yaml
from regenerate_support import (
    ROOT,
    output_rows,
    prompts,
    run_stage,
    stage_dir,
)

from draftline.core.io import read_json
from draftline.engines.preflight import (
    PreflightError,
    ProbeLimits,
    ServedTarget,
    preflight_regeneration,
)
from draftline.regenerate.settings import prompt_sha256
from draftline.tokens.chat import chat_prompt_ids

# shared fixtures (regenerate_support.py)
stub = regenerate_support.stub


def rendered(tokenizer, chat_template_kwargs=None):
    """The prompt ids of a conversation as the stage counts them (preflight's prompt_ids)."""
    return lambda messages, tools: chat_prompt_ids(
        tokenizer, messages, tools, chat_template_kwargs or {}
    )


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_preflight_accepts_the_plain_target(stub, random_target, engine):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    url, _ = stub(engine=engine, tokenizer=tokenizer)
    seen = preflight_regeneration(
        url, engine, ServedTarget("m", rendered(tokenizer)), limits=ProbeLimits(60, 1)
    )
    assert seen["served_models"] == ["m"] and seen["probe_prompt_tokens"] > 10
    assert seen.get("probe_token_ids") == ("match" if engine == "vllm" else None)


@pytest.mark.parametrize(
    "engine, attrs, message",
    [
        ("vllm", {"speculative": True}, "vllm:spec_decode_num_drafts_total"),
        ("sglang", {"speculative": True}, "speculative_algorithm=EAGLE3"),
        ("vllm", {"served": ["other/model"]}, "not the target"),
        ("sglang", {"count_offset": 1}, "another model, tokenizer or chat template"),
        (
            "sglang",
            {"engine": "vllm"},
            "answers as vllm, not sglang",
        ),  # external_engine says sglang, it is not
        ("vllm", {"engine": "sglang"}, "answers as sglang, not vllm"),
        ("vllm", {"engine": "transformers"}, "no vllm: metrics"),  # cannot be checked for a draft
        ("sglang", {"engine": "transformers"}, "no speculative_algorithm"),
    ],
)
def test_preflight_refuses(stub, random_target, engine, attrs, message):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    url, _ = stub(**{"engine": engine, "tokenizer": tokenizer, **attrs})
    with pytest.raises(PreflightError, match=message):
        preflight_regeneration(
            url, engine, ServedTarget("m", rendered(tokenizer)), limits=ProbeLimits(60, 1)
        )


@pytest.mark.parametrize(
    "actual, speculative, message",
    [
        ("vllm", True, "runs speculative decoding.*vllm:spec_decode_num_drafts_total"),
        ("sglang", True, "runs speculative decoding.*speculative_algorithm=EAGLE3"),
        ("vllm", False, "answers as vllm, not transformers"),
        ("sglang", False, "answers as sglang, not transformers"),
    ],
)
def test_preflight_probes_what_the_server_is_whatever_is_declared(
    stub, random_target, actual, speculative, message
):
    """Declared `external_engine: transformers` (which has no speculative mode), the server is
    really vLLM / SGLang: its own evidence decides, a draft is found and refused."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    url, handler = stub(engine=actual, speculative=speculative, tokenizer=tokenizer)
    with pytest.raises(PreflightError, match=message):
        preflight_regeneration(
            url, "transformers", ServedTarget("m", rendered(tokenizer)), limits=ProbeLimits(60, 1)
        )
    assert handler.requests == []  # refused before the probe request, let alone the data


def test_stage_refuses_a_speculative_server_declared_as_transformers(tmp_path, stub, random_target):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    url, handler = stub(
        engine="vllm", speculative=True, tokenizer=tokenizer, served=[random_target.model]
    )
    workdir = stage_dir(
        tmp_path,
        random_target,
        prompts(4),
        backend="external",
        endpoints=[url],
        external_engine="transformers",
    )
    proc = run_stage(workdir)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "speculative decoding" in proc.stderr and "vllm:spec_decode" in proc.stderr
    assert handler.requests == [] and not (workdir / "out/conversations.jsonl").exists()


def test_an_endpoint_where_nothing_answers_is_named_as_such(tmp_path, random_target):
    """A wrong port in regenerate.endpoints: the preflight says nothing answers there (not that
    the server lacks vLLM's metrics), names the param, and nothing is sent or written."""
    from regenerate_support import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    workdir = stage_dir(
        tmp_path,
        random_target,
        prompts(2),
        backend="external",
        endpoints=[url],
        external_engine="vllm",
        max_retries=0,  # one attempt: the retries' back-off (seconds) would change nothing here
    )
    proc = run_stage(workdir)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert f"{url} does not answer (ConnectError" in proc.stderr
    assert "regenerate.endpoints" in proc.stderr
    assert not (workdir / "out/conversations.jsonl").exists()


def test_stage_refuses_a_speculative_server_before_any_request(tmp_path, stub, random_target):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    url, handler = stub(
        engine="vllm", speculative=True, tokenizer=tokenizer, served=[random_target.model]
    )
    workdir = stage_dir(
        tmp_path,
        random_target,
        prompts(4),
        backend="external",
        endpoints=[url],
        external_engine="vllm",
    )
    proc = run_stage(workdir)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "preflight refused" in proc.stderr and "speculative" in proc.stderr
    assert handler.requests == [] and not (workdir / "out/conversations.jsonl").exists()


def test_a_refused_preflight_drops_no_conversation(tmp_path, stub, random_target):
    """Issue #16.1: a changed sampling param makes every line stale; with an endpoint the preflight
    refuses, conversations.jsonl must stay byte for byte (before: all lines were dropped first, and
    reverting the param sent everything again). Once a good endpoint passes, the stale lines move
    to superseded.jsonl (issue 24.2: never deleted)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    rows = prompts(12)
    workdir = stage_dir(tmp_path, random_target, rows)
    out = workdir / "out/conversations.jsonl"
    out.parent.mkdir()
    made_with_other_sampling = [
        {
            **row,
            "regeneration": {
                "fingerprint": "other-sampling",
                "settings": {"max_tokens": 1},
                "prompt_sha256": prompt_sha256(row),
            },
        }
        for row in rows
    ]
    out.write_text(
        "".join(json.dumps(r) + "\n" for r in made_with_other_sampling) + '{"id": "p0", "mess'
    )  # + a cut line
    before = (out.read_bytes(), out.stat().st_mtime_ns)

    bad, bad_handler = stub(
        engine="vllm", speculative=True, tokenizer=tokenizer, served=[random_target.model]
    )
    stage_dir(
        workdir, random_target, rows, backend="external", endpoints=[bad], external_engine="vllm"
    )
    proc = run_stage(workdir)
    assert proc.returncode != 0 and "preflight refused" in proc.stderr
    assert (out.read_bytes(), out.stat().st_mtime_ns) == before and bad_handler.requests == []
    assert "is as it was" in proc.stderr

    good, handler = stub(engine="vllm", tokenizer=tokenizer, served=[random_target.model])
    stage_dir(
        workdir, random_target, rows, backend="external", endpoints=[good], external_engine="vllm"
    )
    proc = run_stage(workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = read_json(workdir / "report.json")
    assert (
        report["resume"]["stale_settings"] == 12
        and report["resume"]["bad_lines"] == 1
        and report["sent"] == 12
    )
    # each line set aside named (the first few of each reason) in the report and on the console
    assert report["resume"]["named"] == {
        "stale_settings": [f"line {i + 1} (p{i})" for i in range(5)],
        "bad_lines": ["line 13"],
    }
    assert "regenerate: stale settings: line 1 (p0), line 2 (p1), " in proc.stdout
    assert "regenerate: bad lines: line 13\n" in proc.stdout
    done = output_rows(workdir)
    assert sorted(r["id"] for r in done) == sorted(r["id"] for r in rows)
    assert {r["regeneration"]["fingerprint"] for r in done} == {
        read_json(workdir / "out/meta.json")["fingerprint"]
    }
    aside = [json.loads(x) for x in (workdir / "out/superseded.jsonl").read_text().splitlines()]
    assert [e["line"] for e in aside if "line" in e] == made_with_other_sampling
    assert [e["text"] for e in aside if "text" in e] == ['{"id": "p0", "mess']


def test_answers_cut_by_max_tokens_fail_the_stage_and_stay(tmp_path, stub, random_target):
    """Issue 24: a thinking model at the default max_tokens 96 has nearly every answer cut, and
    nothing refused the run. Past regenerate.max_length_share the stage fails naming max_tokens;
    the conversations stay on disk (a persist output), a rerun that sends nothing checks them
    again, and raising the threshold (operational) accepts them without sending anything."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    url, handler = stub(
        engine="vllm",
        tokenizer=tokenizer,
        served=[random_target.model],
        answer=lambda body: {"content": "Let me think about", "finish": "length"},
    )
    rows = prompts(8)
    shipped = yaml.safe_load((ROOT / "params.yaml").read_text())["regenerate"]["max_length_share"]
    external = dict(backend="external", endpoints=[url], external_engine="vllm")
    workdir = stage_dir(tmp_path, random_target, rows, max_length_share=shipped, **external)
    for sent in (8, 0):  # the run that cut them, then a rerun with nothing left to send
        proc = run_stage(workdir)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
        assert "8 of 8 answers (100.0%) ended at regenerate.max_tokens 96" in proc.stderr
        assert f"more than regenerate.max_length_share {shipped}" in proc.stderr
        report = read_json(workdir / "report.json")
        assert report["sent"] == sent and report["check"] == {
            "param": "regenerate.max_length_share",
            "conversations": 8,
            "answers": 8,
            "length": 8,
            "share": 1.0,
            "threshold": shipped,
            "verdict": "fail",
        }
        assert len(output_rows(workdir)) == 8  # kept: nothing is lost by failing

    requests = len(handler.requests)
    stage_dir(workdir, random_target, rows, max_length_share=1.0, **external)
    proc = run_stage(workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = read_json(workdir / "report.json")
    assert report["sent"] == 0 and report["reused"] == 8
    # no conversation sent: the only chat requests are the preflight's probe, asked before the
    # kept conversations are spot-checked (this stub returned no token ids: each is skipped, said)
    from draftline.engines.endpoints import PROBE_MESSAGES

    assert all(r["messages"] == PROBE_MESSAGES for r in handler.requests[requests:])
    assert report["spot_check"]["skipped"] == {"no recorded token ids": 8}
    assert report["check"]["verdict"] == "pass" and report["check"]["share"] == 1.0


def test_length_check_counts_the_conversations_the_next_stages_read(tmp_path):
    from draftline.regenerate.run import length_check

    def line(pid, reasons, fingerprint="f"):
        regen = {"fingerprint": fingerprint, "finish_reasons": reasons}
        return json.dumps({"id": pid, "messages": [], "regeneration": regen}) + "\n"

    path = tmp_path / "conversations.jsonl"
    path.write_text(
        line("a", ["stop", "stop", "length"])
        + line("b", ["length"])
        + line("a", ["length"])  # a second line of an id: not read downstream
        + line("c", ["length"], fingerprint="old")  # made with other settings
        + line("gone", ["length"])  # no longer prompted
        + line("d", ["tool_calls", "stop"])
        + '{"id": "e", "mess'  # cut by a kill
    )
    prompted = {pid: {} for pid in "abcde"}
    check = length_check(path, prompted, "f", 0.5)
    assert (check["conversations"], check["answers"], check["length"]) == (3, 6, 2)
    assert check["share"] == round(2 / 6, 4) and check["verdict"] == "pass"
    assert length_check(path, prompted, "f", 0.3)["verdict"] == "fail"
    assert length_check(tmp_path / "none.jsonl", prompted, "f", 0.5)["verdict"] == "skipped"


def test_stage_refuses_sampling_that_transformers_serve_would_ignore(tmp_path, random_target):
    workdir = stage_dir(
        tmp_path, random_target, prompts(2), backend="transformers", temperature=0.7
    )
    proc = run_stage(workdir)
    assert proc.returncode != 0 and "do_sample" in proc.stderr and not (workdir / "out").exists()


def test_an_endpoint_that_is_no_chat_server_is_named_as_such(tmp_path, random_target):
    """regenerate.endpoints pointing at another service (a web page on every path, HTTP 200): the
    preflight names the endpoint, what it answered and the param, instead of a JSONDecodeError
    traceback; nothing is sent or written."""
    import threading
    from http.server import ThreadingHTTPServer

    from stubs import StubHandler

    class WebPage(StubHandler):
        def do_GET(self):
            self._send(b"<html>a dashboard</html>", "text/html")

        def do_POST(self):
            self.do_GET()

    server = ThreadingHTTPServer(("127.0.0.1", 0), WebPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        workdir = stage_dir(
            tmp_path,
            random_target,
            prompts(2),
            backend="external",
            endpoints=[url],
            external_engine="transformers",
        )
        proc = run_stage(workdir)
    finally:
        server.shutdown()
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"{url}: the probe request got HTTP 200 but no chat completion (text/html" in proc.stderr
    assert "regenerate.endpoints" in proc.stderr
    assert not (workdir / "out/conversations.jsonl").exists()
