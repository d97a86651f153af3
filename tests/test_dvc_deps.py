"""dvc.yaml makes each stage depend on exactly the code it runs, and on what that code does.

The `code` stage depends on all of draftline/ and stages/ and writes reports/code/<stage>.json,
the fingerprint of each stage's import closure without prose (draftline/core/code.py). Every other
stage depends on its own fingerprint file and lists no source file. What is checked here: the
walk (imports inside functions followed, imports for type checkers left out, a missing module an
error), the wiring in dvc.yaml, and what an edit does to the fingerprints: prose changes none, a
code change exactly those of the stages that import the edited module. The end-to-end test shows
the same through `dvc status` on a finished run.
"""

import re
import shutil
from pathlib import Path

import pytest
import yaml

from draftline.core.code import (
    PACKAGES,
    MissingModule,
    closure,
    imported_modules,
    imports,
    module_file,
    required_modules,
    stage_fingerprint,
    stage_names,
    without_prose,
)
from draftline.core.environment import PIPELINE_FILES, VLLM_FILES

ROOT = Path(__file__).resolve().parents[1]
STAGE_CMD = re.compile(r"python -m stages\.(\w+)")


def stages() -> dict[str, dict]:
    """Each stage of dvc.yaml; a foreach stage by its `do` template (same code for every item)."""
    with open(ROOT / "dvc.yaml") as f:
        spec = yaml.safe_load(f)["stages"]
    return {name: stage.get("do", stage) for name, stage in spec.items()}


def dep_paths(stage: dict) -> set[str]:
    return {dep if isinstance(dep, str) else next(iter(dep)) for dep in stage.get("deps", [])}


def out_paths(stage: dict) -> set[str]:
    return {out if isinstance(out, str) else next(iter(out)) for out in stage.get("outs", [])}


@pytest.mark.parametrize("name", sorted(set(stages()) - {"code"}))
def test_stage_depends_on_its_code_fingerprint_and_no_source_file(name):
    stage = stages()[name]
    match = STAGE_CMD.search(stage["cmd"])
    assert match, f"dvc.yaml stage {name}: cmd does not run `python -m stages.<name>`"
    deps = dep_paths(stage)
    assert f"reports/code/{match.group(1)}.json" in deps, (
        f"dvc.yaml stage {name}: does not depend on reports/code/{match.group(1)}.json, so an "
        f"edit to the code it runs would leave its outputs stale"
    )
    sources = sorted(d for d in deps if d.split("/")[0] in PACKAGES)
    assert not sources, (
        f"dvc.yaml stage {name}: lists {sources}; its code fingerprint covers them (a comment "
        f"edit there would rerun the stage)"
    )


def test_the_code_stage_covers_all_code_and_writes_every_stage_fingerprint():
    code = stages()["code"]
    assert STAGE_CMD.search(code["cmd"]).group(1) == "code"
    assert dep_paths(code) == {*PACKAGES, *PIPELINE_FILES, *VLLM_FILES}
    assert out_paths(code) == {f"reports/code/{n}.json" for n in stage_names(ROOT)}
    run = {STAGE_CMD.search(s["cmd"]).group(1) for s in stages().values()}
    assert run == {*stage_names(ROOT), "code"}, "a stage module no dvc.yaml stage runs"


# what a train-only experiment keeps: the regenerated answers, the rows, the vocabulary, the hidden
# states, and every stage before them
BEFORE_TRAIN = ("target", "prepare", "mix", "regenerate", "tokenize", "vocab", "hidden_states")


def param_keys(stage: dict) -> list[str]:
    """The params.yaml keys a dvc.yaml stage lists (a `{file: [keys]}` entry: its keys)."""
    keys = []
    for entry in stage.get("params", []):
        keys += [entry] if isinstance(entry, str) else [k for ks in entry.values() for k in ks]
    return keys


def test_a_train_only_experiment_keeps_the_answers_and_the_hidden_states():
    """`dvc exp run -S train.<key>=...` (train.loss, a position weighting, the schedule...) stales
    train and what follows it, none of the stages before: none lists a train param, and
    check_params, which every stage depends on and which reruns on any params edit, writes the same
    bytes for every valid params.yaml. (hidden_states reads train.pack_len for a message alone,
    which is why dvc.yaml does not list it.) The end-to-end run shows it through `dvc status`:
    tests/test_pipeline_e2e.py test_staleness_table (train.epochs) and
    test_train_param_change_stales_only_train_and_after (train.lr)."""
    from stages.check_params import STAMP

    spec = stages()
    for name in BEFORE_TRAIN:
        keys = param_keys(spec[name])
        assert not [k for k in keys if k == "train" or k.startswith("train.")], (name, keys)
        assert "reports/params_check.txt" in dep_paths(spec[name])
    assert "train" in param_keys(spec["train"])
    assert out_paths(spec["check_params"]) == {"reports/params_check.txt"}
    assert "{" not in STAMP  # a constant: no params value in what the stages depend on
    # what train reads of them: their outputs, so train reruns with them and not the reverse
    assert {"datasets/tokenized", "datasets/hidden_states", "models/vocab"} <= dep_paths(
        spec["train"]
    )


def test_closure_follows_imports_inside_functions():
    found = imported_modules(ROOT, ROOT / "stages" / "benchmark.py")
    assert "draftline.benchmark.run" in found  # imported inside main()
    assert "draftline/tokens/config.py" in closure(ROOT, "stages.vocab")
    assert "draftline/targets/model.py" in closure(ROOT, "stages.benchmark")
    assert "stages/vocab.py" in closure(ROOT, "stages.vocab")


def test_an_import_for_type_checkers_only_runs_nothing_but_must_exist():
    text = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from draftline.benchmark.config import BenchmarkConfig\n"
        "import draftline.core.io\n"
    )
    path = ROOT / "stages" / "probe.py"
    assert "draftline.benchmark.config" in required_modules(ROOT, path, text)
    runtime = {base for base, _ in imports(ROOT, path, runtime=True, text=text)}
    assert "draftline.core.io" in runtime and "draftline.benchmark.config" not in runtime


def import_graph() -> dict[Path, set[Path]]:
    """Each project module and the project modules it imports, at module top, inside a function
    or for type checkers only (a package's __init__ left out: importing a submodule runs it)."""
    graph = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            names = {
                n
                for base, names in imports(ROOT, path)
                for n in [base, *(f"{base}.{x}" for x in names)]
            }
            deps = {module_file(ROOT, name) for name in names} - {None, path}
            graph[path] = {d for d in deps if d.name != "__init__.py"}
    return graph


def cycles(graph: dict) -> list[list]:
    """Every cycle a depth-first walk of graph meets, each as the chain of its nodes."""
    done, found = set(), []

    def visit(node, trail):
        if node in trail:
            found.append(trail[trail.index(node) :])
            return
        if node in done:
            return
        for dep in sorted(graph.get(node, ())):
            visit(dep, [*trail, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return found


def package_of(path: Path) -> str:
    """draftline/<package> for a module inside one, else the module itself (draftline/params.py,
    draftline/cli.py, stages/<stage>.py)."""
    parts = path.relative_to(ROOT).parts
    return "/".join(parts[:2]) if len(parts) > 2 else "/".join(parts)


def test_no_import_cycle():
    """No project module imports itself back through any chain of imports, at module top, inside
    a function or for type checkers only; nor does any package, through the modules of others:
    each package builds on those below it."""
    graph = import_graph()
    by_module = [" -> ".join(str(p.relative_to(ROOT)) for p in c) for c in cycles(graph)]
    assert not by_module, "import cycles:\n  " + "\n  ".join(by_module)
    packages: dict[str, set[str]] = {}
    for path, deps in graph.items():
        packages.setdefault(package_of(path), set()).update(package_of(d) for d in deps)
    for package, deps in packages.items():
        deps.discard(package)
    by_package = [" -> ".join(c) for c in cycles(packages)]
    assert not by_package, "package import cycles:\n  " + "\n  ".join(by_package)


def test_every_project_import_resolves():
    """An import of a project module that does not exist fails here, in every file of draftline/
    and stages/ (a module only a GPU host imports included)."""
    broken = [
        f"{path.relative_to(ROOT)}: {name}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in sorted(required_modules(ROOT, path))
        if name.split(".")[0] in PACKAGES and module_file(ROOT, name) is None
    ]
    assert not broken, f"imports of project modules that do not exist: {broken}"


def copy_code(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    for name in (*PIPELINE_FILES, *VLLM_FILES):  # the pins each fingerprint holds
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize(
    "line, name",
    [
        ("from draftline.no_such_module import x  # noqa", "draftline.no_such_module"),
        # a module loaded by name (python -m, a connector) must exist as much as an import
        ('SERVER = "draftline.engines.no_such_server"', "draftline.engines.no_such_server"),
    ],
)
def test_a_missing_project_module_stops_the_walk_with_its_name(tmp_path, line, name):
    root = copy_code(tmp_path)
    vocab = root / "stages" / "vocab.py"
    vocab.write_text(vocab.read_text() + f"\n{line}\n")
    with pytest.raises(MissingModule, match=f"stages/vocab.py imports {name}"):
        closure(root, "stages.vocab")
    with pytest.raises(MissingModule, match="stages.nothing is not a module"):
        closure(root, "stages.nothing")


def test_without_prose_drops_docstrings_and_comments_only():
    code = 'def f(x):\n    """Doubles."""\n    return 2 * x  # twice\n'
    assert without_prose(code) == without_prose("def f(x):\n\n    return 2*x\n")
    assert without_prose(code) != without_prose("def f(x):\n    return 3 * x\n")
    # a string that is not a docstring is code (it is a value the program uses)
    assert without_prose('X = "a"\n') != without_prose('X = "b"\n')
    assert without_prose('def f():\n    """Only a docstring."""\n') == without_prose(
        "def f():\n    pass\n"
    )


def fingerprints(root: Path) -> dict[str, dict]:
    return {name: stage_fingerprint(root, name) for name in stage_names(root)}


def test_prose_edits_change_no_fingerprint_and_a_code_edit_exactly_its_importers(tmp_path):
    root = copy_code(tmp_path)
    before = fingerprints(root)
    run_py, chat = root / "draftline/train/run.py", root / "draftline/tokens/chat.py"
    text = run_py.read_text()
    assert text.startswith('"""')
    run_py.write_text('"""A sentence more in the docstring. ' + text[3:])
    chat.write_text("# a new comment line\n" + chat.read_text().replace("\n\n", "\n\n\n", 1))
    assert fingerprints(root) == before

    chat.write_text(chat.read_text() + "\nEDITED = True\n")
    after = fingerprints(root)
    changed = {name for name in before if after[name] != before[name]}
    importers = {n for n in before if "draftline/tokens/chat.py" in before[n]["modules"]}
    assert changed == importers
    assert "tokenize" in changed and "vocab" not in changed and "mix" not in changed


def test_an_if_not_type_checking_block_runs():
    text = (
        "from typing import TYPE_CHECKING\n"
        "if not TYPE_CHECKING:\n    import draftline.core.io\n"
        "if TYPE_CHECKING:\n    import draftline.core.card\n"
    )
    runtime = {base for base, _ in imports(ROOT, ROOT / "stages" / "probe.py", True, text)}
    assert "draftline.core.io" in runtime and "draftline.core.card" not in runtime


def test_modules_loaded_by_name_are_in_the_closure_of_what_launches_them():
    """vLLM loads the CPU connector by its name, the hf backend starts the batch server with
    `python -m`: an edit to either reruns the stages that launch them."""
    for stage in ("hidden_states", "regenerate", "probe"):
        assert "draftline/hidden_states/vllm_cpu_connector.py" in closure(ROOT, f"stages.{stage}")
    assert "draftline/engines/batch_server.py" in closure(ROOT, "stages.regenerate")
    run_py = (ROOT / "draftline/regenerate/run.py").read_text()
    assert "import batch_server" not in run_py  # found by name, not by an unused import
    # only where it is launched: an edit to the batch server reruns regenerate and no other stage
    for stage in ("hidden_states", "train", "probe", "evaluate", "benchmark"):
        assert "draftline/engines/batch_server.py" not in closure(ROOT, f"stages.{stage}"), stage


# Python 3.11 to Python 3.13 tokenize this alike once f-string parts are joined back
SAMPLE = '''"""Module prose."""
import os  # a comment


def f(x, w=3):
    """Doubles."""  # and a comment
    return f"{x!r:>{w}} {f'{os.sep}'}" "b"

class C:
    \'\'\'Only a docstring.\'\'\'
'''
SAMPLE_FORM = [
    "import", "os", "<newline>",
    "def", "f", "(", "x", ",", "w", "=", "3", ")", ":", "<newline>", "<indent>",
    "return", "f\"{x!r:>{w}} {f'{os.sep}'}\"", '"b"', "<newline>", "<dedent>",
    "class", "C", ":", "<newline>", "<indent>", "pass", "<newline>", "<dedent>",
]  # fmt: skip


def test_without_prose_is_the_same_text_on_every_python():
    """The fingerprint's text is the language's own tokens, not a dump of the syntax tree
    (`ast.dump` differs between Python 3.11, Python 3.12 and Python 3.13): stated token by token, so a Python that
    gave another text would fail here."""
    assert without_prose(SAMPLE).split("\n") == SAMPLE_FORM


def test_a_pin_reruns_the_stages_its_environment_shapes(tmp_path):
    root = copy_code(tmp_path)
    before = fingerprints(root)
    constraints = root / "scripts/vllm_cpu_constraints.txt"
    text = constraints.read_text()
    constraints.write_text(text.replace("transformers==5.19.0", "transformers==5.19.1"))
    after = fingerprints(root)
    changed = {name for name in before if after[name] != before[name]}
    launchers = {n for n in before if "draftline/engines/commands.py" in before[n]["modules"]}
    assert changed == launchers and "regenerate" in changed and "vocab" not in changed
    makefile = root / "Makefile"
    makefile.write_text(makefile.read_text().replace("speculators==0.9.0", "speculators==0.9.1"))
    pinned = fingerprints(root)
    assert all(pinned[n] != after[n] for n in before)
    # a pin outside the set-up rules (a benchmark's baseline) and a comment shape nothing
    makefile.write_text(
        makefile.read_text() + "\n# pip install x==1.0\nlint:\n\tpip install y==2\n"
    )
    assert fingerprints(root) == pinned
