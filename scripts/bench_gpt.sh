#!/usr/bin/env bash
# Tokens per second of greedy generation with the book's GPT (models/gpt/), one thread each, in one
# run: C++ with the KV cache (examples/gpt against the installed package), Python without a cache
# (the book's generate_text_simple) and Python with a cache (examples/gpt/gpt.py); then serving 16
# requests of different lengths: C++ with continuous batching over a paged KV cache (gpt-serve)
# against the same requests one at a time, and Python padding them into batches
# (examples/gpt/serve_padded.py).
#
#   scripts/bench_gpt.sh [--python26]
#
# --python26 runs serve_padded.py with PyTorch 2.6 as well, in the Debian 13 root of
# scripts/debian13.sh.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

python26=false
if [[ ${1:-} == --python26 ]]; then python26=true; fi

"$ROOT/scripts/setup.sh"
configure_and_build -DATTENTION_BUILD_TOOLS=ON >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build_example "$work" gpt
"$work/gpt/gpt" "$ROOT/models/gpt" | grep tokens_per_s
"$PYTHON" "$ROOT/examples/gpt/train.py" --bench "$ROOT/models/gpt"

"$work/gpt/gpt-serve" "$ROOT/models/gpt" --bench --save-requests "$work/requests.json" |
  grep tokens_per_s
"$PYTHON" "$ROOT/examples/gpt/serve_padded.py" "$work/requests.json" "$ROOT/models/gpt"
if $python26; then
  # shellcheck source=debian13.sh
  source "$ROOT/scripts/debian13.sh"
  debian13_enter
  trap 'debian13_unmount; rm -rf "$work"' EXIT
  cp "$work/requests.json" "$DEBIAN13_ROOT/var/tmp/gpt-serve-requests.json"
  debian13_run "python3 /src/examples/gpt/serve_padded.py /var/tmp/gpt-serve-requests.json \
    /src/models/gpt"
  debian13_unmount
fi
