"""The recipe script records each run from its own reports: headline figures, speedup only when the
run reached `benchmark`, the samples point, a rerun replacing its entry in place."""

from devtools.recipe_record import record
from draftline.core.io import read_json, write_json


def test_a_run_is_recorded_from_its_reports(tmp_path):
    reports, out = tmp_path / "reports", tmp_path / "recipe"
    write_json(out / "experiments.json", {"base-250": {"acceptance_length": 1.5}})
    write_json(reports / "acceptance.json", {"acceptance_length": 2.9101, "tau_sim": 2.9872})
    write_json(reports / "benchmark.json", {"speedup": 1.4633, "baseline_tokens_per_s": 17.8})
    write_json(reports / "acceptance_dev.json", {"acceptance_length": 2.4, "tau_sim": 2.5})
    twins = {"exact": 0, "template": 1}
    write_json(reports / "mix.json", {"holdout": {"eval_with_twin_in_train": twins}})
    dev = {"dev_acceptance_length": 2.4, "dev_tau_sim": 2.5, "eval_twins_in_train": twins}
    point = {
        "samples": 500,
        "samples_requested": 500,
        "acceptance_length": 2.9101,
        "tau_sim": 2.9872,
    }
    write_json(reports / "evaluate" / "acceptance_vs_samples.json", [point])
    write_json(out / "acceptance_vs_samples.json", [{"samples": 1000, "experiment": "L27-1000"}])

    record(out, "L27-500", reports, samples_point=True)
    record(out, "c125-emb", reports, benchmark=False)
    assert read_json(out / "experiments.json") == {
        "base-250": {"acceptance_length": 1.5},
        "L27-500": {"acceptance_length": 2.9101, "tau_sim": 2.9872, **dev, "speedup": 1.4633},
        "c125-emb": {"acceptance_length": 2.9101, "tau_sim": 2.9872, **dev},  # no benchmark
    }
    assert [p["experiment"] for p in read_json(out / "acceptance_vs_samples.json")] == [
        "L27-500",
        "L27-1000",
    ]

    write_json(reports / "acceptance.json", {"acceptance_length": 1.6, "tau_sim": 1.7})
    record(out, "base-250", reports, benchmark=False)  # a rerun: replaced where it was
    assert list(read_json(out / "experiments.json")) == ["base-250", "L27-500", "c125-emb"]
    assert read_json(out / "experiments.json")["base-250"] == {
        "acceptance_length": 1.6,
        "tau_sim": 1.7,
        **dev,
    }


def test_a_serving_verdict_is_recorded_with_its_detail(tmp_path):
    reports, out = tmp_path / "reports", tmp_path / "recipe"
    write_json(reports / "acceptance.json", {"acceptance_length": 2.2, "tau_sim": 2.3})
    write_json(reports / "acceptance_dev.json", {"acceptance_length": 2.2, "tau_sim": 2.4})
    write_json(reports / "mix.json", {"holdout": {"eval_with_twin_in_train": {"exact": 0}}})
    headline = {"engine": "vllm", "serve_concurrency": 4, "k": 2, "speedup": 0.91}
    headline.update(pays_off=False, break_even_concurrency=None, lossless_share=1.0)
    write_json(reports / "benchmark.json", headline)
    detail = {"verdict": {"words": "does not pay off"}, "acceptance_by_k": {"2": 2.1}}
    detail.update(levels={"c4": {}}, lossless={"passed": True})
    write_json(reports / "benchmark.detail.json", detail)
    entry = record(out, "d500", reports)
    assert entry["speedup"] == 0.91 and entry["verdict"]["pays_off"] is False
    assert entry["verdict"]["k"] == 2 and entry["verdict"]["serve_concurrency"] == 4
    assert read_json(out / "verdict_d500.json")["verdict"] == {"words": "does not pay off"}
