#!/usr/bin/env bash
# The aarch64 build and its unit tests on this x86-64 machine: Debian's cross compiler
# (gcc-aarch64-linux-gnu), arm64 libraries from Debian's multiarch packages, and the kernel,
# optimizer and model unit tests run under qemu-user. The kernels take the NEON path there
# (and the scalar one: every test runs each path the CPU has); matmuls go through Debian's
# arm64 oneDNN. Usage: scripts/test-aarch64.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-aarch64}
bash scripts/install-deps.sh --aarch64
cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_MPI=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target test_core test_testutil test_ops test_backend_ops test_ops_lowp test_nf4 test_ops_llama test_attention test_optim test_model test_model_train test_units test_memplan
file "$build/tests/test_ops" | grep -q "ARM aarch64" || { echo "test-aarch64: not an aarch64 binary" >&2; exit 1; }
# DT_TEST_QUICK: test_model_train's bitwise checkpointing and fused-loss matrices in fp32 only
# (the 16-bit kernels are checked by test_ops_lowp here; the full matrices run natively in make
# test)
root=$(pwd)
cd "$build" && DT_TEST_QUICK=1 bash "$root/tests/ctest.sh" --output-on-failure
