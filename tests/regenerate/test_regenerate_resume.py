"""Regeneration resumes: finished conversations kept, nothing sent twice."""

import json
import shutil
from pathlib import Path

import regenerate_support
from regenerate_support import (
    prompts,
    run_rows,
)

from draftline.core.io import write_jsonl
from draftline.regenerate.index import entry as index_entry
from draftline.regenerate.index import index_path, read_index
from draftline.regenerate.settings import Wanted, prompt_sha256
from draftline.regenerate.store import load_finished, refresh_index, set_aside_superseded

# shared fixtures (regenerate_support.py)
stub = regenerate_support.stub


def test_resume_keeps_only_lines_that_still_hold(tmp_path):
    """The lines that do not hold are moved to superseded.jsonl with their reason, never deleted."""
    rows = {r["id"]: r for r in prompts(6)}

    def line(pid, fp="F", prompt=None, **regeneration):
        return {
            "id": pid,
            "messages": [],
            "regeneration": {
                "fingerprint": fp,
                "prompt_sha256": prompt_sha256(prompt or rows[pid]),
                **regeneration,
            },
        }

    path = tmp_path / "c.jsonl"
    other = {"messages": [{"role": "user", "content": "changed"}]}
    lines = [
        line("p0"),
        line("p1"),
        line("p0"),
        line("p2", fp="OLD", accepted_for="OLD"),  # accepted by hand for other settings
        line("p3", prompt=other),
        {"id": "p5", "messages": []},
        line("gone", prompt=other),
        line("p1", fp="G", settings={"max_tokens": 4}),
        "not json",
        line("p4"),
    ]
    path.write_text(
        "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
    )  # no final newline: cut by a kill
    wanted = Wanted("F", {"max_tokens": 8})
    unread = path.read_bytes()
    finished = load_finished(path, rows, wanted)
    assert path.read_bytes() == unread and not (tmp_path / "superseded.jsonl").exists()
    set_aside_superseded(finished)
    done, counts = finished.done, finished.counts
    assert done == {"p0", "p1", "gone", "p4"}
    assert counts == {
        "bad_lines": 1,
        "duplicates": 2,
        "stale_settings": 0,
        "unrecorded_settings": 2,
        "stale_prompt": 1,
        "not_in_prompts": 1,
        "restored": 0,
        "last_run": 0,
        # each line set aside named by its line number (and id): the first few of each reason
        "named": {
            "duplicates": ["line 3 (p0)", "line 8 (p1)"],
            "unrecorded_settings": ["line 4 (p2)", "line 6 (p5)"],
            "stale_prompt": ["line 5 (p3)"],
            "bad_lines": ["line 9"],
        },
    }
    kept = path.read_text()
    assert kept.endswith("\n") and [json.loads(x)["id"] for x in kept.splitlines()] == [
        "p0",
        "p1",
        "gone",
        "p4",
    ]
    aside = [json.loads(x) for x in (tmp_path / "superseded.jsonl").read_text().splitlines()]
    assert [(e["reason"], e.get("line", e.get("text"))) for e in aside] == [
        ("duplicate", lines[2]),
        ("unrecorded_settings", lines[3]),
        ("stale_prompt", lines[4]),
        ("unrecorded_settings", lines[5]),
        ("duplicate", lines[7]),
        ("bad_line", "not json"),
    ]
    # a clean file is left untouched
    mtime = path.stat().st_mtime_ns
    finished = load_finished(path, rows, wanted)
    set_aside_superseded(finished)
    assert finished.done == done and path.stat().st_mtime_ns == mtime
    # a line made with other settings: its changed fields are said
    path.write_text(json.dumps(line("p2", fp="G", settings={"max_tokens": 4})) + "\n")
    finished = load_finished(path, rows, wanted)
    set_aside_superseded(finished)
    assert finished.counts["stale_settings"] == 1
    last = json.loads((tmp_path / "superseded.jsonl").read_text().splitlines()[-1])
    assert last["reason"] == "stale_settings" and last["changed"] == ["max_tokens"]


def parsed_entries(path: Path) -> list:
    """The index entries of a file's lines, from parsing every line."""
    out, start = [], 0
    for line in path.read_bytes().splitlines(keepends=True):
        out.append(index_entry(start, line, json.loads(line)))
        start += len(line)
    return out


def test_resume_reads_the_index_and_the_lines_where_it_is_off(tmp_path, stub, monkeypatch):
    """A rerun knows the done conversations from the index beside the file, parsing none of
    them; where the index is short of the file, torn, gone, or the file was edited by hand, the
    lines say, and the index is written anew."""
    from draftline.regenerate import store as conversation_store
    from draftline.regenerate.run import length_check

    url, _ = stub()
    rows = prompts(24)
    tally, out, _, _ = run_rows([url], rows, tmp_path)  # the writer appends each line's entry
    path = tmp_path / "c.jsonl"
    assert tally.ok == 24 and read_index(path) == parsed_entries(path)
    by_id, wanted = {r["id"]: r for r in rows}, Wanted("f", {})
    changed = dict(rows[3], messages=[{"role": "user", "content": "changed"}])
    by_id[rows[3]["id"]] = changed  # a prompt changed since: the index's hash says so
    real_parse, parsed = conversation_store._parse, []
    monkeypatch.setattr(
        conversation_store, "_parse", lambda line: parsed.append(line) or real_parse(line)
    )

    def read(path: Path) -> tuple[set, dict]:
        """What load_finished reads, then the index written where it was off."""
        finished = load_finished(path, by_id, wanted)
        refresh_index(finished)
        return finished.done, finished.counts

    def truth() -> tuple[set, dict]:  # what parsing every line gives
        plain = tmp_path / "plain"
        plain.mkdir(exist_ok=True)
        shutil.copy(path, plain / "c.jsonl")
        index_path(plain / "c.jsonl").unlink(missing_ok=True)
        finished = load_finished(plain / "c.jsonl", by_id, wanted)
        return finished.done, finished.counts

    expected = truth()
    assert expected[1]["stale_prompt"] == 1 and len(expected[0]) == 23
    parsed.clear()
    assert read(path) == expected and not parsed
    assert length_check(path, by_id, "f", 0.5)["conversations"] == 24 and not parsed
    index = index_path(path)
    whole = index.read_bytes()
    extra = json.dumps(dict(out[5], id="p_extra")) + "\n"
    damages = {
        "short of the file": lambda: index.write_bytes(whole[: whole.rstrip().rfind(b"\n") + 1]),
        "torn": lambda: index.write_bytes(whole[:-7]),
        "gone": lambda: index.unlink(),
        "a line added by hand": lambda: path.write_text(extra + path.read_text()),
        "lines cut off by hand": lambda: path.write_text(
            "".join(path.read_text().splitlines(keepends=True)[:-2])
        ),
    }
    for name, damage in damages.items():
        damage()
        expected, parsed[:] = truth(), []
        assert read(path) == expected, name
        assert parsed and read_index(path) == parsed_entries(path), name  # written anew
        parsed.clear()
        assert read(path) == expected and not parsed, name
    # lines moved out: the rewritten file comes with its index
    set_aside_superseded(load_finished(path, by_id, wanted))
    assert read_index(path) == parsed_entries(path) and len(read_index(path)) == 22


def test_a_rerun_reads_and_hashes_only_the_prompts_whose_line_changed(tmp_path, stub, monkeypatch):
    """The prompts of done conversations are neither parsed nor hashed again while their line in
    the prompts file stays as it was checked (its digest in the index); a changed line is."""
    from draftline.regenerate import store as conversation_store
    from draftline.regenerate.store import PromptFile

    url, _ = stub()
    rows = prompts(12)
    write_jsonl(tmp_path / "train.jsonl", rows)
    run_rows([url], rows, tmp_path)
    path, hashed = tmp_path / "c.jsonl", []
    real_hash = conversation_store.prompt_sha256
    monkeypatch.setattr(
        conversation_store, "prompt_sha256", lambda row: hashed.append(row["id"]) or real_hash(row)
    )

    def rerun() -> tuple[set, dict, PromptFile]:
        by_id = PromptFile(tmp_path / "train.jsonl")
        finished = load_finished(path, by_id, "f", by_id.digests)
        refresh_index(finished)  # the index learns the prompt lines
        return finished.done, finished.counts, by_id

    done, _, _ = rerun()  # the lines were written without digests: hashed once, the index told
    assert len(done) == 12 and sorted(hashed) == sorted(r["id"] for r in rows)
    hashed.clear()
    done, _, by_id = rerun()
    assert len(done) == 12 and not hashed and not by_id._rows  # nothing parsed, nothing hashed
    rows[4] = dict(rows[4], messages=[{"role": "user", "content": "changed"}])
    write_jsonl(tmp_path / "train.jsonl", rows)
    done, counts, by_id = rerun()
    assert hashed == [rows[4]["id"]] and list(by_id._rows) == [rows[4]["id"]]
    assert counts["stale_prompt"] == 1 and rows[4]["id"] not in done and len(done) == 11


def test_the_same_conversations_reached_by_two_paths_have_the_same_bytes(tmp_path, stub):
    """canonical_order: answers that finished in another order, or came in two runs where
    another path took one, end as the same file and index bytes: the order tokenize reads (run,
    then the prompt's place), lines of ids no longer prompted last; an ordered file is left
    untouched, and a line nobody can read stops the reordering."""
    import os

    from draftline.regenerate.store import PromptFile, canonical_order

    url, _ = stub()
    rows = prompts(10)
    write_jsonl(tmp_path / "train.jsonl", rows)
    by_id = PromptFile(tmp_path / "train.jsonl")
    run_rows([url], rows, tmp_path)  # four in flight: lines in the order answers finished
    made = (tmp_path / "c.jsonl").read_bytes().splitlines(keepends=True)
    by_pid = {json.loads(line)["id"]: line for line in made}
    run2 = {  # what a second run would have written for prompts 2 and 7, and a line of a
        pid: json.dumps(
            {**json.loads(by_pid[pid]), "regeneration": {"fingerprint": "f", "run": 2}}
        ).encode()
        + b"\n"
        for pid in (rows[2]["id"], rows[7]["id"])
    }
    gone = json.dumps({"id": "no_longer_prompted", "messages": [], "regeneration": {}}) + "\n"

    def ordered(lines: list[bytes], name: str) -> tuple[bytes, bytes]:
        d = tmp_path / name
        d.mkdir()
        path = d / "c.jsonl"
        path.write_bytes(b"".join(lines))
        assert canonical_order(path, by_id.digests) == (lines != sorted_lines)
        return path.read_bytes(), index_path(path).read_bytes()

    first = [by_pid[r["id"]] for r in rows if r["id"] not in run2]
    sorted_lines = [*first, *run2.values(), gone.encode()]
    paths = {
        "one order": sorted_lines,
        "reversed": sorted_lines[::-1],
        "kept after": [gone.encode(), *run2.values(), *first[::2], *first[1::2]],
    }
    results = {name: ordered(lines, name) for name, lines in paths.items()}
    assert len(set(results.values())) == 1
    data, _ = results["one order"]
    ids = [json.loads(line)["id"] for line in data.splitlines()]
    assert ids == [*(json.loads(line)["id"] for line in first), *run2, "no_longer_prompted"]
    path = tmp_path / "one order" / "c.jsonl"
    assert [e._replace(prompt_line=None) for e in read_index(path)] == parsed_entries(path)
    assert [e.prompt_line for e in read_index(path)] == [
        *(by_id.digests[i] for i in ids[:-1]),
        None,
    ]
    stamps = {f: f.stat().st_mtime_ns for f in (path, index_path(path))}
    os.utime(path, ns=(1, 1))
    os.utime(index_path(path), ns=(1, 1))
    assert canonical_order(path, by_id.digests) is False  # in order: nothing written
    assert all(f.stat().st_mtime_ns == 1 for f in stamps)

    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "c.jsonl").write_bytes(b"".join(sorted_lines[::-1]) + b"{not json\n")
    before = (torn / "c.jsonl").read_bytes()
    assert canonical_order(torn / "c.jsonl", by_id.digests) is False
    assert (torn / "c.jsonl").read_bytes() == before
