"""Run by vLLM's python (tests/evaluate/test_vllm.py): answer texts through vLLM's own reasoning and
tool-call parsers, reasoning first and tool calls in what is left, as its chat server applies
them. argv: tokenizer dir, cases.json ([{"text", "tools"}]), out.json; every pair of
REASONING x TOOL_CALLS, a parser that refuses the tokenizer recorded with its error."""

import json
import sys

REASONING = ["qwen3", "deepseek_r1"]
TOOL_CALLS = ["hermes", "qwen3_xml", "llama3_json", "mistral"]


def parse(reasoner, tool_parser, case: dict) -> dict:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    request = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "-"}], tools=case["tools"] or None
    )
    reasoning, content = reasoner.extract_reasoning(case["text"], request)
    calls = tool_parser.extract_tool_calls(content or "", request)
    if calls.tools_called:
        content = calls.content
    return {
        "reasoning_content": reasoning,
        "content": content or "",
        "tool_calls": [
            {"name": c.function.name, "arguments": c.function.arguments} for c in calls.tool_calls
        ]
        if calls.tools_called
        else [],
    }


def main(tokenizer_dir: str, cases_path: str, out_path: str) -> None:
    from transformers import AutoTokenizer
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    with open(cases_path) as f:
        cases = json.load(f)
    out = {}
    for r in REASONING:
        for t in TOOL_CALLS:
            try:
                reasoner = ReasoningParserManager.get_reasoning_parser(r)(tokenizer)
                tool_parser = ToolParserManager.get_tool_parser(t)(tokenizer)
            except Exception as err:  # noqa: BLE001 - a parser that cannot read this vocabulary
                out[f"{r}+{t}"] = {"refused": f"{type(err).__name__}: {err}"}
                continue
            out[f"{r}+{t}"] = {"messages": [parse(reasoner, tool_parser, c) for c in cases]}
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
