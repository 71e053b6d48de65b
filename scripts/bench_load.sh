#!/usr/bin/env bash
# Load time and peak memory of a large state dict: C++ load_weights against Python's
# torch.load + load_state_dict, on the same files, one run.
#
#   scripts/bench_load.sh [D_MODEL]     (default 4096: four 4096 x 4096 projections, 256 MiB)
#
# Python writes MultiHeadAttention(D, D, 32, qkv_bias) with torch.save(model.state_dict()) and as
# safetensors into a temporary folder; each side loads each file three times, and every load
# reports its time and the peak resident memory it reached (reset before each load).
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

d=${1:-4096}
"$ROOT/scripts/setup.sh"
configure_and_build -DATTENTION_BUILD_TOOLS=ON >/dev/null
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$PYTHON" "$ROOT/scripts/bench_load.py" write "$dir" "$d"
ls -l "$dir"
for file in "$dir/model.pth" "$dir/model.safetensors"; do
  "$BUILD_DIR/attention-load-bench" "$file" "$d" 32 3
  "$PYTHON" "$ROOT/scripts/bench_load.py" load "$file" "$d"
done
