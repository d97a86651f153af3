"""`draftline verify-repro`: a user's run against the committed one, every figure against the
tolerance reproducibility.yaml states, the discrete outputs against the committed lock."""

import fnmatch
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from draftline.tools.verify_repro import VerifyError, main, verify

ROOT = Path(__file__).resolve().parents[2]
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(root), *args],
        check=True,
        capture_output=True,
        env={**os.environ, **GIT_ENV},
    )


def lock(md5s: dict[str, str]) -> str:
    stages = {s: {"cmd": "x", "outs": [{"path": f"out/{s}", "md5": m}]} for s, m in md5s.items()}
    return yaml.safe_dump({"schema": "2.0", "stages": stages})


def write(
    root: Path, md5s: dict, acceptance: float, machine: str = "AVX512", ran_at: str = "rerun"
) -> None:
    """A run of the stages in md5s: the lock, the figures, and each stage's run record."""
    (root / "dvc.lock").write_text(lock(md5s))
    (root / "reports/machine").mkdir(parents=True, exist_ok=True)
    (root / "reports/acceptance.json").write_text(json.dumps({"acceptance_length": acceptance}))
    (root / "reports/benchmark.json").write_text(
        json.dumps({"speedup": 1.19 if machine == "AVX512" else 0.88})
    )
    for stage in md5s:
        facts = {"stage": stage, "ran_at": ran_at, "cpu": {"model": "cpu"}}
        facts["torch"] = {"cpu_capability": machine}
        (root / f"reports/machine/{stage}.json").write_text(json.dumps(facts))


@pytest.fixture
def committed(tmp_path: Path) -> Path:
    (tmp_path / "reproducibility.yaml").write_text(
        yaml.safe_dump(
            {
                "identical": ["mix", "prepare@*"],
                "may_differ": [{"stage": "train", "why": "float training"}],
                "within": {"reports/acceptance.json#/acceptance_length": {"abs": 0.3}},
                "reported": {"reports/benchmark.json#/speedup": None},
            }
        )
    )
    write(tmp_path, {"mix": "a", "prepare@x": "b", "train": "c"}, 3.49, ran_at="committed")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "run")
    return tmp_path


def test_a_run_on_other_kernels_within_the_contract_passes(committed, capsys):
    write(committed, {"mix": "a", "prepare@x": "b", "train": "OTHER"}, 3.23, machine="AVX2")
    report = verify(committed)
    assert report["failed"] == []
    main(["--root", str(committed), "--json", str(committed / "v.json")])
    out = capsys.readouterr().out
    assert "differs (allowed)" in out and "train" in out
    assert "torch.cpu_capability: AVX512 -> AVX2" in out  # the facts that explain it
    assert "outside (reported)" in out  # the speedup moved, shown, not failed
    assert json.loads((committed / "v.json").read_text())["failed"] == []


def test_a_discrete_output_that_differs_is_named(committed):
    write(committed, {"mix": "a", "prepare@x": "CHANGED", "train": "c"}, 3.49)
    report = verify(committed)
    assert report["failed"] == ["prepare@x"]
    with pytest.raises(VerifyError, match="outside the contract: prepare@x"):
        main(["--root", str(committed)])


def test_a_figure_beyond_its_tolerance_or_missing_is_named(committed):
    write(committed, {"mix": "a", "prepare@x": "b", "train": "c"}, 3.10)
    assert verify(committed)["failed"] == ["reports/acceptance.json#/acceptance_length"]
    (committed / "reports/acceptance.json").write_text("{}")
    assert verify(committed)["failed"] == ["reports/acceptance.json#/acceptance_length"]


def test_a_decision_reversed_is_named_and_an_undecided_one_is_not(committed):
    """`decisions`: yes in the committed run and no in yours is outside the contract; a load one
    run could not decide is not a contradiction."""
    contract = yaml.safe_load((committed / "reproducibility.yaml").read_text())
    contract["decisions"] = ["reports/benchmark.detail.json#/verdict/decisions"]
    (committed / "reproducibility.yaml").write_text(yaml.safe_dump(contract))

    def decisions(**by_load):
        path = committed / "reports/benchmark.detail.json"
        verdict = {"decisions": {c[1:]: {"decision": d} for c, d in by_load.items()}}
        path.write_text(json.dumps({"verdict": verdict}))

    decisions(c1="yes", c4="yes", c16="undecided")
    git(committed, "add", ".")
    git(committed, "commit", "-qm", "decided")
    write(committed, {"mix": "a", "prepare@x": "b", "train": "c"}, 3.49)  # rerun
    decisions(c1="yes", c4="undecided", c16="no")
    report = verify(committed)
    assert report["failed"] == [] and [r["ok"] for r in report["decisions"]] == [True] * 3
    decisions(c1="no", c4="yes", c16="yes")
    assert verify(committed)["failed"] == ["reports/benchmark.detail.json#/verdict/decisions/1"]
    decisions(c1="yes", c4="yes")  # a load missing from the rerun
    assert verify(committed)["failed"] == ["reports/benchmark.detail.json#/verdict/decisions/16"]


def test_a_stage_missing_from_the_run_is_named(committed):
    write(committed, {"prepare@x": "b", "train": "c"}, 3.49)
    assert verify(committed)["failed"] == ["mix"]


def test_an_untouched_checkout_has_nothing_rerun_to_compare_and_does_not_pass(committed):
    """Every run record is the committed one: comparing the committed run with itself would pass
    by accident, so it says there is nothing rerun and exits 1."""
    with pytest.raises(VerifyError, match="nothing rerun to compare"):
        verify(committed)
    with pytest.raises(VerifyError, match="nothing rerun to compare"):
        main(["--root", str(committed)])


def test_a_stage_that_was_not_rerun_is_listed_and_not_compared(committed, capsys):
    """Only train reran (its record is new); mix and prepare@x hold the committed outputs and
    are said to be not compared, whatever their lock entries."""
    write(committed, {"train": "OTHER"}, 3.40, machine="AVX2")
    (committed / "dvc.lock").write_text(lock({"mix": "a", "prepare@x": "b", "train": "OTHER"}))
    report = verify(committed)
    assert report["not_rerun"] == ["mix", "prepare@x"] and report["failed"] == []
    main(["--root", str(committed)])
    out = capsys.readouterr().out
    assert "not rerun (not compared)" in out and "not rerun, not compared: mix, prepare@x" in out


def test_without_a_committed_run_it_says_so(tmp_path):
    with pytest.raises(VerifyError, match="no dvc.lock committed"):
        verify(tmp_path)


def test_the_contract_names_every_stage_of_the_pipeline():
    """Every stage of dvc.yaml is in the contract, as identical or as may_differ with a reason."""
    contract = yaml.safe_load((ROOT / "reproducibility.yaml").read_text())
    patterns = [*contract["identical"], *(e["stage"] for e in contract["may_differ"])]
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    stages = [
        f"{name}@{key}" if "foreach" in stage else name
        for name, stage in spec.items()
        for key in (stage["foreach"] if isinstance(stage.get("foreach"), dict) else ["any"])
    ]
    unnamed = [s for s in stages if not any(fnmatch.fnmatch(s, p) for p in patterns)]
    assert not unnamed, f"stages reproducibility.yaml does not name: {unnamed}"
    files = {ref.partition("#")[0] for kind in ("within", "reported") for ref in contract[kind]}
    assert all((ROOT / f).is_file() for f in files)


def test_run_facts_inside_the_regenerated_output_are_left_out_of_its_hash():
    """The server's log and timing counters live in datasets/regenerated but are no data: DVC
    ignores them, so the same answers give the same hash on any machine (the `may_differ` stage
    regenerate is byte-identical where the answers are)."""
    facts = ["server.log", "server_stats.json", "server.pid", ".hf_cache/x"]
    done = subprocess.run(
        ["dvc", "check-ignore", *(f"datasets/regenerated/{f}" for f in facts)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(done.stdout.split()) == len(facts)
    kept = subprocess.run(
        ["dvc", "check-ignore", "datasets/regenerated/conversations.jsonl"], cwd=ROOT, check=False
    )
    assert kept.returncode == 1


def test_on_the_committed_machine_what_may_differ_elsewhere_must_not(committed, capsys):
    """The same machine facts in the stage's run record: the float stages' outputs must have the
    committed bytes (the same-machine promise); a stage the contract calls measured (serving
    throughput) may differ there too."""
    contract = yaml.safe_load((committed / "reproducibility.yaml").read_text())
    contract["may_differ"].append({"stage": "bench", "why": "measured", "measured": True})
    (committed / "reproducibility.yaml").write_text(yaml.safe_dump(contract))
    write(committed, {"mix": "a", "prepare@x": "b", "train": "c", "bench": "B"}, 3.49, ran_at="c")
    git(committed, "add", ".")
    git(committed, "commit", "-qm", "a run with its benchmark")
    write(committed, {"mix": "a", "prepare@x": "b", "train": "OTHER", "bench": "X"}, 3.49)
    report = verify(committed)
    rows = {r["stage"]: r for r in report["outputs"]}
    assert rows["train"]["same_machine"] and not rows["train"]["ok"]
    assert rows["bench"]["ok"] and report["failed"] == ["train"]
    with pytest.raises(VerifyError, match="outside the contract: train"):
        main(["--root", str(committed)])
    assert "DIFFERS on the committed machine" in capsys.readouterr().out
    write(committed, {"mix": "a", "prepare@x": "b", "train": "c", "bench": "X"}, 3.49)
    assert verify(committed)["failed"] == []  # the same bytes again: within


def per_prompt(root: Path, values: dict[str, float]) -> None:
    (root / "reports/acceptance.detail.json").write_text(
        json.dumps({"per_prompt_acceptance": values})
    )


def test_per_prompt_acceptance_is_compared_prompt_by_prompt(committed):
    """`paired`: the same prompts' acceptance, the interval of the mean paired difference inside
    the margin. A rerun that drifts on a few prompts passes; every prompt 0.3 lower (a headline
    that `abs 0.3` would let through) fails, as does a run on other prompts."""
    contract = yaml.safe_load((committed / "reproducibility.yaml").read_text())
    ref = "reports/acceptance.detail.json#/per_prompt_acceptance"
    contract["paired"] = {ref: {"margin": 0.1, "alpha": 0.05}}
    (committed / "reproducibility.yaml").write_text(yaml.safe_dump(contract))
    base = {f"p{i}": 2.0 + (i % 5) / 4 for i in range(24)}
    per_prompt(committed, base)
    git(committed, "add", ".")
    git(committed, "commit", "-qm", "per-prompt figures")

    def verdict(values: dict) -> dict:
        write(committed, {"mix": "a", "prepare@x": "b", "train": "OTHER"}, 3.2, machine="AVX2")
        per_prompt(committed, values)
        report = verify(committed)
        (row,) = report["paired"]
        return row | {"failed": report["failed"]}

    same = verdict(base)
    assert same["ok"] and same["changed"] == 0 and same["low"] == same["high"] == 0
    drift = {
        p: v + (0.25 if p in ("p3", "p11") else -0.2 if p == "p7" else 0) for p, v in base.items()
    }
    row = verdict(drift)
    assert row["ok"] and row["changed"] == 3 and row["failed"] == []
    lower = verdict({p: v - 0.3 for p, v in base.items()})
    assert not lower["ok"] and lower["mean"] == -0.3 and lower["failed"] == [ref]
    assert "leaves +-0.1" in lower["why"]
    other = verdict({**{p: v for p, v in base.items() if p != "p0"}, "q0": 2.0})
    assert not other["ok"] and "other prompts: p0, q0" in other["why"]


def test_the_margin_can_be_what_the_committed_run_resolves(committed):
    """margin committed_interval: the half-width of the committed run's own interval of its mean
    (here 24 prompts of sd 0.36: 0.12 at 90%); every prompt 0.3 lower is outside it, a rerun with
    the committed values inside."""
    contract = yaml.safe_load((committed / "reproducibility.yaml").read_text())
    ref = "reports/acceptance.detail.json#/per_prompt_acceptance"
    contract["paired"] = {ref: {"margin": "committed_interval", "alpha": 0.05}}
    (committed / "reproducibility.yaml").write_text(yaml.safe_dump(contract))
    base = {f"p{i}": 2.0 + (i % 5) / 4 for i in range(24)}
    per_prompt(committed, base)
    git(committed, "add", ".")
    git(committed, "commit", "-qm", "per-prompt figures")
    write(committed, {"mix": "a", "prepare@x": "b", "train": "OTHER"}, 3.2, machine="AVX2")
    (row,) = verify(committed)["paired"]
    assert row["ok"] and row["margin"] == pytest.approx(0.1235, abs=1e-4)
    per_prompt(committed, {p: v - 0.3 for p, v in base.items()})
    (row,) = verify(committed)["paired"]
    assert not row["ok"] and row["margin"] == pytest.approx(0.1235, abs=1e-4)


def test_the_committed_default_run_0_3_lower_is_outside_the_shipped_contract(tmp_path):
    """The shipped contract on the committed default's per-prompt acceptance: the same values
    pass; every eval prompt 0.3 lower (a headline the old `abs 0.3` let through) fails."""
    files = ["reproducibility.yaml"] + [
        f"reports/{name}.detail.json" for name in ("acceptance", "acceptance_dev")
    ]
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text((ROOT / f).read_text())
    write(tmp_path, {"train": "c"}, 3.0, ran_at="committed")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "the default")
    write(tmp_path, {"train": "OTHER"}, 3.0, machine="AVX2")
    report = verify(tmp_path)
    rows = {r["figure"].split("#")[0]: r for r in report["paired"]}
    assert all(r["ok"] and r["changed"] == 0 for r in rows.values())
    detail = tmp_path / "reports/acceptance.detail.json"
    data = json.loads(detail.read_text())
    data["per_prompt_acceptance"] = {p: v - 0.3 for p, v in data["per_prompt_acceptance"].items()}
    detail.write_text(json.dumps(data))
    report = verify(tmp_path)
    assert "reports/acceptance.detail.json#/per_prompt_acceptance" in report["failed"]


def test_a_figure_is_read_as_the_stage_that_ran_even_beside_a_stale_lock_entry(committed):
    """A lock keeps the entry of a stage since renamed (`evaluate` before `evaluate@eval`) with
    the same outputs; the figure belongs to the stage that left a run record, so a rerun of it
    is compared, not said to be not rerun."""
    contract = yaml.safe_load((committed / "reproducibility.yaml").read_text())
    contract["may_differ"].append({"stage": "ev*", "why": "acceptance"})
    (committed / "reproducibility.yaml").write_text(yaml.safe_dump(contract))
    stages = {
        "evaluate": {"cmd": "x", "outs": [{"path": "reports/acceptance.json", "md5": "old"}]},
        "ev@eval": {"cmd": "x", "outs": [{"path": "reports/acceptance.json", "md5": "a"}]},
    }
    text = yaml.safe_dump({"schema": "2.0", "stages": stages})
    (committed / "dvc.lock").write_text(text)
    (committed / "reports/machine/ev@eval.json").write_text(json.dumps({"ran_at": "c"}))
    git(committed, "add", ".")
    git(committed, "commit", "-qm", "a lock with a stale entry")
    (committed / "reports/machine/ev@eval.json").write_text(json.dumps({"ran_at": "rerun"}))
    (committed / "reports/acceptance.json").write_text(json.dumps({"acceptance_length": 2.0}))
    report = verify(committed)
    (row,) = [r for r in report["figures"] if r["figure"].startswith("reports/acceptance")]
    assert row["rerun"] and not row["ok"] and row["figure"] in report["failed"]
