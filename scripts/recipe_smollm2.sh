#!/usr/bin/env bash
# The recipe experiments on the real target (SmolLM2-135M-Instruct), as DVC experiments of the
# pipeline itself, in the order they were run for docs/recipe_smollm2.md (the eval split held out
# by content, a dev split beside it):
#
#     bash scripts/recipe_smollm2.sh            # all of them, one after the other, in the workspace
#     bash scripts/recipe_smollm2.sh L27-500    # one of them
#     dvc exp show --md --only-changed          # the comparison table
#
# After each run its headline figures go to reports/recipe_smollm2/ (devtools/recipe_record.py);
# `make docs-figures` then regenerates docs/recipe_smollm2.md from them.
#
# They run in the workspace, one after the other, not `dvc exp run --queue`: `regenerate` and
# `hidden_states` have persist outputs, so a queued experiment (a fresh copy of the repository)
# would regenerate and extract everything again. In the workspace each one reuses what is there:
# growing `samples` regenerates and extracts only the new conversations (prefix-stable mix), a
# training change reruns train -> evaluate -> benchmark only. Shrinking `samples` drops the
# conversations past the new count, so the runs at 500 come first and the smaller ones last.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/smollm2.sh # SMOLLM2_PARAMS: the real target and the recipe found here
export PATH=$PWD/.venv/bin:$PATH

ORDER=(L27-500 d500-emb-head d500-emb-head-ep15 d500-drafts d500-emb-head-verdict d375-emb-head
  d250-emb-head d125-emb-head d500-emb-head-len256)
# Candidates are chosen on the dev split (reports/acceptance_dev.json, `evaluate_dev`); the test
# split (reports/acceptance.json) is what the docs report. The d500-* candidates start from
# L27-500 and stop at the two evaluate stages (no benchmark); every candidate key is given, so a
# run does not depend on the one before (a key given twice: the last -S wins). The one chosen on
# dev (CHOSEN: d500-emb-head) is then run at 375, 250 and 125 conversations for the
# acceptance-vs-samples forecast (four points with d500-emb-head). d500-emb, d500-head, L27-250 / L27-125 (the earlier recipe's forecast), base-250,
# ep10-250 and c125-* (the earlier exploration at 250 / 125 conversations) are runnable by name,
# and d500-long (the chosen recipe plus long train rows, issue 57), run last: the datasets it adds
# stay in params.yaml after it.
RECIPE=(-S 'train.epochs=10' -S '++train.init_layer_from_target=last_aux' -S 'train.lr=0.003'
  -S 'train.ttt_steps=3' -S '++train.speculative_tokens=null' -S 'vocab.draft_vocab_size=4096'
  -S 'regenerate.max_tokens=128' -S '++train.train_lm_head=false' -S '++train.train_embeddings=false')
L27=(-S '++samples=125' "${RECIPE[@]}")
D500=(-S '++samples=500' "${RECIPE[@]}")
# chosen on dev: the draft's embeddings and lm_head trained too (dev <!-- fig reports/recipe_smollm2/experiments.json#/L27-500/dev_acceptance_length .2f -->2.25<!-- /fig -->
# -> <!-- fig reports/recipe_smollm2/experiments.json#/d500-emb-head/dev_acceptance_length .2f -->2.38<!-- /fig --> at 500, reports/recipe_smollm2/experiments.json)
CHOSEN=("${RECIPE[@]}" -S '++train.train_embeddings=true' -S '++train.train_lm_head=true')
# d500-long: the long-context eval set of the verdict run's context measurement (devtools/context_eval.py
# --lengths 512 1024 2048 4096 --per-length 1: one document and one history per length), named in
# evaluate.sets, so that mix holds it out of train piece by piece; and LONG_N long train rows cut
# by the same builtin from the sections that eval set leaves at 2 rows per length (build.part
# train, held_out: a rerun of the measurement at --per-length 2 stays clear of them too; docs/datasets.md).
# The budget: LONG_N rows of 1,024-4,096 estimated tokens (as many documents as histories per
# length), in packs of 5,120 tokens, not 512; `draftline plan` with this run's params gives its
# training tokens, disk and time against the chats' alone
LONG_N=36
RECIPE_DRAFT=drafts/d500-recipe # the recipe's draft d500-long fine-tunes
LONG=(-S '++datasets.long_docs.builtin=pydoc_long'
  -S '++datasets.long_docs.build.lengths=[512, 1024, 2048, 4096]' -S '++datasets.long_docs.build.per_length=1'
  -S 'evaluate.sets=[chitchat_more, long_docs]'
  -S '++datasets.long_train.builtin=pydoc_long' -S '++datasets.long_train.build.part=train'
  -S '++datasets.long_train.build.lengths=[1024, 2048, 4096]' -S "++datasets.long_train.build.per_length=$((LONG_N / 6))"
  -S '++datasets.long_train.build.held_out.lengths=[512, 1024, 2048, 4096]'
  -S '++datasets.long_train.build.held_out.per_length=2'
  # the same 500 chats and the long rows on top: train is the first `samples` rows of a sequence
  # merged by weight, in which the long set's weight (as the chats' together) puts its rows ahead
  # of the 500th chat without reordering the chats (each dataset's rows keep their keys' order; eval
  # and dev come from chitchat_sample alone, mix.holdout_from); its cap is its row count, so that
  # running out is no shortfall (a capped set is asked for no more than its cap)
  -S '++mix.weights.long_train=1.5' -S "++mix.caps.long_train=$LONG_N" -S "++samples=$((500 + LONG_N))"
  # rows of up to 4,096 estimated tokens, with their answers (a history's every part acknowledged),
  # stay below 5,120 of SmolLM2's tokens: neither tokenize nor a pack cuts them. Not 8,192 (SmolLM2's
  # max_position_embeddings): the draft's attention on CPU is eager, a dense score matrix per head
  # and TTT step that grows with the square of the pack
  -S 'tokenize.max_length=5120' -S 'train.pack_len=5120')

run() { # run NAME: one experiment in the workspace
  local name=$1
  case "$name" in
  # the tiny target's training settings on real data: 4 epochs from a random init
  base-250) set -- -S '++samples=250' "${RECIPE[@]}" -S 'train.epochs=4' -S '++train.init_layer_from_target=null' ;;
  # more passes over little data
  ep10-250) set -- -S '++samples=250' "${RECIPE[@]}" -S '++train.init_layer_from_target=null' ;;
  # the draft's decoder layer started from target layer 27 (the last aux layer)
  L27-250) set -- -S '++samples=250' "${RECIPE[@]}" ;;
  # the same recipe on twice the conversations, then on half (acceptance vs samples)
  L27-500) set -- "${D500[@]}" ;;
  L27-125) set -- "${L27[@]}" ;;
  d500-emb) set -- "${D500[@]}" -S '++train.train_embeddings=true' evaluate ;;
  # (4,096 draft tokens already cover every trainable token at 500 conversations: no larger vocabulary)
  d500-head) set -- "${D500[@]}" -S '++train.train_lm_head=true' evaluate ;;
  d500-emb-head) set -- -S '++samples=500' "${CHOSEN[@]}" evaluate ;;
  # validation tau_sim still rising at epoch 10 of d500-emb-head: 15 epochs (the cosine schedule stretched)
  d500-emb-head-ep15) set -- -S '++samples=500' "${CHOSEN[@]}" -S 'train.epochs=15' evaluate ;;
  # many 128-token answers are cut (reports/regenerate.json length_share): the same conversations
  # with up to 256-token answers, more training tokens (every answer regenerated)
  d500-emb-head-len256) set -- -S '++samples=500' "${CHOSEN[@]}" -S 'regenerate.max_tokens=256' evaluate ;;
  # the chosen recipe on half and a quarter of the conversations (acceptance vs samples)
  d375-emb-head) set -- -S '++samples=375' "${CHOSEN[@]}" evaluate ;;
  d250-emb-head) set -- -S '++samples=250' "${CHOSEN[@]}" evaluate ;;
  d125-emb-head) set -- -S '++samples=125' "${CHOSEN[@]}" evaluate ;;
  # the chosen recipe through the whole pipeline: its serving verdict in vLLM's CPU build (a
  # baseline and a speculative server per k at each load; reports/recipe_smollm2/verdict_*.json)
  # and the other drafters (d500-drafts) served against the same baseline passes in the same run
  # (benchmark.compare; docs/drafters.md), each at k = 1 and 3: eight servers, more than this
  # host's memory holds at once, so the speculative ones run in groups beside the baseline
  d500-emb-head-verdict) set -- -S '++samples=500' "${CHOSEN[@]}" \
    -S '+benchmark.compare.peagle=drafts/peagle' -S '+benchmark.compare.dflash=drafts/dflash' \
    -S 'benchmark.compare_k=[1, 3]' ;;
  # the chosen recipe's draft fine-tuned on the same 500 chats plus LONG_N long rows (LONG, above),
  # through the whole pipeline with its serving verdict at one load (4 in flight, the verdict's
  # serve_concurrency). Not trained from scratch like the recipe: at pack 5,120 a step of this
  # CPU's eager attention costs what the recipe's whole epoch at pack 512 nearly does
  # (reports/recipe_smollm2/long_rows.json says how much), so its 10 epochs do not fit a working
  # session; train.init is the recipe's draft (d500-emb-head-verdict's models/draft, copied to
  # drafts/d500-recipe first), its vocabulary remapped to this run's (the long rows add tokens),
  # 2 epochs at a third of the recipe's learning rate; evaluate measures the draft it started from
  # beside it (evaluate.compare_init). regenerate and hidden_states reuse what the runs at 500 left
  # for the same chats (the long rows are new). Then its acceptance by context length as the
  # verdict run's: python -m devtools.context_eval . \
  #   reports/recipe_smollm2/context_d500-long.json --lengths 512 1024 2048 4096 --per-length 1 --buckets 1024 2048 4096
  # (benchmark.compare={} does not clear a dict the workspace's params.yaml already holds: DVC's
  # overrides merge into it, so after the verdict run its P-EAGLE and DFlash drafts are served
  # too, in a group of their own with its own baseline passes, which the long-rows table does not read)
  d500-long)
    set -- "${CHOSEN[@]}" "${LONG[@]}" -S "train.init=$RECIPE_DRAFT" \
      -S '++train.init_layer_from_target=null' -S '++train.init_remap_vocab=true' \
      -S 'train.epochs=2' -S 'train.lr=0.001' -S 'benchmark.concurrency=[4]' \
      -S 'benchmark.compare={}' -S 'benchmark.compare_k=null' ;;
  c125-lr1e-2) set -- "${L27[@]}" -S 'train.lr=0.01' evaluate ;;
  c125-ttt5) set -- "${L27[@]}" -S 'train.lr=0.01' -S 'train.ttt_steps=5' -S '++train.speculative_tokens=3' evaluate ;;
  c125-head) set -- "${L27[@]}" -S '++train.train_lm_head=true' evaluate ;;
  c125-vocab8k) set -- "${L27[@]}" -S '++train.train_lm_head=true' -S 'vocab.draft_vocab_size=8192' evaluate ;;
  c125-lr1e-3) set -- "${L27[@]}" -S '++train.train_lm_head=true' -S 'train.lr=0.001' evaluate ;;
  c125-len64) set -- "${L27[@]}" -S 'regenerate.max_tokens=64' evaluate ;;
  c125-emb) set -- "${L27[@]}" -S '++train.train_embeddings=true' evaluate ;;
  # the other drafters on the verdict run's data and budget (docs/drafters.md): P-EAGLE and DFlash
  # train a new draft (no init_layer_from_target); DFlash keeps the target's embeddings and samples
  # 64 blocks per pack, not 512: on CPU its attention is eager, a dense mask over every block's
  # queries that grows with the blocks sampled (reports/overhead/drafter_attention.json)
  d500-peagle-verdict) set -- -S '++samples=500' "${CHOSEN[@]}" -S '++train.method=peagle' \
    -S '++train.init_layer_from_target=null' ;;
  d500-dflash-verdict) set -- -S '++samples=500' "${CHOSEN[@]}" -S '++train.method=dflash' \
    -S '++train.init_layer_from_target=null' -S '++train.train_embeddings=false' \
    -S '++train.dflash.max_anchors=64' ;;
  # P-EAGLE and DFlash drafts on the chosen recipe's data and budget, for the verdict run's
  # benchmark.compare (devtools/method_draft.py; drafts/ is a dependency of the benchmark stage)
  d500-drafts)
    dvc exp run -n d500-drafts "${SMOLLM2_PARAMS[@]}" -S '++samples=500' "${CHOSEN[@]}" train
    python -m devtools.method_draft peagle drafts/peagle --set train.init_layer_from_target=null
    python -m devtools.method_draft dflash drafts/dflash --set train.init_layer_from_target=null \
      --set train.train_embeddings=false --set train.dflash.max_anchors=64
    return
    ;;
  *)
    echo "unknown run $name; known: ${ORDER[*]}" >&2
    exit 2
    ;;
  esac
  if [[ -n "${RECIPE_PRINT:-}" ]]; then # what `dvc exp run` would be given, one word a line
    printf '%s\n' "${SMOLLM2_PARAMS[@]}" "$@"
    return
  fi
  if [[ "$name" == d500-long && ! -f $RECIPE_DRAFT/config.json ]]; then
    echo "d500-long fine-tunes $RECIPE_DRAFT: dvc exp apply d500-emb-head-verdict, then" \
      "cp -r models/draft $RECIPE_DRAFT" >&2
    exit 2
  fi
  # a run that adds datasets (-S datasets.<name>...): their prepare stages' source deps first
  python -m devtools.exp_sources datasets/sources.yaml "${SMOLLM2_PARAMS[@]}" "$@"
  dvc exp run -n "$name" "${SMOLLM2_PARAMS[@]}" "$@"
  # the run's own reports -> reports/recipe_smollm2/ (docs/recipe_smollm2.md is generated from it)
  local record=()
  case "$name" in
  # stopped at evaluate: reports/benchmark.json is an earlier run's; the chosen recipe at 500 / 250
  # / 125 conversations: the points of the acceptance-vs-samples plot
  d500-emb-head | d375-emb-head | d250-emb-head | d125-emb-head) record=(--no-benchmark --samples-point) ;;
  d500-emb-head-verdict | d500-peagle-verdict | d500-dflash-verdict | d500-long) record=() ;; # the whole pipeline: its benchmark is this run's
  c125-* | d500-*) record=(--no-benchmark) ;;
  esac
  python -m devtools.recipe_record reports/recipe_smollm2 "$name" "${record[@]}"
}

if [[ $# -gt 0 ]]; then
  for name in "$@"; do run "$name"; done
else
  make setup-smollm2
  python -m stages.prepare --write-sources datasets/sources.yaml
  for name in "${ORDER[@]}"; do run "$name"; done
fi
