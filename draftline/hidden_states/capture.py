"""Capturing a target's states in-process (backend hf, the online mode's builtin loop, evaluate).

Aux id i is the residual stream entering decoder layer i (0 = embeddings, N = the final pre-norm
output), which is what vLLM hands an EAGLE-3 draft: its Llama model appends `hidden_states +
residual` for aux layer idx just before calling layer idx (vllm/model_executor/models/llama.py,
LlamaModel.forward). `capture` reads it with forward pre-hooks on those layers and on the final
norm, so only 4 states per token are ever held; backend `vllm` asks vLLM for ids [a, b, c, N]
(draftline/engines/commands.py). The last state is the last decoder layer's output *before* the
final norm: speculators applies the target's norm itself to `verifier_last_hidden_states`.
"""

from __future__ import annotations

import torch

from draftline.core.aux_layers import resolve_aux_layer_ids

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def compute_dtype(compute: str, stored: str, device: str) -> torch.dtype:
    """The dtype the target runs in: hidden_states.compute_dtype, or with `auto` the stored dtype
    on a GPU and float32 on CPU."""
    if compute != "auto":
        return DTYPES[compute]
    return DTYPES[stored if device == "cuda" else "float32"]


def check_aux_layer_ids(aux_layer_ids: list[int], num_layers: int) -> list[int]:
    """Re-check the card's ids (it may have been edited) with the rule the target stage applies."""
    return resolve_aux_layer_ids(list(aux_layer_ids), num_layers)


def decoder_parts(model):
    """(decoder layers, final norm) of a causal LM, also when the language model sits inside a
    multimodal wrapper (wrapper.language_model -> ForCausalLM -> .model.layers): get_decoder() is
    followed, then `.model`, until a module has both `layers` and `norm`."""
    module = model
    for _ in range(6):
        layers, norm = getattr(module, "layers", None), getattr(module, "norm", None)
        if layers is not None and norm is not None:
            return layers, norm
        inner = module.get_decoder() if hasattr(module, "get_decoder") else None
        if inner is None or inner is module:
            inner = getattr(module, "model", None)
        if inner is None or inner is module:
            break
        module = inner
    raise ValueError(
        f"{type(model).__name__}: cannot find the language model's decoder layers and final norm "
        "(followed get_decoder() and .model to a module with .layers and .norm)"
    )


@torch.no_grad()
def capture(model, input_ids: list[list[int]], aux_layer_ids: list[int]) -> list[torch.Tensor]:
    """[L_b, 4, H] hidden states for each sequence of a right-padded batch."""
    layers, norm = decoder_parts(model)
    device = model.get_input_embeddings().weight.device
    longest = max(len(s) for s in input_ids)
    ids = torch.zeros(len(input_ids), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, seq in enumerate(input_ids):
        ids[b, : len(seq)] = torch.tensor(seq)
        mask[b, : len(seq)] = 1
    captured: dict = {}

    def grab(key):
        def hook(_module, args, kwargs):
            captured[key] = args[0] if args else kwargs["hidden_states"]

        return hook

    handles = [norm.register_forward_pre_hook(grab("last"), with_kwargs=True)]
    for i in aux_layer_ids:
        module = layers[i] if i < len(layers) else norm  # id N: the final pre-norm output
        handles.append(module.register_forward_pre_hook(grab(i), with_kwargs=True))
    try:
        model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            logits_to_keep=1,
            use_cache=False,
        )
    finally:
        for h in handles:
            h.remove()
    out_device = captured["last"].device  # with a device_map the layers live on several GPUs
    stacked = torch.stack(
        [captured[i].to(out_device) for i in aux_layer_ids] + [captured["last"]], dim=2
    )  # (B, T, 4, H)
    return [stacked[b, : len(seq)] for b, seq in enumerate(input_ids)]
