#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (AddressSanitizer and UndefinedBehaviorSanitizer on)
# and runs each for SECONDS (default 60) from the seed corpus in tests/fuzz/corpus/ (and the
# target's dictionary of tokens, tests/fuzz/<target>.dict, where it has one), as many at a time as
# there are cores. Every input of the file readers' targets has a budget: one that takes more than
# RSS_LIMIT_MB of memory or TIMEOUT seconds is a failure like a crash (a load of an untrusted file
# must keep to the budget of docs/SECURITY.md; the sanitizers' own memory is counted here too). A
# failure fails the script with libFuzzer's report and leaves the input in build-sanitize/.
#
#   scripts/fuzz.sh [SECONDS]      (RSS_LIMIT_MB=2048 and TIMEOUT=30 per input by default)
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

seconds=${1:-60}
rss_limit_mb=${RSS_LIMIT_MB:-2048}
timeout=${TIMEOUT:-30}
"$ROOT/scripts/setup.sh"
# The sanitized build of test.sh --sanitize: after that leg only the fuzz targets' mains compile.
fuzz_dir=$SANITIZE_BUILD_DIR
configure_sanitized
cmake --build "$fuzz_dir" -j "$JOBS" --target fuzz-safetensors fuzz-load_weights fuzz-unpickler \
  fuzz-attention

# LibTorch is not instrumented: leaks it keeps until exit and container annotations it lacks
# are not findings about this code.
export ASAN_OPTIONS=detect_leaks=0:detect_container_overflow=0:abort_on_error=1

# Runs fuzz-TARGET for the whole time from a copy of its seed corpus; its log and exit status
# go to build-sanitize/fuzz-TARGET.{log,status}.
fuzz_one() {
  local target=$1 corpus status=0 limits=()
  corpus=$(mktemp -d)
  cp "$ROOT/tests/fuzz/corpus/$target"/* "$corpus/"
  if [[ $target == attention ]]; then
    # The differential kernel fuzzer: large problems on purpose, no file budget.
    limits=(-rss_limit_mb=4096)
  else
    limits=(-rss_limit_mb="$rss_limit_mb" -timeout="$timeout")
  fi
  if [[ -f $ROOT/tests/fuzz/$target.dict ]]; then limits+=(-dict="$ROOT/tests/fuzz/$target.dict"); fi
  (cd "$fuzz_dir" && "./fuzz-$target" -max_total_time="$seconds" "${limits[@]}" \
    -print_final_stats=1 "$corpus") >"$fuzz_dir/fuzz-$target.log" 2>&1 || status=$?
  rm -rf "$corpus"
  echo "$status" >"$fuzz_dir/fuzz-$target.status"
}

# Each target is one process on one core: JOBS of them at a time, each for the whole time.
targets=(safetensors load_weights unpickler attention)
for ((first = 0; first < ${#targets[@]}; first += JOBS)); do
  for target in "${targets[@]:first:JOBS}"; do
    echo "fuzz.sh: fuzz-$target for $seconds s"
    fuzz_one "$target" &
  done
  wait
done
failed=0
for target in "${targets[@]}"; do
  log=$fuzz_dir/fuzz-$target.log
  echo "fuzz.sh: fuzz-$target"
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$log" || true
  if [[ $(cat "$fuzz_dir/fuzz-$target.status") != 0 ]]; then
    tail -n 60 "$log"
    echo "fuzz.sh: fuzz-$target found a failure (log: $log)" >&2
    failed=1
  fi
done
((failed == 0)) || exit 1
echo "fuzz.sh: no crash in ${seconds} s per target"
