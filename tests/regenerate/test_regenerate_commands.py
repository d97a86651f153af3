"""vLLM's and SGLang's regeneration launch commands against their documented flags."""

import argparse
import json

import pytest
import yaml
from regenerate_support import ROOT

from draftline.core.config import ParamsError
from draftline.engines.commands import (
    ServeSettings,
    sglang_regenerate_command,
    vllm_regenerate_command,
)
from draftline.params import parse_params


def vllm_serve_parser() -> argparse.ArgumentParser:
    """The flags used, as vLLM defines them: EngineArgs.add_cli_args in vllm/engine/arg_utils.py
    (--served-model-name nargs=+, -tp/-dp aliases, --max-model-len, --reasoning-parser, --revision,
    --speculative-config) and FrontendArgs in vllm/entrypoints/openai/cli_args.py (--host, --port,
    --enable-auto-tool-choice, --tool-call-parser)."""
    p = argparse.ArgumentParser(prog="vllm.entrypoints.openai.api_server", allow_abbrev=False)
    p.add_argument("--model", dest="model_tag")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--revision")
    p.add_argument("--reasoning-parser")
    p.add_argument(
        "--enable-auto-tool-choice", action=argparse.BooleanOptionalAction, default=False
    )
    p.add_argument("--tool-call-parser")
    p.add_argument("--gpu-memory-utilization", type=float)
    p.add_argument("--speculative-config", type=json.loads)
    return p


def sglang_launch_parser() -> argparse.ArgumentParser:
    """The flags used, as SGLang's ServerArgs (python/sglang/srt/server_args.py) defines them:
    --model-path (alias --model), --host, --port, --served-model-name, --tp-size (alias
    --tensor-parallel-size), --dp-size (alias --data-parallel-size), --context-length, --revision,
    --reasoning-parser, --tool-call-parser, --speculative-algorithm."""
    p = argparse.ArgumentParser(prog="sglang.launch_server", allow_abbrev=False)
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--served-model-name")
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", type=int, default=1)
    p.add_argument("--context-length", type=int)
    p.add_argument("--revision")
    p.add_argument("--reasoning-parser")
    p.add_argument("--tool-call-parser")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--speculative-algorithm")
    return p


def test_vllm_command_uses_documented_flags():
    cmd = vllm_regenerate_command(
        ServeSettings(
            "Qwen/Qwen3-8B",
            "0.0.0.0",
            8000,
            served_name="Qwen/Qwen3-8B",
            revision="abc123",
            tensor_parallel_size=4,
            data_parallel_size=2,
            max_model_len=32768,
            reasoning_parser="qwen3",
            tool_call_parser="hermes",
            extra_args=["--gpu-memory-utilization", "0.85"],
        )
    )
    assert cmd[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "Qwen/Qwen3-8B"]
    args, unknown = vllm_serve_parser().parse_known_args(cmd[3:])
    assert not unknown
    assert (args.model_tag, args.served_model_name, args.port, args.revision) == (
        "Qwen/Qwen3-8B",
        ["Qwen/Qwen3-8B"],
        8000,
        "abc123",
    )
    assert (args.tensor_parallel_size, args.data_parallel_size, args.max_model_len) == (4, 2, 32768)
    assert (
        args.reasoning_parser == "qwen3"
        and args.enable_auto_tool_choice
        and args.tool_call_parser == "hermes"
    )
    assert args.gpu_memory_utilization == 0.85 and args.speculative_config is None
    bare, unknown = vllm_serve_parser().parse_known_args(
        vllm_regenerate_command(ServeSettings("m", "h", 1))[3:]
    )
    assert not unknown and not bare.enable_auto_tool_choice and bare.max_model_len is None


def test_sglang_command_uses_documented_flags():
    cmd = sglang_regenerate_command(
        ServeSettings(
            "/models/glm",
            "0.0.0.0",
            30000,
            served_name="glm",
            tensor_parallel_size=8,
            data_parallel_size=2,
            max_model_len=65536,
            reasoning_parser="glm45",
            tool_call_parser="glm45",
            extra_args=["--mem-fraction-static", "0.8"],
        )
    )
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    args, unknown = sglang_launch_parser().parse_known_args(cmd[3:])
    assert not unknown
    assert (args.model_path, args.served_model_name, args.port, args.tp_size, args.dp_size) == (
        "/models/glm",
        "glm",
        30000,
        8,
        2,
    )
    assert (args.context_length, args.reasoning_parser, args.tool_call_parser) == (
        65536,
        "glm45",
        "glm45",
    )
    assert args.mem_fraction_static == 0.8 and args.speculative_algorithm is None


@pytest.mark.parametrize(
    "regenerate, key",
    [
        (
            {"backend": "vllm", "extra_args": ["--speculative-config", "{}"]},
            "regenerate.extra_args",
        ),
        (
            {"backend": "sglang", "extra_args": ["--speculative-algorithm", "EAGLE3"]},
            "regenerate.extra_args",
        ),
        ({"backend": "external"}, "regenerate.endpoints"),
        ({"backend": "external", "endpoints": ["http://h:1"]}, "regenerate.external_engine"),
        ({"endpoints": ["http://h:1"]}, "regenerate.endpoints"),
        ({"reasoning_parser": "qwen3"}, "regenerate.reasoning_parser"),
        (
            {"temperature": 0.5, "temperatures": [{"value": 1.0, "weight": 1}]},
            "regenerate.temperatures",
        ),
        ({"short": {"concurrency": 0}}, "regenerate.short.concurrency"),
        ({"request_timeout_s": 120}, "replaced by first_token_timeout_s"),
        ({"server_slots": 0}, "regenerate.server_slots"),
    ],
)
def test_bad_regenerate_params_name_the_key(regenerate, key):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["regenerate"].update(regenerate)
    with pytest.raises(ParamsError, match=key.replace(".", r"\.")):
        parse_params(raw)
