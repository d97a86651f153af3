"""Dataset presets: the usual datasets, where each lives on the hub and how its rows read."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Preset:
    """A usual dataset: where it lives on the hub and how its rows read (its published schema)."""

    hub_id: str
    format: str
    split: str
    schema: str  # the row schema, as published on the dataset card
    name: str | None = None  # hub config
    fields: dict[str, str] = field(default_factory=dict)  # canonical field -> source column
    parse_markup: bool = False
    streaming: bool = True  # large sets: stream instead of downloading every shard first


PRESETS = {
    "sharegpt_vicuna": Preset(
        "Aeala/ShareGPT_Vicuna_unfiltered",
        "sharegpt",
        "train",
        '{"id", "conversations": [{"from": human|gpt|system|bing|chatgpt, "value"}]}',
    ),
    "ultrachat_200k": Preset(
        "HuggingFaceH4/ultrachat_200k",
        "openai",
        "train_sft",
        '{"prompt", "prompt_id", "messages": [{"content", "role"}]}',
        fields={"id": "prompt_id"},
    ),
    "open_perfectblend": Preset(
        "mlabonne/open-perfectblend",
        "sharegpt",
        "train",
        '{"conversations": [{"from", "value"}], "source"}',
    ),
    "hermes_function_calling": Preset(
        "NousResearch/hermes-function-calling-v1",
        "sharegpt",
        "train",
        '{"id", "conversations": [{"from": system|human|gpt|tool, "value"}], "category", "subcategory", "task"}; '
        "tools in the system turn's <tools> block, calls as <tool_call>, results as <tool_response>",
        name="func_calling",
        parse_markup=True,
        streaming=False,
    ),
    "mixture_of_thoughts": Preset(
        "open-r1/Mixture-of-Thoughts",
        "openai",
        "train",
        '{"messages": [{"content", "role"}], "num_tokens", "source"}; reasoning inline as <think>...</think>',
        name="all",
        parse_markup=True,
    ),
    "gsm8k": Preset(
        "openai/gsm8k",
        "prompt",
        "train",
        '{"question", "answer"}',
        name="main",
        fields={"prompt": "question"},
        streaming=False,
    ),
}
