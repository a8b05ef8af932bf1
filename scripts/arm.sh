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
# The suite's own sources at -O1 (the library, its NEON kernels and the harness
# at the build type's -O3): validation_test 36 s -> 20 s.
cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launch[@]}" \
  -DCMAKE_TOOLCHAIN_FILE="$ROOT/cmake/aarch64-linux-gnu.cmake" \
  -DSHORTCONV_CUDA=OFF -DSHORTCONV_BUILD_CLI=ON -DSHORTCONV_TEST_OPT=-O1
cmake --build "$B" -j "$JOBS" --target shortconv shortconv_tests shortconv_cli
machine=$(readelf -h "$B/bin/shortconv_tests" | grep -o "Machine:.*" | tr -s " ")
# Emulated: about 10x slower than native, so the fuzzer gets a few seconds.
# Left out: the one death test, which re-executes the test binary (an aarch64
# executable the host cannot exec without binfmt registration).  Two shards of
# the suite and the check side by side (qemu runs one emulated thread per
# thread: each is one core's work most of the time).
suite_shard() {
  log "C++ suite on aarch64 under qemu ($machine), shard $1 of 2"
  GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$1 SHORTCONV_FUZZ_SECONDS=${SHORTCONV_FUZZ_SECONDS:-3} \
    OMP_NUM_THREADS=2 qemu-aarch64-static -L /usr/aarch64-linux-gnu "$B/bin/shortconv_tests" \
    --gtest_brief=1 --gtest_filter="${ARM_TEST_FILTER:-*-Validation.NoExceptionCrossesTheAbi}"
}
shard0() { suite_shard 0; }
shard1() { suite_shard 1; }
cli_check() {
  log "shortconv check --backend cpu on aarch64"
  qemu-aarch64-static -L /usr/aarch64-linux-gnu "$B/bin/shortconv" check --backend cpu | tail -n 3
}
side_by_side shard0 shard1 cli_check
