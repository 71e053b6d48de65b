#!/usr/bin/env bash
# Runs the C++ and the Python benchmarks in one go and writes the results (JSON), a Markdown
# table with the targets' ratios, and PNG plots.
#
#   scripts/bench.sh [--quick] [--libtorch2] [OUT_DIR]     (default OUT_DIR: bench-results)
#
# --libtorch2 measures LibTorch 2.6 as well, in the Debian 13 root of scripts/debian13.sh
# (OUT_DIR/libtorch2): the table then has a column per generation.
# Both sides use every core (libgomp starts with one thread here). Python runs twice: with the
# default allocator and with tcmalloc preloaded.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

quick=()
libtorch2=false
while [[ ${1:-} == --* ]]; do
  case $1 in
    --quick) quick=(--quick) ;;
    --libtorch2) libtorch2=true ;;
    *)
      echo "bench.sh: unknown option $1" >&2
      exit 2
      ;;
  esac
  shift
done
out=${1:-$ROOT/bench-results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$SECONDS

"$ROOT/scripts/setup.sh"
configure_and_build -DATTENTION_BUILD_TESTS=OFF -DATTENTION_BUILD_TOOLS=ON
"$ROOT/scripts/bench_measure.sh" "$BUILD_DIR/attention-bench" "$out" "${quick[@]}"

rm -rf "$out/libtorch2"
if $libtorch2; then
  # shellcheck source=debian13.sh
  source "$ROOT/scripts/debian13.sh"
  debian13_enter libtcmalloc-minimal4t64 libxsmm-dev
  debian13_run "cmake -S /src -B $DEBIAN13_BUILD -DCMAKE_BUILD_TYPE=Release \
      -DATTENTION_BUILD_TOOLS=ON >/dev/null
    cmake --build $DEBIAN13_BUILD --target attention-bench attention_ops -j \"\$JOBS\"
    rm -rf /var/tmp/attention-bench-out
    /src/scripts/bench_measure.sh $DEBIAN13_BUILD/attention-bench /var/tmp/attention-bench-out \
      ${quick[*]}"
  cp -r "$DEBIAN13_ROOT/var/tmp/attention-bench-out" "$out/libtorch2"
  debian13_unmount
fi

"$PYTHON" "$ROOT/scripts/bench_report.py" "$out"
if ((${#quick[@]} == 0)); then
  # The README shows the latest full run.
  mkdir -p "$ROOT/docs/bench"
  cp "$out"/table.md "$out"/results.json "$out"/*.png "$ROOT/docs/bench/"
fi
echo "bench.sh: done in $((SECONDS - start)) s; results in $out" >&2
