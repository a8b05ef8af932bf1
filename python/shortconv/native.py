"""The package's common calls compiled against the installed torch (optional).

The package itself needs no compiler: it reaches libshortconv through ctypes, and one
build serves every torch version.  The most frequent calls -- the decode step of
``causal_conv1d_update`` (also as the vllm / dao drop-ins and ShortConvolution call it) and
``causal_conv1d`` of x, weight, bias and cu_seqlens, forward and backward -- spend most of their host time in Python reading tensor metadata and
packing it (bench/RESULTS.md).  ``_native.cpp`` does the same in C++ and is built once per
torch version:

    python -m shortconv.build_native            # compile (a C++ compiler and ninja needed)
    python -m shortconv.build_native --status   # which path the calls take, and why

When the module for this torch is found it is used, the ctypes paths otherwise; both hand
the library the same bytes and give the same results and errors (tests/python/test_fast.py
runs each of its cases through both).

Where the module lives: ``$SHORTCONV_NATIVE_DIR`` if set, else ``build/native`` of the
source tree this package runs from, else ``~/.cache/shortconv/native``; one subdirectory
per (torch version, Python, source hash), so a module is never loaded by another torch
than the one it was compiled against, nor after its sources changed.
``SHORTCONV_NATIVE=0`` turns it off; ``SHORTCONV_NATIVE=1`` makes its absence an ImportError
(the test suite uses it to be sure which path it tests).
"""

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import sys

import torch

from . import _lib, _ops

__all__ = ["module", "status", "build", "directory"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCE = os.path.join(_HERE, "_native.cpp")
_NAME = "shortconv_native"


def _header_dir():
    """The directory holding shortconv/shortconv.h: the package's copy (a wheel) or the
    source tree's include/."""
    for d in (os.path.join(_HERE, "include"),
              os.path.join(os.path.dirname(os.path.dirname(_HERE)), "include")):
        if os.path.exists(os.path.join(d, "shortconv", "shortconv.h")):
            return d
    return None


def _tag():
    """(torch, Python, sources) of a build: its directory's name."""
    h = hashlib.sha256()
    hdr = _header_dir()
    for path in (_SOURCE, hdr and os.path.join(hdr, "shortconv", "shortconv.h")):
        if path is None or not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            h.update(f.read())
    ver = torch.__version__.replace("+", "_")
    return "torch%s-py%d%d-%s" % (ver, sys.version_info[0], sys.version_info[1],
                                  h.hexdigest()[:12])


def directory():
    """Where this torch's module is built and looked for (None: the sources are missing)."""
    tag = _tag()
    if tag is None:
        return None
    root = os.environ.get("SHORTCONV_NATIVE_DIR")
    if not root:
        repo = os.path.dirname(os.path.dirname(_HERE))
        if os.path.exists(os.path.join(repo, "CMakeLists.txt")) and os.path.isdir(
                os.path.join(repo, "build")):
            root = os.path.join(repo, "build", "native")
        else:
            root = os.path.join(os.path.expanduser("~"), ".cache", "shortconv", "native")
    return os.path.join(root, tag)


def _module_file(d):
    for name in sorted(os.listdir(d)) if d and os.path.isdir(d) else ():
        if name.startswith(_NAME + ".") and name.endswith(".so"):
            return os.path.join(d, name)
    return None


def _error(where, cache_names, status, message):
    """The exception of a failed native call: the one the Python path raises."""
    rename = _ops._CACHE_NAMES if cache_names else None
    return _lib.library_error_from(message, where, rename, status)


_why = "not loaded yet"


def _init(mod):
    if mod.args_size != _lib.ARGS_SIZE:
        raise ImportError("sizeof(sc_conv_args) = %d in the module, %d in the library"
                          % (mod.args_size, _lib.ARGS_SIZE))
    mod.init(*_lib.entry_points(), _lib._TEMPLATE, _error)
    return mod


def _load():
    """The module for this torch, initialised, or None (``_why`` says why)."""
    global _why
    mode = os.environ.get("SHORTCONV_NATIVE", "")
    if mode == "0":
        _why = "turned off (SHORTCONV_NATIVE=0)"
        return None
    try:
        d = directory()
        path = _module_file(d)
        if path is None:
            raise ImportError("no module built for this torch at %s; build it with "
                              "`python -m shortconv.build_native`" % d)
        loader = importlib.machinery.ExtensionFileLoader(_NAME, path)
        spec = importlib.util.spec_from_file_location(_NAME, path, loader=loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
        _init(mod)
    except ImportError as e:
        if mode == "1":
            raise ImportError("shortconv: SHORTCONV_NATIVE=1 but the native module is not "
                              "available: %s" % e) from e
        _why = str(e)
        return None
    _why = "loaded from %s" % path
    return mod


module = _load()


def status():
    """A line saying whether the native module is used, and why not when it is not."""
    return ("native module: " + _why) if module is not None else ("native module not used: "
                                                                  + _why)


def build(verbose=False):
    """Compile _native.cpp against the installed torch into directory(); returns the
    module file's path.  Needs a C++ compiler and ninja (torch.utils.cpp_extension)."""
    from torch.utils import cpp_extension
    d = directory()
    if d is None:
        raise RuntimeError("shortconv.native: the sources (%s, shortconv.h) are missing"
                           % _SOURCE)
    os.makedirs(d, exist_ok=True)
    # torch runs ninja from PATH: the one installed beside this Python (pip's) is found too
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    cpp_extension.load(name=_NAME, sources=[_SOURCE], extra_include_paths=[_header_dir()],
                       extra_cflags=["-O2"], build_directory=d,
                       verbose=verbose, with_cuda=False, is_python_module=True)
    path = _module_file(d)
    if path is None:
        raise RuntimeError("shortconv.native: the build left no module in %s" % d)
    return path


def host_only(on):
    """Calls of the native module validated by the library, not run (on=True), or run again:
    the host path alone, for python -m shortconv.bench --overhead-only."""
    if module is not None:
        addr = ctypes.cast(_lib._lib.sc_validate, ctypes.c_void_p).value if on else 0
        module.host_only(addr)
