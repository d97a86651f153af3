"""A seeded generator of chat conversations with learnable structure.

It feeds two things: the training corpus of the embedded tiny target, and the bundled sample
datasets (written once by ``scripts/make_sample_datasets.py`` in real dataset formats). Four kinds
of conversation, each with a fixed shape a small model can learn and a draft can predict:

- arithmetic with reasoning (``reasoning_content``: the worked sum; ``content``: the answer);
- tool calls with JSON arguments, the tool's result, and an answer that reads the result;
- templated prose about animals from a fixed fact table;
- short multi-turn chats about colours and counting.

Conversations are OpenAI-style dicts: ``{"messages": [...], "tools": [...] | None}``.
"""

from __future__ import annotations

import json
import random

ANIMALS = {
    "cat": ("small", "house", "fish", "purrs"),
    "dog": ("loyal", "yard", "meat", "barks"),
    "horse": ("strong", "field", "hay", "neighs"),
    "owl": ("quiet", "forest", "mice", "hoots"),
    "frog": ("green", "pond", "flies", "croaks"),
    "bee": ("busy", "hive", "nectar", "buzzes"),
    "cow": ("calm", "farm", "grass", "moos"),
    "wolf": ("wild", "mountain", "deer", "howls"),
    "duck": ("noisy", "lake", "seeds", "quacks"),
    "lion": ("proud", "savanna", "zebras", "roars"),
}
CITIES = {
    "Paris": ("sunny", 21),
    "London": ("rainy", 14),
    "Tokyo": ("cloudy", 18),
    "Cairo": ("hot", 33),
    "Oslo": ("snowy", -2),
    "Lima": ("foggy", 16),
    "Rome": ("windy", 19),
    "Delhi": ("humid", 30),
}
COLORS = ["red", "blue", "green", "yellow", "purple", "orange", "white", "black"]
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a concise assistant.",
    "Answer briefly and clearly.",
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add_numbers",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]


def _maybe_system(rng: random.Random) -> list[dict]:
    return [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}] if rng.random() < 0.3 else []


def arithmetic(rng: random.Random) -> dict:
    a, b = rng.randint(1, 20), rng.randint(1, 20)
    op = rng.choice(["+", "-", "*"])
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    word = {"+": "plus", "-": "minus", "*": "times"}[op]
    question = rng.choice(
        [f"What is {a} {op} {b}?", f"Compute {a} {word} {b}.", f"How much is {a} {word} {b}?"]
    )
    return {
        "messages": _maybe_system(rng)
        + [
            {"role": "user", "content": question},
            {
                "role": "assistant",
                "reasoning_content": f"We need {a} {op} {b}. {a} {op} {b} = {value}.",
                "content": f"The answer is {value}.",
            },
        ],
        "tools": None,
    }


def tool_call(rng: random.Random) -> dict:
    if rng.random() < 0.6:
        city = rng.choice(sorted(CITIES))
        sky, temp = CITIES[city]
        name, args = "get_weather", {"city": city}
        result = {"city": city, "sky": sky, "temperature": temp}
        question = rng.choice(
            [f"What is the weather in {city}?", f"How is the weather in {city} today?"]
        )
        answer = f"It is {sky} in {city}, {temp} degrees."
    else:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        name, args = "add_numbers", {"a": a, "b": b}
        result = {"sum": a + b}
        question = f"Use the tool to add {a} and {b}."
        answer = f"The sum of {a} and {b} is {a + b}."
    call_id = f"call_{rng.randrange(16**8):08x}"
    return {
        "messages": _maybe_system(rng)
        + [
            {"role": "user", "content": question},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)},
            {"role": "assistant", "content": answer},
        ],
        "tools": TOOLS,
    }


def prose(rng: random.Random) -> dict:
    animal = rng.choice(sorted(ANIMALS))
    adj, home, food, sound = ANIMALS[animal]
    question = rng.choice(
        [
            f"Tell me about the {animal}.",
            f"Describe the {animal}.",
            f"What do you know about the {animal}?",
        ]
    )
    answer = (
        f"The {animal} is a {adj} animal. It lives in the {home} and eats {food}. "
        f"When it is happy, the {animal} {sound}."
    )
    return {
        "messages": _maybe_system(rng)
        + [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
        "tools": None,
    }


def multi_turn(rng: random.Random) -> dict:
    colors = rng.sample(COLORS, rng.randint(2, 4))
    listed = ", ".join(colors)
    return {
        "messages": _maybe_system(rng)
        + [
            {"role": "user", "content": f"My favourite colours are {listed}."},
            {"role": "assistant", "content": f"Nice! You like {listed}."},
            {"role": "user", "content": "How many colours is that?"},
            {"role": "assistant", "content": f"That is {len(colors)} colours: {listed}."},
        ],
        "tools": None,
    }


KINDS = {"arithmetic": arithmetic, "tool_call": tool_call, "prose": prose, "multi_turn": multi_turn}


def generate_conversations(n: int, seed: int, kinds: list[str] | None = None) -> list[dict]:
    """n conversations, drawn uniformly over `kinds` (default: all), reproducible from `seed`."""
    rng = random.Random(seed)
    names = kinds or sorted(KINDS)
    return [KINDS[rng.choice(names)](rng) for _ in range(n)]
