"""Settings changes never delete a finished conversation (issue 24.2): the engine and its launch
arguments are provenance recorded per line; a line made with other sampling moves to
superseded.jsonl and comes back, by the stage or `draftline conversations
restore`, when the settings match again; lines of runs that did not record their settings are
refused until `draftline conversations migrate` recorded them where their fingerprint proves them
(the others superseded, never deleted).

The stage runs for real, as in the test_regenerate_*.py files (regenerate_support.py's fixtures): a launched `hf` batch server,
then a real `transformers serve` kept running and given as `external`; a `vllm` launch whose
stand-in is this file run as a script (`python tests/regenerate/test_conversation_store.py serve MODEL ...`:
vLLM's wire format from regenerate_support.ScriptedEngine, every chat request logged)."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

if __name__ == "__main__":  # run as a stand-in server: the helpers beside the tests by their names
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import regenerate_support
from regenerate_support import (
    FaultProxy,
    Faults,
    QuietServer,
    ScriptedEngine,
    free_port,
    output_rows,
    prompts,
    run_stage,
    stage_cmd,
    stage_dir,
    stage_env,
)

from draftline.core.config import kind_of
from draftline.core.io import read_json, write_json, write_jsonl
from draftline.engines.preflight import PROBE_MESSAGES
from draftline.regenerate.config import RegenerateConfig
from draftline.regenerate.migrate import migrate
from draftline.regenerate.settings import ENGINE_FIELDS, fingerprint, prompt_sha256, wanted_settings
from draftline.regenerate.store import OldFormatError, load_finished, restore, set_aside_superseded

ROOT = Path(__file__).resolve().parents[2]
# the fixtures of regenerate_support.py: a random target made chatty, a real transformers serve on
# it, vLLM-format stubs
chatty_target = regenerate_support.chatty_target
served_chatty = regenerate_support.served_chatty
stub = regenerate_support.stub


def superseded(workdir: Path) -> list[dict]:
    path = workdir / "out/superseded.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def restore_cmd(workdir: Path, *args: str) -> dict:
    return conversations_cmd(workdir, "restore", *args)


def conversations_cmd(workdir: Path, command: str, *args: str) -> dict:
    """`draftline conversations COMMAND out ...` in workdir (its card.json, params.yaml and
    train.jsonl); its JSON line."""
    prompts_file = ["--prompts", "train.jsonl"] if command == "restore" else []
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "draftline.tools.conversations",
            command,
            "out",
            "--card",
            "card.json",
            *prompts_file,
            *args,
        ],
        cwd=workdir,
        env=stage_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def turns(rows: list[dict]) -> int:
    return sum(len(r["regeneration"]["finish_reasons"]) for r in rows)


# ---- switching engines keeps every finished conversation ----------------------------------------


def recording_proxy(upstream: str) -> tuple[QuietServer, list]:
    """A plain proxy in front of a real server, keeping the body of every chat request."""
    bodies = []

    class Recording(FaultProxy):
        faults = Faults(upstream, hang_s=0)

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/v1/chat/completions":
                bodies.append(json.loads(body))
            self._forward(body)

    server = QuietServer(("127.0.0.1", 0), Recording)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    return server, bodies


def test_switching_to_an_external_server_keeps_every_finished_conversation(
    tmp_path, chatty_target, served_chatty
):
    """Issue 24.2: a finished run on the launched `hf` server, then (after a crash, say) the
    server kept running and given as `backend: external`. Before, the backend was part of every
    line's fingerprint: all finished lines were deleted and sent again."""
    rows = prompts(9)
    common = dict(max_tokens=8, short={"concurrency": 2, "max_context": None})
    workdir = stage_dir(tmp_path, chatty_target, rows[:6], port=free_port(), **common)
    proc = run_stage(workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before = output_rows(workdir)
    assert len(before) == 6

    proxy, bodies = recording_proxy(served_chatty)
    try:
        stage_dir(
            workdir,
            chatty_target,
            rows,  # and three prompts the crash left unanswered
            backend="external",
            endpoints=[f"http://127.0.0.1:{proxy.server_port}"],
            external_engine="transformers",
            **common,
        )
        proc = run_stage(workdir)
        assert proc.returncode == 0, proc.stderr[-3000:]
    finally:
        proxy.shutdown()

    after = output_rows(workdir)
    assert after[:6] == before  # every finished line, as written
    assert sorted(r["id"] for r in after) == sorted(r["id"] for r in rows)
    new = after[6:]
    report = read_json(workdir / "report.json")
    assert report["reused"] == 6 and report["sent"] == report["ok"] == 3
    # the server got the requests of the three missing conversations, and nothing else
    sent = [b for b in bodies if b["messages"] != PROBE_MESSAGES]
    assert len(sent) == report["requests"] == turns(new)
    assert superseded(workdir) == []
    # which engine answered is on each line
    assert {r["regeneration"]["engine"]["engine"] for r in before} == {"hf"}
    assert {r["regeneration"]["engine"]["engine"] for r in new} == {"transformers"}
    assert {r["regeneration"]["engine"]["backend"] for r in new} == {"external"}


# ---- a launched vLLM given --max-num-seqs -------------------------------------------------------


def serve_as_vllm(argv: list[str]) -> None:
    """`python -m vllm.entrypoints.openai.api_server --model MODEL --host H --port P
    --served-model-name N ... [extra args]` (argv after the module): vLLM's wire format on P; the
    argv, then each chat request, one JSON line of $STAND_IN_LOG."""
    import argparse

    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name")
    args, _ = parser.parse_known_args(argv)
    log = Path(os.environ["STAND_IN_LOG"])
    with open(log, "a") as f:
        f.write(json.dumps({"argv": argv}) + "\n")

    class Logged(list):
        def append(self, body):
            with open(log, "a") as f:
                f.write(json.dumps({"request": body}) + "\n")

    handler = type(
        "VllmStandIn",
        (ScriptedEngine,),
        {
            "requests": Logged(),
            "auth": [],
            "served": [args.served_model_name or args.model],
            "tokenizer": AutoTokenizer.from_pretrained(args.model),
        },
    )
    QuietServer((args.host, args.port), handler).serve_forever(poll_interval=0.05)


def vllm_stand_in(tmp_path: Path, workdir: Path) -> dict:
    """engines.vllm.python of workdir's params: an interpreter whose `-m MODULE` runs
    serve_as_vllm; the stage's environment with its log."""
    import yaml

    python = tmp_path / "bin" / "python-with-vllm"
    python.parent.mkdir(exist_ok=True)
    python.write_text(f'#!/bin/sh\nshift 2\nexec "{sys.executable}" "{__file__}" "$@"\n')
    python.chmod(0o755)
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    params["engines"] = {"vllm": {"python": str(python)}}
    (workdir / "params.yaml").write_text(yaml.safe_dump(params))
    return dict(stage_env(), STAND_IN_LOG=str(tmp_path / "vllm.log"))


def stand_in_log(tmp_path: Path) -> tuple[list[list[str]], list[dict]]:
    entries = [json.loads(x) for x in (tmp_path / "vllm.log").read_text().splitlines()]
    launches = [e["argv"] for e in entries if "argv" in e]
    requests = [
        e["request"]
        for e in entries
        if "request" in e and e["request"]["messages"] != PROBE_MESSAGES
    ]
    return launches, requests


def test_adding_max_num_seqs_to_extra_args_keeps_every_finished_conversation(
    tmp_path, random_target
):
    """Issue 24.2: docs/regeneration.md suggests --max-num-seqs in extra_args for server_slots;
    adding it after a run made every line stale, and they were deleted and sent again."""
    rows = prompts(9)
    (tmp_path / "w").mkdir()
    workdir = stage_dir(tmp_path / "w", random_target, rows[:6], backend="vllm", max_tokens=8)
    env = vllm_stand_in(tmp_path, workdir)

    def stage():
        proc = subprocess.run(
            stage_cmd(), cwd=workdir, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]

    stage()
    before = output_rows(workdir)
    _, first_requests = stand_in_log(tmp_path)
    assert len(before) == 6 and len(first_requests) == turns(before)

    stage_dir(
        workdir,
        random_target,
        rows,
        backend="vllm",
        max_tokens=8,
        extra_args=["--max-num-seqs", "8"],
    )
    vllm_stand_in(tmp_path, workdir)
    stage()
    launches, requests = stand_in_log(tmp_path)
    assert launches[-1][-2:] == ["--max-num-seqs", "8"]  # the server was launched with it
    after = output_rows(workdir)
    assert after[:6] == before and sorted(r["id"] for r in after) == sorted(r["id"] for r in rows)
    assert {tuple(r["regeneration"]["engine"]["extra_args"]) for r in after[6:]} == {
        ("--max-num-seqs", "8")
    }
    report = read_json(workdir / "report.json")
    assert report["reused"] == 6 and report["sent"] == 3 and report["server_slots"] == 8
    # the second launch got the requests of the three missing conversations only
    assert len(requests) - len(first_requests) == report["requests"] == turns(after[6:])
    assert superseded(workdir) == []


# ---- a sampling change: superseded, then restored ------------------------------------------------


def test_a_sampling_change_supersedes_and_restore_brings_the_lines_back(
    tmp_path, stub, random_target
):
    """max_tokens changed: the lines made with the old value move to superseded.jsonl (never
    deleted) and are sent again; reverted, the restore command brings them back in place of the
    newer ones, with no duplicate id, and the stage sends nothing. Changed once more, the stage
    itself brings the newer lines back instead of sending them again."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_target.model)
    url, handler = stub(engine="vllm", tokenizer=tokenizer, served=[random_target.model])
    rows = prompts(6)

    def stage(max_tokens: int) -> dict:
        stage_dir(
            tmp_path,
            random_target,
            rows,
            backend="external",
            endpoints=[url],
            external_engine="vllm",
            max_tokens=max_tokens,
        )
        proc = run_stage(tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return read_json(tmp_path / "report.json")

    def chat_requests() -> int:
        return sum(b["messages"] != PROBE_MESSAGES for b in handler.requests)

    stage(8)
    made_with_8 = output_rows(tmp_path)
    assert len(made_with_8) == 6

    report = stage(4)
    assert report["resume"]["stale_settings"] == 6 and report["sent"] == 6
    made_with_4 = output_rows(tmp_path)
    aside = superseded(tmp_path)
    assert [e["line"] for e in aside] == made_with_8  # moved, not deleted
    assert {r["regeneration"]["settings"]["max_tokens"] for r in made_with_4} == {4}
    assert all(e["reason"] == "stale_settings" and e["changed"] == ["max_tokens"] for e in aside)
    assert all(e["superseded_at"] and e["by"] == "regenerate" for e in aside)

    # reverted: the restore command swaps them back
    stage_dir(tmp_path, random_target, rows, backend="external", endpoints=[url],
              external_engine="vllm", max_tokens=8)  # fmt: skip
    unchanged = (tmp_path / "out/conversations.jsonl").read_bytes()
    assert restore_cmd(tmp_path, "--dry-run")["restored"] == 6
    assert (tmp_path / "out/conversations.jsonl").read_bytes() == unchanged
    result = restore_cmd(tmp_path)
    assert result["restored"] == 6 and result["stale_settings"] == 6
    restored = output_rows(tmp_path)
    assert sorted(restored, key=lambda r: r["id"]) == sorted(made_with_8, key=lambda r: r["id"])
    assert [e["line"] for e in superseded(tmp_path)] == made_with_4
    assert restore_cmd(tmp_path) == {"accepted": 0, "skipped": {}, "dry_run": False}  # idempotent
    sent = chat_requests()
    report = stage(8)
    assert report["sent"] == 0 and report["reused"] == 6 and chat_requests() == sent
    assert output_rows(tmp_path) == restored

    # changed again: the stage brings the lines made with 4 back rather than sending them
    report = stage(4)
    assert report["sent"] == 0 and report["resume"]["restored"] == 6 and chat_requests() == sent
    again = output_rows(tmp_path)
    assert sorted(again, key=lambda r: r["id"]) == sorted(made_with_4, key=lambda r: r["id"])
    assert [e["line"] for e in superseded(tmp_path)] == made_with_8
    ids = [r["id"] for r in again]
    assert len(ids) == len(set(ids)) == 6


# ---- what is compared and what is recorded ------------------------------------------------------


def test_engine_fields_are_operational_and_answer_shaping_args_are_compared():
    assert all(kind_of(RegenerateConfig, f) == "operational" for f in ENGINE_FIELDS)
    from types import SimpleNamespace

    card = SimpleNamespace(model="m", revision=None, chat_template_sha256="c")

    def fp(**cfg):
        return wanted_settings(RegenerateConfig(**cfg), card).fingerprint

    base = fp(backend="vllm")
    assert fp(backend="vllm", extra_args=["--max-num-seqs", "8", "--dtype=float16"]) == base
    assert fp(backend="sglang") == base == fp(backend="hf", hf={"max_batch": 2})
    assert fp(backend="external", endpoints=["http://h:1"], external_engine="vllm") == base
    assert fp(backend="vllm", extra_args=["--override-generation-config", '{"top_k": 5}']) != base
    assert fp(backend="sglang", extra_args=['--preferred-sampling-params={"top_k": 5}']) != base


def line(row: dict, regeneration: dict) -> dict:
    return {**row, "regeneration": {"prompt_sha256": prompt_sha256(row), **regeneration}}


def old_fingerprint(cfg: RegenerateConfig, card) -> tuple[str, dict]:
    """The fingerprint lines got before the engine was provenance, and the params meta.json had."""
    operational = (
        "host port endpoints served_model_name api_key_env tensor_parallel_size "
        "data_parallel_size max_model_len continuous_batching cb_num_blocks hf startup_timeout_s "
        "server_slots first_token_timeout_s token_timeout_s progress_every_s max_retries "
        "retry_backoff_s retry_backoff_max_s max_failure_rate max_length_share"
    ).split()
    shaping = json.loads(cfg.model_dump_json(exclude=set(operational)))
    shaping["short"].pop("concurrency")
    shaping["long"].pop("concurrency")
    return fingerprint(
        {
            "model": card.model,
            "revision": card.revision,
            "chat_template_sha256": card.chat_template_sha256,
            **shaping,
        }
    ), shaping


def test_a_directory_of_the_format_before_settings_were_recorded_is_migrated_once(
    tmp_path, random_target
):
    """Lines written before settings were recorded per line carry only a fingerprint that had the
    engine in it. The stage refuses them, naming `draftline conversations migrate`; the migration
    proves them by the params that made them (then or now, via meta.json), records their settings,
    and moves the unproven ones aside; the stage then reads the directory as it read such a
    directory before: the proven lines kept when only the engine changed, their settings, engine
    and what proved them added to their record, the unproven ones in superseded.jsonl as
    unrecorded_settings, from where a restore by reason brings them back, accepted for the
    current settings."""
    rows = prompts(6)
    by_id = {r["id"]: r for r in rows}
    out = tmp_path / "out"
    out.mkdir()
    path = out / "conversations.jsonl"
    old_cfg = RegenerateConfig(backend="vllm", extra_args=["--max-num-seqs", "4"], max_tokens=8)
    old_fp, old_params = old_fingerprint(old_cfg, random_target)
    write_json(
        out / "meta.json",
        {
            "stage": "regenerate",
            "params": old_params,
            "target": random_target.model,
            "chat_template_sha256": random_target.chat_template_sha256,
            "fingerprint": old_fp,
        },
    )
    lines = [line(r, {"fingerprint": old_fp, "run": 1}) for r in rows[:4]]
    lines += [line(r, {"fingerprint": "from-long-ago", "run": 1}) for r in rows[4:]]
    write_jsonl(path, lines)
    written = path.read_bytes()

    # the engine switched (external vLLM) in the same run that first reads them
    now = RegenerateConfig(
        backend="external", endpoints=["http://h:1"], external_engine="vllm", max_tokens=8
    )
    wanted = wanted_settings(now, random_target)
    with pytest.raises(OldFormatError, match=f"draftline conversations migrate {out}"):
        load_finished(path, by_id, wanted)
    assert migrate(out, now, random_target, dry_run=True) == {
        "upgraded": 4,
        "unrecorded_settings": 2,
        "superseded_upgraded": 0,
        "dry_run": True,
    }
    assert path.read_bytes() == written and not (out / "superseded.jsonl").exists()
    assert migrate(out, now, random_target)["upgraded"] == 4
    assert migrate(out, now, random_target) == {  # once: nothing of the old format is left
        "upgraded": 0,
        "unrecorded_settings": 0,
        "superseded_upgraded": 0,
        "dry_run": False,
    }

    # what the reader of the old format gave: the proven lines kept, their records completed
    finished = load_finished(path, by_id, wanted)
    set_aside_superseded(finished)
    assert finished.done == {"p0", "p1", "p2", "p3"}
    engine = {"backend": "vllm", "external_engine": None, "extra_args": ["--max-num-seqs", "4"]}
    completed = {"settings": wanted.settings, "engine": engine, "settings_from": "meta.json"}
    kept = [json.loads(x) for x in path.read_text().splitlines()]
    assert kept == [{**r, "regeneration": {**r["regeneration"], **completed}} for r in lines[:4]]
    aside = [json.loads(x) for x in (out / "superseded.jsonl").read_text().splitlines()]
    assert [e["line"] for e in aside] == lines[4:]
    assert {e["reason"] for e in aside} == {"unrecorded_settings"}
    # meta.json rewritten by this run: the kept lines hold on their own record now
    (out / "meta.json").unlink()
    assert load_finished(path, by_id, wanted_settings(now, random_target)).done == finished.done

    # the old params unchanged, no meta.json: the fingerprint they give proves the lines
    path2 = tmp_path / "again" / "conversations.jsonl"
    write_jsonl(path2, lines[:4])
    assert migrate(path2.parent, old_cfg, random_target)["upgraded"] == 4
    again = load_finished(path2, by_id, wanted_settings(old_cfg, random_target))
    assert again.done == {"p0", "p1", "p2", "p3"} and not again.moves
    assert {json.loads(x)["regeneration"]["settings_from"] for x in path2.open()} == {"params"}

    # restore by reason: the unproven lines come back, accepted; no duplicate, nothing lost
    result = restore(out, by_id, wanted, reasons=["unrecorded_settings"])
    assert result["restored"] == 2 and result["accepted"] == 2
    assert not (out / "superseded.jsonl").read_text()
    finished = load_finished(path, by_id, wanted)
    assert finished.done == set(by_id) and finished.counts["unrecorded_settings"] == 0
    ids = [json.loads(x)["id"] for x in path.read_text().splitlines()]
    assert sorted(ids) == sorted(by_id)

    # restore by id puts the chosen line in place of the one holding the id, never beside it
    other = RegenerateConfig(
        backend="external", endpoints=["http://h:1"], external_engine="vllm", max_tokens=3
    )
    set_aside_superseded(load_finished(path, by_id, wanted_settings(other, random_target)))
    assert not path.read_text()  # all 6 aside
    finished = load_finished(path, by_id, wanted)  # back: the settings match again
    set_aside_superseded(finished)
    assert finished.done == set(by_id)
    lines_now = [json.loads(x) for x in path.read_text().splitlines()]
    p0_other = line(by_id["p0"], {"fingerprint": "x", "settings": {"max_tokens": 3}})
    with open(out / "superseded.jsonl", "a") as f:
        f.write(json.dumps({"reason": "stale_settings", "line": p0_other}) + "\n")
    result = restore(out, by_id, wanted, ids=["p0"], reasons=["stale_settings"])
    assert result["restored"] == 1 and result["replaced"] == 1
    after = [json.loads(x) for x in path.read_text().splitlines()]
    assert sorted(r["id"] for r in after) == sorted(by_id)
    (p0,) = [r for r in after if r["id"] == "p0"]
    assert p0["regeneration"]["accepted_for"] == wanted.fingerprint
    replaced = [json.loads(x) for x in (out / "superseded.jsonl").read_text().splitlines()]
    assert [e["line"] for e in replaced if e["reason"] == "replaced"] == [
        r for r in lines_now if r["id"] == "p0"
    ]


def test_migrate_command_rewrites_an_old_directory_and_prints_its_counts(tmp_path, random_target):
    """`draftline conversations migrate DIR [--dry-run]`, with the card and params beside it."""
    import yaml

    rows = prompts(3)
    stage_dir(tmp_path, random_target, rows, backend="vllm", max_tokens=8)
    cfg = RegenerateConfig(**yaml.safe_load((tmp_path / "params.yaml").read_text())["regenerate"])
    fp, _ = old_fingerprint(cfg, random_target)
    (tmp_path / "out").mkdir(exist_ok=True)
    write_jsonl(tmp_path / "out/conversations.jsonl", [line(r, {"fingerprint": fp}) for r in rows])
    assert conversations_cmd(tmp_path, "migrate", "--dry-run") == {
        "upgraded": 3,
        "unrecorded_settings": 0,
        "superseded_upgraded": 0,
        "dry_run": True,
    }
    assert conversations_cmd(tmp_path, "migrate")["upgraded"] == 3
    kept = [json.loads(x) for x in (tmp_path / "out/conversations.jsonl").open()]
    assert {r["regeneration"]["settings_from"] for r in kept} == {"params"}
    assert conversations_cmd(tmp_path, "restore", "--dry-run") == {
        "accepted": 0,
        "skipped": {},
        "dry_run": True,
    }


def test_a_kill_between_the_steps_leaves_every_line_somewhere_and_none_twice(tmp_path, monkeypatch):
    """Lines go to superseded.jsonl (synced) before conversations.jsonl is rewritten: killed in
    between, they are in both files; the rerun finishes the move without appending them twice."""
    import draftline.regenerate.store as store

    rows = {r["id"]: r for r in prompts(4)}
    path = tmp_path / "conversations.jsonl"
    lines = [line(r, {"fingerprint": "G", "settings": {"max_tokens": 4}}) for r in rows.values()]
    write_jsonl(path, lines)
    wanted = store.Wanted("F", {"max_tokens": 8})

    def killed(*args):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(store, "atomic_path", killed)
        try:
            set_aside_superseded(load_finished(path, rows, wanted))
        except KeyboardInterrupt:
            pass
    aside = (tmp_path / "superseded.jsonl").read_text().splitlines()
    assert len(aside) == 4 and len(path.read_text().splitlines()) == 4  # in both files
    finished = load_finished(path, rows, wanted)
    set_aside_superseded(finished)
    assert not finished.done and finished.counts["stale_settings"] == 4 and not path.read_text()
    assert (tmp_path / "superseded.jsonl").read_text().splitlines() == aside  # not twice


if __name__ == "__main__":
    serve_as_vllm(sys.argv[1:])


def test_target_weights_scaled_in_place_supersede_every_answer_and_say_so(tmp_path, random_target):
    """The target's path, revision and chat template unchanged, its weights scaled by 1.01 (a
    fine-tune in place): every kept line was made by another model, so all are superseded, and
    what changed is named per line ("target weights"). The code that decodes them and the pins
    are in every line's settings too (draftline/regenerate/settings.py answer_derivation)."""
    import shutil
    from dataclasses import replace

    from safetensors.torch import load_file, save_file

    from draftline.core.derivation import superseded
    from draftline.regenerate.settings import SETTING_NAMES

    model = tmp_path / "model"
    shutil.copytree(random_target.model, model)
    card = replace(random_target, model=str(model))
    cfg = RegenerateConfig(max_tokens=8)
    made = wanted_settings(cfg, card)
    assert {"target_weights", "code", "pins"} <= set(made.settings)
    rows = prompts(3)
    path = tmp_path / "conversations.jsonl"
    write_jsonl(
        path, [line(r, {"fingerprint": made.fingerprint, "settings": made.settings}) for r in rows]
    )
    by_id = {r["id"]: r for r in rows}
    assert len(load_finished(path, by_id, wanted_settings(cfg, card)).done) == 3

    weights = next(model.glob("*.safetensors"))
    save_file({k: v * 1.01 for k, v in load_file(weights).items()}, str(weights), {"format": "pt"})
    finished = load_finished(path, by_id, wanted_settings(cfg, card))
    assert finished.done == set() and finished.counts["stale_settings"] == 3
    assert dict(finished.plan.changed) == {"target_weights": 3}
    names = [SETTING_NAMES[f] for f in finished.plan.changed]
    assert (
        superseded(names, 3, "conversations")
        == "target weights changed: 3 conversations superseded"
    )
