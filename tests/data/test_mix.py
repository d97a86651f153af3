"""draftline.data.mixing and stages/mix.py: prefix stability, held-out eval, weights, partitions, dedup."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftline.data.config import MixConfig
from draftline.data.formats import content_hash, prepare_records
from draftline.data.holdout import holdout_problem, near_twin_problem, near_twins
from draftline.data.mixing import mix_splits, tag_partition
from draftline.data.shortfall import shortfall_problems, shortfall_table
from draftline.data.sources import read_rows
from tests.stage_runner import mix_in

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = {
    "messages": ROOT / "datasets/samples/openai_messages.jsonl",
    "sharegpt": ROOT / "datasets/samples/sharegpt.jsonl",
}


@pytest.fixture(scope="module")
def pools() -> dict[str, list[dict]]:
    """The bundled samples, prepared: ~594 rows each, 72 prose/colour conversations in both."""
    return {name: prepare_records(read_rows(str(path)), name)[0] for name, path in SAMPLES.items()}


def letters(i: int) -> str:
    """i as a word of letters (aa, ab, ...): numbered prompts would all be template twins."""
    word = ""
    while True:
        i, r = divmod(i, 26)
        word = chr(97 + r) + word
        if not i:
            return word.rjust(2, "a")


def make_pool(source: str, n: int, prompt_chars=lambda i: 8) -> list[dict]:
    return [
        {
            "id": f"{source}-{i}",
            "source": source,
            "tools": None,
            "prompt_tokens_est": -(-prompt_chars(i) // 4),
            "messages": [
                {
                    "role": "user",
                    "content": f"{source} question {letters(i)}".ljust(prompt_chars(i), "."),
                },
                {"role": "assistant", "content": ""},
            ],
        }
        for i in range(n)
    ]


def mix(pools, weights, samples, seed=0, **settings):
    """(train, eval, report) of a mix without a dev split; `settings`: other mix.* keys."""
    splits, report = mix_splits(
        pools, MixConfig(weights=weights, dev_samples=0, **settings), samples, seed
    )
    return splits["train"], splits["eval"], report


def test_train_is_prefix_stable_and_eval_does_not_move(pools):
    weights = {"messages": 0.5, "sharegpt": 0.5}
    train_50, eval_50, _ = mix(pools, weights, 50)
    train_200, eval_200, _ = mix(pools, weights, 200)
    assert len(train_50) == 50 and len(train_200) == 200
    assert train_200[:50] == train_50
    assert eval_50 == eval_200 and len(eval_200) == 24
    eval_ids = {r["id"] for r in eval_200}
    assert not eval_ids & {
        r["id"] for r in mix(pools, weights, 2000)[0]
    }  # disjoint even when all is taken
    assert mix(pools, weights, 50, seed=1)[1] != eval_50  # the seed does reshuffle


def first_turn_text(row: dict) -> str:
    """A row's prompt as the target sees it, normalized: the messages before the first assistant
    turn (and the tools), case and runs of whitespace folded."""
    first = next(i for i, m in enumerate(row["messages"]) if m["role"] == "assistant")
    text = json.dumps([row["messages"][:first], row.get("tools")], sort_keys=True)
    return " ".join(text.lower().split())


def test_first_turn_text_ignores_case_spacing_and_the_answer():
    row = make_pool("a", 1)[0]
    twin = {
        **row,
        "id": "other",
        "messages": [
            {"role": "user", "content": "A  QUESTION AA".ljust(8, ".")},
            {"role": "assistant", "content": "another answer"},
        ],
    }
    assert first_turn_text(twin) == first_turn_text(row)
    assert first_turn_text({**row, "tools": [{"name": "f"}]}) != first_turn_text(row)


def test_no_eval_prompt_has_a_twin_in_train(pools):
    """Held out by content: greedy regeneration gives a twin the same answer, so an eval prompt
    whose first turn is also in train measures recall, not acceptance."""
    train, eval_rows, _ = mix(pools, {"messages": 0.5, "sharegpt": 0.5}, 2000)
    twins = {first_turn_text(r) for r in eval_rows} & {first_turn_text(r) for r in train}
    assert not twins, f"{len(twins)} of {len(eval_rows)} eval prompts have a twin in train"


def bundled_mix(**mix_overrides) -> tuple[dict, dict, dict, dict]:
    """params.yaml's datasets, weights, sizes and hold-out (with `mix_overrides`) mixed as the
    stage does: (splits, report, the eval sets' rows, near-twins per held-out group)."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    cfg = MixConfig(**{**params["mix"], **mix_overrides})
    records = {
        name: prepare_records(read_rows(str(ROOT / spec["path"])), name, spec["format"])[0]
        for name, spec in params["datasets"].items()
    }
    set_names = params["evaluate"]["sets"]
    sets = {name: tag_partition(records.pop(name), 1024) for name in set_names}
    splits, report = mix_splits(records, cfg, params["samples"], params["seed"], sets)
    held = {"eval": splits["eval"], "dev": splits["dev"], **sets}
    near = near_twins(held, splits["train"], cfg.near_twin_jaccard)
    return splits, report, sets, near


def test_default_mix_of_the_bundled_sets_holds_out_real_chats_only():
    """params.yaml's mix: eval and dev are real chats (mix.holdout_from), every dataset gives train
    rows at the weights, the eval set chitchat_more is held out whole; no held-out prompt keeps an
    exact, template (user turns, digits masked) or near twin in train; the weights still hold at
    the size the README's workflow grows `samples` to."""
    splits, report, sets, near = bundled_mix()
    assert set(report["train"]["by_source"]) == {
        "sharegpt_sample",
        "messages_sample",
        "chitchat_sample",
    }
    assert (
        set(report["eval"]["by_source"]) == set(report["dev"]["by_source"]) == {"chitchat_sample"}
    )
    assert list(sets) == ["chitchat_more"] and len(sets["chitchat_more"]) == 40
    none = {"exact": 0, "template": 0}
    holdout = report["holdout"]
    assert holdout["eval_with_twin_in_train"] == holdout["dev_with_twin_in_train"] == none
    assert holdout["eval_with_twin_in_dev"] == none
    assert holdout["sets"]["chitchat_more"]["with_twin_in_train"] == none
    assert {group: found["with_near_twin"] for group, found in near.items()} == {
        "eval": 0,
        "dev": 0,
        "chitchat_more": 0,
    }
    assert holdout_problem(holdout, 0.0) is None and near_twin_problem(near, 0.0, 0.7) is None
    assert shortfall_problems(report) == [] and report["weights_honoured"]
    grown = int(re.search(r"-S samples=(\d+)", (ROOT / "README.md").read_text()).group(1))
    assert report["max_samples_at_weights"] >= grown


def test_templated_sets_cannot_give_held_out_prompts():
    """The blind spot the keys close: drawn from every bundled set with only exact twins skipped,
    eval prompts keep template twins that differ only by system prompt or digits, and near-twins
    (names changed too) for nearly every templated prompt; the template share and the near-twin share
    refuse the mix."""
    _, report, _, near = bundled_mix(holdout_from=None, holdout="exact")
    holdout = report["holdout"]
    templated = sum(
        n for name, n in report["eval"]["by_source"].items() if name != "chitchat_sample"
    )
    assert holdout["eval_with_twin_in_train"]["exact"] == 0
    assert holdout["eval_with_twin_in_train"]["template"] > 0
    assert near["eval"]["with_near_twin"] >= 0.9 * templated > 0  # nearly every templated one
    assert "template (digits masked)" in holdout_problem(holdout, 0.0)
    problem = near_twin_problem(near, 0.05, 0.7)
    assert "eval prompts" in problem and "mix.holdout_from" in problem


def test_template_key_ignores_system_prompt_and_tools_and_digits():
    from draftline.data.holdout import twin_keys

    def prompt(system: str, user: str, tools=None) -> tuple[list[dict], list | None]:
        return [{"role": "system", "content": system}, {"role": "user", "content": user}], tools

    a = twin_keys(*prompt("You are a calculator.", "Use the tool to add 35 and 67."))
    b = twin_keys(*prompt("Answer briefly.", "Use the tool to add 12 and 9.", [{"name": "add"}]))
    c = twin_keys(*prompt("Answer briefly.", "Use the tool to add 35 and 67."))
    assert a["template"] == b["template"] and a["exact"] != b["exact"]
    assert a == c  # the system prompt does not make the same question new


def test_near_twins_found_beyond_templates():
    """A template with its names changed is a near-twin; an unrelated prompt is not; every near
    twin found has its exact Jaccard at least the threshold."""
    from draftline.data.holdout import near_twins

    def row(i, text):
        return {"id": i, "messages": [{"role": "user", "content": text}]}

    held = {"eval": [row("e1", "Alice has 3 apples and gives Bob 2 of them; how many are left?")]}
    train = [
        row("t1", "Carol has 7 apples and gives Dave 5 of them; how many are left?"),
        row("t2", "Write a poem about the sea at night, with rhyme."),
    ]
    found = near_twins(held, train, 0.6)["eval"]
    assert found["with_near_twin"] == 1 and found["examples"][0]["train"] == "t1"
    assert found["examples"][0]["jaccard"] >= 0.6
    assert near_twins(held, train[1:], 0.6)["eval"]["with_near_twin"] == 0


def test_eval_set_prompts_are_held_out_of_train(pools):
    """A train row that is a twin of an eval set's prompt is skipped like an eval twin; the set's
    rows are never drawn."""
    weights = {"messages": 0.5, "sharegpt": 0.5}
    cfg = MixConfig(weights=weights, dev_samples=0)
    base, _ = mix_splits(pools, cfg, 300, 0)
    taken = base["train"][0]
    twin = {**taken, "id": "set-0", "source": "bench"}
    splits, report = mix_splits(pools, cfg, 300, 0, {"bench": [twin]})
    assert taken["id"] not in {r["id"] for r in splits["train"]}
    assert "set-0" not in {r["id"] for r in splits["train"] + splits["eval"]}
    assert report["holdout"]["sets"]["bench"]["with_twin_in_train"] == {"exact": 0, "template": 0}
    assert report["holdout"]["train_rows_skipped"]["exact"] >= 1


def test_weights_roughly_honoured(pools):
    train, eval_rows, report = mix(pools, {"messages": 0.75, "sharegpt": 0.25}, 400)
    share = report["train"]["by_source"]["messages"] / 400
    assert abs(share - 0.75) < 0.02
    assert report["eval"]["by_source"] == {"messages": 18, "sharegpt": 6}
    # Weights are relative: 3:1 is the same mix as 0.75:0.25.
    assert mix(pools, {"messages": 3, "sharegpt": 1}, 400)[0] == train
    # A zero weight leaves the dataset out.
    assert {r["source"] for r in mix(pools, {"messages": 1, "sharegpt": 0}, 100)[0]} == {"messages"}


def test_dataset_that_runs_out_stops_and_shortfall_is_reported():
    small, big = make_pool("small", 30), make_pool("big", 1000)
    train, eval_rows, report = mix(
        {"small": small, "big": big}, {"small": 0.5, "big": 0.5}, 200, eval_samples=10
    )
    assert len(train) == 200 and report["shortfall"] == {"train": 0, "eval": 0, "dev": 0}
    assert report["train"]["by_source"] == {"big": 175, "small": 25}  # 5 of small's 30 went to eval
    train, eval_rows, report = mix({"small": small}, {"small": 1}, 200, eval_samples=10)
    assert len(train) == 20 and report["shortfall"] == {"train": 180, "eval": 0, "dev": 0}
    with pytest.raises(ValueError, match="no rows left for train"):
        mix({"small": small}, {"small": 1}, 200, eval_samples=30)


def test_partition_tagging():
    pool = make_pool(
        "p", 100, prompt_chars=lambda i: 4000 if i % 4 == 0 else 40
    )  # 1000 vs 10 tokens
    train, eval_rows, report = mix({"p": pool}, {"p": 1}, 76, long_threshold_tokens=999)
    for row in train + eval_rows:
        assert row["partition"] == ("long" if row["prompt_tokens_est"] > 999 else "short")
    assert report["train"]["by_partition"]["long"] + report["eval"]["by_partition"]["long"] == 25
    assert (
        mix({"p": pool}, {"p": 1}, 76, long_threshold_tokens=1000)[2]["train"]["by_partition"][
            "long"
        ]
        == 0
    )  # "above" is strict


def test_cross_dataset_duplicates_kept_once(pools):
    _, _, report = mix(pools, {"messages": 0.5, "sharegpt": 0.5}, 5000)
    assert report["duplicates_dropped"] == {
        "total": 72,
        "by_source": {"messages": 0, "sharegpt": 72},
        "copies_of": {"sharegpt": {"messages": 72}},
    }
    assert report["available"] == {"messages": 594, "sharegpt": 522}
    # Same content under different ids: kept in the first dataset by name; same id, other content: renamed.
    a, b = make_pool("a", 5), make_pool("b", 5)
    b[0] = {**a[0], "id": "b-zero", "source": "b"}
    b[1] = {**b[1], "id": a[1]["id"]}
    train, eval_rows, report = mix({"b": b, "a": a}, {"a": 1, "b": 1}, 20, eval_samples=2)
    rows = train + eval_rows
    assert len(rows) == 9 and report["duplicates_dropped"]["by_source"] == {"a": 0, "b": 1}
    assert len({r["id"] for r in rows}) == 9 and "b/a-1" in {r["id"] for r in rows}
    assert report["ids_renamed"] == 1


def test_shortfall_is_worded_with_numbers_per_dataset():
    small, big = make_pool("small", 30), make_pool("big", 1000)
    _, _, report = mix(
        {"small": small, "big": big}, {"small": 0.5, "big": 0.5}, 200, eval_samples=10
    )
    assert report["per_dataset"]["small"] == {
        "weight": 0.5,
        "wanted_train": 100,
        "available": 30,
        "train": 25,
        "eval": 5,
        "dev": 0,
        "twins": 0,
        "share": 0.125,
        "capped": False,
        "short_of_weight": True,
    }
    assert (
        not report["weights_honoured"] and report["max_samples_at_weights"] == 50
    )  # small's 25 train rows = half
    (problem,) = shortfall_problems(report)  # 200 rows drawn, but not at the weights
    assert "small ran out" in problem
    assert (
        shortfall_problems(
            mix({"small": small, "big": big}, {"small": 0.5, "big": 0.5}, 50, eval_samples=10)[2]
        )
        == []
    )
    _, _, report = mix(
        {"small": small}, {"small": 1}, 200, eval_samples=10
    )  # one dataset: short, no drift
    assert shortfall_problems(report) == [
        "samples=200 asks for 200 train prompts; the datasets supply 20"
    ]
    assert shortfall_table(report).splitlines()[1].split() == [
        "small",
        "100%",
        "200",
        "30",
        "10",
        "0",
        "0",
        "20",
        "100%",
    ]
    # a cap is a decision: the others filling in for it is no shortfall
    _, _, report = mix(
        {"small": small, "big": big},
        {"small": 0.5, "big": 0.5},
        200,
        eval_samples=10,
        caps={"small": 20},
    )
    assert report["weights_honoured"] and shortfall_problems(report) == []


def run_mix_stage(tmp_path, pools, samples=100, mix_extra="") -> subprocess.CompletedProcess:
    prepared, reports = tmp_path / "prepared", tmp_path / "reports/prepare"
    prepared.mkdir(exist_ok=True)
    reports.mkdir(parents=True, exist_ok=True)
    for name, rows in pools.items():
        (prepared / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (reports / f"{name}.json").write_text(
            json.dumps(
                {
                    "rows_read": 600,
                    "rows_kept": 594,
                    "dropped": {"empty": 1, "duplicate": 1, name: 4},
                }
            )
        )
    if "dev_samples" not in mix_extra:
        mix_extra += ", dev_samples: 0"
    if "near_twin" not in mix_extra:  # the templated sets alone: their prompts are near-twins
        mix_extra += ", max_near_twin_share: 1.0"
    (tmp_path / "params.yaml").write_text(
        f"samples: {samples}\nseed: 0\ndatasets:\n  messages: {{path: {SAMPLES['messages']}}}\n"
        f"  sharegpt: {{path: {SAMPLES['sharegpt']}}}\n"
        f"mix: {{weights: {{messages: 0.5, sharegpt: 0.5}}, eval_samples: 12, long_threshold_tokens: 100{mix_extra}}}\n"
    )
    return mix_in(tmp_path)


def test_mix_stage_refuses_a_shortfall_unless_allowed(tmp_path, pools):
    done = run_mix_stage(tmp_path, pools, samples=100000)
    assert done.returncode == 1 and not (tmp_path / "mixed/train.jsonl").exists()
    # 363 train rows are twins of the 12 eval prompts (36 exact, 327 template: the user turns with
    # digits masked, whatever the system prompt), kept out of train
    assert "samples=100000 asks for 100000 train prompts; the datasets supply 741" in done.stderr
    assert "sharegpt ran out before giving its share of the weights" in done.stderr
    rows = {
        line.split()[0]: line.split()[1:]
        for line in done.stderr.splitlines()
        if line.startswith("  ")
    }
    assert rows["messages"] == ["50%", "50000", "594", "6", "0", "163", "425", "57%"]
    assert rows["sharegpt"] == ["50%", "50000", "522", "6", "0", "200", "316", "43%"]
    for line in ("at most 632 keeps the weights", "mix.allow_shortfall: true"):
        assert line in done.stderr, done.stderr
    done = run_mix_stage(tmp_path, pools, samples=100000, mix_extra=", allow_shortfall: true")
    assert done.returncode == 0, done.stderr
    assert "SHORTFALL accepted (mix.allow_shortfall: true)" in done.stderr
    report = json.loads((tmp_path / "reports/mix.json").read_text())
    assert (
        report["train"]["rows"] == 741
        and report["allow_shortfall"]
        and not report["weights_honoured"]
    )
    assert report["per_dataset"]["messages"]["share"] == round(425 / 741, 4)
    assert (
        json.loads((tmp_path / "mixed/meta.json").read_text())["counts"]["train"] == 741
    )  # what evaluate plots


def test_mix_stage(tmp_path, pools):
    done = run_mix_stage(tmp_path, pools)
    assert done.returncode == 0, done.stderr
    train = [json.loads(line) for line in open(tmp_path / "mixed/train.jsonl")]
    eval_rows = [json.loads(line) for line in open(tmp_path / "mixed/eval.jsonl")]
    assert len(train) == 100 and len(eval_rows) == 12
    expected_train, expected_eval, _ = mix(
        pools, {"messages": 0.5, "sharegpt": 0.5}, 100, eval_samples=12, long_threshold_tokens=100
    )
    assert train == expected_train and eval_rows == expected_eval  # light rows in, full records out
    assert set(train[0]) == {"id", "source", "messages", "tools", "prompt_tokens_est", "partition"}
    report = json.loads((tmp_path / "reports/mix.json").read_text())
    assert (
        report["train"]["by_partition"]["long"] == sum(r["partition"] == "long" for r in train) > 0
    )
    assert report["dropped_by_reason"] == {
        "duplicate_across_datasets": 72,
        "duplicate": 2,
        "empty": 2,
        "messages": 4,
        "sharegpt": 4,
    }
    assert report["prepare"]["sharegpt"]["rows_kept"] == 594
    meta = json.loads((tmp_path / "mixed/meta.json").read_text())
    assert meta["stage"] == "mix" and set(meta["inputs"]) == {"messages", "sharegpt"}


def test_caps_limit_train_rows_and_stay_prefix_stable(pools):
    weights = {"messages": 0.5, "sharegpt": 0.5}
    train, eval_rows, report = mix(pools, weights, 300, caps={"sharegpt": 100})
    assert report["train"]["by_source"] == {"messages": 200, "sharegpt": 100} and report[
        "capped"
    ] == ["sharegpt"]
    assert eval_rows == mix(pools, weights, 300)[1]  # eval is drawn before any cap applies
    uncapped = mix(pools, weights, 300)[0]
    assert train[:150] == uncapped[:150]  # identical until sharegpt reaches its cap (~row 200)
    assert mix(pools, weights, 120, caps={"sharegpt": 100})[0] == train[:120]
    assert mix(pools, weights, 300, caps={"sharegpt": 0})[2]["train"]["by_source"] == {
        "messages": 300
    }
    with pytest.raises(ValueError, match="mix.caps names unknown datasets \\['nope'\\]"):
        mix(pools, weights, 10, caps={"nope": 1})


# ---- properties ------------------------------------------------------------------------------


@st.composite
def mixes(draw):
    """Small pools (some content shared across datasets), weights, caps, seed and two sizes N < M."""
    names = draw(st.lists(st.sampled_from("abcd"), min_size=1, max_size=3, unique=True))
    pools = {name: make_pool(name, draw(st.integers(0, 40))) for name in names}
    if len(names) > 1 and draw(
        st.booleans()
    ):  # the second dataset repeats some of the first's conversations
        first, second = pools[names[0]], pools[names[1]]
        for j in range(min(len(first), len(second), draw(st.integers(0, 10)))):
            second[j] = {**first[j], "id": f"{names[1]}-copy-{j}", "source": names[1]}
    weights = {name: draw(st.sampled_from([0.0, 0.1, 0.5, 1.0, 3.0])) for name in names}
    if not any(weights.values()):
        weights[names[0]] = 1.0
    caps = {name: draw(st.integers(0, 30)) for name in names if draw(st.booleans())}
    n = draw(st.integers(1, 60))
    return (
        pools,
        weights,
        caps,
        draw(st.integers(1, 10)),
        draw(st.integers(0, 2**32)),
        n,
        draw(st.integers(n + 1, 120)),
    )


def mix_or_none(pools, weights, samples, eval_samples, seed, caps):
    try:
        return mix(pools, weights, samples, seed, eval_samples=eval_samples, caps=caps)
    except ValueError as err:
        assert "no rows left for train" in str(err)
        return None


@settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(mixes())
def test_property_prefix_stable_and_eval_disjoint(case):
    pools, weights, caps, eval_samples, seed, n, m = case
    small = mix_or_none(pools, weights, n, eval_samples, seed, caps)
    large = mix_or_none(pools, weights, m, eval_samples, seed, caps)
    assert (small is None) == (large is None)  # an empty train does not depend on `samples`
    if small is None:
        return
    (train_n, eval_n, _), (train_m, eval_m, report) = small, large
    assert train_m[:n] == train_n and eval_n == eval_m
    assert len(train_n) == min(n, len(train_m))
    train_ids, eval_ids = [r["id"] for r in train_m], [r["id"] for r in eval_m]
    assert not set(train_ids) & set(eval_ids) and len(set(train_ids)) == len(train_ids)
    contents = [content_hash(r["messages"], r["tools"]) for r in train_m + eval_m]
    assert len(set(contents)) == len(contents)  # no conversation twice, across datasets too
    eval_turns = {first_user_turn(r) for r in eval_m}
    assert not [r for r in train_m if first_user_turn(r) in eval_turns]  # held out by content
    for name, cap in caps.items():
        assert report["train"]["by_source"].get(name, 0) <= cap
    assert {r["source"] for r in train_m + eval_m} <= {name for name, w in weights.items() if w > 0}


def test_reports_break_sources_down_by_the_rows_own_source():
    """Issue #16.6: a blended dataset's rows keep their upstream source (`source_detail`), and the
    mix report counts them per dataset."""
    blend = [
        {**row, "source_detail": "math" if i % 3 else "code"}
        for i, row in enumerate(make_pool("blend", 60))
    ]
    train, eval_rows, report = mix(
        {"blend": blend, "plain": make_pool("plain", 60)},
        {"blend": 1, "plain": 1},
        40,
        eval_samples=10,
    )
    counts = report["train"]["by_source_detail"]
    assert (
        set(counts) == {"blend"}
        and sum(counts["blend"].values()) == report["train"]["by_source"]["blend"]
    )
    assert set(counts["blend"]) == {"math", "code"}
    assert all(r.get("source_detail") for r in train if r["source"] == "blend")
    assert (
        "by_source_detail"
        not in mix({"plain": make_pool("plain", 60)}, {"plain": 1}, 40, eval_samples=10)[2]["train"]
    )


def first_user_turn(row: dict) -> str:
    """The test's own reading of a prompt: system and first user message, and the tools' names,
    case and spacing ignored."""
    first = next(i for i, m in enumerate(row["messages"]) if m["role"] == "user")
    turn = [m["content"] for m in row["messages"][: first + 1]]
    tools = [t["function"]["name"] for t in row["tools"] or []]
    return " ".join(" | ".join(turn + tools).lower().split())


def test_eval_is_held_out_by_content_not_only_by_id(pools):
    """The bundled sets are templated: at the default (600 train, 24 eval) 4 eval prompts had an exact
    first-turn twin in train and 12 a template twin (digits masked). None may reach train."""
    weights = {"messages": 0.5, "sharegpt": 0.5}
    train, eval_rows, report = mix(pools, weights, 600)
    masked = lambda row: re.sub(r"\d+", "0", first_user_turn(row))  # noqa: E731
    train_turns, train_masked = {first_user_turn(r) for r in train}, {masked(r) for r in train}
    assert not [r for r in eval_rows if first_user_turn(r) in train_turns]
    assert not [r for r in eval_rows if masked(r) in train_masked]
    assert len(train) == 600 and report["shortfall"]["train"] == 0  # others took the twins' places
    holdout = report["holdout"]
    assert holdout["eval_with_twin_in_train"] == {"exact": 0, "template": 0}
    assert (
        holdout["train_rows_skipped"]["exact"] > 0 and holdout["train_rows_skipped"]["template"] > 0
    )
    # holdout: exact keeps the template twins, and says how many eval prompts have one
    train_x, eval_x, report_x = mix(pools, weights, 600, holdout="exact")
    assert eval_x == eval_rows
    exact = lambda row: (json.dumps(row["messages"][:-1]), json.dumps(row["tools"]))  # noqa: E731
    assert not {exact(r) for r in eval_x if len(r["messages"]) == 2} & {exact(r) for r in train_x}
    own_count = sum(masked(r) in {masked(t) for t in train_x} for r in eval_x)
    assert report_x["holdout"]["eval_with_twin_in_train"]["template"] == own_count >= 10


def test_holdout_keeps_prefix_stability_and_weights(pools):
    weights = {"messages": 0.75, "sharegpt": 0.25}
    train_50, eval_50, _ = mix(pools, weights, 50)
    train_500, eval_500, report = mix(pools, weights, 500)
    assert train_500[:50] == train_50 and eval_50 == eval_500
    assert abs(report["train"]["by_source"]["messages"] / 500 - 0.75) < 0.02
    fuzzy = MixConfig(weights=weights).model_copy(update={"holdout": "fuzzy"})  # unvalidated
    with pytest.raises(ValueError, match="mix.holdout must be one of"):
        mix_splits(pools, fuzzy, 50, 0)


def test_mix_stage_fails_when_eval_keeps_template_twins(tmp_path, pools):
    done = run_mix_stage(tmp_path, pools, mix_extra=", holdout: exact")
    assert done.returncode == 1 and not (tmp_path / "mixed/train.jsonl").exists()
    assert "share a template (digits masked) with a train prompt" in done.stderr
    assert "mix.max_template_twin_share=0.25" in done.stderr
    done = run_mix_stage(tmp_path, pools, mix_extra=", holdout: exact, max_template_twin_share: 1")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "reports/mix.json").read_text())["holdout"]
    assert report["rule"] == "exact" and report["eval_with_twin_in_train"]["exact"] == 0
    assert 0 < report["template_twin_share"] <= 1
    done = run_mix_stage(tmp_path, pools)  # the default rule
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "reports/mix.json").read_text())["holdout"]
    assert report["template_twin_share"] == 0 and report["rule"] == "template"


def test_dev_split_is_held_out_from_train_and_eval(pools):
    """mix.dev_samples: a second held-out split, taken right after eval, for choosing recipes; no
    exact or template twin of a dev prompt in train, none of an eval prompt in dev; with 0 the
    mix is exactly the mix without one."""
    weights = {"messages": 0.5, "sharegpt": 0.5}
    splits, report = mix_splits(pools, MixConfig(weights=weights), 300, 0)
    train, eval_rows, dev = splits["train"], splits["eval"], splits["dev"]
    assert len(dev) == 12 and len(eval_rows) == 24 and len(train) == 300
    masked = lambda row: re.sub(r"\d+", "0", first_user_turn(row))  # noqa: E731
    assert not {masked(r) for r in dev} & {masked(r) for r in train}
    assert not {masked(r) for r in eval_rows} & {masked(r) for r in dev + train}
    assert not {r["id"] for r in dev} & {r["id"] for r in train + eval_rows}
    assert report["dev"]["rows"] == 12 and report["requested"]["dev"] == 12
    holdout = report["holdout"]
    assert (
        holdout["dev_with_twin_in_train"]
        == holdout["eval_with_twin_in_dev"]
        == {
            "exact": 0,
            "template": 0,
        }
    )
    assert sum(row["dev"] for row in report["per_dataset"].values()) == 12
    # eval does not move; train for a larger `samples` extends this one
    assert splits_eval_only(pools, weights) == eval_rows
    assert mix_splits(pools, MixConfig(weights=weights), 400, 0)[0]["train"][:300] == train
    no_dev, _ = mix_splits(pools, MixConfig(weights=weights, dev_samples=0), 300, 0)
    assert no_dev["dev"] == [] and no_dev["train"] == mix(pools, weights, 300)[0]
    with pytest.raises(ValueError, match="690 to dev"):  # dev took every row left
        mix_splits(pools, MixConfig(weights=weights, dev_samples=5000), 10, 0)


def splits_eval_only(pools, weights):
    return mix(pools, weights, 10)[1]


def test_mix_stage_writes_the_dev_split(tmp_path, pools):
    done = run_mix_stage(tmp_path, pools, mix_extra=", dev_samples: 6")
    assert done.returncode == 0, done.stderr
    dev = [json.loads(line) for line in open(tmp_path / "mixed/dev.jsonl")]
    meta = json.loads((tmp_path / "mixed/meta.json").read_text())
    assert len(dev) == 6 == meta["counts"]["dev"] and "dev 6" in done.stdout
    done = run_mix_stage(tmp_path, pools)
    assert (tmp_path / "mixed/dev.jsonl").read_text() == ""  # no dev split: an empty file


def test_evaluate_stage_reports_an_empty_dev_split(tmp_path):
    """evaluate_dev with mix.dev_samples: 0: a report of 0 prompts, not a failure (and no target load)."""
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    (tmp_path / "dev.jsonl").write_text("")
    done = subprocess.run(
        [
            sys.executable,
            "-P",
            str(ROOT / "stages/evaluate.py"),
            "missing-card.json",
            "missing-draft",
            "dev.jsonl",
            "acceptance_dev.json",
            "evaluate_dev",
            "--dev",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "acceptance_dev.json").read_text()) == {"prompts": 0}
    assert (tmp_path / "evaluate_dev").is_dir()
    done = subprocess.run(
        [
            sys.executable,
            "-P",
            str(ROOT / "stages/evaluate.py"),
            *"a b dev.jsonl r p --bogus".split(),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "unknown options ['--bogus']" in done.stderr


def test_a_capped_set_weighted_up_comes_on_top_of_the_same_rows(pools):
    """scripts/recipe_smollm2.sh d500-long: a set of N rows (long rows to train on) added with a
    weight that puts them ahead of the others' last row and a cap of N, samples + N: train is the
    rows without it, in the same order, plus its N; eval does not move; no shortfall (a capped set
    asked for its cap is not short)."""
    weights = {"messages": 0.35, "sharegpt": 0.8}
    settings = {"holdout_from": ["sharegpt"]}
    train, eval_rows, _ = mix(pools, weights, 300, **settings)
    extra = {**pools, "long": make_pool("long", 36, prompt_chars=lambda i: 4000 + i)}
    more, more_eval, report = mix(
        extra, {**weights, "long": 1.15}, 336, caps={"long": 36}, **settings
    )
    assert [r["id"] for r in more if r["source"] != "long"] == [r["id"] for r in train]
    assert sum(r["source"] == "long" for r in more) == 36 and more_eval == eval_rows
    assert shortfall_problems(report) == [] and report["capped"] == ["long"]
