"""Your run against the committed one: each figure against its stated tolerance, each output that
must be identical against the committed lock, and the machine facts that explain a difference.

    draftline verify-repro                       # after `make repro`: the workspace against HEAD
    draftline verify-repro --rev v1.2 --json reports/verify_repro.json

The contract (README, docs/operations.md) and its tolerances are in `reproducibility.yaml`:
- `identical`: stages whose DVC outputs must have the committed bytes on any machine (discrete
  work: prepared and mixed data, the shipped tiny target);
- `may_differ`: stages whose outputs are byte-identical on the same machine and environment but
  follow from float kernels elsewhere (greedy answers at near ties, hidden states, the draft): a
  difference is listed with its reason and failed only where the stage's run record shows the
  committed machine facts (MACHINE_KEYS: the same CPU, kernels, threads and versions), unless the
  entry says `measured: true` (serving throughput differs on one machine too);
- `within`: figures (`file#/json/pointer`) with an absolute or relative tolerance;
- `paired`: per-prompt figures (`file#/pointer` to {prompt id: value}) compared prompt by prompt:
  the interval of the mean paired difference (Student t, two-sided at 1 - 2 alpha, the
  equivalence test's) must lie inside +-margin; the same prompts on both sides. `margin:
  committed_interval` takes the half-width of the committed run's own interval of its mean at
  the same confidence: a rerun may differ by less than the eval set resolves, not by more;
- `reported`: figures compared and shown but never failed (serving throughput on a shared CPU).
- `decisions`: the serving decisions per load: yes in one run and no in the other is outside;
  undecided on either side is not (the passes could not tell).
Exit status 1 names every output or figure outside the contract; a figure missing on either side
is outside it too. Only what was rerun is compared: a stage whose run record
(`reports/machine/<stage>.json`, written by every run with the time it ran) is the committed one
was not rerun, and its outputs and figures are listed as not compared; a workspace where no stage
was rerun (an untouched checkout) has nothing to compare and exits 1 saying so, rather than pass
by comparing the committed run with itself. Reads the committed side with `git show`, so it needs
a git work tree.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import subprocess
from pathlib import Path

import yaml

from draftline.core.errors import DraftlineError

CONTRACT = "reproducibility.yaml"
MACHINE_KEYS = (  # the facts shown side by side when they differ (draftline/core/machine.py)
    ("cpu", "model"),
    ("cpu", "flags"),
    ("torch", "cpu_capability"),
    ("torch", "threads"),
    ("python",),
    ("versions", "torch"),
    ("versions", "transformers"),
    ("environment",),
)


class VerifyError(DraftlineError):
    """The committed side cannot be read (no git work tree, no such revision or file)."""


def git_show(root: Path, rev: str, path: str) -> str | None:
    """`path` as committed in `rev`, or None when that commit does not hold it."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "show", f"{rev}:{path}"],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        raise VerifyError(
            "verify-repro: git is not installed; it reads the committed run"
        ) from None
    return done.stdout if done.returncode == 0 else None


def lock_outs(text: str | None) -> dict[str, dict[str, str]]:
    """{stage: {out path: md5}} of a dvc.lock text."""
    stages = (yaml.safe_load(text) or {}).get("stages", {}) if text else {}
    return {
        name: {o["path"]: o.get("md5", "") for o in stage.get("outs", [])}
        for name, stage in stages.items()
    }


def pointer(data, path: str):
    """The value at a JSON pointer (`/a/b/0`); KeyError when it is not there."""
    for part in [p for p in path.split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        data = data[int(part)] if isinstance(data, list) else data[part]
    return data


def figure(root: Path, rev: str | None, ref: str):
    """The value of `file#/pointer` committed in `rev` (None: the workspace's), or None if absent."""
    file, _, path = ref.partition("#")
    text = git_show(root, rev, file) if rev else None
    if rev is None and (root / file).is_file():
        text = (root / file).read_text()
    if text is None:
        return None
    try:
        return pointer(json.loads(text), path)
    except (KeyError, IndexError, ValueError, TypeError):
        return None


def within(committed, yours, tol: dict) -> tuple[bool, float | None]:
    """Whether `yours` is within `tol` ({abs: x} or {rel: x}) of `committed`, and the difference."""
    if isinstance(committed, bool) or not isinstance(committed, int | float):
        return committed == yours, None
    if not isinstance(yours, int | float) or isinstance(yours, bool):
        return False, None
    diff = yours - committed
    limit = tol.get("abs", 0.0) + tol.get("rel", 0.0) * abs(committed)
    return abs(diff) <= limit + 1e-12, diff


def rerun_stages(root: Path, rev: str) -> dict[str, bool]:
    """{stage: whether the workspace reran it}: its run record in reports/machine/ differs from
    the one committed in `rev` (each run writes the time it ran), or `rev` has none."""
    out = {}
    for path in sorted((root / "reports" / "machine").glob("*.json")):
        committed = git_show(root, rev, str(path.relative_to(root)))
        out[path.stem] = committed is None or committed != path.read_text()
    return out


def stage_of_file(lock: dict[str, dict[str, str]], file: str, ran=()) -> str | None:
    """The stage whose outputs hold `file` (an output itself, or inside an output directory),
    one that left a run record (`ran`) first: a lock keeps the entries of stages since renamed
    (`evaluate` before `evaluate@eval`), and those never run again."""
    holders = [
        stage
        for stage, outs in lock.items()
        if any(file == p or file.startswith(p.rstrip("/") + "/") for p in outs)
    ]
    return next((s for s in holders if s in ran), holders[0] if holders else None)


def compare_outputs(contract: dict, committed: dict, yours: dict) -> list[dict]:
    """One row per stage of the contract's identical / may_differ lists found in either lock."""
    rows = []
    for kind in ("identical", "may_differ"):
        for entry in contract.get(kind, []):
            pattern, why = (entry, "") if isinstance(entry, str) else (entry["stage"], entry["why"])
            measured = isinstance(entry, dict) and bool(entry.get("measured"))
            for stage in sorted(n for n in {*committed, *yours} if fnmatch.fnmatch(n, pattern)):
                a, b = committed.get(stage), yours.get(stage)
                differ = sorted(
                    p for p in {*(a or {}), *(b or {})} if (a or {}).get(p) != (b or {}).get(p)
                )
                ok = not differ or kind == "may_differ"
                if a is None or b is None:
                    ok, differ = (
                        False,
                        [
                            "(stage not in the "
                            + ("committed" if a is None else "workspace")
                            + " lock)"
                        ],
                    )
                rows.append(
                    {
                        "stage": stage,
                        "kind": kind,
                        "differ": differ,
                        "ok": ok,
                        "why": why,
                        "measured": measured,
                    }
                )
    return rows


def compare_figures(root: Path, rev: str, contract: dict) -> list[dict]:
    rows = []
    for kind in ("within", "reported"):
        for ref, tol in (contract.get(kind) or {}).items():
            tol = tol or {}
            committed, yours = figure(root, rev, ref), figure(root, None, ref)
            ok, diff = within(committed, yours, tol)
            if committed is None or yours is None:
                ok = False
            rows.append(
                {
                    "figure": ref,
                    "kind": kind,
                    "committed": committed,
                    "yours": yours,
                    "diff": diff,
                    "tolerance": tol,
                    "ok": ok or kind == "reported",
                    "inside": ok,
                }
            )
    return rows


def paired_interval(diffs: list[float], alpha: float) -> tuple[float, float, float, float]:
    """(mean, sd, low, high) of paired differences: the two-sided 1 - 2 alpha Student t interval
    of their mean (one observation: the difference itself, no spread to estimate)."""
    from scipy import stats

    n = len(diffs)
    mean = sum(diffs) / n
    sd = (sum((d - mean) ** 2 for d in diffs) / (n - 1)) ** 0.5 if n > 1 else 0.0
    half = stats.t.ppf(1 - alpha, n - 1) * sd / n**0.5 if n > 1 and sd > 0 else 0.0
    return mean, sd, mean - half, mean + half


def compare_paired(root: Path, rev: str, contract: dict) -> list[dict]:
    """One row per `paired` figure: the prompts' paired differences (yours - committed), their
    mean and interval against +-margin. Outside: prompts on one side only (another eval set is
    not a rerun), or an interval reaching past the margin."""
    rows = []
    for ref, spec in (contract.get("paired") or {}).items():
        margin, alpha = spec["margin"], spec.get("alpha", 0.05)
        committed, yours = figure(root, rev, ref), figure(root, None, ref)
        row = {"figure": ref, "kind": "paired", "margin": margin, "alpha": alpha}
        if not isinstance(committed, dict) or not isinstance(yours, dict) or not committed:
            rows.append({**row, "margin": 0.0, "ok": False, "why": "missing on one side"})
            continue
        if margin == "committed_interval":  # what the committed run itself resolves
            mean, _, low, _ = paired_interval(list(committed.values()), alpha)
            margin = row["margin"] = round(mean - low, 4)
        if set(committed) != set(yours):
            only = sorted(set(committed) ^ set(yours))
            rows.append({**row, "ok": False, "why": f"other prompts: {', '.join(only[:3])}"})
            continue
        diffs = [yours[p] - committed[p] for p in sorted(committed)]
        mean, sd, low, high = paired_interval(diffs, alpha)
        ok = -margin - 1e-12 <= low and high <= margin + 1e-12
        rows.append(
            {
                **row,
                "prompts": len(diffs),
                "changed": sum(d != 0 for d in diffs),
                "mean": round(mean, 4),
                "sd": round(sd, 4),
                "low": round(low, 4),
                "high": round(high, 4),
                "ok": ok,
                "why": "" if ok else f"the interval [{low:+.3f}, {high:+.3f}] leaves +-{margin:g}",
            }
        )
    return rows


CONTRADICTS = {("yes", "no"), ("no", "yes")}


def compare_decisions(root: Path, rev: str, contract: dict) -> list[dict]:
    """One row per load of each `decisions` pointer ({load: {"decision": yes / no / undecided}}):
    a load decided yes in one run and no in the other is outside; undecided on either side is
    not a contradiction (it says the passes could not tell)."""
    rows = []
    for ref in contract.get("decisions") or []:
        committed, yours = figure(root, rev, ref) or {}, figure(root, None, ref) or {}
        for load in sorted({*committed, *yours}, key=lambda c: int(c)):
            a = (committed.get(load) or {}).get("decision")
            b = (yours.get(load) or {}).get("decision")
            ok = a is not None and b is not None and (a, b) not in CONTRADICTS
            rows.append({"figure": f"{ref}/{load}", "committed": a, "yours": b, "ok": ok})
    return rows


def machine_differences(root: Path, rev: str) -> dict[str, dict]:
    """{stage: {fact: [committed, yours]}} for the machine facts that differ (reports/machine/),
    with an empty dict for a stage whose facts are all the committed ones (the same machine)."""
    out = {}
    for path in sorted((root / "reports" / "machine").glob("*.json")):
        rel = str(path.relative_to(root))
        text = git_show(root, rev, rel)
        if text is None:
            continue
        theirs, ours = json.loads(text), json.loads(path.read_text())
        diff = {}
        for keys in MACHINE_KEYS:
            a, b = theirs, ours
            for k in keys:
                a = a.get(k) if isinstance(a, dict) else None
                b = b.get(k) if isinstance(b, dict) else None
            if a != b:
                diff[".".join(keys)] = [a, b]
        out[path.stem] = diff
    return out


def tolerance_text(tol: dict) -> str:
    return " + ".join(f"{k} {v:g}" for k, v in tol.items()) or "exact"


def render(report: dict) -> str:
    lines = [f"verify-repro: the workspace against {report['rev']} ({CONTRACT})", ""]
    for row in report["outputs"]:
        state = (
            "same" if not row["differ"] else ("DIFFERS" if not row["ok"] else "differs (allowed)")
        )
        if row["differ"] and row.get("same_machine") and not row["ok"]:
            state = "DIFFERS on the committed machine"
        if not row.get("rerun", True):
            state = "not rerun (not compared)"
        lines.append(
            f"  {row['kind']:<10} {row['stage']:<28} {state}"
            + (f": {', '.join(row['differ'])}" if row["differ"] else "")
        )
    lines.append("")
    for row in report["figures"]:
        mark = (
            "ok"
            if row["inside"]
            else ("OUTSIDE" if row["kind"] == "within" else "outside (reported)")
        )
        if not row.get("rerun", True):
            mark = "not rerun (not compared)"
        diff = f"{row['diff']:+.4g}" if row["diff"] is not None else "-"
        lines.append(
            f"  {row['figure']:<52} {row['committed']!s:>9} -> {row['yours']!s:<9} {diff:>9}  "
            f"tol {tolerance_text(row['tolerance']):<12} {mark}"
        )
    for row in report.get("paired", []):
        mark = "ok" if row["ok"] else "OUTSIDE"
        if not row.get("rerun", True):
            mark = "not rerun (not compared)"
        if "mean" in row:
            text = (
                f"{row['prompts']} prompts, {row['changed']} changed, mean {row['mean']:+.4f} "
                f"[{row['low']:+.4f}, {row['high']:+.4f}]"
            )
        else:
            text = row["why"]
        lines.append(f"  {row['figure']:<52} {text}  margin +-{row['margin']:g}  {mark}")
    for row in report.get("decisions", []):
        mark = "ok" if row["ok"] else "CONTRADICTS"
        if not row.get("rerun", True):
            mark = "not rerun (not compared)"
        lines.append(
            f"  {row['figure']:<52} {row['committed']!s:>9} -> {row['yours']!s:<9} {'':>9}  "
            f"{'decision':<16} {mark}"
        )
    if report["machine"]:
        lines += ["", "  machine facts that differ (committed -> yours):"]
        for stage, facts in report["machine"].items():
            for fact, (a, b) in facts.items():
                lines.append(f"    {stage}: {fact}: {a} -> {b}")
    failed = report["failed"]
    if report.get("not_rerun"):
        lines += ["", f"  not rerun, not compared: {', '.join(report['not_rerun'])}"]
    lines += [
        "",
        f"verify-repro: {len(failed)} outside the contract"
        + (f": {', '.join(failed)}" if failed else ": every output and figure within it"),
    ]
    return "\n".join(lines)


def verify(root: Path, rev: str = "HEAD", contract_path: Path | None = None) -> dict:
    """The comparison as a report dict (render() prints it; `failed` names what is outside).
    VerifyError when nothing was rerun (see the module docstring)."""
    if git_show(root, rev, "dvc.lock") is None:
        raise VerifyError(
            f"verify-repro: {root} has no dvc.lock committed in {rev!r} (a git work tree with a committed run is needed)"
        )
    contract = yaml.safe_load((contract_path or root / CONTRACT).read_text())
    committed = lock_outs(git_show(root, rev, "dvc.lock"))
    yours = lock_outs((root / "dvc.lock").read_text() if (root / "dvc.lock").is_file() else None)
    rerun = rerun_stages(root, rev)
    if not any(rerun.values()):
        raise VerifyError(
            "verify-repro: nothing rerun to compare: every run record in reports/machine/ is the "
            f"one committed in {rev!r} (an untouched checkout, or a `dvc repro` that found "
            "nothing stale); run `make repro` (`dvc repro -f` to redo a run that is up to date) "
            "first"
        )
    outputs = compare_outputs(contract, committed, yours)
    figures = compare_figures(root, rev, contract)
    paired = compare_paired(root, rev, contract)
    decisions = compare_decisions(root, rev, contract)
    machine = machine_differences(root, rev)
    for row in outputs:  # a stage not rerun holds the committed outputs: nothing to compare
        missing = row["stage"] not in committed or row["stage"] not in yours
        row["rerun"] = rerun.get(row["stage"], False) or missing
        # the committed machine facts: what may differ between machines must not differ here
        row["same_machine"] = machine.get(row["stage"]) == {}
        if row["kind"] == "may_differ" and row["same_machine"] and not row["measured"]:
            row["ok"] = not row["differ"]
    for row in [*figures, *paired, *decisions]:
        stage = stage_of_file(yours, row["figure"].partition("#")[0], rerun)
        row["rerun"] = rerun.get(stage, False) if stage else True
    compared = [r for r in [*outputs, *figures, *paired, *decisions] if r["rerun"]]
    failed = [r["stage"] for r in outputs if r["rerun"] and not r["ok"]] + [
        r["figure"] for r in [*figures, *paired, *decisions] if r["rerun"] and not r["ok"]
    ]
    return {
        "rev": rev,
        "outputs": outputs,
        "figures": figures,
        "paired": paired,
        "decisions": decisions,
        "not_rerun": sorted(stage for stage, ran in rerun.items() if not ran),
        "compared": len(compared),
        "machine": {stage: facts for stage, facts in machine.items() if facts},
        "failed": failed,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="draftline verify-repro", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--root", default=".", help="the repository (a git work tree with a run)")
    ap.add_argument("--rev", default="HEAD", help="the committed run to compare with")
    ap.add_argument("--contract", help=f"tolerances, instead of <root>/{CONTRACT}")
    ap.add_argument("--json", help="also write the comparison here")
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    report = verify(root, args.rev, Path(args.contract) if args.contract else None)
    print(render(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1, default=str) + "\n")
    if report["failed"]:
        raise VerifyError(f"verify-repro: outside the contract: {', '.join(report['failed'])}")
