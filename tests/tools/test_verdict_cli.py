"""`draftline verdict`: the decision again from a recorded sweep, at another load, with other
goals, with a forecast over given points; a load the sweep did not measure is refused."""

import json

import pytest

from draftline.core.io import read_json, write_json
from draftline.tools.verdict import main


def detail_file(tmp_path):
    """A report whose sweep pays at 1 and 4 requests in flight and loses at 16."""
    speedups = {1: {1: 1.2, 3: 1.5}, 4: {1: 1.1, 3: 1.05}, 16: {1: 0.9, 3: 0.8}}
    tau = {1: 1.8, 3: 3.0}
    levels = {}
    for c, by_k in speedups.items():
        level = {"baseline": {"output_tokens_per_s": 100.0}}
        for k, s in by_k.items():
            level[f"k{k}"] = {
                "output_tokens_per_s": 100.0 * s,
                "acceptance_length": tau[k],
                "paired_speedups": [s * 0.99, s, s / 0.99],  # three rounds within 1%
            }
        levels[f"c{c}"] = level
    path = tmp_path / "benchmark.detail.json"
    write_json(path, {"engine": "vllm", "levels": levels, "verdict": {"serve_concurrency": 4}})
    return path


def test_the_verdict_at_another_load_and_with_a_forecast(tmp_path, capsys):
    path = detail_file(tmp_path)
    main([str(path)])
    headline = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert {key: headline[key] for key in ("serve_concurrency", "decision", "k", "speedup")} == {
        "serve_concurrency": 4,
        "decision": "yes",
        "k": 1,
        "speedup": 1.1,
    }
    assert 1 < headline["speedup_low"] < 1.1 < headline["speedup_high"]
    # at 99.99% shared by two ks, three rounds no longer tell 1.05-1.1 from 1
    main([str(path), "--confidence", "0.9999"])
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["decision"] == "undecided"
    points = tmp_path / "points.json"
    write_json(
        points,
        [{"samples": n, "acceptance_length": a} for n, a in ((100, 2.0), (200, 2.3), (400, 2.6))],
    )
    out = tmp_path / "v.json"
    main(
        [
            str(path),
            "--serve-concurrency",
            "16",
            "--points",
            str(points),
            "--points-k",
            "3",
            "--out",
            str(out),
        ]
    )
    v = read_json(out)
    assert (v["serve_concurrency"], v["decision"], v["k"], v["pays_off"]) == (16, "no", None, False)
    assert "at 16 requests in flight it does not pay off: even k=1 gives 0.90x" in (
        capsys.readouterr().out
    )
    forecast = v["needs"]["1.0"].get("forecast")
    assert forecast is None or forecast["k"] == 3  # the points' k, not the verdict's


def test_an_unmeasured_load_and_points_without_k_are_refused(tmp_path):
    path = detail_file(tmp_path)
    with pytest.raises(SystemExit, match="measured \\[1, 4, 16\\]"):
        main([str(path), "--serve-concurrency", "8"])
    points = tmp_path / "points.json"
    write_json(points, [{"samples": 100, "acceptance_length": 2.0}])
    with pytest.raises(SystemExit, match="give --points-k"):
        main([str(path), "--points", str(points)])
