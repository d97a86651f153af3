"""docs/params.md is what devtools/params_reference.py makes of the config classes: a field added,
renamed or re-commented without regenerating it fails here."""

import shutil
from pathlib import Path

import pytest

from devtools import params_reference
from draftline.params import Params

ROOT = Path(__file__).resolve().parents[2]


def test_the_reference_is_up_to_date():
    params_reference.main(["--check"])  # `python -m devtools.params_reference` rewrites it


def test_a_stale_reference_fails(tmp_path):
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / params_reference.OUT, tmp_path / params_reference.OUT)
    stale = tmp_path / params_reference.OUT
    stale.write_text(stale.read_text().replace("| `samples` |", "| `sample` |"))
    with pytest.raises(SystemExit, match="docs/params.md is stale"):
        params_reference.main(["--check", "--root", str(tmp_path)])
    params_reference.main(["--root", str(tmp_path)])
    assert stale.read_text() == (ROOT / params_reference.OUT).read_text()


def test_every_section_and_key_is_listed():
    tables = {t.path: t for t in params_reference.tables()}
    assert [k.name for k in tables[""].keys] == list(Params.model_fields)
    for table in tables.values():
        assert [k.name for k in table.keys] == list(table.model.model_fields)
        for key in table.keys:
            assert key.section is None or key.section in tables
    # a section's default comes from its parent's default when that differs from the class's
    long = {k.name: k.default for k in tables["regenerate.long"].keys}
    assert long["concurrency"] == "`4`"


def test_descriptions_are_the_comments_at_the_field():
    tables = {t.path: t for t in params_reference.tables()}
    train = {k.name: k.description for k in tables["train"].keys}
    assert train["pack_len"] == "tokens per packed micro-batch, per device"  # on its line
    assert train["backend"].startswith("builtin: our loop on CPU")  # the lines above it
    assert train["epochs"] == ""  # none written: none invented
