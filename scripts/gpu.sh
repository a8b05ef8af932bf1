#!/usr/bin/env bash
# One call on the GPU machine: build for sm_90, run the GPU tests, the
# compute-sanitizer subset (memcheck + racecheck), `shortconv check --backend
# cuda` and `shortconv bench --backend cuda --json`, ncu on a batch-1 decode
# step, then print a short table.
#
#   scripts/gpu.sh [build-dir]        (default /tmp/sc-gpu; logs under ./gpu-logs)
#
# With $OUT set (a folder that is collected after the call), the logs are also
# packed into $OUT/gpu-logs.tar.gz and the stage summary written to
# $OUT/summary.txt after every stage: two files, so a run cut short still
# returns everything finished so far.
#
# GPU_CONFORM_SECONDS / GPU_PYTEST_SECONDS bound the two Python stages.
# Environment: GPU_SKIP_TESTS=1 / GPU_SKIP_SAN=1 / GPU_SKIP_CHECK=1 / GPU_SKIP_BENCH=1 / GPU_SKIP_NCU=1 /
# GPU_SKIP_PY=1 / GPU_SKIP_CONFORM=1 / GPU_SKIP_PYBENCH=1 / GPU_SKIP_PYDECODE=1 / GPU_SKIP_TOKENS=1 /
# GPU_SKIP_CTYPES=1 / GPU_SKIP_CPU=1
# skip a stage;
# GPU_SAN_FILTER replaces the memcheck stage's gtest filter, GPU_RACE_FILTER the racecheck one's; GPU_PYTEST_PATHS the Python
# suite's paths (default tests/python) and GPU_PYTEST_ARGS adds pytest options;
# GPU_BENCH_ARGS adds options to the bench (e.g. "--shape 8x4096x4096");
# GPU_BASELINE=<source tree> also builds that tree (an older commit, e.g. from
# `git archive`) and benches it in the same run, right after this tree, for a
# before/after table on the same card.
# Every stage runs even when an earlier one fails; the exit status is the
# number of failed stages.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-/tmp/sc-gpu}
LOG=$ROOT/gpu-logs
mkdir -p "$LOG"
JOBS=$(nproc 2>/dev/null || echo 8)
declare -A STATUS
FAILED=0
stage() {  # stage NAME CMD...: run, log to $LOG/NAME.log, record pass/fail and seconds
  local name=$1; shift
  local t0=$(date +%s)
  echo "=== $name: $*"
  if "$@" >"$LOG/$name.log" 2>&1; then STATUS[$name]="ok"; else STATUS[$name]="FAIL($?)"; FAILED=$((FAILED+1)); fi
  STATUS[$name]="${STATUS[$name]} $(( $(date +%s) - t0 ))s"
  tail -n 5 "$LOG/$name.log"
  collect
}
collect() {  # the logs so far into $OUT (when set)
  [ -n "${OUT:-}" ] || return 0
  for s in build tests memcheck racecheck check bench ncu base_build base_bench native pyconform pytest pybench pydecode pytokens pyhost_ctypes pydecode_ctypes cpuisa; do
    [ -n "${STATUS[$s]:-}" ] && printf '%-10s %s\n' "$s" "${STATUS[$s]}"
  done >"$OUT/summary.txt"
  tar czf "$OUT/gpu-logs.tar.gz" -C "$LOG" . 2>/dev/null
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv >"$LOG/gpu.txt" 2>&1
cat "$LOG/gpu.txt"

# The baseline tree builds in the background while this one builds (the
# longest file compiles alone: two builds overlap almost fully).
BASE_PID=
if [ -n "${GPU_BASELINE:-}" ]; then
  ( t0=$(date +%s)
    if cmake -S "$GPU_BASELINE" -B "$B-base" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DSHORTCONV_CUDA=ON -DSHORTCONV_BUILD_TESTS=OFF \
        && cmake --build "$B-base" -j$JOBS; then st=ok; else st="FAIL($?)"; fi
    echo "$st" >"$LOG/base_build.status"
    echo "$(( $(date +%s) - t0 ))s" >>"$LOG/base_build.status" ) >"$LOG/base_build.log" 2>&1 &
  BASE_PID=$!
fi
if [ "${GPU_SKIP_TESTS:-0}" = 1 ] && [ "${GPU_SKIP_SAN:-0}" = 1 ]; then
  BUILD_TESTS=OFF; TARGETS="shortconv shortconv_cli"  # (no gtest binary wanted)
else
  BUILD_TESTS=ON; TARGETS="shortconv shortconv_tests shortconv_cli"
fi
stage build bash -c "cmake -S '$ROOT' -B '$B' -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DSHORTCONV_CUDA=ON -DSHORTCONV_BUILD_TESTS=$BUILD_TESTS \
  && cmake --build '$B' -j$JOBS --target $TARGETS 2>&1 \
  || cmake --build '$B' -j$JOBS"
TESTS=$B/bin/shortconv_tests
CLI=$B/bin/shortconv
[ -x "$CLI" ] || CLI=$(find "$B" -maxdepth 2 -type f -name shortconv -perm -u+x | head -1)

GPU_FILTER='Cuda.*:*/cuda'
SAN_FILTER=${GPU_SAN_FILTER:-'Cuda.TokenMajorVectorSizes:Backends/StateAddressing.UnalignedPoolEqualsAlignedPool/cuda:Cuda.PackedVector:Cuda.InPlaceDecode:Cuda.GeneralPathWide:Cuda.ChannelMajor*:Cuda.StridedViews:Backends/SeqIdx.*/cuda:Backends/Serving.AcceptedCountsAtBothEndsAndPadSlots/cuda:Backends/Serving.StarDraftsAreTwoTokenSteps/cuda:Cuda.DecodeGraphReplaysWithNewRowsAndCounts:Cuda.DecodeWideSteps:Cuda.DecodeWideForms'}
if [ "${GPU_SKIP_TESTS:-0}" != 1 ]; then
  stage tests "$TESTS" --gtest_filter="$GPU_FILTER"
fi
if [ "${GPU_SKIP_SAN:-0}" != 1 ]; then
  stage memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$TESTS" --gtest_filter="$SAN_FILTER"
  stage racecheck compute-sanitizer --tool racecheck --error-exitcode 1 "$TESTS" --gtest_filter="${GPU_RACE_FILTER:-Cuda.PackedVector:Cuda.ChannelMajor*:Cuda.InPlaceDecode}"
fi
if [ "${GPU_SKIP_CHECK:-0}" != 1 ]; then
  stage check "$CLI" check --backend cuda
fi
if [ "${GPU_SKIP_BENCH:-0}" != 1 ]; then
  stage bench bash -c "'$CLI' bench --backend cuda --json ${GPU_BENCH_ARGS:-} > '$LOG/bench.json'"
fi
# ncu on one batch-1 decode step (the decode bench's 41st step launch: vLLM rows, D = 4096,
# one token), with warm caches as in its graph replays (--cache-control none: ncu's default
# flush makes every load a DRAM miss): instructions and the stall reasons per issued
# instruction, the evidence for what a latency-bound step spends.
if [ "${GPU_SKIP_NCU:-0}" != 1 ] && [ "${GPU_SKIP_BENCH:-0}" != 1 ] && command -v ncu >/dev/null; then
  NCU_M=smsp__inst_executed.sum,smsp__warps_launched.sum,gpu__time_duration.sum
  for r in long_scoreboard wait short_scoreboard imc_miss no_instruction branch_resolving; do
    NCU_M=$NCU_M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
  done
  stage ncu bash -c "timeout 60 ncu --clock-control none --cache-control none --kill yes \
    -k 'regex:fwd_decode_(linear|plain)' -s 40 -c 1 --metrics $NCU_M \
    '$CLI' bench --backend cuda --decode --dtype bf16 > '$LOG/ncu_decode.txt' 2>&1"
fi
if [ -n "$BASE_PID" ]; then
  wait "$BASE_PID"
  STATUS[base_build]="$(tr '\n' ' ' <"$LOG/base_build.status" 2>/dev/null)"
  case "${STATUS[base_build]}" in ok*) ;; *) FAILED=$((FAILED+1)) ;; esac
  stage base_bench bash -c "'$B-base/bin/shortconv' bench --backend cuda --json ${GPU_BENCH_ARGS:-} > '$LOG/bench_base.json'"
fi
# The PyTorch package on the device's torch: its tests (CUDA streams, graphs,
# inductor) and the PyTorch-API bench against plain F.conv1d, beside the CLI's
# figures of this run (bench.json) and with the package's host overhead.
PY=${PYTHON:-python3}
if [ "${GPU_SKIP_PY:-0}" != 1 ]; then
  # the package's common calls compiled against the device's torch (shortconv/native.py);
  # the stages below require it (SHORTCONV_NATIVE=1), the *_ctypes ones run without it
  export SHORTCONV_NATIVE_DIR="$B/native"
  stage native env PYTHONPATH="$ROOT/python" SHORTCONV_LIBRARY="$B/lib/libshortconv.so" \
    "$PY" -m shortconv.build_native
  case "${STATUS[native]}" in ok*) export SHORTCONV_NATIVE=1 ;; esac  # (else: ctypes alone)
  # the peers' conformance parametrisations on the GPU first (their CUDA cases),
  # (the torch.compile suite last: its compilations are the slow part), then the suite,
  # bounded: it runs every test on both devices, torch.compile ones included
  [ "${GPU_SKIP_CONFORM:-0}" = 1 ] || stage pyconform env SHORTCONV_LIBRARY="$B/lib/libshortconv.so" PYTHONPATH="$ROOT/python" \
    timeout "${GPU_CONFORM_SECONDS:-300}" "$PY" -m pytest -q -p no:cacheprovider -rf -k cuda --durations=10 \
    $(for f in dao fla vllm compile_dropins; do echo "$ROOT/tests/python/conformance/test_$f.py"; done)
  stage pytest env SHORTCONV_LIBRARY="$B/lib/libshortconv.so" PYTHONPATH="$ROOT/python" \
    timeout "${GPU_PYTEST_SECONDS:-300}" "$PY" -m pytest -q -p no:cacheprovider --durations=15 \
    ${GPU_PYTEST_PATHS:-$ROOT/tests/python} ${GPU_PYTEST_ARGS:-}
  [ "${GPU_SKIP_PYBENCH:-0}" = 1 ] || stage pybench env SHORTCONV_LIBRARY="$B/lib/libshortconv.so" PYTHONPATH="$ROOT/python" \
    "$PY" -m shortconv.bench --device cuda --budget ${GPU_PYBENCH_BUDGET:-0.3} \
    $([ -s "$LOG/bench.json" ] && echo --cli-json "$LOG/bench.json")
  # the decode section through the PyTorch API: eager vs one torch op, graph replays, the
  # host path of one step per entry point against torch.mul
  [ "${GPU_SKIP_PYDECODE:-0}" = 1 ] || stage pydecode env SHORTCONV_LIBRARY="$B/lib/libshortconv.so" PYTHONPATH="$ROOT/python" \
    "$PY" -m shortconv.bench --device cuda --decode --budget ${GPU_PYBENCH_BUDGET:-0.3}
  # the speculative step against the plain one by tokens per sequence (bench/decode_tokens.py)
  [ "${GPU_SKIP_TOKENS:-0}" = 1 ] || stage pytokens env SHORTCONV_LIBRARY="$B/lib/libshortconv.so" PYTHONPATH="$ROOT/python" \
    "$PY" "$ROOT/bench/decode_tokens.py"
  # the same host paths through ctypes alone (the package without its native module)
  if [ "${GPU_SKIP_CTYPES:-0}" != 1 ]; then
    stage pyhost_ctypes env SHORTCONV_NATIVE=0 SHORTCONV_LIBRARY="$B/lib/libshortconv.so" PYTHONPATH="$ROOT/python" \
      "$PY" -m shortconv.bench --device cuda --overhead-only --budget ${GPU_PYBENCH_BUDGET:-0.3}
    stage pydecode_ctypes env SHORTCONV_NATIVE=0 SHORTCONV_LIBRARY="$B/lib/libshortconv.so" PYTHONPATH="$ROOT/python" \
      "$PY" -m shortconv.bench --device cuda --decode --budget ${GPU_PYBENCH_BUDGET:-0.3}
  fi
  unset SHORTCONV_NATIVE
fi
# The CPU backend on this host, once per instruction set it has (AVX2, AVX-512
# and AVX-512 BF16 by default: the tables bench/RESULTS.md keeps), bench and CPU tests.
if [ "${GPU_SKIP_CPU:-0}" != 1 ]; then
  stage cpuisa env SHORTCONV_ISA_BENCH_BUILD="$B" SHORTCONV_ISA_BENCH_ISAS="${GPU_CPU_ISAS:-avx2 avx512 avx512bf16}" \
    bash "$ROOT/scripts/cpu_isa_bench.sh" ${GPU_CPU_BENCH_ARGS:-}
fi

echo
echo "==== summary ($(date -u +%FT%TZ), $(head -2 "$LOG/gpu.txt" | tail -1))"
for s in build tests memcheck racecheck check bench ncu base_build base_bench native pyconform pytest pybench pydecode pytokens pyhost_ctypes pydecode_ctypes cpuisa; do
  [ -n "${STATUS[$s]:-}" ] && printf '%-10s %s\n' "$s" "${STATUS[$s]}"
done
grep -hE '^\[  FAILED  \]' "$LOG/tests.log" 2>/dev/null | head -20
grep -h -A12 'Failure' "$LOG/tests.log" 2>/dev/null | cut -c1-400 | head -60
grep -hE 'ERROR SUMMARY|Race reports|RACECHECK SUMMARY' "$LOG/memcheck.log" "$LOG/racecheck.log" 2>/dev/null
[ -s "$LOG/ncu_decode.txt" ] && grep -E 'fwd_decode|inst_executed|warps_launched|duration|ratio' "$LOG/ncu_decode.txt" | sed 's/  */ /g' 
tail -n 1 "$LOG/pyconform.log" "$LOG/pytest.log" 2>/dev/null
[ -s "$LOG/pybench.log" ] && tail -n 22 "$LOG/pybench.log"
[ -s "$LOG/pydecode.log" ] && tail -n 95 "$LOG/pydecode.log"  # the tables and the host-path rows
[ -s "$LOG/pytokens.log" ] && cat "$LOG/pytokens.log"
[ -s "$LOG/pyhost_ctypes.log" ] && tail -n 12 "$LOG/pyhost_ctypes.log"
[ -s "$LOG/pydecode_ctypes.log" ] && tail -n 16 "$LOG/pydecode_ctypes.log"
[ -s "$LOG/cpuisa.log" ] && grep -E '^== |copy|GB/s|^ *(dense|packed|long|small)|tests|PASSED|FAILED' "$LOG/cpuisa.log" | head -60
if [ -s "$LOG/bench.json" ]; then
  python3 - "$LOG/bench.json" "$LOG/bench_base.json" <<'EOF'
import json, os, sys
d = json.load(open(sys.argv[1]))
base, b = {}, None
if os.path.exists(sys.argv[2]) and os.path.getsize(sys.argv[2]):
    b = json.load(open(sys.argv[2]))
    base = {(r.get("shape"), r.get("dtype"), r.get("layout"), r.get("W")): r for r in b.get("results", [])}
    print(f"baseline copy bandwidth {b.get('copy_GBps', 0):.0f} GB/s")
bw = d.get("copy_GBps", 0)
print(f"copy bandwidth {bw:.0f} GB/s")
print(f"{'shape':34} {'dt':5} {'layout':13} {'W':>2} {'fwd us':>9} {'frac':>5} {'f+b us':>9} {'frac':>5} {'eager f / f+b us':>17}")
for r in d.get("results", []):
    xb = r.get("x_bytes", 0)
    f, fb = r.get("fwd_us", 0), r.get("fwdbwd_us", 0)
    ff = (r.get("fwd_tensors", 2) * xb / (bw * 1e3)) / f if f and bw else 0
    fbf = (r.get("fwdbwd_tensors", 5) * xb / (bw * 1e3)) / fb if fb and bw else 0
    print(f"{r.get('shape','')[:34]:34} {r.get('dtype',''):5} {r.get('layout','')[:13]:13} {r.get('W',0):>2} "
          f"{f:9.1f} {ff:5.2f} {fb:9.1f} {fbf:5.2f} {r.get('fwd_call_us') or 0:8.1f} {r.get('fwdbwd_call_us') or 0:8.1f} {r.get('error','')}")
    o = base.get((r.get("shape"), r.get("dtype"), r.get("layout"), r.get("W")))
    if o:
        print(f"{'  baseline':34} {'':5} {'':13} {'':>2} {o.get('fwd_us', 0):9.1f} {'':5} {o.get('fwdbwd_us', 0):9.1f}")
if d.get("decode"):
    print(f"decode steps (GPU us from graph replays); empty kernel {d.get('empty_kernel_us') or 0:.2f} us, "
          f"eager {d.get('empty_kernel_call_us') or 0:.2f} us; one round trip {d.get('round_trip_us') or 0:.2f} us, "
          f"an index then a load {d.get('index_round_trip_us') or 0:.2f} us; launched to overlap: empty "
          f"{d.get('empty_kernel_overlap_us') or 0:.2f}, index then load {d.get('index_round_trip_overlap_us') or 0:.2f}, "
          f"read ahead {d.get('ahead_round_trip_overlap_us') or 0:.2f} us")
    bdec = {}
    if b:  # (a baseline benched in this run)
        bdec = {(r["rows"], r["D"], r["T"], r["batch"]): r for r in b.get("decode", [])}
    print(f"{'rows':5} {'D':>5} {'T':>2} {'batch':>5} {'us':>8} {'/empty':>7} {'frac':>5} {'eager us':>9} "
          f"{'launch':>7} {'reads':>7} {'/empty':>7} {'base us':>8} {'reads':>7}")
    for r in d["decode"]:
        o = bdec.get((r["rows"], r["D"], r["T"], r["batch"]), {})
        print(f"{r['rows']:5} {r['D']:5} {r['T']:2} {r['batch']:5} {r.get('us') or 0:8.2f} "
              f"{r.get('per_empty') or 0:7.2f} {r.get('frac') or 0:5.2f} {r.get('call_us') or 0:9.1f} "
              f"{r.get('launch_us') or 0:7.2f} {r.get('reads_us') or 0:7.2f} {r.get('reads_per_empty') or 0:7.2f} "
              f"{o.get('us') or 0:8.2f} {o.get('reads_us') or 0:7.2f} {r.get('error','')}")
EOF
fi
collect
exit $FAILED
