# Sourced by the scripts in this folder: installs what the project needs on a
# fresh Debian machine (apt for system packages, pip into a cached virtual
# environment for Python ones) and knows where things go.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${JOBS:-$(nproc)}"
# PyPI's torch is several GB: one virtual environment, reused by every script and CI run.
VENV="${SHORTCONV_VENV:-$HOME/.cache/shortconv/venv}"

log() { printf '\n== %s\n' "$*"; }

# Debian packages: install only what is missing (apt-get update only then).
ensure_apt() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
  fi
}

ensure_build_deps() {
  ensure_apt cmake g++ ninja-build libgtest-dev libgmock-dev python3 python3-venv
  ensure_apt ccache || true  # optional (a machine without a package mirror builds without it)
}

# ccache for every build (when present): within one run the wheel of
# package_test.sh takes the CPU kernel units from test.sh's tree (same compiler,
# same preprocessed source and flags; the sanitizer and aarch64 trees' flags
# differ), and between CI runs in the same place most units are unchanged; a
# miss costs nothing but the lookup.
launcher_args() {
  if command -v ccache >/dev/null 2>&1; then
    printf '%s\n' -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
      -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache
  fi
}

# Runs the named shell functions side by side (the test suites are mostly one
# thread each, and the machine has two cores), each one's output to a file; then
# prints the outputs in the order given, each after its own wait, and fails when
# any of them failed.
side_by_side() {
  local dir pids=() rc=0 i
  dir=$(mktemp -d)
  for ((i = 1; i <= $#; i++)); do
    "${!i}" > "$dir/$i.log" 2>&1 &
    pids[i]=$!
  done
  for ((i = 1; i <= $#; i++)); do
    if wait "${pids[i]}"; then cat "$dir/$i.log"
    else rc=1; cat "$dir/$i.log"; printf '\n== %s FAILED\n' "${!i}"; fi
  done
  rm -rf "$dir"
  return $rc
}

# The Python test environment: current PyTorch from PyPI plus test tools.
ensure_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating virtual environment $VENV"
    mkdir -p "$(dirname "$VENV")"
    python3 -m venv "$VENV"
  fi
  # Found, not imported (importing torch to check takes 7 s here).
  if ! "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None
    for m in ('torch', 'numpy', 'pytest', 'hypothesis', 'scikit_build_core')))" >/dev/null 2>&1; then
    log "pip install torch numpy pytest hypothesis scikit-build-core ninja into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q torch numpy pytest hypothesis scikit-build-core ninja
  fi
}

# Configure and build into $1 with extra cmake arguments.
build_into() {
  local dir="$1"; shift
  local launch; mapfile -t launch < <(launcher_args)
  cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launch[@]}" "$@"
  cmake --build "$dir" -j "$JOBS"
}
