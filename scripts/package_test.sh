#!/usr/bin/env bash
# Packaging: build the wheel offline (`pip wheel --no-build-isolation`, as on a
# machine without network), install it into a scratch prefix and run the
# Python suite against the installed package (no SHORTCONV_LIBRARY, no repo on
# the path).  CPU-only build to keep it quick (and without the AVX-512 unit
# on a machine that could not run it); the CUDA build is compiled by
# scripts/test.sh.
source "$(dirname "$0")/common.sh"
ensure_build_deps
ensure_venv
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "pip wheel --no-build-isolation (SHORTCONV_CUDA=OFF)"
# The compilers CMake picks for scripts/test.sh's tree (scikit-build-core would
# otherwise take Python's, g++ and gcc here): ccache keys on the compiler's name,
# and with the same one the CPU kernel units come from that tree's objects
# (measured: the wheel's build 165 s -> 15 s on this 2-core machine).
CC="${CC:-cc}" CXX="${CXX:-c++}" "$VENV/bin/python" -m pip wheel -q --no-build-isolation --no-deps -w "$tmp/wheel" \
  -C cmake.define.SHORTCONV_CUDA=OFF -C build-dir="$tmp/build" \
  $(grep -qw avx512f /proc/cpuinfo || echo -C cmake.define.SHORTCONV_CPU_AVX512=OFF) \
  $(command -v ccache >/dev/null && echo -C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache) "$ROOT"
"$VENV/bin/python" -m pip install -q --no-deps --target "$tmp/site" "$tmp"/wheel/shortconv-*.whl
cp -r "$ROOT/tests/python" "$tmp/tests"
# The native module built from the installed package (its sources and the C header ship in
# the wheel), into the scratch prefix; the second half below requires it.
log "native module from the installed wheel (python -m shortconv.build_native)"
(cd "$tmp" && env -u SHORTCONV_LIBRARY SHORTCONV_NATIVE_DIR="$tmp/native" PYTHONPATH="$tmp/site" \
  "$VENV/bin/python" -m shortconv.build_native)
# The suites that only re-run the same library calls (the peers' conformance
# parametrisations, the multi-process and property-based ones) ran in
# scripts/test.sh; here the point is the installed package: loading, the op
# registration, the numerics through it.  In two halves side by side (one
# thread each): the ones that start fresh interpreters, and the rest.
wheel_pytest() {
  (cd "$tmp" && env -u SHORTCONV_LIBRARY PYTHONPATH="$tmp/site" \
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@" -k "not distributed and not fuzz")
}
wheel_half1() {
  log "pytest against the installed wheel, first half: env and hostile (fresh interpreters)"
  wheel_pytest tests/test_env.py tests/test_hostile.py
}
wheel_half2() {
  log "pytest against the installed wheel, second half: the rest (with the native module)"
  SHORTCONV_NATIVE=1 SHORTCONV_NATIVE_DIR="$tmp/native" wheel_pytest tests --ignore=tests/conformance --ignore=tests/test_env.py --ignore=tests/test_hostile.py
}
side_by_side wheel_half1 wheel_half2
