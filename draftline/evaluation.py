"""Loading the trained draft for inference and turning eval prompts into token ids."""

from __future__ import annotations

from pathlib import Path


def load_draft(draft_dir: str | Path, device: str):
    """The saved draft with verifier weights restored, eager attention, eval mode."""
    from speculators.models.eagle3 import Eagle3DraftModel

    draft = Eagle3DraftModel.from_pretrained(str(draft_dir))
    # Our incremental decoder passes dense float masks; flex attention would need block masks.
    draft.config.transformer_layer_config._attn_implementation = "eager"  # noqa: SLF001
    for layer in draft.layers:
        layer.self_attn.config._attn_implementation = "eager"  # noqa: SLF001
    return draft.to(device).eval()


def first_turn_prompt(row: dict) -> list[dict]:
    """The messages before the first assistant turn: what the model is asked to answer."""
    prompt = []
    for m in row["messages"]:
        if m["role"] == "assistant":
            break
        prompt.append(m)
    return prompt


def prompt_ids(tokenizer, row: dict) -> list[int]:
    return tokenizer.apply_chat_template(
        first_turn_prompt(row), tools=row.get("tools") or None, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def eos_ids(tokenizer, model) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
