"""The drafters' registry (draftline/draft/methods/, on the methods' facts in draftline/draft/params/):
a method registered in a module of each is validated, served, run and summarized through its
drafter with no other file touched; an unknown one gets the same error everywhere; and no module
outside the two packages compares method names."""

import ast
import re
import subprocess
import sys
from dataclasses import fields
from functools import cache
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from draftline.draft.checkpoint import DraftFacts
from draftline.draft.methods import (
    Forward,
    UnknownDrafter,
    drafter,
    names,
    of_config,
    register,
    summarize,
)
from draftline.draft.methods.base import REGISTRY, ratio
from draftline.draft.methods.eagle3 import Eagle3
from draftline.draft.params import register as register_method
from draftline.draft.params.base import METHODS
from draftline.draft.preflight import check_draft
from draftline.params import parse_params
from draftline.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "draftline" / "draft" / "methods", ROOT / "draftline" / "draft" / "params")


class Tandem(Eagle3):
    """A test-only fourth method: EAGLE-3's speculators classes and decoder under another name,
    served by vLLM as its own method, its accuracy each position's own."""

    name = "tandem"
    title = "Tandem"
    label = "Tandem (test)"
    unnamed_checkpoints = False  # EAGLE-3 reads the checkpoints that name no method
    vllm_reason = "a tandem draft is a test's"

    def vllm_speculative(self) -> dict:
        return {"method": self.name, "parallel_drafting": True}

    def classes(self):
        """Its speculators model and config: EAGLE-3's, registered under its own name (what a real
        fourth method's module would bring, or find in speculators)."""
        return tandem_classes()

    def draft_forward(self, get, k: int) -> Forward:
        return Forward(self.name, k, (("ttt_steps", k),))

    def accuracy(self, metric_sums, positions):
        acc = [ratio(metric_sums, f"position_{d}_acc") for d in range(positions)]
        return acc, 1 + sum(acc)


@cache
def tandem_classes():
    from typing import ClassVar, Literal

    import torch  # noqa: F401 (speculators' config annotations name it)
    from speculators import SpeculatorModel, SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    @SpeculatorModelConfig.register("tandem")
    class TandemConfig(Eagle3SpeculatorConfig):
        speculators_model_type: Literal["tandem"] = "tandem"

    TandemConfig.model_rebuild(_types_namespace={"torch": torch})

    @SpeculatorModel.register("tandem")
    class TandemModel(Eagle3DraftModel):
        config_class: ClassVar[type[TandemConfig]] = TandemConfig

    return TandemModel, TandemConfig


@pytest.fixture
def tandem():
    register_method(Tandem)
    register(Tandem)
    yield drafter("tandem")
    REGISTRY.pop("tandem")
    METHODS.pop("tandem")


def test_the_three_methods_register_on_import_in_order():
    assert names() == ("eagle3", "peagle", "dflash")
    assert [drafter(name).name for name in names()] == list(names()) == list(REGISTRY)


def test_a_drafter_needs_its_method_registered():
    with pytest.raises(UnknownDrafter, match="'tandem'"):
        register(Tandem)


def test_a_fourth_method_is_one_class(tandem):
    assert names()[-1] == "tandem" and of_config({"speculators_model_type": "tandem"}) is tandem
    cfg = TrainConfig(method="tandem", ttt_steps=2)
    assert cfg.method == "tandem"
    assert tandem.vllm_speculative() == {"method": "tandem", "parallel_drafting": True}
    assert Forward.for_training(cfg) == Forward(
        "tandem", 2, (("ttt_steps", 2), ("ttt_step_loss_decay", 1.0))
    )
    forward = Forward.for_draft({"speculators_model_type": "tandem"}, 3)
    assert forward == Forward("tandem", 3, (("ttt_steps", 3),))
    sums = {"position_0_acc_sum": 3.0, "position_0_acc_total": 4.0}
    sums |= {"position_1_acc_sum": 1.0, "position_1_acc_total": 4.0, "loss_sum": 2.0}
    sums |= {"loss_total": 1.0}
    summary = summarize(sums, Forward("tandem", 2, ()))
    assert summary == {"loss": 2.0, "position_accuracy": [0.75, 0.25], "tau_sim": 2.0}


def test_a_fourth_method_trains_a_step_and_is_served(tandem, random_target, vocab_dir, tmp_path):
    """The fourth method end to end through the code every method goes through: a training step
    on captured hidden states, its checkpoint, the benchmark's preflight and serve command."""
    import json

    import torch

    from datasets import Dataset
    from draftline.benchmark.commands import benchmark_serve_command
    from draftline.benchmark.config import BenchmarkConfig
    from draftline.benchmark.preflight import check_engine_settings
    from draftline.core.io import write_json
    from draftline.draft.checkpoint import read_draft_facts
    from draftline.draft.model import build_draft, save_draft
    from draftline.hidden_states.capture import capture
    from draftline.hidden_states.files import hs_path, save_hidden_states
    from draftline.targets.model import load_target
    from draftline.train import data as draft_data
    from draftline.train import run as training

    target, _ = load_target(random_target)
    g = torch.Generator().manual_seed(0)
    rows = [
        torch.randint(3, random_target.vocab_size, (24,), generator=g).tolist() for _ in range(4)
    ]
    dataset = Dataset.from_dict(
        {"input_ids": rows, "loss_mask": [[1] * 24] * 4, "seq_len": [24] * 4}
    )
    dataset.set_format(type="torch", columns=["input_ids", "loss_mask", "seq_len"])
    dataset.save_to_disk(str(tmp_path / "tokenized"))
    (tmp_path / "hs").mkdir()
    for i, ids in enumerate(rows):
        hs = capture(target, [ids], random_target.aux_ids)[0]
        save_hidden_states(hs_path(tmp_path / "hs", i), ids, hs, torch.bfloat16)
    write_json(tmp_path / "hs" / "meta.json", {"aux_layer_ids": random_target.aux_ids})
    cfg = TrainConfig(
        method="tandem", ttt_steps=2, epochs=1, pack_len=48, val_fraction=0.25, device="cpu"
    )
    model = build_draft(random_target, vocab_dir, cfg)
    result = training.train_draft(
        model, cfg, draft_data.TrainingData(tmp_path / "tokenized", tmp_path / "hs"), "cpu"
    )
    assert result["steps"] >= 1 and result["history"]
    save_draft(model, tmp_path / "draft")
    facts = read_draft_facts(str(tmp_path / "draft"))
    assert facts.algorithm == "tandem"
    bench = BenchmarkConfig(k=[2])
    assert check_engine_settings("vllm", bench, facts) == []
    command = benchmark_serve_command("vllm", random_target, bench, str(tmp_path / "draft"), k=2)
    spec = json.loads(command[command.index("--speculative-config") + 1])
    assert spec["method"] == "tandem" and spec["num_speculative_tokens"] == 2


def test_params_take_a_registered_method(tandem):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["train"]["method"] = "tandem"
    assert parse_params(raw).train.method == "tandem"


def test_a_second_drafter_of_one_name_is_refused():
    with pytest.raises(ValueError, match="registered already"):
        register(Eagle3)


def test_an_unknown_method_gets_one_error_everywhere(random_target):
    with pytest.raises(UnknownDrafter) as err:
        drafter("medusa")
    message = str(err.value)
    pattern = re.escape(message)
    assert "'medusa'" in message and "eagle3, peagle, dflash" in message
    with pytest.raises(UnknownDrafter, match=pattern):
        of_config({"speculators_model_type": "medusa"})
    with pytest.raises(ValidationError, match=pattern):
        TrainConfig(method="medusa")
    with pytest.raises(UnknownDrafter, match=pattern):
        Forward.for_draft({"speculators_model_type": "medusa"}, 3)
    unknown = {"path": "d", "layout": "speculators", "algorithm": "medusa", "architectures": ()}
    facts = DraftFacts(**{f.name: None for f in fields(DraftFacts)} | unknown)
    assert f"d: {message}" in check_draft(random_target, facts, "vllm")


def name_comparisons(source: str, method_names: set[str]) -> list[int]:
    """The lines where `source` compares a value with a method's name (==, !=, in, a match case)
    or keys a table by one."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            parts = [node.value]
        elif isinstance(node, ast.Dict):
            parts = [key for key in node.keys if key is not None]
        else:
            continue
        if any(
            isinstance(sub, ast.Constant) and sub.value in method_names
            for part in parts
            for sub in ast.walk(part)
        ):
            lines.append(node.lineno)
    return lines


def test_the_scan_finds_comparisons_and_tables_not_prose():
    source = (
        '"""A docstring naming peagle."""  # and dflash in a comment\n'
        'if m == "peagle" or m in ("a", "dflash"):\n'
        '    t = {"eagle3": 1}\n'
        "match m:\n"
        '    case "dflash":\n'
        '        label = "eagle3"\n'
    )
    assert name_comparisons(source, set(names())) == [2, 2, 3, 5]  # line 2: == and in


def test_no_module_outside_the_drafters_compares_method_names():
    """A branch on a method's name belongs in its drafter (docstrings and comments may name it)."""
    files = [
        path
        for folder in ("draftline", "stages", "devtools", "overhead")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if not any(package in path.parents for package in PACKAGES)
    ]
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in files
        for line in name_comparisons(path.read_text(), set(names()))
    ]
    assert not found, f"method names compared outside the drafters' packages: {found}"


@pytest.mark.parametrize("package", ["draftline.draft.params", "draftline.draft.methods"])
def test_the_registries_import_neither_torch_nor_speculators(package):
    code = (
        f"import sys, {package}; "
        "print(sorted(m for m in ('torch', 'speculators') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_reading_params_imports_no_drafter():
    code = "import sys, draftline.params; print('draftline.draft.methods' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
