import pytest

from draftline.corpus import generate_conversations
from draftline.tiny import CHAT_TEMPLATE, train_tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The tiny target's tokenizer, trained on a small slice of its corpus (a second or two)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    convs = generate_conversations(400, 7)
    texts = [
        render_jinja_template([c["messages"]], tools=c["tools"], chat_template=CHAT_TEMPLATE)[0][0]
        for c in convs
    ]
    return train_tokenizer(texts, 512)


@pytest.fixture(scope="session")
def random_target(tmp_path_factory, tiny_tokenizer):
    """A small random-weight Llama chat model saved with the tiny tokenizer, and its card."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftline.target import build_card

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("random_target")
    config = LlamaConfig(
        vocab_size=len(tiny_tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=tiny_tokenizer.eos_token_id,
        pad_token_id=tiny_tokenizer.pad_token_id,
        bos_token_id=None,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return build_card(str(path), "test", None, [1, 2, 3], {})


@pytest.fixture(scope="session")
def vocab_dir(tmp_path_factory, random_target):
    """d2t/t2d over the first half of the target vocabulary (offsets all zero)."""
    import numpy as np

    path = tmp_path_factory.mktemp("vocab")
    size = random_target.vocab_size // 2
    np.save(path / "d2t.npy", np.zeros(size, dtype=np.int64))
    t2d = np.zeros(random_target.vocab_size, dtype=bool)
    t2d[:size] = True
    np.save(path / "t2d.npy", t2d)
    return path


@pytest.fixture(scope="session")
def eagle3_draft_dir(tmp_path_factory, random_target, vocab_dir):
    """A draft of the original EAGLE-3 architecture (train.architecture: eagle3), its trained parts
    moved off their initialisation, saved in speculators format."""
    import torch

    from draftline.draft_model import build_draft

    torch.manual_seed(5)
    model = build_draft(random_target, vocab_dir, 1, 3, architecture="eagle3")
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.1)
    path = tmp_path_factory.mktemp("eagle3_draft")
    model.save_pretrained(path)
    return path
