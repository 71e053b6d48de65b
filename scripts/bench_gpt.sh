#!/usr/bin/env bash
# Tokens per second of greedy generation with the book's GPT (models/gpt/), one thread each, in one
# run: C++ with the KV cache (examples/gpt against the installed package), Python without a cache
# (the book's generate_text_simple) and Python with a cache (examples/gpt/gpt.py).
#
#   scripts/bench_gpt.sh
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

"$ROOT/scripts/setup.sh"
configure_and_build -DATTENTION_BUILD_TOOLS=ON >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build_example "$work" gpt
"$work/gpt/gpt" "$ROOT/models/gpt" | grep tokens_per_s
"$PYTHON" "$ROOT/examples/gpt/train.py" --bench "$ROOT/models/gpt"
