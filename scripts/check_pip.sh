#!/usr/bin/env bash
# Installs the Python packages as a Python user would: `pip install --no-build-isolation` of this
# tree into a fresh virtual environment (which sees the system's torch), with no network, then
# imports attention_ops from another folder with no PYTHONPATH and no ATTENTION_OPS_LIBRARY, and
# runs the operators' Python tests against the installed package.
#
#   scripts/check_pip.sh [PYTHON] [BUILD_DIR]
#
# PYTHON (default /usr/bin/python3) makes the environment; BUILD_DIR (default build/), a
# configured build of this tree, is where the library comes from (setup.py's ATTENTION_BUILD_DIR),
# so that the check does not compile the library a second time. Without it, pip builds its own.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
python=${1:-$PYTHON}
build=${2:-$BUILD_DIR}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m venv --system-site-packages "$work/venv"
ATTENTION_BUILD_DIR=$build "$work/venv/bin/python" -m pip install --no-build-isolation --no-index \
  --quiet "$ROOT"
cd "$work"
env -u PYTHONPATH -u ATTENTION_OPS_LIBRARY "$work/venv/bin/python" - "$work/venv" <<'PYTHON'
import os, sys, torch
import attention_ops, attention_parity
where = attention_ops.library_path()
assert where.startswith(os.path.realpath(sys.argv[1])), where
q, k, v = (torch.randn(1, 2, 40, 8, dtype=torch.float64) for _ in range(3))
got = attention_ops.scaled_dot_product_attention(q, k, v, is_causal=True)
hidden = torch.ones(40, 40, dtype=torch.bool).triu(1)
expected = (q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(hidden, -torch.inf).softmax(-1) @ v
torch.testing.assert_close(got, expected)
print("check_pip.sh: the pip-installed attention_ops loads", where)
PYTHON
# The operators' own tests, on the installed package (their reference classes from scripts/).
env -u ATTENTION_OPS_LIBRARY PYTHONPATH="$ROOT/scripts" "$work/venv/bin/python" -m unittest \
  discover -s "$ROOT/python/tests" 2>&1 | tail -n 3
echo "check_pip.sh: pip install of the Python packages works"
