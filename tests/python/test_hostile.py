"""Hostile input through the Python package: overflowing shapes and tiles, SiLU at the
ends of the range, the decode cache written under a saved tensor, tensors whose memory
is not their values.

Each test states the one outcome allowed: a clean ValueError / TypeError naming the
argument with nothing written, or the right result.  Calls that used to crash the
process run in a child interpreter, so a crash fails the test instead of the suite.
"""
import os
import subprocess
import sys

import pytest
import torch

import shortconv
from shortconv import _lib
from shortconv.reference import causal_conv1d_ref

from helpers import TORCH_VERSION, assert_close, make_problem

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(shortconv.__file__)))


def run_isolated(script, timeout=120):
    """Run ``script`` in a fresh interpreter; (returncode, stdout + stderr)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("SHORTCONV_LIBRARY", shortconv.library_path)
    r = subprocess.run([sys.executable, "-c", "import torch; torch.set_num_threads(1)\n" + script],
                       env=env, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


# ---- 1. scratch sizes that overflow 64 bits -----------------------------------------
def test_workspace_size_overflow_from_expanded_tensors():
    # 2^58 sequences of 0 tokens described through stride-0 views: the workspace
    # arithmetic (N*(W-1)*D*4 bytes) wraps; the call must fail cleanly or succeed.
    rc, out = run_isolated(r"""
import shortconv as sc
try:
    y, _ = sc.causal_conv1d(torch.zeros(1, 0, 1).expand(2**58, 0, 1), torch.randn(1, 2),
                            initial_state=torch.zeros(1, 1, 1).expand(2**58, 1, 1))
    print("RESULT", tuple(y.shape))
except ValueError as e:
    print("ERROR", e)
""")
    assert rc == 0, "the process died (status %d):\n%s" % (rc, out[-2000:])
    assert "RESULT (288230376151711744, 0, 1)" in out or "ERROR shortconv.causal_conv1d" in out, out


# ---- 2. a width at the top of int32 ----------------------------------------------------
def test_width_at_int32_max():
    # W = 2^31-1 taps of a stride-0 weight of ones, S = W or W-1, h0 = 0: y = x exactly.
    rc, out = run_isolated(r"""
import shortconv as sc
W = 2**31 - 1
x = torch.randn(1, 1, 1)
for S in (W, W - 1):
    try:
        y, _ = sc.causal_conv1d(x, torch.ones(1, 1).expand(1, W), state_len=S)
        print("RESULT", S, torch.equal(y, x))
    except ValueError as e:
        print("ERROR", S, e)
""", timeout=300)
    assert rc == 0, "the process died (status %d):\n%s" % (rc, out[-2000:])
    lines = [ln for ln in out.splitlines() if ln.startswith(("RESULT", "ERROR"))]
    assert len(lines) == 2, out
    for ln in lines:
        if ln.startswith("RESULT"):
            assert ln.endswith("True"), ln
        else:  # an error about the width or the state length, not a workspace of 0 bytes
            assert "workspace" not in ln, ln
            assert any(w in ln for w in ("width", "weight", "state_len")), ln


# ---- 3. forced tiles at the top of int64 ----------------------------------------------
@pytest.mark.parametrize("tile", [(2**63 - 1, 0), (0, 2**63 - 1), (2**62, 2**62)])
def test_forced_tile_overflow(tile):
    # exec.tile_t / tile_d are only reachable through the ctypes layer (tests, bench).
    p = make_problem(B=2, T=9, D=5, W=4, S=4, seed=300)
    x, w, h0 = p["x"], p["weight"], p["initial_state"]
    c = _lib.Call("t", x, 4, 4, _lib.ACT_SILU)
    _lib._EXEC_PACK(c.buf, _lib._EXEC_OFF, _lib.SC_BACKEND_CPU, 1, tile[0], tile[1], 0)
    c.set("x", x)
    c.set("weight", w)
    c.set("initial_state", h0)
    y = torch.full_like(x, float("nan"))
    c.set_out("y", y)
    try:
        c.run_forward()
    except shortconv.ShortConvError as e:
        assert "tile" in str(e), e
        assert y.isnan().all(), "y written on error"
        return
    yr, _ = causal_conv1d_ref(x, w, initial_state=h0, activation="silu")
    assert_close(y, yr, what="y with tiles %s" % (tile,))


# ---- 6. SiLU over the whole finite range (seen through Python) --------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_silu_and_its_gradient_at_extreme_values(dtype):
    # W = 1, weight 1: pre = x.  Elementwise against float64 within the dtype's tolerance,
    # with an absolute floor of the smallest normal number (a flushed subnormal is fine).
    fi = torch.finfo(dtype)
    z = torch.tensor([-fi.max, -fi.max / 3, -fi.max / 30, -1e4, -100.0, -20.0, -1.0, 0.0, 1.0,
                      20.0, 100.0, 1e4, fi.max / 30, fi.max], dtype=torch.float64)
    x = z.clamp(-fi.max, fi.max).to(dtype).view(1, -1, 1).requires_grad_()
    y, _ = shortconv.causal_conv1d(x, torch.ones(1, 1, dtype=dtype), activation="silu")
    (g,) = torch.autograd.grad(y.sum(), [x])
    xr = x.detach().double().requires_grad_()
    yr = torch.nn.functional.silu(xr)
    (gr,) = torch.autograd.grad(yr.sum(), [xr])
    tol = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 1e-2)
    for what, out, ref in (("y", y, yr), ("dx", g, gr)):
        ref = ref.detach().view(-1)
        out = out.detach().double().view(-1)
        bad = (out - ref).abs() > tol * ref.abs() + fi.tiny
        assert not bad.any(), "%s %s at pre = %s: %s, expected %s" % (
            dtype, what, xr.detach().view(-1)[bad].tolist(), out[bad].tolist(), ref[bad].tolist())


# ---- 4. the decode cache written under a saved tensor ---------------------------------
def _paths():
    paths = ["eager"]
    if shortconv.HAS_CUSTOM_OPS:
        paths.append("custom_op")
    return paths


@pytest.fixture(params=_paths())
def path(request, monkeypatch):
    """Route eager calls through the autograd.Function or through the custom ops."""
    monkeypatch.setattr(shortconv._ops, "EAGER_CUSTOM_OP", request.param == "custom_op")
    return request.param


def test_decode_into_a_saved_initial_state_fails_loudly(path):
    # h0 needs no grad, but the backward reads it: writing it must invalidate the graph.
    torch.manual_seed(301)
    x = torch.randn(2, 5, 8, requires_grad=True)
    w = torch.randn(8, 4, requires_grad=True)
    h0 = torch.randn(2, 8, 4)
    y, _ = shortconv.causal_conv1d(x, w, initial_state=h0, activation="silu")
    v = h0._version
    shortconv.causal_conv1d_update(torch.randn(2, 8), h0, weight=w.detach())
    assert h0._version > v
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_decode_through_a_view_bumps_the_base(path):
    # A pool row given as a view shares the pool's version counter.
    torch.manual_seed(302)
    pool = torch.randn(3, 4, 3)
    x = torch.randn(1, 6, 4, requires_grad=True)
    w = torch.randn(4, 3)
    y, _ = shortconv.causal_conv1d(x, w, initial_state=pool[1:2])
    shortconv.causal_conv1d_update(torch.randn(1, 4), pool[1:2], weight=w)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_module_decode_step_bumps_the_cache():
    torch.manual_seed(303)
    m = shortconv.ShortConvolution(4, 3, bias=True)
    cache = torch.randn(2, 4, 3)
    x = torch.randn(2, 5, 4, requires_grad=True)
    y, _ = m(x, cache=cache)
    with torch.no_grad():
        m(torch.randn(2, 1, 4), cache=cache)  # one token each: a decode step
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_decode_of_inference_tensors():
    # No version counter to bump (and none needed: inference tensors are never saved).
    w = torch.randn(4, 3)
    with torch.inference_mode():
        cache = torch.zeros(2, 4, 3)
        y, _ = shortconv.causal_conv1d_update(torch.ones(2, 4), cache, weight=w)
    assert torch.equal(cache[:, :, -1], torch.ones(2, 4))
    with torch.no_grad():
        shortconv.causal_conv1d_update(torch.ones(2, 4), cache, weight=w)
    assert torch.equal(cache[:, :, -2:], torch.ones(2, 4, 2))


# ---- 7. tensors whose memory is not their values ------------------------------------
def _neg_view(t):
    """A view with torch's negative bit set whose values equal t (memory holds -t)."""
    z = torch.complex(torch.zeros_like(t), -t)
    v = z.conj().imag
    assert v.is_neg() and torch.equal(v, t)
    return v


@pytest.mark.skipif(TORCH_VERSION < (1, 10), reason="negative bit needs torch >= 1.10")
@pytest.mark.parametrize("arg", ["x", "weight", "bias", "residual", "initial_state"])
def test_negated_views_are_read_as_their_values(arg):
    p = make_problem(B=2, T=6, D=3, W=3, S=3, residual=True, seed=304)
    names = ["x", "weight", "bias", "residual", "initial_state"]
    args = [p[k] for k in names]
    yr, hr = causal_conv1d_ref(*args, True, "silu")
    args[names.index(arg)] = _neg_view(p[arg])
    y, h = shortconv.causal_conv1d(*args, True, "silu")
    assert_close(y, yr, what="y")
    assert_close(h, hr, what="final_state")


def test_negated_views_in_backward_and_decode():
    p = make_problem(B=2, T=5, D=3, W=3, seed=305)
    x = _neg_view(p["x"]).requires_grad_()
    w = p["weight"].clone().requires_grad_()
    y, _ = shortconv.causal_conv1d(x, w, initial_state=_neg_view(p["initial_state"]),
                                   activation="silu")
    gx, gw = torch.autograd.grad(y.sum(), [x, w])
    xr, wr = p["x"].clone().requires_grad_(), p["weight"].clone().requires_grad_()
    yr, _ = causal_conv1d_ref(xr, wr, initial_state=p["initial_state"], activation="silu")
    gxr, gwr = torch.autograd.grad(yr.sum(), [xr, wr])
    assert_close(gx, gxr, what="dx")
    assert_close(gw, gwr, what="dweight")
    # decode: a negated x and weight are read as values; the cache is written
    cache = p["initial_state"].clone()
    yd, _ = shortconv.causal_conv1d_update(_neg_view(p["x"][:, 0]), cache,
                                           weight=_neg_view(p["weight"]))
    ydr, htr = causal_conv1d_ref(p["x"][:, :1], p["weight"], initial_state=p["initial_state"],
                                 output_final_state=True)
    assert_close(yd, ydr[:, 0], what="decode y")
    assert torch.equal(cache, htr)


def test_negated_cache_is_rejected_and_not_written():
    p = make_problem(B=2, T=1, D=3, W=3, seed=306)
    cache = _neg_view(p["initial_state"])
    memory = cache.detach().resolve_neg().clone()  # the values, as a plain tensor
    with pytest.raises(TypeError, match=r"cache is a lazily negated view"):
        shortconv.causal_conv1d_update(p["x"][:, 0], cache, weight=p["weight"])
    assert torch.equal(cache, memory)


_LAYOUTS = {"sparse": lambda t: t.to_sparse(), "mkldnn": lambda t: t.float().to_mkldnn()}


@pytest.mark.parametrize("kind", ["sparse", "mkldnn"])
@pytest.mark.parametrize("arg", ["x", "weight", "initial_state"])
def test_non_strided_layouts_are_rejected(kind, arg):
    if kind == "mkldnn" and not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no mkldnn")
    p = make_problem(B=2, T=4, D=3, W=3, dtype=torch.float32, seed=307)
    kw = dict(x=p["x"], weight=p["weight"], initial_state=p["initial_state"])
    kw[arg] = _LAYOUTS[kind](kw[arg])
    with pytest.raises(TypeError, match=r"%s has layout torch\.\w+; expected a dense" % arg):
        shortconv.causal_conv1d(**kw)


def test_sparse_cache_is_rejected():
    w = torch.randn(3, 3)
    with pytest.raises(TypeError, match=r"cache has layout torch.sparse_coo"):
        shortconv.causal_conv1d_update(torch.randn(2, 3), torch.zeros(2, 3, 3).to_sparse(),
                                       weight=w)


@pytest.mark.filterwarnings("ignore::UserWarning")  # quantized tensors are deprecated
def test_quantized_input_is_rejected():
    x = torch.quantize_per_tensor(torch.randn(2, 4, 3), 0.1, 0, torch.qint8)
    with pytest.raises(TypeError, match=r"x has dtype torch.qint8"):
        shortconv.causal_conv1d(x, torch.randn(3, 3))


@pytest.mark.filterwarnings("ignore::UserWarning")  # nested tensors are a prototype
def test_nested_tensor_is_rejected():
    if not hasattr(torch, "nested"):
        pytest.skip("torch.nested needs torch >= 1.13")
    x = torch.nested.nested_tensor([torch.randn(3, 4), torch.randn(5, 4)])
    with pytest.raises(TypeError, match=r"x: .*nested tensor"):
        shortconv.causal_conv1d(x, torch.randn(4, 3))


class _Wrapper(torch.Tensor):
    """A __torch_dispatch__ subclass whose own memory is a placeholder."""

    @staticmethod
    def __new__(cls, inner):
        t = torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype,
                                                device=inner.device)
        t.inner = inner
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda a: a.inner if isinstance(a, _Wrapper) else a  # noqa: E731
        return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})


class _Plain(torch.Tensor):
    """A subclass without __torch_dispatch__: its memory is its values."""


@pytest.mark.skipif(not hasattr(torch.Tensor, "_make_wrapper_subclass"),
                    reason="wrapper subclasses need a newer torch")
@pytest.mark.parametrize("arg", ["x", "weight", "initial_state"])
def test_dispatch_subclasses_are_rejected(arg):
    p = make_problem(B=2, T=4, D=3, W=3, seed=308)
    kw = dict(x=p["x"], weight=p["weight"], initial_state=p["initial_state"])
    kw[arg] = _Wrapper(kw[arg])
    with pytest.raises(TypeError, match=r"%s is a _Wrapper, a tensor subclass" % arg):
        shortconv.causal_conv1d(**kw)


@pytest.mark.skipif(not hasattr(torch.Tensor, "_make_wrapper_subclass"),
                    reason="wrapper subclasses need a newer torch")
def test_dispatch_subclass_cache_is_rejected_and_not_written():
    inner = torch.randn(2, 3, 3)
    before = inner.clone()
    with pytest.raises(TypeError, match=r"cache is a _Wrapper, a tensor subclass"):
        shortconv.causal_conv1d_update(torch.randn(2, 3), _Wrapper(inner), weight=torch.randn(3, 3))
    assert torch.equal(inner, before)


def test_plain_subclasses_and_parameters_are_accepted():
    p = make_problem(B=2, T=4, D=3, W=3, seed=309)
    yr, _ = causal_conv1d_ref(p["x"], p["weight"], initial_state=p["initial_state"])
    y, _ = shortconv.causal_conv1d(p["x"].as_subclass(_Plain), torch.nn.Parameter(p["weight"]),
                                   initial_state=p["initial_state"].as_subclass(_Plain))
    assert_close(y.as_subclass(torch.Tensor), yr)


@pytest.mark.skipif(TORCH_VERSION < (2, 0), reason="FakeTensorMode needs torch >= 2.0")
def test_fake_tensors_in_eager_are_rejected():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w = torch.randn(2, 4, 3), torch.randn(3, 3)
        with pytest.raises(TypeError, match=r"x is a FakeTensor, a tensor subclass"):
            shortconv.causal_conv1d(x, w)


@pytest.mark.skipif(not hasattr(torch, "vmap"), reason="torch.vmap needs torch >= 2.0")
def test_vmap_batched_tensors_are_rejected():
    w = torch.randn(3, 3)
    with pytest.raises(TypeError, match=r"x: expected a dense strided tensor whose memory"):
        torch.vmap(lambda x: shortconv.causal_conv1d(x, w)[0])(torch.randn(4, 1, 5, 3))


def test_meta_tensors_are_rejected():
    x = torch.empty(2, 4, 3, device="meta")
    with pytest.raises(ValueError, match=r"x is on device meta"):
        shortconv.causal_conv1d(x, torch.empty(3, 3, device="meta"))
