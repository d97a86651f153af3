"""params.yaml validation: unknown keys and bad values fail with the dotted key named."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from draftline.config import ParamsError, load_params, parse_params

ROOT = Path(__file__).resolve().parents[1]


def default_raw():
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_default_params_validate():
    params = load_params(ROOT / "params.yaml")
    assert params.samples > 0 and set(params.mix.weights) == set(params.datasets)


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda r: r["train"].__setitem__("epocs", 3), "train.epocs"),
        (lambda r: r.__setitem__("samples", -5), "samples"),
        (lambda r: r["target"]["tiny"].__setitem__("heads", 0), "target.tiny.heads"),
        (lambda r: r["regenerate"].__setitem__("backend", "ollama"), "regenerate.backend"),
        (lambda r: r.__setitem__("extra_section", {}), "extra_section"),
        (lambda r: r["mix"]["weights"].pop("sharegpt_sample"), "mix.weights"),
        (lambda r: r["evaluate"].__setitem__("dtype", "int8"), "evaluate.dtype"),
        (lambda r: r["train"].__setitem__("architecture", "medusa"), "train.architecture"),
        (lambda r: r["evaluate"].update(device="cpu", device_map="auto"), "evaluate"),
        (lambda r: r["benchmark"].update(device="cpu", device_map="auto"), "benchmark"),
    ],
)
def test_bad_params_name_the_key(mutate, key):
    raw = default_raw()
    mutate(raw)
    with pytest.raises(ParamsError) as err:
        parse_params(raw)
    assert key in str(err.value)


def test_stage_refuses_bad_params_before_work(tmp_path):
    raw = default_raw()
    raw["samples"] = -1
    raw["train"]["bogus"] = 1
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    proc = subprocess.run([sys.executable, "-m", "stages.train", "a", "b", "c", "d", "e", "f"], cwd=tmp_path,
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0
    assert "samples" in proc.stderr and "train.bogus" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_tie_tolerance_follows_the_dtype_unless_given():
    raw = default_raw()
    assert parse_params(raw).evaluate.resolved_tie_tolerance() == 0.0  # float32: token for token
    raw["evaluate"]["dtype"] = "bfloat16"
    assert parse_params(raw).evaluate.resolved_tie_tolerance() == 0.5
    raw["evaluate"]["tie_tolerance"] = 0.2
    assert parse_params(raw).evaluate.resolved_tie_tolerance() == 0.2
