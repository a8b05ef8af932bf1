#!/usr/bin/env bash
# Every test: the C++ suite (CTest, CUDA backend compiled when nvcc exists),
# the Python suite on a current PyPI torch (custom ops, torch.compile), and the
# Python suite again on Debian's torch 1.13 (the autograd.Function fallback).
source "$(dirname "$0")/common.sh"
ensure_build_deps
# The suite's own sources at -O1 (the library, the harness and the CLI at the
# build type's -O3): a third less compile time for the suite, whose checks are
# of the library's code.
build_into "$ROOT/build" -DSHORTCONV_TEST_OPT=-O1
log "ctest"
ctest --test-dir "$ROOT/build" --output-on-failure -j "$JOBS"

ensure_venv
export SHORTCONV_LIBRARY="$ROOT/build/lib/libshortconv.so"
PY="$ROOT/tests/python"
# The package's common calls compiled against the PyPI torch (shortconv/native.py, into
# build/native): the PyPI suites require it (SHORTCONV_NATIVE=1) and test_fast.py runs its
# cases through both one-pass paths; the Debian torch finds no module of its version and
# runs the ctypes paths alone.
log "native module against the PyPI torch (python -m shortconv.build_native)"
PYTHONPATH="$ROOT/python" "$VENV/bin/python" -m shortconv.build_native
# The Python suites run one thread each (tests/python/conftest.py): the PyPI
# suite in two halves and the Debian one, side by side.
# (Halves by time on this machine: distributed 53 s, fuzz and hostile 8 s each;
# conformance 44 s, env 14 s, compile 9 s, the rest 10 s.)
pypi_half1() {
  log "pytest (torch from PyPI), first half: multi-process, property-based, hostile"
  SHORTCONV_NATIVE=1 PYTHONPATH="$ROOT/python" "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
    "$PY/test_distributed.py" "$PY/test_fuzz.py" "$PY/test_hostile.py"
}
pypi_half2() {
  log "pytest (torch from PyPI), second half: the rest"
  SHORTCONV_NATIVE=1 PYTHONPATH="$ROOT/python" "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$PY" \
    --ignore="$PY/test_distributed.py" --ignore="$PY/test_fuzz.py" --ignore="$PY/test_hostile.py"
}
# What differs on torch 1.13 is the package's side (no custom ops: the
# autograd.Function path); the peers' conformance parametrisations and the
# multi-process and fuzz suites re-run the same library calls through it
# and run on the current torch.
debian_torch() {
  log "pytest (Debian torch, fallback path)"
  PYTHONPATH="$ROOT/python" /usr/bin/python3 -m pytest -q -p no:cacheprovider "$PY" \
    --ignore="$PY/conformance" -k "not distributed and not fuzz"
}
suites=(pypi_half1 pypi_half2)
if [ "${SHORTCONV_SKIP_FALLBACK:-0}" != "1" ]; then
  ensure_apt python3-torch python3-pytest python3-numpy
  suites+=(debian_torch)
fi
side_by_side "${suites[@]}"
