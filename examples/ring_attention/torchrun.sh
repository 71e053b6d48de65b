#!/usr/bin/env bash
# Starts PROGRAM on N local processes with torchrun's static rendezvous on a free port, as the
# tests do: `torchrun --standalone` needs a libuv store in torchrun 2.4+, which LibTorch builds
# without libuv (Debian 13's 2.6) cannot serve; the static rendezvous honours USE_LIBUV=0.
# torchrun 1.13 under Python 3.11 also needs an explicit stream setting (--redirects/--tee 1).
#
#   examples/ring_attention/torchrun.sh N PROGRAM [ARGS...]
set -euo pipefail
n=$1
shift
python=${PYTHON:-/usr/bin/python3}
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
USE_LIBUV=0 exec torchrun --nnodes=1 --nproc_per_node="$n" --rdzv_backend=static \
  --master_addr=127.0.0.1 --master_port="$port" --redirects 1 --tee 1 --no_python "$@"
