#!/usr/bin/env bash
# Build-time variants of the CUDA library, built side by side and benched in
# one call, interleaved, each row written as soon as it is measured:
#
#   GPU_VARIANTS='base: ; stages6:-DSC_SOME_KNOB=6' scripts/gpu_variants.sh [out-dir]
#
# GPU_VARIANTS: `name:flags` entries separated by `;` (the flags go to
#   CMAKE_CUDA_FLAGS and CMAKE_CXX_FLAGS, so that the host planner sees them
#   too: -D macros a change under measurement reads with #ifndef defaults; an
#   empty entry builds the tree as it is).
# GPU_VARIANT_SRC_<name>: another source tree for that variant (e.g. an older
#   commit from `git archive`), default this tree.
# GPU_VARIANT_ROWS: `shortconv bench` argument sets separated by `;` (default:
#   the dense, W=8, long, packed and small bf16 rows).
# GPU_VARIANT_ROUNDS: passes over all variants (default 2: the spread shows).
# Output (default $OUT, else ./gpu-logs/variants): build logs, bench.txt (a
# `## name | args` header before each row), builds.txt with each build's time.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
O=${1:-${OUT:-$ROOT/gpu-logs}/variants}
mkdir -p "$O"
JOBS=$(nproc 2>/dev/null || echo 8)
ROWS=${GPU_VARIANT_ROWS:-'--shape 8x4096x4096;--shape 8x4096x4096 --width 8;--shape 1x65536x4096;--shape 1x32768x8192 --seqs 16 --states;--shape 1x2048x2048'}
IFS=';' read -r -a VARIANTS <<<"${GPU_VARIANTS:-base:}"
IFS=';' read -r -a ROWSETS <<<"$ROWS"
names=()
t0=$(date +%s)
for v in "${VARIANTS[@]}"; do
  v=$(echo "$v" | sed 's/^ *//; s/ *$//')
  [ -n "$v" ] || continue
  name=${v%%:*}; flags=${v#*:}
  src_var="GPU_VARIANT_SRC_$name"; src=${!src_var:-$ROOT}
  names+=("$name")
  ( cmake -S "$src" -B "/tmp/sc-var-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DSHORTCONV_CUDA=ON -DSHORTCONV_BUILD_TESTS=OFF \
      "-DCMAKE_CUDA_FLAGS=$flags" "-DCMAKE_CXX_FLAGS=$flags" >"$O/build_$name.log" 2>&1 \
    && cmake --build "/tmp/sc-var-$name" -j"$JOBS" --target shortconv shortconv_cli >>"$O/build_$name.log" 2>&1
    echo "$name rc=$? $(( $(date +%s) - t0 ))s" >>"$O/builds.txt" ) &
done
wait
cat "$O/builds.txt"
for round in $(seq 1 "${GPU_VARIANT_ROUNDS:-2}"); do
  for name in "${names[@]}"; do
    cli=/tmp/sc-var-$name/bin/shortconv
    [ -x "$cli" ] || continue
    for args in "${ROWSETS[@]}"; do
      echo "## $name | $args" >>"$O/bench.txt"
      # shellcheck disable=SC2086
      "$cli" bench --backend cuda --dtype bf16 $args 2>&1 | grep -E "^(dense|packed|vllm |rows )" >>"$O/bench.txt"
    done
  done
  echo "round $round $(( $(date +%s) - t0 ))s" >>"$O/builds.txt"
done
