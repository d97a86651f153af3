#!/usr/bin/env bash
# The wheels the GPU check installs on a bare CUDA host with no network (docs/gpu-check.md).
# Run on any machine with pip and an index: downloads, for Python 3.12 on manylinux x86-64, exactly
# the distributions of scripts/gpu_requirements.txt (binary wheels only, no dependencies: the GPU
# host brings torch, the CUDA libraries, transformers, triton, safetensors, pyarrow and pytest),
# then prints their total size and fails past the limit.
#
#   bash scripts/gpu_wheels.sh                    # -> wheels/gpu/ of this checkout
#   bash scripts/gpu_wheels.sh DIR                # -> DIR
#   PYTHON_VERSION=3.11 bash scripts/gpu_wheels.sh DIR   # for a host with another Python
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

dest=${1:-$repo/wheels/gpu}
python_version=${PYTHON_VERSION:-3.12}
limit_mb=${LIMIT_MB:-60}
read -r -a pip <<<"${PIP:-python3 -m pip}" # the command, split into words

mkdir -p "$dest"
# manylinux tags from the oldest to the newest glibc a current CUDA host has; pure-Python wheels match any
"${pip[@]}" download --quiet --no-deps --only-binary=:all: \
    --python-version "$python_version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
    --dest "$dest" --requirement "$repo/scripts/gpu_requirements.txt"

# Only what the list names stays (a folder reused across list changes keeps no old wheel).
python3 - "$dest" "$repo/scripts/gpu_requirements.txt" "$limit_mb" <<'EOF'
import re
import sys
from pathlib import Path

dest, requirements, limit_mb = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


wanted = {}
for line in requirements.read_text().splitlines():
    line = line.split("#")[0].strip()
    if line:
        name, version = line.split("==")
        wanted[norm(name)] = version
kept, total = [], 0
for wheel in sorted(dest.glob("*.whl")):
    name, version = wheel.name.split("-")[:2]
    if wanted.get(norm(name)) != version:
        wheel.unlink()
        continue
    kept.append(norm(name))
    total += wheel.stat().st_size
missing = sorted(set(wanted) - set(kept))
if missing:
    sys.exit(f"error: no wheel in {dest} for {missing}")
print(f"gpu_wheels: {len(kept)} wheels in {dest}, {total / 1e6:.1f} MB (limit {limit_mb:.0f} MB)")
if total > limit_mb * 1e6:
    sys.exit(f"error: the wheels take {total / 1e6:.1f} MB, over the {limit_mb:.0f} MB the GPU host can be sent")
EOF
