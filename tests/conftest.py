import os

# Torch in the test process (fixtures, in-process stages) waits for work without spinning: with
# `make test`'s two workers on two cores a spinning pool would take the other worker's core (the
# 10x slowdown draftline/core/threads.py describes). Set before anything imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402

from draftline.core.log import setup_logging  # noqa: E402
from draftline.targets.corpus import generate_conversations  # noqa: E402
from draftline.targets.tiny import CHAT_TEMPLATE, train_tokenizer  # noqa: E402

# The longest files first (each about a minute or more on the 2-core machine, longest first):
# `make test` hands whole files to its two workers in this order (pytest-xdist --dist loadfile
# --no-loadscope-reorder), so no long file starts last and runs alone at the end. Within a file the
# order stays as written (the e2e tests build on each other).
setup_logging()  # the library's messages on stdout, as the entry points set them up (capsys reads them)

LONGEST_FIRST = [
    "test_pipeline_e2e.py",
    "test_vllm.py",
    "test_overhead.py",
    "test_gpu_check.py",
    "test_regenerate_real_server.py",
    "test_regenerate_slow_server.py",
    "test_regenerate_resume.py",
    "test_regenerate_key.py",
    "test_regenerate_replay.py",
    "test_batch_server.py",
    "test_conversation_store.py",
    "test_prepare_dvc.py",
    "test_gguf_target.py",
    "test_engines.py",
    "test_train.py",
    "test_deepseek_v3_target.py",
    "test_hidden.py",
]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept


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
    return random_llama(tmp_path_factory.mktemp("random_target"), tiny_tokenizer)


def random_llama(path, tokenizer, **overrides):
    """random_target's model in `path` (LlamaConfig fields in `overrides`), and its card."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftline.targets.model import build_card

    torch.manual_seed(0)
    config = LlamaConfig(
        **{
            "vocab_size": len(tokenizer),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 5,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 1024,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": None,
            **overrides,
        }
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
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

    from draftline.draft.model import build_draft
    from draftline.train.config import TrainConfig

    torch.manual_seed(5)
    model = build_draft(random_target, vocab_dir, TrainConfig(architecture="eagle3"))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.1)
    path = tmp_path_factory.mktemp("eagle3_draft")
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def trained_draft(tmp_path_factory, random_target):
    """A draft that has learned its target: the random target with a sharpened lm_head (the same
    argmax everywhere, peaked distributions to learn; its own card), and a draft over the whole
    target vocabulary trained by the built-in loop (draftline.train.run.train_draft, 40 steps, ~10 s)
    on that target's 40-token greedy answers to the first turns of `conversations`, so speculative
    decoding of those prompts accepts draft tokens (acceptance length ~1.3-2.6 at k = 1 and 3).
    Returns (card, draft dir, conversations, their first-turn prompt ids)."""
    return train_a_draft(tmp_path_factory.mktemp("trained_draft"), random_target)


def train_a_draft(root, random_target):
    """trained_draft's recipe in `root` for any random target card (tests/evaluate/test_vllm.py uses one
    whose attention vLLM's CPU build runs)."""
    from types import SimpleNamespace

    import numpy as np
    import torch

    from datasets import Dataset
    from draftline.core.io import write_json
    from draftline.draft import model as draft_model
    from draftline.evaluate.specdec import greedy_generate
    from draftline.hidden_states.capture import capture
    from draftline.hidden_states.files import hs_path, save_hidden_states
    from draftline.targets.model import build_card, load_target
    from draftline.tokens.chat import first_turn_ids
    from draftline.train import resume as train_state
    from draftline.train import run as training
    from draftline.train.config import TrainConfig
    from draftline.train.data import TrainingData

    model, tokenizer = load_target(random_target)
    with torch.no_grad():
        model.lm_head.weight.mul_(10)
    model.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    card = build_card(str(root / "target"), "test", None, random_target.aux_ids, {})
    vocab = root / "vocab"  # the whole target vocabulary: every answer token can be drafted
    vocab.mkdir()
    np.save(vocab / "d2t.npy", np.zeros(card.vocab_size, dtype=np.int64))
    np.save(vocab / "t2d.npy", np.ones(card.vocab_size, dtype=bool))
    conversations = generate_conversations(4, 5)
    prompts = [first_turn_ids(tokenizer, c) for c in conversations]
    rows, masks = [], []
    for prompt in prompts:
        answer = greedy_generate(model, prompt, 40, eos_ids={-1}).tokens
        rows.append(prompt + answer)
        masks.append([0] * len(prompt) + [1] * len(answer))
    rows, masks = rows * 4, masks * 4  # the validation rows repeat training rows
    dataset = Dataset.from_dict(
        {"input_ids": rows, "loss_mask": masks, "seq_len": [len(r) for r in rows]}
    )
    dataset.set_format(type="torch", columns=["input_ids", "loss_mask", "seq_len"])
    dataset.save_to_disk(str(root / "tokenized"))
    (root / "hs").mkdir()
    for i, ids in enumerate(rows):
        states = capture(model, [ids], card.aux_ids)[0]
        save_hidden_states(hs_path(root / "hs", i), ids, states, torch.bfloat16)
    write_json(root / "hs" / "meta.json", {"aux_layer_ids": card.aux_ids})
    cfg = TrainConfig(
        epochs=10, pack_len=256, lr=1e-2, warmup_steps=2, val_fraction=0.25, device="cpu", seed=0
    )
    train_state.seed_everything(cfg.seed)
    draft = draft_model.build_draft(card, vocab, cfg)
    training.train_draft(draft, cfg, TrainingData(root / "tokenized", root / "hs"), "cpu")
    draft_model.save_draft(draft, root / "draft")
    return SimpleNamespace(
        card=card, dir=root / "draft", conversations=conversations, prompts=prompts
    )
