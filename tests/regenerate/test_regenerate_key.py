"""The settings each regenerated line records (draftline/regenerate/settings.py
regeneration_settings) against what the answers depend on: every regenerate param classified, and,
with the stage run on two prompts by a real server, every change that alters the answers alters
the line's settings fingerprint.

A setting that misses something keeps, on a rerun, answers another model or another way of asking
made: a kept line is never sent again."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

from regenerate_support import free_port, output_rows, prompts, run_stage, stage_dir
from safetensors.torch import load_file, save_file

from draftline.core.config import kind_of
from draftline.regenerate.config import RegenerateConfig
from draftline.regenerate.settings import (
    DERIVED,
    ENGINE_FIELDS,
    SETTING_NAMES,
    regeneration_settings,
    wanted_settings,
)
from draftline.targets.model import build_card

# The regenerate params by how a line's settings treat them: a param added to RegenerateConfig
# without a line here fails test_every_regenerate_param_is_classified.
IN_SETTINGS = {
    "reasoning_parser": "how reasoning comes back (split from the content or in it)",
    "tool_call_parser": "how tool calls come back (structured or in the content)",
    "short": "max_context cuts max_tokens (its concurrency is operational, left out)",
    "long": "max_context cuts max_tokens (its concurrency is operational, left out)",
    "max_tokens": "where an answer is cut",
    "temperature": "sampling",
    "temperatures": "sampling, drawn per conversation",
    "top_p": "sampling",
    "seed": "each request's seed",
    "chat_template_kwargs": "the prompt as the template renders it",
}
IN_SETTINGS_IN_PART = {
    "extra_args": "only the ANSWER_SHAPING_ARGS of the launch (answer_shaping_args); the rest is "
    "engine provenance",
}
# recorded with each line as the engine that answered (engine_record), never compared: another
# engine or launch of the same target, template and sampling is taken to give the same answers
ENGINE = {
    "backend": "the engine that answers",
    "external_engine": "what serves the endpoints",
    "served_model_name": "the name requests carry",
    "tensor_parallel_size": "the engine's parallelism",
    "data_parallel_size": "the engine's replicas",
    "max_model_len": "the engine's context limit (a prompt past it fails, it is not answered otherwise)",
    "continuous_batching": "transformers serve's scheduling",
    "cb_num_blocks": "transformers serve's KV-cache size",
    "hf": "the batch server's batching and threads; tie_tolerance only counts near-ties",
    "server_slots": "requests one server runs at once",
}
NOT_IN_SETTINGS = {
    "host": "where the launched server listens",
    "port": "where the launched server listens",
    "endpoints": "where the external servers are",
    "api_key_env": "how the endpoints are authenticated",
    "startup_timeout_s": "how long a launch may take",
    "first_token_timeout_s": "when a request is retried (with the same seed)",
    "token_timeout_s": "when a request is retried (with the same seed)",
    "progress_every_s": "how often a progress line is printed",
    "max_retries": "how often a request is retried",
    "retry_backoff_s": "how long a retry waits",
    "retry_backoff_max_s": "how long a retry waits",
    "max_failure_rate": "whether the stage fails, not what a line holds",
    "max_length_share": "whether the stage fails, not what a line holds",
}
# what a line's settings hold that is no regenerate param
TARGET_SETTINGS = {"model", "revision", "chat_template_sha256", "answer_shaping_args", *DERIVED}


def test_every_regenerate_param_is_classified():
    fields = set(RegenerateConfig.model_fields)
    classes = [IN_SETTINGS, IN_SETTINGS_IN_PART, ENGINE, NOT_IN_SETTINGS]
    assert sum(len(c) for c in classes) == len(fields), "a param classified twice"
    assert fields == set().union(*classes), (
        "classify the new regenerate param here (and declare its kind in regenerate/config.py)"
    )
    assert set(ENGINE) | {"extra_args"} == set(ENGINE_FIELDS)
    assert all(kind_of(RegenerateConfig, f) == "shaping" for f in IN_SETTINGS)
    unkept = set(IN_SETTINGS_IN_PART) | set(ENGINE) | set(NOT_IN_SETTINGS)
    assert all(kind_of(RegenerateConfig, f) == "operational" for f in unkept)
    settings = regeneration_settings(RegenerateConfig(), _card())
    assert set(settings) == set(IN_SETTINGS) | TARGET_SETTINGS
    assert set(SETTING_NAMES) <= set(settings)


def _card():
    """What regeneration_settings reads of a card whose model is no local directory (a hub id:
    no weights or generation config digest)."""
    return SimpleNamespace(model="org/model", revision="main", chat_template_sha256="t")


# one other value per param (with what it needs to be a valid config); the base is backend vllm,
# where sampling and the parsers are allowed
BASE = {"backend": "vllm"}
OTHER = {
    "backend": {"backend": "sglang"},
    "host": {"host": "0.0.0.0"},
    "port": {"port": 8123},
    "endpoints": {"backend": "external", "endpoints": ["http://h:1"], "external_engine": "vllm"},
    "external_engine": {
        "backend": "external",
        "endpoints": ["http://h:1"],
        "external_engine": "sglang",
    },
    "served_model_name": {"served_model_name": "m"},
    "api_key_env": {"api_key_env": "KEY"},
    "tensor_parallel_size": {"tensor_parallel_size": 2},
    "data_parallel_size": {"data_parallel_size": 2},
    "max_model_len": {"max_model_len": 1024},
    "reasoning_parser": {"reasoning_parser": "qwen3"},
    "tool_call_parser": {"tool_call_parser": "hermes"},
    "extra_args": {"extra_args": ["--max-num-seqs", "4"]},
    "continuous_batching": {"continuous_batching": True},
    "cb_num_blocks": {"cb_num_blocks": 8},
    "hf": {"hf": {"max_batch": 1, "gather_ms": 0, "tie_tolerance": 0.1, "threads": 1}},
    "short": {"short": {"concurrency": 32, "max_context": 256}},
    "long": {"long": {"concurrency": 4, "max_context": 256}},
    "max_tokens": {"max_tokens": 8},
    "temperature": {"temperature": 0.7},
    "temperatures": {"temperatures": [{"value": 0.6, "weight": 1.0}]},
    "top_p": {"top_p": 0.9},
    "seed": {"seed": 1},
    "chat_template_kwargs": {"chat_template_kwargs": {"enable_thinking": True}},
    "startup_timeout_s": {"startup_timeout_s": 60},
    "server_slots": {"server_slots": 2},
    "first_token_timeout_s": {"first_token_timeout_s": 5},
    "token_timeout_s": {"token_timeout_s": 5},
    "progress_every_s": {"progress_every_s": 1},
    "max_retries": {"max_retries": 0},
    "retry_backoff_s": {"retry_backoff_s": 2},
    "retry_backoff_max_s": {"retry_backoff_max_s": 5},
    "max_failure_rate": {"max_failure_rate": 0.5},
    "max_length_share": {"max_length_share": 1.0},
}
# what moves the fingerprint beyond IN_SETTINGS: a launch argument that changes how the server
# samples; what does not: the partitions' concurrency
MORE = {
    "extra_args_answer_shaping": ({"extra_args": ["--generation-config", "vllm"]}, True),
    "short_concurrency": ({"short": {"concurrency": 2, "max_context": None}}, False),
    "long_concurrency": ({"long": {"concurrency": 1, "max_context": None}}, False),
}


def test_each_param_moves_the_fingerprint_as_classified():
    """A line's settings fingerprint (wanted_settings) under one other value of each param: the
    params in the settings move it, the others do not."""
    assert set(OTHER) == set(RegenerateConfig.model_fields)
    card = _card()
    base = wanted_settings(RegenerateConfig(**BASE), card).fingerprint
    cases = {name: (other, name in IN_SETTINGS) for name, other in OTHER.items()} | MORE
    for name, (other, moves) in cases.items():
        now = wanted_settings(RegenerateConfig(**{**BASE, **other}), card).fingerprint
        assert (now != base) == moves, f"regenerate.{name}: in the settings is {moves}"


def answers(workdir: Path) -> dict:
    """Each line's answers as the stage kept them (messages and the generated token ids), and its
    settings fingerprint."""
    out = {}
    for row in output_rows(workdir):
        regen = row["regeneration"]
        made = json.dumps([row["messages"], regen.get("completion_token_ids")], sort_keys=True)
        out[row["id"]] = (made, regen["fingerprint"])
    return out


def regenerate_once(root: Path, name: str, card, **params) -> dict:
    """The regenerate stage (python -m stages.regenerate, its server launched and stopped) on the
    two prompts in a directory of its own: each line's answers and fingerprint."""
    workdir = root / name
    workdir.mkdir()
    stage_dir(workdir, card, prompts(2), port=free_port(), **params)
    proc = run_stage(workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    made = answers(workdir)
    assert len(made) == 2
    return made


def compare(base: dict, now: dict, name: str) -> bool:
    """Whether `now`'s answers differ from `base`'s; where a line's do, its fingerprint must."""
    differ = False
    for pid, (made, fp) in now.items():
        if made != base[pid][0]:
            differ = True
            assert fp != base[pid][1], f"{name} changed {pid}'s answers but not its settings"
    return differ


def target_copy(root: Path, source: str, name: str):
    """A copy of the target's directory and its card (as the target stage builds it)."""
    path = root / name
    shutil.copytree(source, path)
    return path, build_card(str(path), "test", None, [1, 2, 3], {})


def test_wherever_the_answers_change_the_settings_change(tmp_path, random_target):
    """The differential check of a line's settings with the batch server (backend hf, greedy):
    two prompts answered under the default params, then one change at a time (max_tokens,
    max_context, the target's weights and its chat template edited in place, operational params);
    wherever a line's answers differ from the base run's, its fingerprint differs."""
    model, card = target_copy(tmp_path, random_target.model, "target")
    base = regenerate_once(tmp_path, "base", card, max_tokens=16)

    changed = set()
    params = {
        "max_tokens": {"max_tokens": 8},
        # the prompts are about 170 tokens: the answer is cut to what is left of 180
        "max_context": {"short": {"concurrency": 32, "max_context": 180}},
    }
    for name, overrides in params.items():
        if compare(
            base, regenerate_once(tmp_path, name, card, **{"max_tokens": 16, **overrides}), name
        ):
            changed.add(name)

    operational = {  # neither the answers nor the settings
        "progress_every_s": 1,
        "first_token_timeout_s": 60,
        "max_retries": 1,
        "hf": {"max_batch": 1, "gather_ms": 0, "tie_tolerance": 0.5, "threads": 1},
        "short": {"concurrency": 1, "max_context": None},
    }
    same = regenerate_once(tmp_path, "operational", card, max_tokens=16, **operational)
    assert same == base

    backup = tmp_path / "backup"
    shutil.copytree(model, backup)

    def edited(name: str, edit) -> None:
        """The target's files edited in place (its path unchanged), the card rebuilt as the target
        stage would, the stage run; then the target put back."""
        edit()
        now = build_card(str(model), "test", None, [1, 2, 3], {})
        try:
            if compare(base, regenerate_once(tmp_path, name, now, max_tokens=16), name):
                changed.add(name)
        finally:
            shutil.rmtree(model)
            shutil.copytree(backup, model)

    def scale_weights():
        for f in model.glob("*.safetensors"):
            save_file({k: v * 1.01 for k, v in load_file(f).items()}, str(f), {"format": "pt"})

    edited("target_weights", scale_weights)
    template = model / "chat_template.jinja"
    edited(
        "chat_template",
        lambda: template.write_text("{{- 'Be brief.\\n' -}}" + template.read_text()),
    )
    assert changed == {"max_tokens", "max_context", "target_weights", "chat_template"}


def test_a_generation_config_edit_changes_the_settings(tmp_path, random_target):
    """The target's generation_config.json (its decoding defaults: repetition_penalty here) edited
    in place: the batch server decodes with its logits processors (greedy_batch.py
    greedy_generation_config), so the answers change, and so must every line's settings."""
    model, card = target_copy(tmp_path, random_target.model, "target")
    base = regenerate_once(tmp_path, "base", card, max_tokens=16)
    config = json.loads((model / "generation_config.json").read_text())
    config["repetition_penalty"] = 5.0
    (model / "generation_config.json").write_text(json.dumps(config))
    now = regenerate_once(
        tmp_path, "penalty", build_card(str(model), "test", None, [1, 2, 3], {}), max_tokens=16
    )
    assert compare(base, now, "generation_config.json"), "the edit changed no answer"


def test_sampled_answers_change_with_the_seed_and_temperature_and_so_do_the_settings(
    tmp_path, random_target
):
    """The same check where answers are sampled (backend transformers: a real `transformers serve`,
    the target's generation config with do_sample): the same seed gives the same answers, another
    seed or temperature other answers and other settings."""
    model, card = target_copy(tmp_path, random_target.model, "sampling_target")
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "do_sample": True}))
    card = build_card(str(model), "test", None, [1, 2, 3], {})
    sampled = {"backend": "transformers", "max_tokens": 8, "temperature": 1.0, "seed": 0}
    base = regenerate_once(tmp_path, "base", card, **sampled)
    assert regenerate_once(tmp_path, "again", card, **sampled) == base  # seeded: reproducible
    for name, other in {"seed": {"seed": 1}, "temperature": {"temperature": 0.5}}.items():
        assert compare(base, regenerate_once(tmp_path, name, card, **{**sampled, **other}), name)


def test_a_line_of_another_generation_config_is_superseded_one_that_predates_it_kept(
    tmp_path, random_target
):
    """Lines as the store reads them: one recording another generation config is superseded
    and the reason named ("target generation config"); one made before the setting was
    recorded (no generation_config in its settings) is taken as made under today's."""
    from draftline.core.io import write_jsonl
    from draftline.regenerate.settings import prompt_sha256
    from draftline.regenerate.store import load_finished

    model, card = target_copy(tmp_path, random_target.model, "target")
    cfg = RegenerateConfig(max_tokens=8)
    made = wanted_settings(cfg, card)
    assert made.settings["generation_config"] is not None
    older = {k: v for k, v in made.settings.items() if k != "generation_config"}
    rows = prompts(2)

    def line(row, settings):
        fp = made.fingerprint if settings == made.settings else "other"
        regen = {"fingerprint": fp, "settings": settings, "prompt_sha256": prompt_sha256(row)}
        return {**row, "regeneration": regen}

    path = tmp_path / "conversations.jsonl"
    write_jsonl(path, [line(rows[0], made.settings), line(rows[1], older)])
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "top_k": 5}))
    now = wanted_settings(cfg, card)
    assert now.fingerprint != made.fingerprint
    finished = load_finished(path, {r["id"]: r for r in rows}, now)
    assert finished.done == {rows[1]["id"]}
    assert dict(finished.plan.changed) == {"generation_config": 1}
    assert SETTING_NAMES["generation_config"] == "target generation config"
