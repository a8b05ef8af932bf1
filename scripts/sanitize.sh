#!/usr/bin/env bash
# The C++ suite under AddressSanitizer + UndefinedBehaviorSanitizer (CPU only).
source "$(dirname "$0")/common.sh"
ensure_build_deps
# The AVX-512 unit is left out where it could never run (it is the slowest unit
# to compile instrumented, and the suite would test the AVX2 table anyway).
avx512=ON; grep -qw avx512f /proc/cpuinfo || avx512=OFF
# -O1 -g1 (line tables): what the sanitizers' reports need; compiling is the
# bulk of this script (instrumented AVX2 unit at -O1: 199 s with -g, 161 s with -g1).
# The suite's own sources at -O0 (instrumented all the same; the library and the
# harness keep -O1): half their compile time (validation_test 53 s -> 26 s).
# No CLI: nothing here runs it (scripts/test.sh and arm.sh do).
build_into "$ROOT/build-asan" -DSHORTCONV_CUDA=OFF -DSHORTCONV_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DSHORTCONV_CPU_AVX512=$avx512 -DSHORTCONV_BUILD_CLI=OFF -DSHORTCONV_TEST_OPT=-O0
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
T="$ROOT/build-asan/bin/shortconv_tests"
# The suite as two processes (ctest's one process per test cost more than the
# tests: 39 s of CPU against 15 s), with ctest for the C and install tests; then
# the C ABI fuzzer as two streams side by side (seeds of their own), each for
# SHORTCONV_FUZZ_SECONDS: 2 x 30 s, a minute of fuzzing on both cores.
suite_shard() {
  log "C++ suite under ASan+UBSan, shard $1 of 2 (the fuzzer below)"
  GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$1 "$T" --gtest_brief=1 --gtest_filter=-Fuzz.*
}
shard0() { suite_shard 0; }
shard1() {
  suite_shard 1
  log "ctest: the C ABI test and the install test under ASan+UBSan"
  ctest --test-dir "$ROOT/build-asan" --output-on-failure -R "^(c_abi|install_consumer)$"
}
export SHORTCONV_FUZZ_SECONDS=${SHORTCONV_FUZZ_SECONDS:-30}
fuzz_stream() {
  log "the C ABI fuzzer under ASan+UBSan: seed $1, $SHORTCONV_FUZZ_SECONDS s"
  SHORTCONV_FUZZ_SEED=$1 "$T" --gtest_brief=1 --gtest_filter=Fuzz.*
}
fuzz_a() { fuzz_stream 20261201; }  # the test's default seed
fuzz_b() { fuzz_stream 20261202; }
side_by_side shard0 shard1
side_by_side fuzz_a fuzz_b
