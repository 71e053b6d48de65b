#!/usr/bin/env bash
# Starts PROGRAM on N local processes with torchrun, as the tests do, in a way that works with
# LibTorch 1.13 and with builds of 2.x that lack libuv (Debian 13's 2.6): torchrun 2.4+ makes
# every TCPStore of its own with libuv, so its rendezvous meets in a file store here and it does
# not share a TCP store with the workers; rank 0 then hosts the workers' store itself (c10d's
# classic backend). torchrun 1.13 under Python 3.11 also needs an explicit stream setting.
#
#   examples/ring_attention/torchrun.sh N PROGRAM [ARGS...]
set -euo pipefail
n=$1
shift
rendezvous=$(mktemp -u "${TMPDIR:-/tmp}/torchrun-rendezvous.XXXXXX")
trap 'rm -f "$rendezvous"' EXIT
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=1 --nproc_per_node="$n" \
  --rdzv_backend=c10d --rdzv_endpoint="$rendezvous" --rdzv_conf=store_type=file \
  --redirects 1 --tee 1 --no_python "$@"
