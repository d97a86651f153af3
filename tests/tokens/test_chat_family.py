"""Loss masks for the templates of the DeepSeek-V3 / Kimi-K2 family (the user's targets): the
decoded masked-in tokens are exactly the assistant turns, written out by hand from each template's
structure; the Kimi-K2-style template keeps reasoning only after the last user message and takes a
`thinking` switch, which reaches the tokenizer as it reaches the server."""

import json

import pytest
from family_targets import deepseek_tokenizer, kimi_tokenizer

from draftline.tokens.chat import render, tokenize_conversation
from tests.tokens.test_chat import WEATHER, assert_rows_are_renders, masked_runs


def kimi_call(index: int, city: str):
    return {
        "id": f"functions.get_weather:{index}",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
    }


@pytest.fixture(scope="module")
def deepseek(tiny_tokenizer):
    return deepseek_tokenizer(tiny_tokenizer)


@pytest.fixture(scope="module")
def kimi(tiny_tokenizer):
    return kimi_tokenizer(tiny_tokenizer)


def test_deepseek_v3_template(deepseek):
    tok = deepseek
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [kimi_call(0, "Paris") | {"type": "function"}],
        },
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": '{"sky": "sunny"}'},
        {"role": "assistant", "content": "It is sunny in Paris."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You are welcome."},
    ]
    rows = tokenize_conversation(tok, messages, [WEATHER], 4096)
    assert len(rows) == 1
    assert masked_runs(tok, rows) == [
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
        "It is sunny in Paris.<｜end▁of▁sentence｜>",
        "You are welcome.<｜end▁of▁sentence｜>",
    ]
    assert_rows_are_renders(tok, rows, messages, [WEATHER])
    context = tok.decode([t for t, m in zip(rows[0]["input_ids"], rows[0]["loss_mask"]) if not m])
    assert context.startswith("<｜begin▁of▁sentence｜>You are helpful.\n\n## Tools")
    assert "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>" in context and context.endswith(
        "<｜User｜>Thanks!<｜Assistant｜>"
    )


def kimi_conversation():
    return [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "reasoning_content": "Need the weather tool.",
            "content": "",
            "tool_calls": [kimi_call(0, "Paris")],
        },
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": '{"sky": "sunny"}'},
        {
            "role": "assistant",
            "reasoning_content": "The tool says sunny.",
            "content": "It is sunny in Paris.",
        },
        {"role": "user", "content": "And in Rome?"},
        {
            "role": "assistant",
            "reasoning_content": "Call again for Rome.",
            "content": "Let me check.",
            "tool_calls": [kimi_call(1, "Rome")],
        },
        {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": '{"sky": "rainy"}'},
        {"role": "assistant", "reasoning_content": "Rainy.", "content": "It is rainy in Rome."},
    ]


def test_kimi_k2_thinking_template(kimi):
    tok, messages = kimi, kimi_conversation()
    rows = tokenize_conversation(tok, messages, [WEATHER], 4096)
    section = (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:{i}<|tool_call_argument_begin|>"
        '{{"city": "{city}"}}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
    )
    assert masked_runs(tok, rows) == [
        "<think>Need the weather tool.</think>" + section.format(i=0, city="Paris"),
        "<think>The tool says sunny.</think>It is sunny in Paris.<|im_end|>",
        "<think>Call again for Rome.</think>Let me check." + section.format(i=1, city="Rome"),
        "<think>Rainy.</think>It is rainy in Rome.<|im_end|>",
    ]
    # the full render shows the first answers' reasoning as an empty <think></think>: they get a row of their own
    assert [r["messages"] for r in rows] == [4, 8]
    assert "Need the weather tool." not in render(tok, messages, [WEATHER])
    assert_rows_are_renders(tok, rows, messages, [WEATHER])
    masked = "".join(masked_runs(tok, rows))
    assert (
        "## Return of" not in masked
        and "tool_declare" not in masked
        and "<|im_user|>" not in masked
    )


def test_kimi_thinking_switch_reaches_the_tokenizer(kimi):
    """thinking=false: the generation prompt pre-fills an empty <think></think>, so the model wrote only the answer."""
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    assert masked_runs(
        kimi, tokenize_conversation(kimi, messages, None, 512, template_kwargs={"thinking": False})
    ) == ["Hello.<|im_end|>"]
    assert masked_runs(kimi, tokenize_conversation(kimi, messages, None, 512)) == [
        "<think></think>Hello.<|im_end|>"
    ]


def test_thinking_switch_reaches_a_real_server_as_the_tokenizer(kimi, tmp_path):
    """A `transformers serve` on a Kimi-template target: the server renders the probe with
    regenerate.chat_template_kwargs exactly as the local tokenizer does (the preflight compares the
    prompt token counts), with the switch as a server default and per request."""
    import torch
    from regenerate_support import free_port
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftline.engines.preflight import (
        PROBE_MESSAGES,
        PreflightError,
        ServedTarget,
        preflight_regeneration,
    )
    from draftline.engines.servers import ManagedServer, server_env
    from draftline.regenerate.config import RegenerateConfig
    from draftline.regenerate.launch import regenerate_command
    from draftline.targets.model import build_card
    from draftline.tokens.chat import chat_prompt_ids

    torch.manual_seed(0)
    model_dir = tmp_path / "kimi_target"
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(kimi),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=2,
            num_key_value_heads=1,
            eos_token_id=kimi.eos_token_id,
            pad_token_id=kimi.pad_token_id,
            bos_token_id=None,
        )
    ).save_pretrained(model_dir)
    kimi.save_pretrained(model_dir)
    card = build_card(str(model_dir), "test", None, [1, 2, 3], {})
    kwargs = {"thinking": False}
    off, on = (len(chat_prompt_ids(kimi, PROBE_MESSAGES, None, k)) for k in (kwargs, {}))
    assert off == on + 2  # the pre-filled <think></think>

    def render(chat_template_kwargs):
        return lambda messages, tools: chat_prompt_ids(kimi, messages, tools, chat_template_kwargs)

    port = free_port()
    cfg = RegenerateConfig(backend="transformers", port=port, chat_template_kwargs=kwargs)
    command = regenerate_command(cfg, card, card.model)
    assert command[command.index("--chat-template-kwargs") + 1] == '{"thinking": false}'
    with ManagedServer(
        command,
        server_env(tmp_path / "hf"),
        f"http://127.0.0.1:{port}",
        tmp_path / "server.log",
        300,
    ) as url:
        assert (
            preflight_regeneration(
                url, "transformers", ServedTarget(card.model, render(kwargs), kwargs)
            )["probe_prompt_tokens"]
            == off
        )
        # a client that forgets the switch still gets the server's default: counted as thinking off, not as the tokenizer's
        with pytest.raises(PreflightError, match=f"server counts {off} prompt tokens"):
            preflight_regeneration(url, "transformers", ServedTarget(card.model, render({})))
