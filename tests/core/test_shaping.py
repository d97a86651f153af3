"""The code that shapes each persisted output (draftline/core/shaping.py): every module listed is
one its stage runs, every module of the output's own phase package is classified, and on a copy of
the source tree an edit to a log line or to prose keeps the fingerprint while an edit to what a
shaping module does changes it. The stages' own tests show the same through their resume:
tests/hidden_states/test_hidden.py, tests/tokens/test_tokenize_stage.py, tests/train/test_train.py,
tests/probe/test_probe.py."""

import shutil
from pathlib import Path

import pytest

from draftline.core.code import PACKAGES, closure
from draftline.core.shaping import BOOKKEEPING, OUTPUTS, SHAPES, shaping_fingerprint

ROOT = Path(__file__).resolve().parents[2]

# per output: an edit that shapes nothing (a log line, a progress label) in a module of its stage,
# and an edit to what a shaping module does
EDITS = {
    "regenerate": (
        (
            "draftline/regenerate/progress.py",
            'f"{minutes}m{sec:02d}s"',
            'f"{minutes} m {sec:02d} s"',
        ),
        (
            "draftline/engines/greedy_batch.py",
            'kwargs["logits_to_keep"] = 1',
            'kwargs["logits_to_keep"] = 2',
        ),
    ),
    "hidden_states": (
        ("draftline/hidden_states/extract.py", '"hidden_states: running "', '"hs: running "'),
        ("draftline/hidden_states/capture.py", "logits_to_keep=1", "logits_to_keep=2"),
    ),
    "tokenize": (
        ("draftline/tokens/tokenize.py", 'add_task("tokenize"', 'add_task("tokenizing"'),
        ("draftline/tokens/chat.py", "JOIN_WINDOW = 16", "JOIN_WINDOW = 24"),
    ),
    "train": (
        ("draftline/train/progress.py", "(validation aside)", "(validation not counted)"),
        ("draftline/draft/forward.py", '"eager" if device == "cpu"', '"fused" if device == "cpu"'),
    ),
    "probe": (
        (
            "draftline/probe/checks.py",
            'f"probe: one {len(ids)}-token',
            'f"probe: a {len(ids)}-token',
        ),
        ("draftline/probe/extraction.py", 'probe_file=transfer != "mooncake"', "probe_file=True"),
    ),
}


def copy_code(dst: Path) -> Path:
    """draftline/ and stages/ copied under dst (what shaping_fingerprint reads)."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, dst / package, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def edit(root: Path, module: str, old: str, new: str) -> None:
    """Replace `old` (which must be there) with `new` in root/module."""
    path = root / module
    text = path.read_text()
    assert old in text, f"{module} no longer holds {old!r}: update the edit"
    path.write_text(text.replace(old, new))


def phase_modules(name: str) -> list[str]:
    """The modules of the output's phase package that its stage runs."""
    stage, package = OUTPUTS[name]
    return [m for m in closure(ROOT, f"stages.{stage}") if m.startswith(package)]


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_shaping_module_runs_in_its_stage_and_every_phase_module_is_classified(name):
    stage, _ = OUTPUTS[name]
    runs = closure(ROOT, f"stages.{stage}")
    for module in SHAPES[name]:
        assert (ROOT / module).is_file(), f"SHAPES[{name!r}]: {module} does not exist"
        assert module in runs, f"SHAPES[{name!r}]: stages.{stage} never runs {module}"
    unclassified = [m for m in phase_modules(name) if m not in SHAPES[name] + BOOKKEEPING]
    assert not unclassified, (
        f"draftline/core/shaping.py: say whether {unclassified} shape {name!r} (SHAPES) or not "
        "(BOOKKEEPING)"
    )
    both = [m for m in phase_modules(name) if m in SHAPES[name] and m in BOOKKEEPING]
    assert not both, f"{both}: in SHAPES[{name!r}] and in BOOKKEEPING"


def test_bookkeeping_names_modules_that_exist_and_every_output_has_a_stage():
    assert set(OUTPUTS) == set(SHAPES)
    assert all((ROOT / m).is_file() for m in BOOKKEEPING)
    assert len(set(BOOKKEEPING)) == len(BOOKKEEPING)
    assert all(len(set(modules)) == len(modules) for modules in SHAPES.values())


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_log_line_or_prose_keeps_the_fingerprint_and_a_code_edit_changes_it(tmp_path, name):
    root = copy_code(tmp_path)
    before = shaping_fingerprint(name, root=root)
    assert before == shaping_fingerprint(name) == shaping_fingerprint(name, root=ROOT)

    keep, shape = EDITS[name]
    edit(root, *keep)
    assert shaping_fingerprint(name, root=root) == before

    module = shape[0]  # prose in a shaping module: a docstring and a comment
    text = (root / module).read_text()
    (root / module).write_text(text.replace('"""', '"""Reworded. ', 1) + "\n# a comment\n")
    assert shaping_fingerprint(name, root=root) == before

    edit(root, *shape)
    assert shaping_fingerprint(name, root=root) != before


def test_the_fingerprint_follows_each_listed_module_only(tmp_path):
    """An edit to a module another output lists (draftline/tokens/chat.py) changes that output's
    fingerprint alone."""
    root = copy_code(tmp_path)
    before = {name: shaping_fingerprint(name, root=root) for name in SHAPES}
    edit(root, "draftline/tokens/chat.py", "JOIN_WINDOW = 16", "JOIN_WINDOW = 24")
    after = {name: shaping_fingerprint(name, root=root) for name in SHAPES}
    assert {name for name in SHAPES if after[name] != before[name]} == {"tokenize"}
