#!/usr/bin/env bash
# Runs the C++ and the Python benchmarks in one go and writes the results (JSON), a Markdown
# table with the targets' ratios, and PNG plots.
#
#   scripts/bench.sh [--quick] [OUT_DIR]     (default OUT_DIR: bench-results)
#
# Both sides use every core (libgomp starts with one thread here). Python runs twice: with the
# default allocator and with tcmalloc preloaded.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

quick=()
if [[ ${1:-} == --quick ]]; then
  quick=(--quick)
  shift
fi
out=${1:-$ROOT/bench-results}
mkdir -p "$out"
start=$SECONDS

"$ROOT/scripts/setup.sh"
configure_and_build -DATTENTION_BUILD_TESTS=OFF -DATTENTION_BUILD_TOOLS=ON
bench=("$BUILD_DIR/attention-bench" "${quick[@]}")
python_bench=("$PYTHON" "$ROOT/scripts/bench_python.py" "${quick[@]}")
tcmalloc=$(ldconfig -p | awk '/libtcmalloc_minimal.so.4 /{path = $NF} END {print path}')

lengths=(512 1024 2048 4096 8192 16384 32768)
math_lengths=(512 1024 2048 4096 8192)
if ((${#quick[@]})); then
  lengths=(256 512)
  math_lengths=(256 512)
fi

echo "bench.sh: C++ ..." >&2
"${bench[@]}" matmul article raschka raschka-train decode >"$out/cpp.jsonl"
# One process per long-context run: each reports its own peak memory.
for t in "${lengths[@]}"; do
  echo "bench.sh: long context T=$t" >&2
  "${bench[@]}" "long:chunked:$t" >>"$out/cpp.jsonl"
done
for t in "${math_lengths[@]}"; do
  "${bench[@]}" "long:math:$t" >>"$out/cpp.jsonl"
  "${python_bench[@]}" "long:$t" >>"$out/python.jsonl.tmp"
done

echo "bench.sh: Python ..." >&2
"${python_bench[@]}" matmul article raschka raschka-train >"$out/python.jsonl"
cat "$out/python.jsonl.tmp" >>"$out/python.jsonl"
rm -f "$out/python.jsonl.tmp"
if [[ -n $tcmalloc ]]; then
  LD_PRELOAD=$tcmalloc "${python_bench[@]}" raschka raschka-train >>"$out/python.jsonl"
else
  echo "bench.sh: libtcmalloc_minimal.so.4 not found; Python runs with glibc only" >&2
fi

"$PYTHON" "$ROOT/scripts/bench_report.py" "$out"
if ((${#quick[@]} == 0)); then
  # The README shows the latest full run.
  mkdir -p "$ROOT/docs/bench"
  cp "$out"/table.md "$out"/results.json "$out"/*.png "$ROOT/docs/bench/"
fi
echo "bench.sh: done in $((SECONDS - start)) s; results in $out" >&2
