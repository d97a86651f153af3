#!/usr/bin/env bash
# Candidates for a recipe that learns from little data on the real target (SmolLM2-135M-Instruct):
# at most 1,000 training conversations, the whole pipeline within 60 minutes on a 2-core CPU,
# maximising the real acceptance length at k = 3 on the held-out eval prompts.
# NOT YET RUN: docs/recipe_smollm2.md says what each candidate tests and where its results go.
#
#     bash scripts/recipe_smollm2.sh data        # 1. regenerate + tokenize + hidden states once, commit
#     bash scripts/recipe_smollm2.sh train       # 2. the training candidates, one after the other
#     bash scripts/recipe_smollm2.sh data-size   # 3. the candidates that change the data (slow: regenerate again)
#     dvc exp show --md --only-changed > docs/recipe_smollm2_results.md
#
# Why not `dvc exp run --queue` for all: `regenerate` and `hidden_states` have persist outputs,
# which skip DVC's run cache, so every queued experiment (its own temporary copy) would regenerate
# and extract again: hours instead of minutes. Training candidates run in the workspace after the
# data is committed, so each reruns only train -> evaluate -> benchmark (~10 min each on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/smollm2.sh   # SMOLLM2_PARAMS: the real target and its base settings
export PATH=$PWD/.venv/bin:$PATH

run() {  # run NAME -S ... : one experiment in the workspace on top of the committed base
  local name=$1; shift
  dvc exp run -n "$name" "${SMOLLM2_PARAMS[@]}" -S '++samples=1000' "$@"
}

case "${1:-}" in
data)
  make setup-smollm2
  python -m stages.prepare --write-sources datasets/sources.yaml
  run base-1000
  dvc exp apply base-1000 && git add -A && git commit -m "smollm2 base data: 1,000 conversations"
  ;;
train)
  # epochs and schedule: small data wants more passes; the best-val-tau_sim epoch is kept anyway
  run ep8-cos      -S '++train.epochs=8'
  run ep16-cos     -S '++train.epochs=16' -S '++train.lr=0.001'
  run ep8-linear   -S '++train.epochs=8' -S '++train.scheduler=linear'
  # learning rate around the tiny-target default
  run lr1e-3       -S '++train.lr=0.001'
  run lr1e-2       -S '++train.lr=0.01'
  # test-time-training steps: fewer = easier, more = closer to k = 3 at inference
  run ttt1         -S '++train.ttt_steps=1' -S '++train.speculative_tokens=3'
  run ttt5         -S '++train.ttt_steps=5' -S '++train.speculative_tokens=3'
  run ttt3-decay   -S '++train.ttt_step_loss_decay=0.8'
  # trainable embeddings / lm_head (frozen target copies by default)
  run train-emb    -S '++train.train_embeddings=true'
  run train-head   -S '++train.train_lm_head=true'
  # capacity
  run layers2      -S '++train.num_layers=2'
  # architecture: the original EAGLE-3 decoder (no extra norms)
  run arch-eagle3  -S '++train.architecture=eagle3'
  ;;
data-size)
  # draft vocabulary: coverage of the trainable tokens vs a harder output layer
  run vocab2k      -S '++vocab.draft_vocab_size=2048'
  run vocab8k      -S '++vocab.draft_vocab_size=8192'
  run vocab16k     -S '++vocab.draft_vocab_size=16384'
  # regenerated answer length: more tokens per conversation at the same conversation count
  run len64        -S '++regenerate.max_tokens=64'
  run len256       -S '++regenerate.max_tokens=256' -S '++tokenize.max_length=1024'
  # fewer conversations, for the acceptance-vs-samples forecast (python -m draftline.forecast --dvc-exps)
  run samples250   -S '++samples=250'
  run samples500   -S '++samples=500'
  ;;
*)
  echo "usage: bash scripts/recipe_smollm2.sh data | train | data-size" >&2
  exit 2
  ;;
esac
