"""Stage `tokenize`: regenerated conversations -> speculators Arrow layout + token frequencies.

    python -m stages.tokenize models/target/card.json datasets/prompts/train.jsonl \
        datasets/regenerated/conversations.jsonl datasets/tokenized reports/tokenize.json

Rows follow the prompt order of train.jsonl (hidden-state file hs_{i} is row i). Columns:
`id`, `input_ids`, `loss_mask`, `seq_len`. token_freq.pt counts trainable tokens only.
"""

import sys
from pathlib import Path

from draftline.config import stage_params


def main(card_path: str, prompts_path: str, regenerated_path: str, out_dir: str, report_path: str) -> None:
    params = stage_params()
    cfg = params.tokenize
    from datasets import Dataset
    from rich.progress import track
    from speculators.train.vocab_mapping import save_token_frequency_distribution
    from transformers import AutoTokenizer

    from draftline.chat import TemplateMismatch, tokenize_conversation
    from draftline.io import read_json, read_jsonl, write_json, write_meta

    card = read_json(card_path)
    tokenizer = AutoTokenizer.from_pretrained(card["model"], revision=card.get("revision"))
    regenerated = {row["id"]: row for row in read_jsonl(regenerated_path)}
    order = [row["id"] for row in read_jsonl(prompts_path) if row["id"] in regenerated]

    columns = {"id": [], "input_ids": [], "loss_mask": [], "seq_len": []}
    skipped = {"template_mismatch": 0, "no_trainable_tokens": 0}
    truncated = tokens = trainable = 0
    for pid in track(order, description="tokenize"):
        row = regenerated[pid]
        try:
            enc = tokenize_conversation(tokenizer, row["messages"], row.get("tools"), cfg.max_length)
        except TemplateMismatch:
            skipped["template_mismatch"] += 1
            continue
        if not any(enc["loss_mask"]):
            skipped["no_trainable_tokens"] += 1
            continue
        truncated += enc["truncated"]
        tokens += len(enc["input_ids"])
        trainable += sum(enc["loss_mask"])
        columns["id"].append(pid)
        columns["input_ids"].append(enc["input_ids"])
        columns["loss_mask"].append(enc["loss_mask"])
        columns["seq_len"].append(len(enc["input_ids"]))
    if not columns["id"]:
        raise SystemExit(f"error: tokenize produced no rows (skipped: {skipped})")

    out = Path(out_dir)
    dataset = Dataset.from_dict(columns)
    dataset.set_format(type="torch", columns=["input_ids", "loss_mask", "seq_len"], output_all_columns=True)
    dataset.save_to_disk(str(out))
    save_token_frequency_distribution(dataset, out / "token_freq.pt")
    write_meta(out, "tokenize", cfg.model_dump(), chat_template_sha256=card["chat_template_sha256"])
    report = {
        "conversations": len(columns["id"]),
        "missing_regenerations": sum(1 for r in read_jsonl(prompts_path)) - len(order),
        "skipped": skipped,
        "tokens": tokens,
        "trainable_tokens": trainable,
        "trainable_fraction": round(trainable / tokens, 4),
        "truncated": truncated,
        "max_length": cfg.max_length,
    }
    write_json(report_path, report)
    print(f"tokenize: {report['conversations']} conversations, {tokens} tokens, "
          f"{report['trainable_fraction']:.1%} trainable, {truncated} truncated")


if __name__ == "__main__":
    main(*sys.argv[1:])
