#!/usr/bin/env bash
# The RDMA user-space libraries that the Mooncake transfer engine's CPU build links against
# (libibverbs.so.1, librdmacm.so.1): `make setup-mooncake` runs this after installing the engine.
#
#     bash scripts/rdma_libs.sh .venv/bin/python
#
# Best effort, never fails the set-up: when `import mooncake.store` fails and this runs as root on
# a host with apt-get, it installs libibverbs1 and librdmacm1 (Debian/Ubuntu names); otherwise it
# prints why the engine does not import, and tests/hidden_states/test_mooncake.py skips with that reason.
set -uo pipefail
python=${1:-python3}

import_error() { # the import's last error line, empty when mooncake.store imports
    "$python" -c 'import mooncake.store' 2>&1 >/dev/null | tail -n 1
}

why=$(import_error)
[[ -z $why ]] && exit 0
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "setup-mooncake: $why; installing libibverbs1 librdmacm1 with apt-get"
    # the package lists of a fresh machine may be empty: update once, then retry
    apt-get install -y -qq libibverbs1 librdmacm1 >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libibverbs1 librdmacm1 >/dev/null 2>&1; }
    why=$(import_error)
    [[ -z $why ]] && exit 0
fi
echo "setup-mooncake: warning: the Mooncake transfer engine does not import ($why);" \
    "tests/hidden_states/test_mooncake.py will skip. As root: apt-get install libibverbs1 librdmacm1" >&2
exit 0
