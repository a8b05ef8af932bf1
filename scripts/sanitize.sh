#!/usr/bin/env bash
# The C++ suite under AddressSanitizer + UndefinedBehaviorSanitizer (CPU only).
source "$(dirname "$0")/common.sh"
ensure_build_deps
# The AVX-512 unit is left out where it could never run (it is the slowest unit
# to compile instrumented, and the suite would test the AVX2 table anyway).
avx512=ON; grep -qw avx512f /proc/cpuinfo || avx512=OFF
# -O1 -g1 (line tables): what the sanitizers' reports need; compiling is the
# bulk of this script (instrumented AVX2 unit at -O1: 199 s with -g, 161 s with -g1).
build_into "$ROOT/build-asan" -DSHORTCONV_CUDA=OFF -DSHORTCONV_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DSHORTCONV_CPU_AVX512=$avx512
log "ctest under ASan+UBSan (the C ABI fuzzer for ${SHORTCONV_FUZZ_SECONDS:=60} s)"
export SHORTCONV_FUZZ_SECONDS
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$ROOT/build-asan" --output-on-failure -j "$JOBS"
