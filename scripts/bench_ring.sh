#!/usr/bin/env bash
# Per-rank peak memory, bytes sent and time of causal ring attention for T = 4096 to 65536 on 1,
# 2 and 4 local processes started by torchrun (examples/ring_attention/torchrun.sh) (B=1, H=2, d=64, float32, forward; T = 16384 also
# with backward). This machine has 2 cores: the times are a check of overhead, not of speed-up.
# Writes docs/bench/ring.jsonl (one line per rank and run).
#
#   scripts/bench_ring.sh
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"

configure_and_build -DATTENTION_BUILD_TOOLS=ON -DATTENTION_DISTRIBUTED=ON
out=$ROOT/docs/bench/ring.jsonl
: >"$out"
run() {
  "$ROOT/examples/ring_attention/torchrun.sh" "$1" "$BUILD_DIR/attention-ring-bench" \
    --length "$2" "${@:3}" 2>/dev/null |
    sed -n 's/^\[default0\]://p' | grep '^{' | tee -a "$out"
}
for length in 4096 16384 65536; do
  for ranks in 1 2 4; do run "$ranks" "$length"; done
done
for ranks in 1 2 4; do run "$ranks" 16384 --backward; done
echo "bench_ring.sh: wrote $out"
