"""The probe stage: train.init checked against the card, and one row extracted through the vLLM
path, before regeneration starts; a refusal names what to change and leaves the stamp regenerate
depends on untouched. vLLM itself needs a GPU: the stand-in of test_hidden.py plays it."""

import contextlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from draftline.draft import model as draft_model
from draftline.probe.checks import STAMP
from draftline.train.config import TrainConfig
from stages.probe import main
from tests.hidden_states.test_hidden import fake_vllm_python, free_port

ROOT = Path(__file__).resolve().parents[2]
BASE = {
    "samples": 10,
    "datasets": {"d": {"path": "d.jsonl", "format": "openai"}},
    "mix": {"weights": {"d": 1.0}},
}


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, random_target, vocab_dir):
    """A speculators-format drafter made for the random target (1 layer, the card's aux ids, a
    draft vocabulary of half the target's)."""
    torch.manual_seed(2)
    path = tmp_path_factory.mktemp("drafter") / "drafter"
    draft = draft_model.build_draft(random_target, vocab_dir, TrainConfig())
    draft_model.save_draft(draft, path)
    return path


def run_probe(root: Path, card, **sections) -> dict:
    """The stage's main() in `root` with params BASE + sections; returns reports/probe.json."""
    params = {**BASE, "vocab": {"draft_vocab_size": card.vocab_size // 2}, **sections}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    card.write(root / "card.json")
    with contextlib.chdir(root):
        main("card.json", "reports/probe.json", "reports/probe_passed.txt")
    return json.loads((root / "reports" / "probe.json").read_text())


def edited(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    edit(config)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_a_compatible_init_passes(tmp_path, random_target, drafter):
    report = run_probe(tmp_path, random_target, train={"init": str(drafter)})
    init = report["init"]
    assert (init["hidden_size"], init["target_vocab_size"]) == (
        random_target.hidden_size,
        random_target.vocab_size,
    )
    assert init["aux_layer_ids"] == random_target.aux_ids and init["remaps"] == []
    assert init["warnings"]  # its own draft vocabulary: the vocab stage must pick the same tokens
    assert report["extraction"]["probed"] is False and report["error"] is None
    assert (tmp_path / "reports" / "probe_passed.txt").read_text() == STAMP


@pytest.mark.parametrize(
    "edit, train, vocab, message",
    [
        (
            lambda c: c["transformer_layer_config"].__setitem__("hidden_size", 96),
            {},
            None,
            "hidden size 96 differs from the target's 64",
        ),
        (
            lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [0, 2, 4]),
            {},
            None,
            r"aux layer ids \[0, 2, 4\] differ .* train.init_remap_aux_layers: true",
        ),
        (
            lambda c: c["transformer_layer_config"].__setitem__("vocab_size", 4000),
            {},
            None,
            "target vocabulary of 4000 tokens differs",
        ),
        (None, {}, 100, r"draft vocabulary has \d+ tokens, vocab.draft_vocab_size is 100"),
        (None, {"num_layers": 2}, None, "set train.num_layers to match"),
        (None, {"architecture": "eagle3"}, None, "set train.architecture to match"),
    ],
    ids=["hidden_size", "aux_ids", "target_vocab", "draft_vocab", "num_layers", "architecture"],
)
def test_an_init_that_does_not_fit_stops_before_regeneration(
    tmp_path, random_target, drafter, edit, train, vocab, message
):
    """Each of these used to pass check_params and target and fail only at the train stage."""
    init = edited(drafter, tmp_path / "init", edit) if edit else drafter
    (tmp_path / "run").mkdir()
    sections = {"train": {"init": str(init), **train}}
    if vocab:
        sections["vocab"] = {"draft_vocab_size": vocab}
    with pytest.raises(SystemExit, match=message):
        run_probe(tmp_path / "run", random_target, **sections)
    assert not (tmp_path / "run" / "reports" / "probe_passed.txt").exists()
    assert json.loads((tmp_path / "run" / "reports" / "probe.json").read_text())["error"]


@pytest.mark.parametrize("fits", [True, False])
def test_a_hub_init_is_checked_on_its_config_before_its_weights_are_fetched(
    tmp_path, random_target, drafter, monkeypatch, fits
):
    """train.init as a hub id: its config.json alone first; the weights (d2t) are fetched only
    for a drafter whose config fits (the hub is played by local directories)."""
    import huggingface_hub
    import speculators.convert.utils

    config_only = tmp_path / "config_only"
    config_only.mkdir()
    shutil.copy(drafter / "config.json", config_only)
    if not fits:
        config = json.loads((config_only / "config.json").read_text())
        config["transformer_layer_config"]["hidden_size"] = 96
        (config_only / "config.json").write_text(json.dumps(config))
    fetched = []

    def hub_download(repo_id, filename, **_):
        assert (repo_id, filename) == ("org/drafter", "config.json")
        return str(config_only / filename)

    def snapshot(repo_id, cache_dir=None):
        fetched.append(repo_id)
        return drafter

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hub_download)
    monkeypatch.setattr(speculators.convert.utils, "ensure_checkpoint_is_local", snapshot)
    (tmp_path / "run").mkdir()
    if fits:
        report = run_probe(tmp_path / "run", random_target, train={"init": "org/drafter"})
        assert report["init"]["path"] == str(drafter) and fetched == ["org/drafter"]
    else:
        with pytest.raises(SystemExit, match="hidden size 96"):
            run_probe(tmp_path / "run", random_target, train={"init": "org/drafter"})
        assert fetched == []


def engines_of(python) -> dict:
    """engines.vllm.python: the interpreter every vLLM launch runs (here a stand-in's)."""
    return {"vllm": {"python": str(python)}}


def vllm_section(**extra) -> dict:
    return {
        "backend": "vllm",
        "vllm": {
            "port": free_port(),
            "startup_timeout_s": 60,
            "request_timeout_s": 30,
            **extra,
        },
    }


def test_vllm_extraction_is_probed_once_per_card_and_settings(tmp_path, random_target, monkeypatch):
    """hidden_states.backend vllm: one row through the stage's own server command and
    speculators' client; a pass is not repeated for an operational change, it is for one that
    decides whether extraction works."""
    python = fake_vllm_python(tmp_path, random_target, monkeypatch)
    args = tmp_path / "args.json"
    report = run_probe(
        tmp_path, random_target, engines=engines_of(python), hidden_states=vllm_section()
    )
    extraction = report["extraction"]
    assert extraction["path"] == "offline" and extraction["passed"] and extraction["probed"]
    tokens = extraction["seen"]["tokens"]
    assert extraction["seen"]["shape"] == [tokens, 4, random_target.hidden_size]
    argv = json.loads(args.read_text())
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [
        *random_target.aux_ids,
        random_target.num_layers,
    ]

    args.unlink()
    report = run_probe(
        tmp_path,
        random_target,
        engines=engines_of(python),
        hidden_states=vllm_section(concurrency=3),
    )
    assert not args.exists() and report["extraction"]["probed"] is False
    assert report["extraction"]["key"] == extraction["key"]

    hs = vllm_section(extra_args=["--enforce-eager"])
    assert run_probe(tmp_path, random_target, engines=engines_of(python), hidden_states=hs)[
        "extraction"
    ]["probed"]
    assert json.loads(args.read_text())[-1] == "--enforce-eager"


@pytest.mark.parametrize(
    "fault, value, message",
    [
        (
            "FAKE_VLLM_REFUSE",
            "Model architectures ['KimiK25ForConditionalGeneration'] do not support extract_hidden_states",
            "do not support extract_hidden_states",
        ),
        ("FAKE_VLLM_DROP_LAYER", "1", r"shape \[\d+, 3, 64\], the card needs \[\d+, 4, 64\]"),
    ],
    ids=["server_refuses", "other_layers"],
)
def test_a_failed_extraction_probe_stops_the_run_and_can_be_skipped(
    tmp_path, random_target, monkeypatch, fault, value, message
):
    python = fake_vllm_python(tmp_path, random_target, monkeypatch)
    monkeypatch.setenv(fault, value)
    with pytest.raises(SystemExit, match=message) as err:
        run_probe(tmp_path, random_target, engines=engines_of(python), hidden_states=vllm_section())
    assert "hidden_states.vllm.probe: false" in str(err.value)
    assert not (tmp_path / "reports" / "probe_passed.txt").exists()
    (tmp_path / "args.json").unlink()

    report = run_probe(
        tmp_path, random_target, engines=engines_of(python), hidden_states=vllm_section(probe=False)
    )
    assert report["extraction"] == {
        "path": "offline",
        "probed": False,
        "why": "hidden_states.vllm.probe: false",
    }
    assert not (tmp_path / "args.json").exists()  # nothing launched
    assert (tmp_path / "reports" / "probe_passed.txt").read_text() == STAMP


def test_online_extraction_is_probed_on_the_train_stages_server(
    tmp_path, random_target, monkeypatch
):
    """mode online with train.backend speculators: the server the train stage would launch for
    speculators' trainers answers the probe row with the card's layers."""
    python = fake_vllm_python(tmp_path, random_target, monkeypatch)
    hs = {**vllm_section(), "mode": "online", "backend": "hf"}
    report = run_probe(
        tmp_path,
        random_target,
        engines=engines_of(python),
        hidden_states=hs,
        train={"backend": "speculators"},
    )
    extraction = report["extraction"]
    assert extraction["path"] == "online" and extraction["passed"]
    assert extraction["seen"]["probe_shape"][1:] == [4, random_target.hidden_size]
    argv = json.loads((tmp_path / "args.json").read_text())
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv["kv_connector"] == "ExampleHiddenStatesConnector"


def test_regenerate_waits_for_the_probe():
    """In dvc.yaml regenerate depends on the probe's stamp, and the probe on the sections whose
    params it checks, on the card, and on nothing regenerate writes."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    probe, regenerate = stages["probe"], stages["regenerate"]
    outs = [next(iter(o)) if isinstance(o, dict) else o for o in probe["outs"]]
    assert "reports/probe_passed.txt" in outs and "reports/probe_passed.txt" in regenerate["deps"]
    assert probe["cmd"].split()[3:] == ["models/target/card.json", *outs]
    assert {"train", "vocab", "hidden_states"} <= set(probe["params"])
    assert "models/target" in probe["deps"]
    assert not any(dep.startswith("datasets/") for dep in probe["deps"])


@pytest.mark.parametrize(
    "content, what",
    [
        (
            '{"architectures": ["Eagle3Speculator"',
            "is not valid JSON .Expecting ',' delimiter at line 1",
        ),
        ("[1, 2]", "holds a JSON list"),
    ],
    ids=["truncated", "not_an_object"],
)
def test_a_corrupt_init_config_is_named_not_a_traceback(
    tmp_path, random_target, drafter, content, what
):
    """A train.init whose config.json is cut short (or not an object): check_params names the
    param, the file and where it breaks, before any stage runs; the probe says the same."""
    from draftline.data.workspace import init_problem

    init = tmp_path / "init"
    shutil.copytree(drafter, init)
    (init / "config.json").write_text(content)
    problem = init_problem(str(init), tmp_path / "models" / "draft")
    assert re.match(f"train.init: {init / 'config.json'} {what}", problem), problem
    (tmp_path / "run").mkdir()
    with pytest.raises(SystemExit, match=f"train.init: .*config.json {what}"):
        run_probe(tmp_path / "run", random_target, train={"init": str(init)})


@pytest.mark.parametrize(
    "damage, what",
    [
        (
            lambda w: w.write_bytes(w.read_bytes()[:-64]),
            "model.safetensors cannot be read .SafetensorError: .*: a truncated or corrupt weights file",
        ),
        (lambda w: w.write_bytes(b"\x10"), "model.safetensors cannot be read .SafetensorError"),
        (lambda w: w.unlink(), "has no weights .no model.safetensors."),
    ],
    ids=["truncated", "garbage", "missing"],
)
def test_init_weights_that_cannot_be_read_are_named_not_a_traceback(
    tmp_path, random_target, drafter, damage, what
):
    """A train.init whose model.safetensors is cut short, garbage or gone: the probe names the
    param, the file and what is wrong (a truncated one used to end in a SafetensorError traceback,
    a missing one was blamed on a missing d2t); check_params says the same, from the headers."""
    from draftline.data.workspace import init_problem

    init = tmp_path / "init"
    shutil.copytree(drafter, init)
    damage(init / "model.safetensors")
    (tmp_path / "run").mkdir()
    with pytest.raises(SystemExit, match=f"error: train.init: {re.escape(str(init))}.*{what}"):
        run_probe(tmp_path / "run", random_target, train={"init": str(init)})
    problem = init_problem(str(init), tmp_path / "models" / "draft")
    assert re.match(f"train.init: {re.escape(str(init))}.*{what}", problem), problem


def test_an_extraction_pass_survives_a_log_edit_and_not_the_code_that_decides_it(
    tmp_path, random_target, monkeypatch, capsys
):
    """The pass's key holds the code of SHAPES["probe"] (draftline/core/shaping.py), read here
    from a copy of the source tree: a log line edited in checks.py keeps the pass; an edit to how
    the probe row is checked probes again, and the log says why."""
    from draftline.core.shaping import CODE_CHANGED, shaping_fingerprint
    from draftline.hidden_states.config import HiddenStatesConfig
    from draftline.probe import checks
    from tests.core.test_shaping import copy_code, edit

    code = copy_code(tmp_path / "code")
    monkeypatch.setattr(checks, "shaping_fingerprint", lambda n: shaping_fingerprint(n, code))
    probed = []  # the offline path's probe, stood in for: no server is started here
    monkeypatch.setattr(checks, "probe_offline", lambda *a: probed.append(a) or {"tokens": 1})
    hs, train, log = HiddenStatesConfig(backend="vllm"), TrainConfig(), tmp_path / "probe.log"

    first = checks.probe_extraction(hs, train, random_target, None, log)
    assert first["passed"] and first["probed"] and len(probed) == 1

    edit(code, "draftline/probe/checks.py", '"probe: one {len(ids)}', '"probe: a {len(ids)}')
    kept = checks.probe_extraction(hs, train, random_target, first, log)
    assert kept["probed"] is False and kept["key"] == first["key"] and len(probed) == 1

    edit(code, "draftline/probe/extraction.py", 'probe_file=transfer != "mooncake"', "probe_file=1")
    capsys.readouterr()
    again = checks.probe_extraction(hs, train, random_target, first, log)
    assert again["probed"] and again["key"] != first["key"] and len(probed) == 2
    assert f"passed before, but {CODE_CHANGED}: probing again" in capsys.readouterr().out
