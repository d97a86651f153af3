"""Write the bundled sample datasets, in two real formats, from draftline.targets.corpus.

    python scripts/make_sample_datasets.py datasets/samples

- sharegpt.jsonl: ShareGPT/Vicuna rows {"id", "conversations": [{"from", "value"}], "tools"?: JSON
  string}; reasoning inline as <think>…</think>\\n, tool calls inline as <tool_call>{…}</tool_call>.
- openai_messages.jsonl: OpenAI rows {"messages": [...], "tools"?: list}, with reasoning_content,
  tool_calls and tool turns carrying tool_call_id; no ids (prepare derives them from content).

Each file holds GOOD_ROWS distinct conversations plus a few deliberately bad rows (see the
bad_* functions), spread through the file, so prepare's filters are exercised; the tests count
them. Seeds differ from the tiny target's corpus seed (1234) so the samples are not its training data.
"""

import json
import sys
from pathlib import Path

from draftline.targets.corpus import generate_conversations

GOOD_ROWS = 594  # + 6 bad rows = 600 lines per file
SHAREGPT_SEED, OPENAI_SEED = 2024, 2025
SHAREGPT_FROM = {"system": "system", "user": "human", "assistant": "gpt", "tool": "tool"}


def distinct_rows(rows, n: int) -> list[dict]:
    """The first n rows with no exact repeats (the corpus repeats short prose, and ShareGPT drops
    the call ids that make tool conversations differ), so the only duplicate is the deliberate one."""
    seen, out = set(), []
    for row in rows:
        key = json.dumps(row, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(row)
        if len(out) == n:
            return out
    raise RuntimeError(f"corpus gave fewer than {n} distinct rows")


def sharegpt_value(message: dict) -> str:
    """An assistant message rendered as the chat template would: <think>, content, <tool_call>s."""
    think = (
        f"<think>{message['reasoning_content']}</think>\n"
        if message.get("reasoning_content")
        else ""
    )
    calls = "".join(
        "<tool_call>"
        + json.dumps(
            {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
        )
        + "</tool_call>"
        for c in message.get("tool_calls", [])
    )
    return think + (message.get("content") or "") + calls


def to_sharegpt(conv: dict) -> dict:
    turns = [
        {
            "from": SHAREGPT_FROM[m["role"]],
            "value": sharegpt_value(m) if m["role"] == "assistant" else m["content"],
        }
        for m in conv["messages"]
    ]
    row = {"conversations": turns}
    if conv["tools"]:
        row["tools"] = json.dumps(
            conv["tools"]
        )  # ShareGPT datasets usually store tools as a JSON string
    return row


def to_openai(conv: dict) -> dict:
    return {"messages": conv["messages"], **({"tools": conv["tools"]} if conv["tools"] else {})}


def bad_sharegpt_lines(good: list[str]) -> list[str]:
    """One line per filter: malformed_json, no_user_turn, empty, duplicate, invalid_role_order, invalid_tools_json."""
    dup = json.loads(good[3])
    dup["id"] = "sharegpt-bad-duplicate"  # new id, same content: still a duplicate
    rows = [
        {
            "id": "sharegpt-bad-no-user",
            "conversations": [
                {"from": "system", "value": "You are a helpful assistant."},
                {"from": "gpt", "value": "Hello!"},
            ],
        },
        {"id": "sharegpt-bad-empty", "conversations": []},
        dup,
        {
            "id": "sharegpt-bad-order",
            "conversations": [
                {"from": "gpt", "value": "Hi, ask me anything."},
                {"from": "human", "value": "What is 2 + 2?"},
            ],
        },
        {
            "id": "sharegpt-bad-tools",
            "tools": '[{"type": "function", ',
            "conversations": [
                {"from": "human", "value": "What is the weather in Oslo?"},
                {"from": "gpt", "value": "Cold."},
            ],
        },
    ]
    return ['{"id": "sharegpt-bad-json", "conversations": [{"from": "human", "value": "cut off'] + [
        json.dumps(r) for r in rows
    ]


def bad_openai_lines(good: list[str]) -> list[str]:
    """One line per filter: malformed_json, no_user_turn, empty, duplicate (verbatim), invalid_role_order x2."""
    rows = [
        {
            "messages": [
                {"role": "system", "content": "Answer briefly."},
                {"role": "assistant", "content": "Sure."},
            ]
        },
        {"messages": []},
        {
            "messages": [
                {"role": "user", "content": "What is the weather in Lima?"},
                {"role": "tool", "tool_call_id": "call_x", "content": '{"sky": "foggy"}'},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Bye"},
            ]
        },
    ]
    return ['{"messages": [{"role": "user", "content": "cut', good[5]] + [
        json.dumps(r) for r in rows
    ]


def interleave(good: list[str], bad: list[str]) -> list[str]:
    """Bad lines spread evenly through the good ones, at fixed positions."""
    out = list(good)
    for k, line in enumerate(bad):
        out.insert((k + 1) * len(out) // (len(bad) + 1), line)
    return out


def main(out_dir: str = "datasets/samples") -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    conversations = generate_conversations(4 * GOOD_ROWS, SHAREGPT_SEED)
    sharegpt = [
        json.dumps({"id": f"sharegpt-{i:04d}", **row})
        for i, row in enumerate(distinct_rows(map(to_sharegpt, conversations), GOOD_ROWS))
    ]
    conversations = generate_conversations(4 * GOOD_ROWS, OPENAI_SEED)
    openai = [json.dumps(row) for row in distinct_rows(map(to_openai, conversations), GOOD_ROWS)]
    for name, good, bad in (
        ("sharegpt.jsonl", sharegpt, bad_sharegpt_lines(sharegpt)),
        ("openai_messages.jsonl", openai, bad_openai_lines(openai)),
    ):
        lines = interleave(good, bad)
        with open(out / name, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"{out / name}: {len(lines)} lines ({len(bad)} deliberately bad)")


if __name__ == "__main__":
    main(*sys.argv[1:])
