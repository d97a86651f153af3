"""The measured figures in README.md and docs/*.md are what their committed JSON says: regenerating
them (`make docs-figures`) changes nothing. A JSON edited without regenerating, a number edited by
hand inside a figure, or a key that is gone fails here. The reports compared with are the ones
committed in HEAD: `make repro` rewriting reports/ with one's own measurements fails nothing here."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from devtools import docs_figures
from devtools.docs_figures import FIGURES, FigureError, Reports, render, run

ROOT = Path(__file__).resolve().parents[2]


def test_every_doc_figure_matches_its_json():
    stale = run(ROOT, write=False)  # the reports committed in HEAD, whatever reports/ holds now
    assert not stale, (
        "figures differ from their JSON committed in HEAD (run `make docs-figures`, commit the "
        "docs with the reports):\n" + "\n".join(stale)
    )


def test_the_check_of_this_repository_reads_no_working_tree_report(monkeypatch):
    """What a run of one's own writes under reports/ cannot change the check above."""
    if Reports(ROOT, "HEAD").rev is None:
        pytest.skip("not a git work tree: the check reads the working tree's reports")

    def refused(self, file):
        raise AssertionError(f"{file} read from the working tree")

    monkeypatch.setattr(Reports, "_file_text", refused)
    assert run(ROOT, write=False) == []


def test_every_table_figure_is_used_in_a_doc():
    text = "".join(p.read_text() for p in docs_figures.doc_paths(ROOT))
    unused = [name for name in FIGURES if f"<!-- figures:{name}:begin -->" not in text]
    assert not unused, f"figures no doc shows: {unused}"


def doc_root(tmp_path: Path, doc: str, reports: dict) -> Path:
    for name, data in reports.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(doc)
    return tmp_path


VALUE_DOC = (
    "Acceptance length "
    "<!-- fig reports/acceptance.json#/acceptance_length .2f -->3.62<!-- /fig --> at "
    "<!-- fig reports/levels.json#/levels/c256~1x/ratio .3f -->0.945<!-- /fig --> in flight.\n"
)
VALUE_REPORTS = {
    "reports/acceptance.json": {"acceptance_length": 3.6195},
    "reports/levels.json": {"levels": {"c256/x": {"ratio": 0.9454}}},
}


def test_a_hand_edited_number_fails(tmp_path):
    root = doc_root(tmp_path, VALUE_DOC.replace("3.62", "3.64"), VALUE_REPORTS)
    assert run(root, write=False) == [
        "docs/page.md: reports/acceptance.json#/acceptance_length is 3.62, the doc says '3.64'"
    ]
    run(root)  # make docs-figures puts the JSON's figure back
    assert (root / "docs" / "page.md").read_text() == VALUE_DOC
    assert run(root, write=False) == []


def test_a_json_edited_without_regenerating_fails(tmp_path):
    root = doc_root(tmp_path, VALUE_DOC, VALUE_REPORTS)
    assert run(root, write=False) == []
    (root / "reports" / "acceptance.json").write_text(json.dumps({"acceptance_length": 3.7297}))
    assert len(run(root, write=False)) == 1
    with pytest.raises(SystemExit, match="make docs-figures"):
        docs_figures.main(["--check", "--root", str(root)])


def test_a_table_is_regenerated_from_its_json(tmp_path):
    src = ROOT / "reports" / "overhead" / "cpu_load_train_threads.json"
    data = json.loads(src.read_text())
    doc = (
        "<!-- figures:cpu_load_train_threads:begin -->\nold table\n"
        "<!-- figures:cpu_load_train_threads:end -->\n"
    )
    root = doc_root(tmp_path, doc, {"reports/overhead/cpu_load_train_threads.json": data})
    assert run(root) == ["docs/page.md: figure cpu_load_train_threads"]
    text = (root / "docs" / "page.md").read_text()
    idle = data["stages"]["train"]["policy"]["idle_s"]
    assert f"| {idle:.1f} |" in text and "cpu_load_train_threads.json" in text
    assert run(root, write=False) == []
    data["stages"]["train"]["policy"]["idle_s"] = idle + 1
    (root / "reports/overhead/cpu_load_train_threads.json").write_text(json.dumps(data))
    assert run(root, write=False) == ["docs/page.md: figure cpu_load_train_threads"]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("<!-- fig reports/acceptance.json#/gone .2f -->1<!-- /fig -->", "no 'gone' there"),
        ("<!-- fig reports/missing.json#/x .2f -->1<!-- /fig -->", "no such file"),
        ("<!-- fig reports/acceptance.json#/acceptance_length yesno -->1<!-- /fig -->", "boolean"),
        ("<!-- figures:nothing:begin -->\n<!-- figures:nothing:end -->", "unknown figure"),
        ("<!-- fig reports/acceptance.json#/acceptance_length .2f -->3.62", "without its pair"),
        ("<!-- figures:recipe_runs:begin -->\n", "without its pair"),
    ],
)
def test_a_broken_figure_is_refused(tmp_path, doc, message):
    root = doc_root(tmp_path, doc, VALUE_REPORTS)
    with pytest.raises(FigureError, match=message):
        run(root, write=False)


def specdec_root(tmp_path: Path, speedup_acceptance: float) -> Reports:
    for name in ("acceptance.detail.json", "overhead/specdec_speedup.json"):
        (tmp_path / "reports" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "reports" / name, tmp_path / "reports" / name)
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    path = tmp_path / "reports" / "overhead" / "specdec_speedup.json"
    data = json.loads(path.read_text())
    ours = json.loads((tmp_path / "reports" / "acceptance.detail.json").read_text())
    data.update(prompts=ours["prompts"], k=ours["k"], acceptance_length=speedup_acceptance)
    path.write_text(json.dumps(data))
    return Reports(tmp_path)


def test_the_speedup_row_says_stale_when_the_evaluate_report_moved_on(tmp_path):
    ours = json.loads((ROOT / "reports" / "acceptance.detail.json").read_text())
    same = docs_figures._specdec_row(specdec_root(tmp_path, ours["acceptance_length"]))[1]
    assert "stale" not in same
    older = docs_figures._specdec_row(specdec_root(tmp_path, ours["acceptance_length"] + 0.11))[1]
    assert "**stale**" in older


def test_render_keeps_everything_outside_the_figures(tmp_path):
    doc = "# Title\n\n" + VALUE_DOC + "\n<!-- workflow:begin -->\nkept\n<!-- workflow:end -->\n"
    root = doc_root(tmp_path, doc, VALUE_REPORTS)
    out, changed = render(doc, Reports(root))
    assert out == doc and changed == []


def test_the_hs_formats_row_reads_the_file_once_make_overhead_commits_it(tmp_path):
    reports = Reports(tmp_path)
    assert "not in a committed file" in docs_figures._hs_formats_row(reports)[1]
    formats = {
        fmt: {"ratio_to_minimum": ratio, "argmax_agreement": 0.9998}
        for fmt, ratio in (("bf16", 1.0096), ("fp8", 1.0211))
    }
    path = tmp_path / "reports" / "overhead" / "hs_format_tradeoffs.json"
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {
                "hidden_size": 128,
                "formats": formats,
                "tau_sim_fp8_minus_bf16": -0.007,
                "tau_sim_online_minus_offline_bf16": 0.0,
            }
        )
    )
    row = docs_figures._hs_formats_row(Reports(tmp_path))[1]
    assert "fp8 1.0211 (H = 128)" in row and "fp8 - bf16 -0.0070" in row


def test_the_recipe_table_shows_the_runs_measured_and_refuses_an_unknown_one(tmp_path):
    run_500 = {"acceptance_length": 2.31, "tau_sim": 2.4, "dev_acceptance_length": 2.2}
    run_500 |= {"dev_tau_sim": 2.3, "eval_twins_in_train": {"exact": 0, "template": 1}}
    run_500 |= {"speedup": 1.2}
    candidate = {k: v for k, v in run_500.items() if k != "speedup"}  # stopped at evaluate
    path = tmp_path / docs_figures.RECIPE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"L27-500": run_500, "d500-emb": candidate}))
    text = docs_figures.recipe_heldout(Reports(tmp_path))
    rows = [line for line in text.splitlines() if line.startswith("| L27") or "d500" in line]
    assert rows == [
        "| L27-500 | 500 | the earlier recipe | 2.3100 | 2.4000 | 2.2000 | 2.3000 "
        "| 0 / 1 | 1.2000 |",
        "| d500-emb | 500 | train_embeddings | 2.3100 | 2.4000 | 2.2000 | 2.3000 | 0 / 1 "
        "| (not run) |",
    ]  # the runs not measured yet have no row
    path.write_text(json.dumps({"L27-500": run_500, "L27-9000": run_500}))
    with pytest.raises(FigureError, match="L27-9000"):
        docs_figures.recipe_heldout(Reports(tmp_path))


def test_no_figure_outside_a_generated_one():
    """params.yaml, the scripts and the code's comments and docstrings quote a measured number only
    as a generated figure: a copy that no rerun updates is what #43 found there."""
    loose = docs_figures.unsourced(ROOT)
    assert not loose, "figures that no JSON gives:\n" + "\n".join(loose)


PARAMS = """\
tokenize:
  max_length: 512     # rows longer than this are cut; 0.05 below (issue #43, line 12 of the stage)
  max_truncated_share: 0.05   # fail when more rows were cut (default run: {figure})
  extra: ["--dtype", "float32"]   # `--temperature 0.6` as an example; Python 3.12, vLLM 0.9.2
"""
SCRIPT = """\
#!/usr/bin/env bash
# the recipe (PYTHON_VERSION=3.11; draftline forecast --targets 2.5 3.0): reaches {figure}
dvc exp run -S 'train.lr=0.003'  # lr 0.003: the default's
"""
GENERATED = "<!-- fig reports/acceptance.json#/acceptance_length .2f -->3.62<!-- /fig -->"


def code_root(tmp_path: Path, params_figure: str, script_figure: str) -> Path:
    root = doc_root(tmp_path, "No figure.\n", VALUE_REPORTS)
    (root / "params.yaml").write_text(PARAMS.format(figure=params_figure))
    (root / "scripts").mkdir()
    (root / "scripts" / "recipe.sh").write_text(SCRIPT.format(figure=script_figure))
    return root


@pytest.mark.parametrize(
    ("params_figure", "script_figure", "where"),
    [
        ("0 of 969", GENERATED, "params.yaml:3: '0 of 969'"),
        ("1.00", GENERATED, "params.yaml:3: '1.00'"),
        (GENERATED, "1.52 at k = 3", "scripts/recipe.sh:2: '1.52'"),
        (GENERATED, "3.3x the tokens/s", "scripts/recipe.sh:2: '3.3x'"),
        (GENERATED, "a ~35 s start", "scripts/recipe.sh:2: '~35'"),
    ],
    ids=["count", "decimal", "script-decimal", "ratio", "approximation"],
)
def test_a_figure_in_a_params_or_script_comment_fails_unless_generated(
    tmp_path, params_figure, script_figure, where
):
    root = code_root(tmp_path, params_figure, script_figure)
    loose = docs_figures.unsourced(root)
    assert len(loose) == 1 and loose[0].startswith(where), loose
    with pytest.raises(SystemExit, match="figure.* that no JSON gives"):
        docs_figures.main(["--check", "--root", str(root)])


def test_generated_figures_outside_the_docs_pass_and_are_regenerated(tmp_path):
    # config values, a code span, option values, an assignment, versions, an issue and a line
    # number, and a value the script itself sets are not figures
    root = code_root(tmp_path, GENERATED, GENERATED)
    docs_figures.main(["--check", "--root", str(root)])
    (root / "reports" / "acceptance.json").write_text(json.dumps({"acceptance_length": 2.4}))
    assert run(root, write=False) == [
        f"{where}: reports/acceptance.json#/acceptance_length is 2.40, the doc says '3.62'"
        for where in ("params.yaml", "scripts/recipe.sh")
    ]
    run(root)
    assert GENERATED.replace("3.62", "2.40") in (root / "scripts" / "recipe.sh").read_text()
    docs_figures.main(["--check", "--root", str(root)])


def test_in_python_only_comments_and_docstrings_are_read(tmp_path):
    module = tmp_path / "draftline" / "part.py"
    module.parent.mkdir()
    module.write_text(
        '"""A part. Measured once: 2.47 on 250 conversations."""\n\n'
        "TOLERANCE = 0.02  # 0.02: one flip in fifty steps\n"
        'TEXT = "ran 1.52 -> 2.47, 6 of 24"  # a string in code is code\n\n\n'
        "def f():\n"
        '    """Its memory: ~130 MB a shard."""\n'
        "    return 0.5  # (j + 0.5) / w: a constant of the code\n"
    )
    found = docs_figures.loose_figures(module.read_text(), module, "draftline/part.py")
    assert [line.split(",")[0] for line in found] == [
        "draftline/part.py:1: '2.47'",
        "draftline/part.py:8: '~130'",
    ]


# ---- the committed reports, not the working tree's ----------------------------------------------

GIT_ENV = {
    **{k: v for k, v in os.environ.items() if k not in docs_figures.GIT_ENV},
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, env=GIT_ENV, check=True, capture_output=True)


def commit_all(root: Path, message: str) -> None:
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)


def committed_root(tmp_path: Path) -> Path:
    """A repository whose HEAD holds a doc generated from its reports (VALUE_DOC, VALUE_REPORTS),
    with a params.yaml and a script whose comments hold figures too."""
    root = code_root(tmp_path, GENERATED, GENERATED)
    (root / "docs" / "page.md").write_text(VALUE_DOC)
    git(root, "init", "-q")
    commit_all(root, "docs and the reports they were generated from")
    docs_figures.main(["--check", "--root", str(root)])
    return root


def a_run_of_ones_own(root: Path) -> None:
    """What `make repro` and `make overhead` do to reports/: other numbers, and a new file, nothing
    committed."""
    for name, value in {
        "reports/acceptance.json": {"acceptance_length": 1.2345},
        "reports/levels.json": {"levels": {"c256/x": {"ratio": 0.5}}},
        "reports/overhead/hs_format_tradeoffs.json": {"hidden_size": 1},
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(json.dumps(value))


def test_the_check_passes_after_a_run_of_ones_own(tmp_path):
    """`make repro`, then `make test`: the check reads the reports committed in HEAD."""
    root = committed_root(tmp_path)
    a_run_of_ones_own(root)
    assert run(root, write=False) == []  # what test_every_doc_figure_matches_its_json runs
    docs_figures.main(["--check", "--root", str(root)])
    assert not Reports(root, "HEAD").exists("reports/overhead/hs_format_tradeoffs.json")
    # the working tree's reports, asked for, are another run's
    assert len(run(root, write=False, reports="worktree")) == 4  # the doc's two, params, script
    with pytest.raises(SystemExit, match="differ from the working tree's reports"):
        docs_figures.main(["--check", "--reports", "worktree", "--root", str(root)])


def test_a_hand_edited_figure_still_fails_after_a_run_of_ones_own(tmp_path):
    root = committed_root(tmp_path)
    a_run_of_ones_own(root)
    (root / "docs" / "page.md").write_text(VALUE_DOC.replace("3.62", "3.64"))
    assert run(root, write=False) == [
        "docs/page.md: reports/acceptance.json#/acceptance_length is 3.62, the doc says '3.64'"
    ]
    with pytest.raises(SystemExit, match="differ from the reports committed in HEAD"):
        docs_figures.main(["--check", "--root", str(root)])


def test_a_report_committed_without_regenerating_fails(tmp_path):
    root = committed_root(tmp_path)
    (root / "reports" / "acceptance.json").write_text(json.dumps({"acceptance_length": 3.7297}))
    commit_all(root, "a new report, the docs not regenerated")
    stale = run(root, write=False)
    assert len(stale) == 3 and all("is 3.73, the doc says '3.62'" in line for line in stale)
    with pytest.raises(SystemExit, match="3 figure.* differ from the reports committed in HEAD"):
        docs_figures.main(["--check", "--root", str(root)])
    # an older revision still holds the docs' figures
    assert run(root, write=False, reports=Reports(root, "HEAD~1")) == []


def test_a_report_no_commit_holds_is_absent_from_the_check(tmp_path):
    root = committed_root(tmp_path)
    (root / "docs" / "page.md").write_text(
        "<!-- fig reports/new.json#/x .2f -->1.00<!-- /fig -->\n"
    )
    (root / "reports" / "new.json").write_text(json.dumps({"x": 1}))
    with pytest.raises(FigureError, match="reports/new.json: no such file in HEAD"):
        run(root, write=False)
    with pytest.raises(SystemExit, match="no such file in HEAD"):
        docs_figures.main(["--check", "--root", str(root)])
    assert run(root, write=False, reports="worktree") == []
    commit_all(root, "the new report and its figure")
    assert run(root, write=False) == []


def test_writing_after_a_run_of_ones_own_reads_the_working_tree(tmp_path, capsys):
    """`make repro`, then `make docs-figures`: the docs take the run's figures, to commit with its
    reports; until then the check compares them with HEAD's."""
    root = committed_root(tmp_path)
    a_run_of_ones_own(root)
    docs_figures.main(["--root", str(root)])
    assert "4 rewritten from the working tree's reports" in capsys.readouterr().out
    page = (root / "docs" / "page.md").read_text()
    assert page == VALUE_DOC.replace("3.62", "1.23").replace("0.945", "0.500")
    assert "-->1.23<!-- /fig -->" in (root / "scripts" / "recipe.sh").read_text()
    assert run(root, write=False, reports="worktree") == []
    assert len(run(root, write=False)) == 4  # HEAD's reports: not committed yet
    commit_all(root, "the run's reports and the docs regenerated from them")
    docs_figures.main(["--check", "--root", str(root)])


def test_a_root_below_another_repository_reads_its_own_files(tmp_path):
    """Only the top of a work tree reads from git: a directory inside another repository, its
    files untracked there, is not that repository's committed state."""
    git(tmp_path, "init", "-q")
    root = doc_root(tmp_path / "sub", VALUE_DOC, VALUE_REPORTS)
    reports = Reports(root, "HEAD")
    assert reports.rev is None and "not the top of a git work tree" in reports.source
    assert run(root, write=False) == []
