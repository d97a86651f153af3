"""A target of the multimodal-wrapper class, built on the spot: the checkpoint layout of Kimi-K2.5 /
Qwen-VL style models, with the code shipped in the model directory.

- config.json: model_type `draftline_wrapper` (unknown to transformers), `auto_map` pointing at
  configuration_wrapper.py / modeling_wrapper.py in the directory, the language model's config
  under `text_config` (a Llama), a small `vision_config`;
- tokenizer_config.json: `auto_map` to tokenization_wrapper.py (a fast-tokenizer subclass);
- model.safetensors: `language_model.model.embed_tokens.weight`, `language_model.model.layers.…`,
  `language_model.model.norm.weight`, `language_model.lm_head.weight`, plus `vision_tower.…` and
  `multi_modal_projector.…` tensors whose names end like the text model's (a `…norm.weight`, an
  `…embed_tokens.weight` of another shape) so that matching by suffix alone would go wrong.

Nothing of it loads without trust_remote_code=True.
"""

from __future__ import annotations

import json
from pathlib import Path

CONFIGURATION = """
from transformers import AutoConfig, PretrainedConfig


class WrapperVisionConfig(PretrainedConfig):
    model_type = "draftline_wrapper_vision"

    def __init__(self, hidden_size=24, patch_vocab=40, **kwargs):
        self.hidden_size = hidden_size
        self.patch_vocab = patch_vocab
        super().__init__(**kwargs)


class WrapperConfig(PretrainedConfig):
    model_type = "draftline_wrapper"
    sub_configs = {"text_config": AutoConfig, "vision_config": WrapperVisionConfig}

    def __init__(self, text_config=None, vision_config=None, image_token_id=3, **kwargs):
        from transformers import CONFIG_MAPPING

        if isinstance(text_config, dict):
            text_config = CONFIG_MAPPING[text_config.get("model_type", "llama")](**text_config)
        self.text_config = text_config if text_config is not None else CONFIG_MAPPING["llama"]()
        if isinstance(vision_config, dict):
            vision_config = WrapperVisionConfig(**vision_config)
        self.vision_config = vision_config if vision_config is not None else WrapperVisionConfig()
        self.image_token_id = image_token_id
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)
"""

MODELING = '''
import torch
from torch import nn
from transformers import AutoModelForCausalLM, GenerationMixin, PreTrainedModel

from .configuration_wrapper import WrapperConfig


class WrapperVisionTower(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.patch_vocab, config.hidden_size)  # patch ids, not text tokens
        self.post_norm = nn.LayerNorm(config.hidden_size)


class WrapperPreTrainedModel(PreTrainedModel):
    config_class = WrapperConfig
    base_model_prefix = ""
    _no_split_modules = ["LlamaDecoderLayer"]
    _supports_sdpa = True
    _supports_attention_backend = True


class WrapperForConditionalGeneration(WrapperPreTrainedModel, GenerationMixin):
    """A vision tower and a projector around a causal language model (text-only forward here)."""

    def __init__(self, config):
        super().__init__(config)
        self.vision_tower = WrapperVisionTower(config.vision_config)
        self.multi_modal_projector = nn.Sequential(nn.LayerNorm(config.vision_config.hidden_size),
                                                   nn.Linear(config.vision_config.hidden_size, config.text_config.hidden_size))
        self.multi_modal_projector.norm = self.multi_modal_projector[0]
        self.language_model = AutoModelForCausalLM.from_config(config.text_config)
        self.post_init()

    def get_input_embeddings(self):
        return self.language_model.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.language_model.set_input_embeddings(value)

    def get_output_embeddings(self):
        return self.language_model.get_output_embeddings()

    def get_decoder(self):
        return self.language_model

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
        return self.language_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   past_key_values=past_key_values, inputs_embeds=inputs_embeds, labels=labels,
                                   use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs)
'''

TOKENIZATION = '''
from transformers import PreTrainedTokenizerFast


class WrapperTokenizer(PreTrainedTokenizerFast):
    """The checkpoint's own tokenizer class (here a fast tokenizer under another name)."""
'''


def build_wrapped_target(
    tokenizer, out: Path, layers: int = 5, hidden: int = 64, seed: int = 0
) -> Path:
    """Write the wrapper target (random weights) with `tokenizer` to `out`; returns out."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    (out / "configuration_wrapper.py").write_text(CONFIGURATION)
    (out / "modeling_wrapper.py").write_text(MODELING)
    (out / "tokenization_wrapper.py").write_text(TOKENIZATION)
    torch.manual_seed(seed)
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    language_model = LlamaForCausalLM(text)
    with (
        torch.no_grad()
    ):  # a final norm that is not all ones, so that a fallback to ones would show
        language_model.model.norm.weight.uniform_(0.5, 1.5)
    vision = {"hidden_size": 24, "patch_vocab": 40}
    tensors = {
        f"language_model.{k}": v.contiguous() for k, v in language_model.state_dict().items()
    }
    tensors.update(
        {
            "vision_tower.embed_tokens.weight": torch.randn(
                vision["patch_vocab"], vision["hidden_size"]
            ),
            "vision_tower.post_norm.weight": torch.rand(vision["hidden_size"]) + 0.5,
            "vision_tower.post_norm.bias": torch.zeros(vision["hidden_size"]),
            "multi_modal_projector.0.weight": torch.rand(vision["hidden_size"]) + 0.5,
            "multi_modal_projector.0.bias": torch.zeros(vision["hidden_size"]),
            "multi_modal_projector.1.weight": torch.randn(hidden, vision["hidden_size"]) * 0.02,
            "multi_modal_projector.1.bias": torch.zeros(hidden),
        }
    )
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "model_type": "draftline_wrapper",
        "architectures": ["WrapperForConditionalGeneration"],
        "auto_map": {
            "AutoConfig": "configuration_wrapper.WrapperConfig",
            "AutoModel": "modeling_wrapper.WrapperForConditionalGeneration",
            "AutoModelForCausalLM": "modeling_wrapper.WrapperForConditionalGeneration",
        },
        "text_config": text.to_dict(),
        "vision_config": vision,
        "image_token_id": 3,
        "tie_word_embeddings": False,
        "dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(out)
    tok_config_path = out / "tokenizer_config.json"
    tok_config = json.loads(tok_config_path.read_text())
    tok_config.update(
        {
            "tokenizer_class": "WrapperTokenizer",
            "auto_map": {"AutoTokenizer": [None, "tokenization_wrapper.WrapperTokenizer"]},
        }
    )
    tok_config_path.write_text(json.dumps(tok_config, indent=2))
    return out
