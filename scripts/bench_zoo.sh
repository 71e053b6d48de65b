#!/usr/bin/env bash
# The zoo's measurements, C++ and the book's Python classes side by side on LibTorch 2.6 in the
# Debian 13 root (scripts/debian13.sh), at 1 and 2 threads, interleaved:
#   - one attention layer of Qwen3-0.6B and of Gemma 3 1B at their sizes (attention-bench
#     zoo-layer against scripts/bench_zoo.py, the stand-ins of the book's classes);
#   - with BOOK (a checkout of rasbt/LLMs-from-scratch, not part of this repository), each
#     family's tiny model generating through its KV cache: examples/zoo against the book's own
#     KV-cache classes (examples/zoo/check_against_book.py --bench).
# Prints the JSON records; the build is the LibTorch 2.6 leg's (scripts/test.sh --libtorch2).
#
#   scripts/bench_zoo.sh [BOOK]
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
# shellcheck source=debian13.sh
source "$(dirname "$0")/debian13.sh"
book=${1:-}

debian13_enter
debian13_build -DATTENTION_BUILD_TESTS=ON -DATTENTION_BUILD_TOOLS=ON >/dev/null
if [[ -n $book ]]; then
  "${debian13_sudo[@]}" rm -rf "$DEBIAN13_ROOT/tmp/zoo-book"
  "${debian13_sudo[@]}" cp -r "$book" "$DEBIAN13_ROOT/tmp/zoo-book"
fi
debian13_run "
  cd $DEBIAN13_BUILD
  python3 /src/examples/zoo/write_models.py /tmp/zoo-models --dtype float32 >/dev/null
  for threads in 1 2; do
    ./attention-bench --threads \$threads zoo-layer
    python3 /src/scripts/bench_zoo.py --threads \$threads
    if [[ -d /tmp/zoo-book ]]; then
      for model in /tmp/zoo-models/*/; do
        ./tests/zoo-example \$model --bench --threads \$threads | tail -n 1
      done
      python3 /src/examples/zoo/check_against_book.py --book /tmp/zoo-book --bench \
        --threads \$threads 2>/dev/null
    fi
  done"
