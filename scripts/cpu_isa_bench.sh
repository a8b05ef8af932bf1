#!/usr/bin/env bash
# The CPU backend once per instruction set the machine has: for each of
# sse2, avx2, avx512 and avx512bf16 (x86-64; elsewhere the 128-bit baseline only) that
# the processor supports, `shortconv bench --backend cpu` with
# SHORTCONV_CPU_ISA set (one table per instruction set, each with the copy
# bandwidth measured in the same run), then the CPU C++ tests under that
# instruction set (the CPU suites and the CPU instances of the
# backend-parametrised ones; a few seconds each).
#
#   bash scripts/cpu_isa_bench.sh [bench options...]   e.g. --dtype all, --threads 16
#
# Builds into build-cpu-isa/ (CUDA off), or into SHORTCONV_ISA_BENCH_BUILD
# (an existing build tree is reused).  SHORTCONV_ISA_BENCH_NO_TESTS=1 skips
# the tests.
# SHORTCONV_ISA_BENCH_ISAS="avx2 avx512" runs only those of the machine's.
source "$(dirname "$0")/common.sh"
BUILD="${SHORTCONV_ISA_BENCH_BUILD:-$ROOT/build-cpu-isa}"
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  ensure_build_deps
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHORTCONV_CUDA=OFF >/dev/null
fi
cmake --build "$BUILD" -j "$JOBS" --target shortconv_cli shortconv_tests

# The instruction sets this processor runs, lowest first (as the library
# decides them: cpu_isa.cpp's best_isa).
isas() {
  local isa
  if [ -n "${SHORTCONV_ISA_BENCH_ISAS:-}" ]; then
    for isa in $(machine_isas); do [[ " $SHORTCONV_ISA_BENCH_ISAS " == *" $isa "* ]] && echo "$isa"; done
    return 0
  fi
  machine_isas
}
machine_isas() {
  case "$(uname -m)" in
    x86_64|amd64) ;;
    *) echo v128; return ;;
  esac
  local flags
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  local has=1
  for f in avx2 fma f16c; do [[ "$flags" == *" $f "* ]] || has=0; done
  echo sse2
  [ "$has" = 1 ] || return 0
  echo avx2
  for f in avx512f avx512bw avx512dq avx512vl; do [[ "$flags" == *" $f "* ]] || return 0; done
  echo avx512
  [[ "$flags" == *" avx512_bf16 "* ]] && echo avx512bf16
  return 0
}

log "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) threads"
for isa in $(isas); do
  log "SHORTCONV_CPU_ISA=$isa shortconv bench --backend cpu $*"
  SHORTCONV_CPU_ISA=$isa "$BUILD/bin/shortconv" bench --backend cpu "$@"
done
if [ "${SHORTCONV_ISA_BENCH_NO_TESTS:-0}" != 1 ]; then
  for isa in $(isas); do
    log "SHORTCONV_CPU_ISA=$isa CPU tests"
    SHORTCONV_CPU_ISA=$isa "$BUILD/bin/shortconv_tests" --gtest_brief=1 \
      --gtest_filter='Cpu*.*:*/cpu:ValidEdges.*:FpMode.*'
  done
fi
