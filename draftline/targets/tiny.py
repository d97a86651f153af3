"""The embedded tiny target: a byte-level BPE tokenizer with chat tokens, a chat template that
renders reasoning and tool calls, and a small Llama model trained for a few CPU minutes on the
generated corpus of ``draftline.targets.corpus``.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import TYPE_CHECKING

from draftline.core.config import resolve_device
from draftline.targets.corpus import generate_conversations

if TYPE_CHECKING:
    from draftline.targets.config import TinyTargetConfig

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added but not "special": a server decoding with skip_special_tokens keeps them in the text,
# as Qwen3 does with <think>. Each is one token.
MARKUP_TOKENS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]

# ChatML-style, Qwen3-like. Reasoning goes in <think>…</think> before the content; tool calls are
# JSON objects inside <tool_call>…</tool_call>; tool results in <tool_response> on a `tool` turn.
CHAT_TEMPLATE = (
    # every output string is an expression, so the whitespace control below never eats a newline
    "{%- set ns = namespace(start=0) -%}"
    "{%- if messages and messages[0].role == 'system' -%}{%- set ns.start = 1 -%}{%- endif -%}"
    "{%- if tools or ns.start == 1 -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if ns.start == 1 -%}{{- messages[0].content -}}{%- endif -%}"
    "{%- if tools -%}{{- '\\n# Tools\\n' -}}{%- for t in tools -%}{{- t | tojson -}}{{- '\\n' -}}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for m in messages[ns.start:] -%}"
    "{%- if m.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if m.reasoning_content -%}{{- '<think>' + m.reasoning_content + '</think>\\n' -}}{%- endif -%}"
    # after reasoning, the content's leading newlines are the template's own, as in Qwen3's: what
    # vLLM's qwen3 parser returns as content ("\n" + text) renders back to the same tokens
    "{%- if m.reasoning_content -%}{{- (m.content or '').lstrip('\\n') -}}"
    "{%- else -%}{{- m.content or '' -}}{%- endif -%}"
    "{%- for tc in m.tool_calls or [] -%}"
    '{{- \'<tool_call>{"name": "\' + tc.function.name + \'", "arguments": \' -}}'
    "{%- if tc.function.arguments is string -%}{{- tc.function.arguments -}}"
    "{%- else -%}{{- tc.function.arguments | tojson -}}{%- endif -%}"
    "{{- '}</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{{- '<|im_start|>tool\\n<tool_response>' + m.content + '</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE over `texts`, wrapped as a transformers fast tokenizer with the chat template."""
    # tokenizers / torch / transformers load on first use: target.source imports this module
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _batches(token_stream: list[int], seq_len: int, batch_size: int, rng: random.Random):
    """Endless random windows of seq_len+1 tokens from the concatenated corpus."""
    import torch

    limit = len(token_stream) - seq_len - 1
    data = torch.tensor(token_stream, dtype=torch.long)
    while True:
        starts = [rng.randrange(limit) for _ in range(batch_size)]
        yield torch.stack([data[s : s + seq_len + 1] for s in starts])  # (B, T+1)


def _corpus_stream(conversations: list[dict], vocab_size: int):
    """(tokenizer, token stream): the tokenizer trained on the rendered conversations, and their
    tokens concatenated in order (what the model trains on)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    # The tokenizer learns its merges from the rendered text, markup included.
    rendered = [
        render_jinja_template([c["messages"]], tools=c["tools"], chat_template=CHAT_TEMPLATE)[0][0]
        for c in conversations
    ]
    tokenizer = train_tokenizer(rendered, vocab_size)
    stream: list[int] = []
    for text in rendered:
        stream.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
    return tokenizer, stream


def _llama_config(cfg: TinyTargetConfig, tokenizer):
    """The tiny model's LlamaConfig: cfg's sizes, the tokenizer's vocabulary and eos/pad ids."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _train_model(
    model, stream: list[int], cfg: TinyTargetConfig, device, rng: random.Random, progress
) -> float:
    """Train `model` in place on random windows of `stream` (AdamW, warmup then cosine decay);
    the exponential moving average of the loss at the last step."""
    import torch

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    warmup = max(1, cfg.train_steps // 20)

    def lr_at(step: int) -> float:  # linear warmup, cosine decay to 10%
        if step < warmup:
            return (step + 1) / warmup
        t = (step - warmup) / max(1, cfg.train_steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    batches = _batches(stream, cfg.seq_len, cfg.batch_size, rng)
    ema_loss = None
    for step in range(cfg.train_steps):
        batch = next(batches).to(device)
        out = model(input_ids=batch[:, :-1], labels=batch[:, :-1])
        # labels are shifted inside the model; the extra token only keeps windows full
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss = out.loss.item()
        ema_loss = loss if ema_loss is None else 0.95 * ema_loss + 0.05 * loss
        if progress:
            progress(step + 1, cfg.train_steps, ema_loss)
    return ema_loss


def _save_target(model, tokenizer, out_dir: Path) -> None:
    """Move the model to the CPU in eval mode, give it its sampling generation config, and save
    model and tokenizer to out_dir."""
    from transformers import GenerationConfig

    model.to("cpu").eval()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def build_tiny_target(cfg: TinyTargetConfig, out_dir: Path, progress=None) -> dict:
    """Generate the corpus, train tokenizer and model (on cfg.device), save both to out_dir.
    Returns training stats."""
    import torch
    from transformers import LlamaForCausalLM

    device = resolve_device(cfg.device)

    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    conversations = generate_conversations(cfg.corpus_conversations, cfg.seed)
    tokenizer, stream = _corpus_stream(conversations, cfg.vocab_size)
    model = LlamaForCausalLM(_llama_config(cfg, tokenizer)).to(device)
    ema_loss = _train_model(model, stream, cfg, device, rng, progress)
    _save_target(model, tokenizer, out_dir)
    return {
        "final_train_loss": round(ema_loss, 4),
        "train_steps": cfg.train_steps,
        "corpus_conversations": len(conversations),
        "corpus_tokens": len(stream),
        "parameters": sum(p.numel() for p in model.parameters()),
    }
