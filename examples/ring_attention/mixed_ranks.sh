#!/usr/bin/env bash
# One group of a C++ rank (./ring-attention, rank 0) and a Python rank (python_rank.py, rank 1)
# computing one causal ring attention together. Exits non-zero when either rank fails.
#
#   examples/ring_attention/mixed_ranks.sh RING_ATTENTION_BINARY [PYTHON]
set -euo pipefail
binary=$1
python=${2:-/usr/bin/python3}
here=$(dirname "$0")
# A free port for rank 0's store.
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
RANK=0 "$binary" --forward-only &
cpp=$!
RANK=1 "$python" "$here/python_rank.py" &
py=$!
status=0
wait "$cpp" || status=1
wait "$py" || status=1
exit "$status"
