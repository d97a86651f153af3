"""Stage compare_drafts: benchmark.compare's drafts hashed, the file rewritten only when a draft's
content, name or path changed (so that `benchmark` reruns then and only then), a directory that is
no draft refused."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from draftline.benchmark.compare_drafts import Paths, run
from draftline.benchmark.config import BenchmarkConfig, BenchmarkError


def params(**compare) -> SimpleNamespace:
    return SimpleNamespace(benchmark=BenchmarkConfig(compare=compare))


def test_a_changed_draft_changes_the_file_and_an_unchanged_one_leaves_it(tmp_path: Path):
    draft = tmp_path / "peagle"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    (draft / "model.safetensors").write_bytes(b"weights")
    out = Paths(tmp_path / "reports/compare_drafts.json")
    first = run(params(peagle=str(draft)), out)
    assert first["peagle"]["files"] == 2
    mtime, text = out.out.stat().st_mtime_ns, out.out.read_text()
    run(params(peagle=str(draft)), out)
    assert out.out.stat().st_mtime_ns == mtime  # same content: not rewritten
    (draft / "model.safetensors").write_bytes(b"retrained")
    second = run(params(peagle=str(draft)), out)
    assert second["peagle"]["sha256"] != first["peagle"]["sha256"] and out.out.read_text() != text
    run(params(), out)
    assert out.out.read_text() == "{}\n"


def test_a_directory_without_a_draft_is_refused(tmp_path: Path):
    with pytest.raises(BenchmarkError, match=r"benchmark.compare x: .* \(no config.json\)"):
        run(params(x=str(tmp_path)), Paths(tmp_path / "out.json"))
