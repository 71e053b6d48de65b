#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (AddressSanitizer and UndefinedBehaviorSanitizer on)
# and runs each for SECONDS (default 60) from the seed corpus in tests/fuzz/corpus/. A crash
# stops the script with libFuzzer's report and leaves the input in build-sanitize/.
#
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

seconds=${1:-60}
"$ROOT/scripts/setup.sh"
# The sanitized build of test.sh --sanitize: after that leg only the fuzz targets' mains compile.
fuzz_dir=$SANITIZE_BUILD_DIR
configure_sanitized
cmake --build "$fuzz_dir" -j "$JOBS" --target fuzz-safetensors fuzz-load_weights fuzz-unpickler \
  fuzz-attention

# LibTorch is not instrumented: leaks it keeps until exit and container annotations it lacks
# are not findings about this code.
export ASAN_OPTIONS=detect_leaks=0:detect_container_overflow=0:abort_on_error=1
for target in safetensors load_weights unpickler attention; do
  corpus=$(mktemp -d)
  cp "$ROOT/tests/fuzz/corpus/$target"/* "$corpus/"
  echo "fuzz.sh: fuzz-$target for $seconds s"
  log=$fuzz_dir/fuzz-$target.log
  status=0
  (cd "$fuzz_dir" && "./fuzz-$target" -max_total_time="$seconds" -rss_limit_mb=4096 \
    -print_final_stats=1 "$corpus") >"$log" 2>&1 || status=$?
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$log" || true
  rm -rf "$corpus"
  if ((status != 0)); then
    tail -n 60 "$log"
    echo "fuzz.sh: fuzz-$target found a failure (log: $log)" >&2
    exit 1
  fi
done
echo "fuzz.sh: no crash in ${seconds} s per target"
