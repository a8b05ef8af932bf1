#!/usr/bin/env bash
# The main job: build, then `shortconv check` (the exactness suite) and
# `shortconv bench`.  Extra arguments go to both, e.g. --backend cuda.
source "$(dirname "$0")/common.sh"
ensure_build_deps
build_into "$ROOT/build" -DSHORTCONV_BUILD_TESTS=OFF
log "shortconv check $*"
"$ROOT/build/bin/shortconv" check "$@"
log "shortconv bench $*"
"$ROOT/build/bin/shortconv" bench "$@"
