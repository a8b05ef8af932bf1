"""Shared helpers for the Python tests: tolerances, random problems, comparisons."""
import contextlib
import ctypes
import os
import struct
import subprocess
import sys

import torch

# ||out - ref|| / ||ref|| limits (CONTRIBUTING.md, "Standards").
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}

HAS_CUDA = torch.cuda.is_available()
TORCH_VERSION = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])


def rel(out, ref):
    """||out - ref|| / ||ref|| in float64 (0 when both are zero)."""
    out = out.detach().double().cpu()
    ref = ref.detach().double().cpu()
    den = ref.norm().item()
    num = (out - ref).norm().item()
    return num / den if den > 0 else num


def assert_close(out, ref, dtype=None, what=""):
    tol = TOL[dtype if dtype is not None else ref.dtype]
    assert out.shape == ref.shape, "%s: shape %s vs %s" % (what, tuple(out.shape), tuple(ref.shape))
    err = rel(out, ref)
    assert err <= tol, "%s: relative error %.3g > %.1g" % (what, err, tol)


def lengths_to_cu(lengths, dtype=torch.int32, device="cpu"):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=dtype, device=device)


def make_problem(B=2, T=7, D=5, W=4, S=None, dtype=torch.float64, lengths=None, bias=True,
                 residual=False, h0=True, device="cpu", param_dtype=None, state_dtype=None,
                 seed=0, requires_grad=False):
    """Random inputs.  lengths: packed batch of those sequence lengths (x [1, total, D])."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dt).to(device)

    S = W if S is None else S
    if lengths is not None:
        N, total = len(lengths), sum(lengths)
        x = rnd(1, total, D)
        cu = lengths_to_cu(lengths, device=device)
    else:
        N = B
        x = rnd(B, T, D)
        cu = None
    p = dict(
        x=x,
        weight=rnd(D, W, dt=param_dtype or dtype),
        bias=rnd(D, dt=param_dtype or dtype) if bias else None,
        residual=rnd(*x.shape) if residual else None,
        initial_state=rnd(N, D, S, dt=state_dtype or dtype) if h0 else None,
        cu_seqlens=cu,
        state_len=S,
    )
    if requires_grad:
        for k in ("x", "weight", "bias", "residual", "initial_state"):
            if p[k] is not None:
                p[k].requires_grad_(True)
    return p


def contiguous_strides(shape):
    """torch's strides for a contiguous tensor of this shape."""
    return torch.empty(shape, device="meta").stride()


@contextlib.contextmanager
def library_calls():
    """Record what each sc_forward / sc_backward call receives: a list of
    (direction, {field: (data_ptr, shape, strides)}) for the tensors present, read back from
    the sc_conv_args bytes handed to the C library (so a copy anywhere above is visible)."""
    from shortconv import _lib

    calls = []
    desc = struct.Struct("<Qii%dq%dq" % (_lib._MAX_DIMS, _lib._MAX_DIMS))

    def read(args):
        out = {}
        for field in _lib.TENSOR_FIELDS + getattr(_lib, "TENSOR_FIELDS_AFTER_PAD", ()):
            v = desc.unpack(ctypes.string_at(args + _lib.OFF[field], desc.size))
            ptr, nd = v[0], v[2]
            if nd:
                out[field] = (ptr, tuple(v[3:3 + nd]), tuple(v[3 + _lib._MAX_DIMS:][:nd]))
        return out

    def wrap(direction, fn):
        def run(args, err):
            calls.append((direction, read(args)))
            return fn(args, err)
        return run

    with entry_points_wrapped(wrap):
        yield calls


_RUN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


@contextlib.contextmanager
def entry_points_wrapped(wrap):
    """sc_forward / sc_backward replaced by wrap("fwd", real) / wrap("bwd", real) (callables
    (args address, error address) -> status) while the block runs: for the ctypes paths
    (_lib's entry points) and for the native module (C function pointers calling them)."""
    from shortconv import _lib, native

    saved = _lib._sc_forward, _lib._sc_backward
    _lib._sc_forward, _lib._sc_backward = wrap("fwd", saved[0]), wrap("bwd", saved[1])
    kept = None
    if native.module is not None:
        kept = _RUN(wrap("fwd", saved[0])), _RUN(wrap("bwd", saved[1]))
        addr = [ctypes.cast(f, ctypes.c_void_p).value
                for f in kept + (_lib._sc_forward_ws, _lib._sc_backward_ws)]
        native.module.init(*addr, _lib._TEMPLATE, native._error)
    try:
        yield
    finally:
        _lib._sc_forward, _lib._sc_backward = saved
        if kept is not None:
            native.module.init(*_lib.entry_points(), _lib._TEMPLATE, native._error)


def run_python(script, **env):
    """A fresh interpreter running ``script`` with this package and library (import-time
    switches): the CompletedProcess, output captured."""
    import shortconv

    e = dict(os.environ)
    pkg_dir = os.path.dirname(os.path.dirname(os.path.abspath(shortconv.__file__)))
    e["PYTHONPATH"] = pkg_dir + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("SHORTCONV_LIBRARY", shortconv.library_path)
    e.update(env)
    return subprocess.run([sys.executable, "-c", script], env=e, capture_output=True, text=True,
                          timeout=120)
