"""params.yaml validation: unknown keys and bad values fail with the dotted key named."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from draftline.core.config import ParamsError
from draftline.params import load_params, parse_params

ROOT = Path(__file__).resolve().parents[2]


def default_raw():
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_default_params_validate():
    params = load_params(ROOT / "params.yaml")
    assert params.samples > 0 and set(params.mix.weights) == set(params.datasets) - set(
        params.evaluate.sets
    )


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
        (lambda r: r["train"].update(method="medusa"), "train.method"),
        (lambda r: r["train"].update(method="dflash", architecture="eagle3"), "architecture"),
        (lambda r: r["train"].update(method="dflash", train_embeddings=True), "train_embeddings"),
        (lambda r: r["train"].update(method="peagle", init="models/draft"), "init"),
        (lambda r: r["train"].update(method="peagle", peagle={"depths": 1}), "train.peagle.depths"),
        (lambda r: r["train"].update(method="dflash", dflash={"block_size": 1}), "block_size"),
        (
            lambda r: (r["train"].update(method="peagle"), r["evaluate"].update(engine="hf")),
            "evaluate.engine: hf decodes EAGLE-3 drafts only",
        ),
        (
            lambda r: (r["train"].update(method="dflash"), r["benchmark"].update(engine="sglang")),
            "benchmark.engine: sglang serves EAGLE-3 drafts only",
        ),
    ],
)
def test_bad_params_name_the_key(mutate, key):
    raw = default_raw()
    mutate(raw)
    with pytest.raises(ParamsError) as err:
        parse_params(raw)
    assert key in str(err.value)


def test_stage_refuses_bad_params_before_work(tmp_path):
    """A stage validates the sections it reads and names each bad key; check_params, before any
    stage under DVC, validates every section."""
    raw = default_raw()
    raw["samples"] = -1
    raw["train"]["bogus"] = 1
    raw["train"]["lr"] = "fast"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))

    def stage(*argv):
        return subprocess.run(
            [sys.executable, "-m", *argv],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        )

    train = stage("stages.train", "a", "b", "c", "d", "e", "f")
    assert train.returncode != 0 and "Traceback" not in train.stderr
    assert "train.bogus" in train.stderr and "train.lr" in train.stderr
    assert "samples" not in train.stderr  # not a key the train stage reads
    check = stage("stages.check_params", "sources.yaml", "draft", "stamp.txt")
    assert check.returncode != 0 and "Traceback" not in check.stderr
    assert all(key in check.stderr for key in ("samples", "train.bogus", "train.lr"))


def test_tie_tolerance_follows_the_dtype_unless_given():
    raw = default_raw()
    assert parse_params(raw).evaluate.resolved_tie_tolerance() == 0.0  # float32: token for token
    raw["evaluate"]["dtype"] = "bfloat16"
    assert parse_params(raw).evaluate.resolved_tie_tolerance() == 0.5
    raw["evaluate"]["tie_tolerance"] = 0.2
    assert parse_params(raw).evaluate.resolved_tie_tolerance() == 0.2


# ---- issue #16: refused at validation, before any stage works --------------------------------


def test_aux_layer_ids_out_of_range_fail_in_seconds_naming_the_key(tmp_path):
    """Issue #16.4: `target.aux_layer_ids: [1, 99]` was found only after the tiny target trained.
    The layer count is known from params (tiny), a local config.json or the hub cache."""
    raw = default_raw()
    raw["target"]["aux_layer_ids"] = [1, 99, 3]
    with pytest.raises(ParamsError, match=r"target: .*target\.aux_layer_ids: .*within \[0, 6\]"):
        parse_params(raw)
    raw["target"]["aux_layer_ids"] = None  # the EAGLE-3 rule gives [2, 3, 3] for 6 layers
    with pytest.raises(ParamsError, match="set target.aux_layer_ids explicitly"):
        parse_params(raw)
    local = tmp_path / "model"
    local.mkdir()
    (local / "config.json").write_text(
        '{"architectures": ["X"], "text_config": {"num_hidden_layers": 32}}'
    )
    raw["target"].update(model=str(local), aux_layer_ids=[2, 16, 33])
    with pytest.raises(ParamsError, match=r"within \[0, 32\]"):
        parse_params(raw)
    raw["target"]["aux_layer_ids"] = [2, 16, 29]
    assert parse_params(raw).target.aux_layer_ids == [2, 16, 29]

    raw = default_raw()
    raw["target"]["aux_layer_ids"] = [1, 99]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    proc = subprocess.run(
        [sys.executable, "-m", "stages.target", "models/target"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode != 0
    assert "target.aux_layer_ids" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "models").exists()  # nothing trained, nothing written


@pytest.mark.parametrize("name", ["../../escape", "a/b", "x.y", "", "-dash", "a b"])
def test_dataset_names_are_plain(name, tmp_path):
    """Issue #16.10: a name becomes datasets/prepared/<name>.jsonl, prepare@<name> and datasets.<name>."""
    raw = default_raw()
    raw["datasets"][name] = raw["datasets"].pop("sharegpt_sample")
    raw["mix"]["weights"][name] = raw["mix"]["weights"].pop("sharegpt_sample")
    with pytest.raises(ParamsError, match="datasets: .*not a plain dataset name"):
        parse_params(raw)


def test_prepare_called_directly_stays_in_the_workspace(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.jsonl").write_text('{"prompt": "hi"}\n')
    (work / "params.yaml").write_text(
        "samples: 1\ndatasets:\n  a: {path: a.jsonl}\nmix: {weights: {a: 1}}\n"
    )
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    prepare = [sys.executable, "-P", str(ROOT / "stages/prepare.py")]
    proc = subprocess.run(
        [*prepare, "../a", "../a.jsonl", "r.json"],
        cwd=work,
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode != 0 and "not a plain dataset name" in proc.stderr
    proc = subprocess.run(
        [*prepare, "a", "../outside.jsonl", "r.json"],
        cwd=work,
        capture_output=True,
        text=True,
        env=env,
    )
    assert (
        proc.returncode != 0
        and f"outside the workspace {work.resolve()}: {tmp_path.resolve() / 'outside.jsonl'}"
        in proc.stderr
    )
    assert not (tmp_path / "outside.jsonl").exists()
    proc = subprocess.run(
        [*prepare, "a", "out/a.jsonl", "r.json"], cwd=work, capture_output=True, text=True, env=env
    )
    assert (
        proc.returncode == 0 and str((work / "out/a.jsonl").resolve()) in proc.stdout
    )  # reported resolved


@pytest.mark.parametrize(
    "value, key",
    [
        (
            {
                "backend": "external",
                "external_engine": "vllm",
                "endpoints": ["http://alice:s3cret@gpu-1:8000"],
            },
            "regenerate.endpoints.0",
        ),
        (
            {
                "backend": "external",
                "external_engine": "vllm",
                "endpoints": ["https://s3cret@gpu-1:8000"],
            },
            "regenerate.endpoints.0",
        ),
        (
            {
                "backend": "external",
                "external_engine": "vllm",
                "endpoints": ["http://gpu-1:8000/?api_key=s3cret"],
            },
            "regenerate.endpoints.0",
        ),
    ],
)
def test_credentials_in_urls_are_refused_and_never_echoed(value, key):
    """Issue #16.11: params go into dvc.lock, meta.json and reports (and to git and DVC remotes)."""
    raw = default_raw()
    raw["regenerate"].update(value)
    with pytest.raises(ParamsError) as err:
        parse_params(raw)
    assert (
        key in str(err.value) and "api_key_env" in str(err.value) and "s3cret" not in str(err.value)
    )
    raw["regenerate"]["endpoints"] = ["http://gpu-1:8000", "https://gpu-2.example.com/serve"]
    assert parse_params(raw).regenerate.endpoints == raw["regenerate"]["endpoints"]


def test_params_never_reach_a_shell_and_the_trust_boundary_is_documented(tmp_path):
    """Issue #16.12: launcher, engines.vllm.python and extra_args choose what runs: params are
    code. They go to the process as argv, never through a shell, and docs/reliability.md says so."""
    import re

    code = "\n".join(
        p.read_text() for d in ("draftline", "stages") for p in (ROOT / d).glob("*.py")
    )
    assert not re.search(r"shell\s*=\s*True|os\.system\(|os\.popen\(|subprocess\.getoutput", code)
    doc = (ROOT / "docs" / "reliability.md").read_text()
    section = doc[doc.index("## Params are code") :]
    section = section[: section.index("\n#", 1) if "\n#" in section[1:] else len(section)]
    for key in ("benchmark.vllm.launcher", "engines.vllm.python", "extra_args", "shell"):
        assert key in section, key

    # shell metacharacters in extra_args are one literal argument each
    from draftline.engines.servers import ManagedServer, server_url

    marker = tmp_path / "pwned"
    (tmp_path / "health").write_text("ok")
    serve = "import runpy, sys; sys.argv = ['http.server', *sys.argv[1:6]]; runpy.run_module('http.server', run_name='__main__')"
    with ManagedServer(
        lambda port: [
            sys.executable,
            "-c",
            serve,
            str(port),
            "--bind",
            "127.0.0.1",
            "--directory",
            str(tmp_path),
            f"; touch {marker}",
            f"$(touch {marker})",
            f"`touch {marker}`",
        ],
        None,
        server_url("127.0.0.1", None),
        tmp_path / "s.log",
        30,
    ):
        pass
    assert not marker.exists()
