#!/usr/bin/env bash
# The second LibTorch generation: builds and runs the whole C++ suite against Debian 13's
# LibTorch 2.6 (with its python3-torch for the Python-side tests) inside a Debian 13 root made
# with debootstrap and kept in a cache folder outside the checkout (scripts/debian13.sh).
#
#   scripts/test_libtorch2.sh          (scripts/test.sh --libtorch2 runs this)
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
# shellcheck source=debian13.sh
source "$(dirname "$0")/debian13.sh"
start=$SECONDS

debian13_enter zlib1g-dev libgloo-dev libxsmm-dev python3-venv python3-pip python3-setuptools \
  python3-wheel
debian13_run 'python3 -c "import torch; print(\"test_libtorch2.sh: torch\", torch.__version__)"'
# The benchmark scripts run the load and ring benchmarks of the main build only; the fused
# kernels' forced routes and the goldens' regeneration are the same code on both generations, and
# the first leg runs them.
debian13_build -DATTENTION_BUILD_TESTS=ON -DATTENTION_BUILD_TOOLS=ON -DATTENTION_DISTRIBUTED=ON \
  -DATTENTION_BUILD_BENCH_EXTRAS=OFF -DATTENTION_GENERATION_INDEPENDENT_TESTS=OFF
debian13_run "$DEBIAN13_BUILD/attention-demo | tail -n 1
  cd $DEBIAN13_BUILD && ctest --output-on-failure -j \"\$JOBS\""
# pip install of the Python packages for the root's Python and its torch 2.6.
debian13_run "/src/scripts/check_pip.sh python3 $DEBIAN13_BUILD"
echo "test_libtorch2.sh: LibTorch 2 leg took $((SECONDS - start)) s"
