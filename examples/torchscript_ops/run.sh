#!/usr/bin/env bash
# Python writes and scripts the model, the C++ program loads and checks it: one ctest entry.
#   examples/torchscript_ops/run.sh PYTHON PROGRAM LIBRARY DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=$1 program=$2 library=$3 dir=$4
rm -rf "$dir"
ATTENTION_OPS_LIBRARY=$library PYTHONPATH="$here/../../python" "$python" "$here/write_model.py" "$dir"
"$program" "$dir"
