#!/usr/bin/env bash
# Installs the library from BUILD_DIR into a prefix in BUILD_DIR/check-package (removed after),
# builds the examples against the installed package as a downstream project would, and runs
# them: examples/load_python_weights on
# weights that Python saves, examples/gpt on the book's GPT that examples/gpt/train.py trained
# (models/gpt/), which must generate Python's tokens, and with each attention of the book's
# chapter 4 (examples/gpt/chapter4.py writes them seeded), Python's tokens again; gpt-serve serves
# 16 requests at once with continuous batching, each getting the tokens it gets alone;
# examples/ring_attention
# over torchrun on two processes when the library has attention::distributed; and
# examples/ci_regression, whose CTest checks its C++ block against the cases its Python records
# with the parity kit; the installed Python package attention_ops on the installed operators. A
# shared build's libraries must export their API alone.
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

# A shared build's installed libraries: their SONAME (major.minor while the major version is 0)
# and exports (scripts/check_exports.sh).
check_shared_exports() {
  local prefix=$1 major minor soversion lib
  major=$(sed -n 's/^#define ATTENTION_VERSION_MAJOR \([0-9]*\)$/\1/p' "$ROOT/include/attention/version.h")
  minor=$(sed -n 's/^#define ATTENTION_VERSION_MINOR \([0-9]*\)$/\1/p' "$ROOT/include/attention/version.h")
  soversion=$major
  [[ $major == 0 ]] && soversion=$major.$minor
  for name in attention attention_distributed attention_testing; do
    lib=$(find "$prefix" -name "lib$name.so" | head -n 1)
    [[ -n $lib ]] && "$ROOT/scripts/check_exports.sh" "$lib" "lib$name.so.$soversion"
  done
  return 0
}

# In the build folder, under a name that is the same in every run: the compiler cache keys the
# examples' compiles by their paths relative to the checkout (build_example).
work=$BUILD_DIR/check-package
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

# The examples are one or two files each: they build at the same time, one compiler per core,
# from one installation made first.
install_package "$work"
has_distributed=false
[[ -f $work/prefix/include/attention/distributed.h ]] && has_distributed=true
builds=()
build_example "$work" load_python_weights &
builds+=($!)
build_example "$work" gpt &
builds+=($!)
# The parity kit as a downstream CI uses it: Python records at build time.
build_example "$work" ci_regression -DPARITY_PYTHON="$PYTHON" &
builds+=($!)
# attention::distributed is optional: present when the library was built with it.
if $has_distributed; then
  build_example "$work" ring_attention &
  builds+=($!)
fi
for build in "${builds[@]}"; do wait "$build"; done

"$PYTHON" "$ROOT/examples/load_python_weights/save_weights.py" "$work"
for file in mha.pt mha_state_dict.pt; do
  "$work/load_python_weights/load-python-weights" "$work/$file"
done
check_shared_exports "$work/prefix"
# The operators from the installed Python package, which loads the installed libattention_ops.
if [[ -d $work/prefix/share/attention/python/attention_ops ]]; then
  PYTHONPATH="$work/prefix/share/attention/python" "$PYTHON" - "$work/prefix" <<'PYTHON'
import os, sys, torch
import attention_ops
assert attention_ops.library_path().startswith(os.path.realpath(sys.argv[1])), attention_ops.library_path()
q, k, v = (torch.randn(1, 2, 40, 8, dtype=torch.float64) for _ in range(3))
got = attention_ops.scaled_dot_product_attention(q, k, v, is_causal=True)
hidden = torch.ones(40, 40, dtype=torch.bool).triu(1)
expected = (q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(hidden, -torch.inf).softmax(-1) @ v
torch.testing.assert_close(got, expected)
print("check_package.sh: the installed attention_ops loads", attention_ops.library_path())
PYTHON
fi
# CTest checks one test per case that Python recorded.
(cd "$work/ci_regression" && ctest --output-on-failure)
"$work/gpt/gpt" "$ROOT/models/gpt"
# The same GPT with each attention of the book's chapter 4, against Python's generation.
"$PYTHON" "$ROOT/examples/gpt/chapter4.py" "$work/chapter4" >/dev/null
for model in "$work"/chapter4/*/; do
  echo "check_package.sh: gpt with $(basename "$model")"
  "$work/gpt/gpt" "$model"
done
# 16 requests at once over a paged KV cache, each getting the tokens it gets alone.
"$work/gpt/gpt-serve" "$ROOT/models/gpt"
# The same from an 8-bit cache: how far its tokens and logits are from the float cache's.
"$work/gpt/gpt-serve" "$ROOT/models/gpt" --int8
# Requests that share a system prompt, and a conversation's turns, with prefix caching.
"$work/gpt/gpt-serve" "$ROOT/models/gpt" --shared-prompt
if $has_distributed; then
  torchrun --standalone --nproc_per_node=2 --redirects 1 --tee 1 --no_python \
    "$work/ring_attention/ring-attention" | grep "matches one process"
fi
echo "check_package.sh: the installed package builds and runs the examples"
