#!/usr/bin/env bash
# Measures how long each file of the suite's build takes to compile: configures a throwaway
# build as scripts/test.sh does (no compiler cache), builds it with every compile timed, and
# prints the slowest files with their CPU seconds (user + system, which contention on the other
# cores changes little) and wall seconds.
#
#   scripts/compile_times.sh [COUNT]    the COUNT slowest (10 by default); full list in the log
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

count=${1:-10}
work=${COMPILE_TIMES_DIR:-$ROOT/build-compile-times}
log=$work/compile-times.tsv
rm -rf "$work"
mkdir -p "$work"
: >"$log"

# The launcher runs each compile under GNU time and appends "cpu wall object" to the log.
launcher=$work/timed-compile
cat >"$launcher" <<'LAUNCHER'
#!/usr/bin/env bash
out=unknown
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  if [[ ${args[i]} == -o ]]; then out=${args[i + 1]}; fi
done
exec /usr/bin/time -a -o "$COMPILE_TIMES_LOG" -f "%U %S %e $out" "$@"
LAUNCHER
chmod +x "$launcher"

export COMPILE_TIMES_LOG=$log
BUILD_DIR=$work/build
configure_suite -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" >/dev/null
start=$SECONDS
if ! cmake --build "$work/build" -j "$JOBS" >"$work/build.log" 2>&1; then
  grep -B2 -A12 -m5 'error' "$work/build.log" >&2 || tail -n 40 "$work/build.log" >&2
  exit 1
fi
total=$((SECONDS - start))

awk -v root="$work/build/" '{ cpu = $1 + $2; obj = $4; sub(root, "", obj); sum += cpu;
  printf "%.1f\t%.1f\t%s\n", cpu, $3, obj } END { printf "%.0f\ttotal\n", sum > "/dev/stderr" }' \
  "$log" 2>"$work/total" | sort -rn >"$work/sorted.tsv"
echo "compile_times.sh: $(wc -l <"$work/sorted.tsv") compiles, $(cut -f1 "$work/total") CPU-seconds, build $total s wall with $JOBS jobs"
echo "cpu_s	wall_s	object"
head -n "$count" "$work/sorted.tsv"
