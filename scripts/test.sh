#!/usr/bin/env bash
# Every test: the C++ suite (CTest, CUDA backend compiled when nvcc exists),
# the Python suite on a current PyPI torch (custom ops, torch.compile), and the
# Python suite again on Debian's torch 1.13 (the autograd.Function fallback).
source "$(dirname "$0")/common.sh"
ensure_build_deps
build_into "$ROOT/build"
log "ctest"
ctest --test-dir "$ROOT/build" --output-on-failure -j "$JOBS"

ensure_venv
export SHORTCONV_LIBRARY="$ROOT/build/lib/libshortconv.so"
log "pytest (torch from PyPI)"
PYTHONPATH="$ROOT/python" "$VENV/bin/python" -m pytest -q "$ROOT/tests/python"

if [ "${SHORTCONV_SKIP_FALLBACK:-0}" != "1" ]; then
  ensure_apt python3-torch python3-pytest python3-numpy
  # What differs on torch 1.13 is the package's side (no custom ops: the
  # autograd.Function path); the peers' conformance parametrisations and the
  # multi-process and fuzz suites re-run the same library calls through it
  # and ran above on the current torch.
  log "pytest (Debian torch, fallback path)"
  PYTHONPATH="$ROOT/python" /usr/bin/python3 -m pytest -q -p no:cacheprovider "$ROOT/tests/python" \
    --ignore="$ROOT/tests/python/conformance" -k "not distributed and not fuzz"
fi
