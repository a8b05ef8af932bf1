#!/usr/bin/env bash
# The C++ suite built for aarch64 (Debian's cross compiler) and run under
# qemu-user: the 128-bit (NEON) kernels against the oracle at every forced
# tile, the validation tables, the chunking and state-addressing invariants.
# CPU backend only (the CUDA backend is compiled by scripts/test.sh).
source "$(dirname "$0")/common.sh"
ensure_build_deps
ensure_apt g++-aarch64-linux-gnu qemu-user-static
B="$ROOT/build-arm"
mapfile -t launch < <(launcher_args)
cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launch[@]}" \
  -DCMAKE_TOOLCHAIN_FILE="$ROOT/cmake/aarch64-linux-gnu.cmake" \
  -DSHORTCONV_CUDA=OFF -DSHORTCONV_BUILD_CLI=ON
cmake --build "$B" -j "$JOBS" --target shortconv shortconv_tests shortconv_cli
log "C++ suite on aarch64 under qemu ($(readelf -h "$B/bin/shortconv_tests" | grep -o "Machine:.*" | tr -s " "))"
# Emulated: about 10x slower than native, so the fuzzer gets a few seconds.
# Left out: the one death test, which re-executes the test binary (an aarch64
# executable the host cannot exec without binfmt registration).
SHORTCONV_FUZZ_SECONDS=${SHORTCONV_FUZZ_SECONDS:-3} OMP_NUM_THREADS=2 \
  qemu-aarch64-static -L /usr/aarch64-linux-gnu "$B/bin/shortconv_tests" \
  --gtest_brief=1 --gtest_filter="${ARM_TEST_FILTER:-*-Validation.NoExceptionCrossesTheAbi}"
log "shortconv check --backend cpu on aarch64"
qemu-aarch64-static -L /usr/aarch64-linux-gnu "$B/bin/shortconv" check --backend cpu | tail -n 3
