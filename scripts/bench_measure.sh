#!/usr/bin/env bash
# The measurements of scripts/bench.sh, run where the LibTorch to measure lives (this machine,
# or the Debian 13 root): the C++ benchmark and the Python one, Python with the default
# allocator and with tcmalloc preloaded.
#
#   scripts/bench_measure.sh ATTENTION_BENCH OUT_DIR [--quick]
#
# Writes OUT_DIR/processor.txt (the processor's /proc/cpuinfo lines), OUT_DIR/cpp.jsonl and
# OUT_DIR/python.jsonl, and where Python has PyTorch 2.x the runs of
# both sides forced to AVX2 in OUT_DIR/cpp_avx2.jsonl and OUT_DIR/python_avx2.jsonl. Python is
# $PYTHON (default /usr/bin/python3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bench=("$1")
out=$2
shift 2
quick=("$@")
bench+=("${quick[@]}")
python_bench=("${PYTHON:-/usr/bin/python3}" "$here/bench_python.py" "${quick[@]}")
tcmalloc=$(ldconfig -p | awk '/libtcmalloc_minimal.so.4 /{path = $NF} END {print path}')
mkdir -p "$out"
# The processor the numbers come from, for the report's table.
grep -m5 -E '^(vendor_id|cpu family|model|model name|flags)\s*:' /proc/cpuinfo >"$out/processor.txt" || true

lengths=(512 1024 2048 4096 8192 16384 32768)
math_lengths=(512 1024 2048 4096 8192)
train_lengths=(8192)
window_lengths=(8192 32768)
window=1024
if ((${#quick[@]})); then
  lengths=(256 512)
  math_lengths=(256 512)
  train_lengths=(512)
  window_lengths=(512)
  window=128
fi
# PyTorch 2.x has a fused CPU kernel behind F.scaled_dot_product_attention and goes as far as
# Chunked; 1.13's is whole matrices, as far as Math.
python_lengths=("${math_lengths[@]}")
python_train_lengths=()
if "${python_bench[0]}" -c 'import sys, torch; sys.exit(int(torch.__version__.split(".")[0]) < 2)'
then
  python_lengths=("${lengths[@]}")
  python_train_lengths=("${train_lengths[@]}")
fi

echo "bench_measure.sh: C++ ..." >&2
"${bench[@]}" matmul article raschka raschka-train core-train decode dtypes paged-decode \
  >"$out/cpp.jsonl"
# bfloat16 once more on the widened route, for the side-by-side ratio of the bfloat16 products.
ATTENTION_CPU_BF16=widened "${bench[@]}" dtypes >>"$out/cpp.jsonl"
# Where the processor has AMX's tiles, once more on AVX512_BF16's vector products: what the tiles
# give.
if grep -qw amx_bf16 /proc/cpuinfo; then
  ATTENTION_CPU_BF16=avx512_bf16 "${bench[@]}" dtypes >>"$out/cpp.jsonl"
fi
# One process per long-context run: each reports its own peak memory. Python's run of the same
# length follows at once, so that the two sides of a ratio are measured minutes apart at most.
for t in "${lengths[@]}"; do
  echo "bench_measure.sh: long context T=$t" >&2
  "${bench[@]}" "long:chunked:$t" >>"$out/cpp.jsonl"
  if [[ " ${python_lengths[*]} " == *" $t "* ]]; then
    "${python_bench[@]}" "long:$t" >>"$out/python.jsonl.tmp"
  fi
done
for t in "${math_lengths[@]}"; do
  "${bench[@]}" "long:math:$t" >>"$out/cpp.jsonl"
done
for t in "${window_lengths[@]}"; do
  echo "bench_measure.sh: sliding window $window at T=$t" >&2
  "${bench[@]}" "window:$t:$window" >>"$out/cpp.jsonl"
done
for t in "${train_lengths[@]}"; do
  echo "bench_measure.sh: long-context training T=$t" >&2
  for impl in chunked math; do
    "${bench[@]}" "long-train:$impl:$t" >>"$out/cpp.jsonl"
  done
done
for t in "${python_train_lengths[@]}"; do
  "${python_bench[@]}" "long-train:$t" >>"$out/python.jsonl.tmp"
done

# The AVX2 route on both sides, where Python has PyTorch 2.x's fused attention to compare with:
# the library's exponential passes, products and generated kernels capped at AVX2, PyTorch's
# kernels, oneDNN's and OpenBLAS's at AVX2 (Haswell). Any AVX-512 processor runs it.
if ((${#python_train_lengths[@]})); then
  echo "bench_measure.sh: both sides forced to AVX2" >&2
  avx2_lengths=(8192 32768)
  if ((${#quick[@]})); then avx2_lengths=(512); fi
  avx2=(env ATTENTION_CPU_VECTOR=avx2 OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2
    DNNL_MAX_CPU_ISA=AVX2)
  "${avx2[@]}" "${bench[@]}" core-train >"$out/cpp_avx2.jsonl"
  "${avx2[@]}" "${python_bench[@]}" core-train >"$out/python_avx2.jsonl"
  for t in "${avx2_lengths[@]}"; do
    "${avx2[@]}" "${bench[@]}" "long:chunked:$t" >>"$out/cpp_avx2.jsonl"
    "${avx2[@]}" "${python_bench[@]}" "long:$t" >>"$out/python_avx2.jsonl"
  done
fi

echo "bench_measure.sh: Python ..." >&2
"${python_bench[@]}" matmul article raschka raschka-train core-train dtypes >"$out/python.jsonl"
# The operators of the build that made the C++ benchmark, beside PyTorch's attention.
ATTENTION_OPS_LIBRARY=$(dirname "${bench[0]}")/libattention_ops.so "${python_bench[@]}" operators \
  >>"$out/python.jsonl"
cat "$out/python.jsonl.tmp" >>"$out/python.jsonl"
rm -f "$out/python.jsonl.tmp"
if [[ -n $tcmalloc ]]; then
  LD_PRELOAD=$tcmalloc "${python_bench[@]}" raschka raschka-train >>"$out/python.jsonl"
else
  echo "bench_measure.sh: libtcmalloc_minimal.so.4 not found; Python runs with glibc only" >&2
fi
