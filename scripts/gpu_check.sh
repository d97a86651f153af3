#!/usr/bin/env bash
# The GPU check (docs/gpu-check.md): on a CUDA host, from this checkout plus the wheels of
# scripts/gpu_wheels.sh, with no network. Installs from the wheel folder only the distributions of
# scripts/gpu_requirements.txt that the host's Python lacks (--no-deps: torch, transformers and the
# rest stay as the host has them) into a folder of their own put on PYTHONPATH (the host's Python
# is left as it is, externally managed or not), then runs scripts/gpu_check.py, which runs every
# stage on the GPU and writes one JSON (default reports/gpu_check.json).
#
#   bash scripts/gpu_check.sh                                  # make gpu-check
#   bash scripts/gpu_check.sh --wheels /data/wheels --out /data/gpu_check.json
#   bash scripts/gpu_check.sh --device cpu --out /tmp/gpu_check.json    # the dry run (tests/test_gpu_check.py)
#
# Options of this script: --wheels DIR (default wheels/gpu), --site DIR (where they are installed,
# default wheels/site-<python version>), --python PY (default $PYTHON or python3). Every other
# option goes to scripts/gpu_check.py (--device, --out, --work, --target, --budget-s). A
# distribution installed at another version than the list's is kept and named.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)  # paths given on the command line stay relative to where it runs

wheels=$repo/wheels/gpu
site=
python=${PYTHON:-python3}
args=()
while (($#)); do
    case $1 in
        --wheels) wheels=$2; shift 2 ;;
        --site) site=$2; shift 2 ;;
        --python) python=$2; shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
site=$(realpath -m "${site:-$repo/wheels/site-$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}")
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

installed=$(mktemp)
trap 'rm -f "$installed"' EXIT
# What is missing, by the installed distributions' metadata (not by import: a module can be there
# without its distribution record, and pip goes by the record).
missing=$("$python" - "$repo/scripts/gpu_requirements.txt" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, wanted = line.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        print(line)
        continue
    if have != wanted:
        print(f"gpu_check: keeping {name} {have} (the list has {wanted})", file=sys.stderr)
EOF
)
if [[ -n $missing && ! -d $wheels ]]; then
    # the stages that import them fail, each with its error in the JSON
    echo "gpu_check: warning: no wheel folder at $wheels (scripts/gpu_wheels.sh makes it); not installed: ${missing//$'\n'/ }" >&2
elif [[ -n $missing ]]; then
    echo "gpu_check: installing $(echo "$missing" | wc -l) distributions from $wheels into $site"
    # shellcheck disable=SC2086  # one requirement per word
    if "$python" -m pip install --quiet --no-index --no-deps --find-links "$wheels" --target "$site" $missing; then
        echo "$missing" > "$installed"
    else
        echo "gpu_check: warning: pip could not install them; the stages run with what there is" >&2
    fi
else
    echo "gpu_check: every distribution of scripts/gpu_requirements.txt is installed"
fi

"$python" "$repo/scripts/gpu_check.py" --installed "$installed" ${args[@]+"${args[@]}"}
