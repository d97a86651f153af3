"""Dataset presets: the usual datasets, where each lives on the hub and how its rows read; and the
standard benchmark sets drafts are compared on (`eval_only`: named in evaluate.sets, never trained on)."""

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
    data_files: str | None = None  # hub files read (a set stored as one file per category)
    # a benchmark set: only evaluated on (evaluate.sets), never a source of train prompts
    eval_only: bool = False


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


# Standard benchmark sets, as peers publish acceptance on them. Each is a dataset whose rows all go
# to evaluation (evaluate.sets names it); its prompt is the first user turn, and MT-Bench's second
# turn is asked after the target's own answer to the first. HumanEval is here for users who compare
# with published figures; this project neither bundles it nor trains or tunes on it.
EVAL_PRESETS = {
    "mt_bench": Preset(
        "HuggingFaceH4/mt_bench_prompts",
        "prompt",
        "train",
        '{"prompt": [turn 1, turn 2], "prompt_id", "category", "reference"}',
        fields={"id": "prompt_id", "source": "category"},
        streaming=False,
        eval_only=True,
    ),
    "humaneval": Preset(
        "openai/openai_humaneval",
        "prompt",
        "test",
        '{"task_id", "prompt", "canonical_solution", "test", "entry_point"}',
        fields={"id": "task_id"},
        streaming=False,
        eval_only=True,
    ),
    "gsm8k_test": Preset(
        "openai/gsm8k",
        "prompt",
        "test",
        '{"question", "answer"}',
        name="main",
        fields={"prompt": "question"},
        streaming=False,
        eval_only=True,
    ),
    "math500": Preset(
        "HuggingFaceH4/MATH-500",
        "prompt",
        "test",
        '{"problem", "solution", "answer", "subject", "level", "unique_id"}',
        fields={"prompt": "problem", "id": "unique_id", "source": "subject"},
        streaming=False,
        eval_only=True,
    ),
    # speculators' benchmark prompts, one file per category (coding, math, QA, RAG, summarization,
    # tool calls, translation, writing); data_files picks one, e.g. math_reasoning.jsonl (its
    # HumanEval.jsonl is HumanEval's prompts)
    "speculator_benchmarks": Preset(
        "RedHatAI/speculator_benchmarks",
        "prompt",
        "train",
        '{"prompt"} per file <category>.jsonl',
        data_files="math_reasoning.jsonl",
        streaming=False,
        eval_only=True,
    ),
}
PRESETS = {**PRESETS, **EVAL_PRESETS}
