"""Machine facts go beside a DVC stage's outputs (reports/machine/<stage>.json), never inside the
hashed ones: meta.json holds what made an artifact, not which Python patch release ran."""

import json

from draftline.core.errors import entry_point
from draftline.core.io import write_meta


def test_a_dvc_stage_leaves_its_machine_facts_beside_its_outputs(tmp_path, monkeypatch):
    import torch  # loaded by the stage: its kernel choice is recorded

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_STAGE", "evaluate@eval")
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_CBWR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")

    @entry_point
    def main(out: str) -> None:
        write_meta(tmp_path / out, "demo", {"k": 1})

    (tmp_path / "out").mkdir()
    main("out")
    facts = json.loads((tmp_path / "reports/machine/evaluate@eval.json").read_text())
    assert facts["stage"] == "evaluate@eval"
    assert facts["cpu"]["cores"] and facts["python"] and facts["versions"]["torch"]
    assert facts["torch"]["threads"] == torch.get_num_threads()
    assert facts["environment"] == {"ATEN_CPU_CAPABILITY": "avx2"}
    meta = json.loads((tmp_path / "out/meta.json").read_text())
    assert meta == {"stage": "demo", "params": {"k": 1}}  # no versions, no python


def test_outside_dvc_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    entry_point(lambda: None)()
    assert not (tmp_path / "reports").exists()
