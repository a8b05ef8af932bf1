"""Outputs follow x's layout (python/shortconv/_layout.py), at every entry point.

y and dx have x's strides when x is dense in any layout, and dense strides in x's order of
dims otherwise (torch.empty_like's rule, causal-conv1d's outputs); gradients arriving in
another layout are handed to the library as they are (read back from the sc_conv_args
bytes: helpers.library_calls); values are bitwise those of the same call on a token-major
copy of x (y, dx, states; on the CPU also dweight and dbias, whose partial sums on the GPU
follow the kernel path).  Runs on the CPU, and on CUDA when a device is present.
"""
import pytest
import torch

import shortconv
from shortconv import dao, vllm

from helpers import HAS_CUDA, contiguous_strides, library_calls

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA and shortconv.has_backend("cuda") else [])
B, T, D, W = 2, 16, 12, 4  # T % 8 == 0: the CUDA channel-major path takes 16-bit rows


def _rand(*shape, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(device, dtype)


# Each layout: a function (B, T, D, dtype, device, seed) -> x [B, T, D], and the layout its
# outputs get: "x" (x is dense: its own strides), "token" (contiguous) or "channel"
# (channel-major [B, D, T] storage): x's order of dims, as torch.empty_like(x).
LAYOUTS = {
    "token": (lambda b, t, d, **k: _rand(b, t, d, **k), "x"),
    "channel": (lambda b, t, d, **k: _rand(b, d, t, **k).transpose(1, 2), "x"),
    "time-major": (lambda b, t, d, **k: _rand(t, b, d, **k).transpose(0, 1), "x"),
    "qkv-slice": (lambda b, t, d, **k: _rand(b, t, 3 * d, **k)[:, :, d:2 * d], "token"),
    "channel-slice": (lambda b, t, d, **k: _rand(b, 3 * d, t, **k)[:, d:2 * d].transpose(1, 2),
                      "channel"),
    "channel-time-slice": (lambda b, t, d, **k: _rand(b, d, t + 3, **k)[:, :, 1:t + 1]
                           .transpose(1, 2), "channel"),
    "broadcast": (lambda b, t, d, **k: _rand(1, t, d, **k).expand(b, t, d), "token"),
}


def expected_strides(x, kind):
    b, t, d = x.shape
    return {"x": x.stride(), "token": contiguous_strides((b, t, d)),
            "channel": (d * t, 1, t)}[kind]


def significant_strides(t):
    """Strides of the dims with more than one element (the others address nothing)."""
    return tuple(s if n > 1 else None for n, s in zip(t.shape, t.stride()))


def _fla(x, w, b, r, h0, dy, dht):
    """shortconv.causal_conv1d, its gradients (dy, dht as given) and the library's calls."""
    with library_calls() as calls:
        y, ht = shortconv.causal_conv1d(x, w, b, r, h0, True, "silu")
        grads = torch.autograd.grad([y, ht], [x, w, b, r, h0], [dy, dht])
    return y, ht, grads, calls


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_fla_outputs_follow_x(layout, dtype, device):
    make, kind = LAYOUTS[layout]
    kw = dict(dtype=dtype, device=device)
    inputs = (make(B, T, D, seed=1, **kw), _rand(D, W, seed=2, **kw), _rand(D, seed=3, **kw),
              make(B, T, D, seed=5, **kw), _rand(B, D, W, seed=4, **kw))
    dy, dht = _rand(B, T, D, seed=6, **kw), _rand(B, D, W, seed=7, **kw)
    x, *rest = leaves = [t.detach().requires_grad_() for t in inputs]
    y, ht, grads, calls = _fla(*leaves, dy, dht)
    want = expected_strides(x, kind)
    assert y.stride() == want and grads[0].stride() == want  # y, dx
    (_, fwd), (_, bwd) = calls
    assert fwd["x"] == (x.data_ptr(), tuple(x.shape), x.stride())  # x read as it is
    assert fwd["y"] == (y.data_ptr(), tuple(y.shape), want)
    assert bwd["dx"] == (grads[0].data_ptr(), tuple(x.shape), want)
    # bitwise the values of a token-major x
    ref_leaves = [t.detach().contiguous().requires_grad_() for t in inputs]
    yr, htr, ref, _ = _fla(*ref_leaves, dy, dht)
    assert yr.is_contiguous() and torch.equal(y, yr) and torch.equal(ht, htr)
    for name, a, e in zip(("x", "weight", "bias", "residual", "initial_state"), grads, ref):
        # summed in the path's order: the GPU's, and the CPU's time-vectorised
        # kernels when x's time axis is contiguous (docs/semantics.md §6)
        if name in ("weight", "bias") and (device != "cpu" or x.stride(1) == 1):
            assert torch.allclose(a, e, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5,
                                  atol=1e-5), "d" + name
        else:
            assert torch.equal(a, e), "d" + name


def _assert_same_dx(dx, expected, device):
    """dx of one layout against the token-major dx (fp32).  docs/semantics.md §6: the layout
    never changes a bit of dx, on the CPU and on CUDA (whose channel-major backward sums the
    taps in the token-major kernel's order)."""
    assert torch.equal(dx, expected), (device, (dx - expected).abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_layout", ["token", "channel"])
@pytest.mark.parametrize("dy_layout", ["token", "channel", "broadcast"])
def test_dy_is_read_as_given(x_layout, dy_layout, device):
    kw = dict(dtype=torch.float32, device=device)
    x = LAYOUTS[x_layout][0](B, T, D, seed=10, **kw).requires_grad_()
    w = _rand(D, W, seed=11, **kw).requires_grad_()
    if dy_layout == "broadcast":
        dy = _rand(1, 1, D, seed=12, **kw).expand(B, T, D)
    else:
        dy = LAYOUTS[dy_layout][0](B, T, D, seed=12, **kw)
    y, _ = shortconv.causal_conv1d(x, w, activation="silu")
    with library_calls() as calls:
        dx, dw = torch.autograd.grad(y, [x, w], dy)
    (direction, got), = calls
    assert direction == "bwd"
    assert got["dy"] == (dy.data_ptr(), tuple(dy.shape), dy.stride())  # no copy on the way
    assert dx.stride() == x.stride()
    xr = x.detach().contiguous().requires_grad_()
    yr, _ = shortconv.causal_conv1d(xr, w, activation="silu")
    dxr, = torch.autograd.grad(yr, [xr], dy.contiguous())
    _assert_same_dx(dx, dxr, device)


@pytest.mark.skipif(not shortconv.HAS_CUSTOM_OPS, reason="custom ops need torch >= 2.4")
@pytest.mark.parametrize("device", DEVICES)
def test_custom_op_autograd_reads_dy_as_given(device):
    kw = dict(dtype=torch.float32, device=device)
    x = LAYOUTS["channel"][0](B, T, D, seed=13, **kw).requires_grad_()
    w = _rand(D, W, seed=14, **kw).requires_grad_()
    dy = LAYOUTS["channel"][0](B, T, D, seed=15, **kw)
    y, _ = torch.ops.shortconv.causal_conv1d_fwd(x, w, None, None, None, None, W, 1, False)
    assert y.stride() == x.stride()
    with library_calls() as calls:
        dx, = torch.autograd.grad(y, [x], dy)
    (_, got), = calls
    assert got["dy"] == (dy.data_ptr(), tuple(dy.shape), dy.stride())
    assert dx.stride() == x.stride()


@pytest.mark.skipif(not shortconv.HAS_CUSTOM_OPS, reason="custom ops need torch >= 2.4")
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_fake_implementations_give_the_real_strides(layout):
    """What torch.compile sees (the fake implementations under FakeTensorMode) is what the
    real calls return: every output's shape, dtype and strides."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    make, _ = LAYOUTS[layout]
    x = make(B, T, D, seed=20)
    w, b, h0 = _rand(D, W, seed=21), _rand(D, seed=22), _rand(B, D, W, seed=23)
    h0_t = h0.transpose(1, 2).contiguous().transpose(1, 2)  # a non-contiguous state
    dy = make(B, T, D, seed=24)
    ops = torch.ops.shortconv
    calls = [
        (ops.causal_conv1d_fwd, (x, w, b, None, h0, None, W, 1, True)),
        (ops.causal_conv1d_fwd, (x, w, None, None, h0_t, None, W, 0, True)),
        (ops.causal_conv1d_fwd, (x, w, b, None, None, None, W, 1, True)),
        (ops.causal_conv1d_bwd, (x, w, b, h0, None, dy, None, W, 1, True, True, True, True)),
        (ops.causal_conv1d_bwd, (x, w, b, h0_t, None, dy, None, W, 1, True, True, True, True)),
        (ops.causal_conv1d_bwd, (x, w, None, None, None, dy, None, W, 1, True, True, False,
                                 True)),
        (ops.causal_conv1d_update, (x, torch.zeros(B, D, W), w, b, None, None, None, 1, None,
                                    None, -1)),
    ]
    mode = FakeTensorMode()
    for op, args in calls:
        real = op(*[a.clone() if torch.is_tensor(a) and a is not x and a is not dy else a
                    for a in args])
        with mode:
            fargs = [mode.from_tensor(a) if torch.is_tensor(a) else a for a in args]
            fake = op(*fargs)
        real = real if isinstance(real, (tuple, list)) else (real,)
        fake = fake if isinstance(fake, (tuple, list)) else (fake,)
        for i, (r, f) in enumerate(zip(real, fake)):
            assert (tuple(r.shape), r.dtype, r.stride()) == (tuple(f.shape), f.dtype, f.stride()), \
                "%s output %d" % (op, i)


@pytest.mark.skipif(not shortconv.HAS_CUSTOM_OPS, reason="custom ops need torch >= 2.4")
def test_compiled_outputs_follow_x():
    """A channel-major x through torch.compile: y and dx in x's layout, as in eager (a
    non-dense x's strides come from the fakes, checked above)."""
    torch._dynamo.reset()

    def f(x, w, b):
        return shortconv.causal_conv1d(x, w, b, activation="silu")[0]

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    x = LAYOUTS["channel"][0](B, T, D, seed=30).requires_grad_()
    w, b = _rand(D, W, seed=31).requires_grad_(), _rand(D, seed=32).requires_grad_()
    dy = LAYOUTS["channel"][0](B, T, D, seed=33)
    yc, ye = cf(x, w, b), f(x, w, b)
    assert yc.stride() == ye.stride() == x.stride()
    assert torch.equal(yc, ye)
    gc = torch.autograd.grad(yc, [x, w, b], dy)
    ge = torch.autograd.grad(ye, [x, w, b], dy)
    assert gc[0].stride() == ge[0].stride() == x.stride()
    for a, e in zip(gc, ge):
        assert torch.equal(a, e)


# ---- the other entry points -------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channel_first", [True, False])
def test_dao_fn_follows_x(channel_first, device):
    kw = dict(dtype=torch.float32, device=device)
    # causal-conv1d's x is [batch, dim, seqlen]: channel-first storage, or channel-last
    # storage ([batch, seqlen, dim] memory) seen through a transpose
    x = (_rand(B, D, T, seed=40, **kw) if channel_first
         else _rand(B, T, D, seed=40, **kw).transpose(1, 2)).requires_grad_()
    w = _rand(D, W, seed=41, **kw).requires_grad_()
    h0 = _rand(B, D, W - 1, seed=42, **kw).requires_grad_()
    dout = _rand(B, D, T, seed=43, **kw)
    if not channel_first:
        dout = dout.transpose(1, 2).contiguous().transpose(1, 2)
    out, ht = dao.causal_conv1d_fn(x, w, None, None, h0, True, None, "silu")
    assert out.stride() == x.stride()  # what causal-conv1d returns (torch.empty_like(x))
    with library_calls() as calls:
        dx, = torch.autograd.grad(out, [x], dout)
    (_, got), = calls
    assert got["dy"][0] == dout.data_ptr()
    assert dx.stride() == x.stride()
    xr = x.detach().transpose(1, 2).contiguous().requires_grad_()  # token-major
    yr, _ = shortconv.causal_conv1d(xr, w, None, None, h0, True, "silu", state_len=W - 1)
    dxr, = torch.autograd.grad(yr, [xr], dout.transpose(1, 2))
    assert torch.equal(out.transpose(1, 2), yr)
    _assert_same_dx(dx.transpose(1, 2), dxr, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channel_first", [True, False])
def test_dao_fn_seq_idx_follows_x(channel_first, device):
    """seq_idx goes to the core with x as it is: out and dx in x's layout."""
    kw = dict(dtype=torch.float32, device=device)
    x = (_rand(B, D, T, seed=46, **kw) if channel_first
         else _rand(B, T, D, seed=46, **kw).transpose(1, 2)).requires_grad_()
    w = _rand(D, W, seed=45, **kw)
    row = [0] * 5 + [1] * (T - 7) + [-1] * 2
    seq = torch.tensor([row, [r + 2 if r >= 0 else r for r in row]], device=device,
                       dtype=torch.int32)
    out = dao.causal_conv1d_fn(x, w, seq_idx=seq, activation="silu")
    assert out.stride() == x.stride()
    dout = _rand(B, D, T, seed=47, **kw)
    dx, = torch.autograd.grad(out, [x], dout)
    assert dx.stride() == x.stride()
    xr = (x.detach().transpose(1, 2).contiguous().transpose(1, 2) if channel_first
          else x.detach().contiguous()).requires_grad_()  # the other layout
    ref = dao.causal_conv1d_fn(xr, w, seq_idx=seq, activation="silu")
    dxr, = torch.autograd.grad(ref, [xr], dout)
    assert torch.equal(out, ref) and torch.equal(dx, dxr)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("token_major_storage", [True, False])
def test_vllm_follow_x(token_major_storage, device):
    kw = dict(dtype=torch.float32, device=device)
    total, P = 2 * T, 5
    w = _rand(D, W, seed=50, **kw)
    # causal_conv1d_fn: x (dim, total_tokens), usually a transposed token-major buffer
    x = (_rand(total, D, seed=51, **kw).t() if token_major_storage
         else _rand(D, total, seed=51, **kw))
    qsl = torch.tensor([0, 5, total], dtype=torch.int32, device=device)
    pool = _rand(P, D, W - 1, seed=52, **kw)
    idx = torch.tensor([3, 1], dtype=torch.int32, device=device)
    out = vllm.causal_conv1d_fn(x, w, None, pool.clone(), qsl, idx, activation="silu")
    assert out.stride() == x.stride()
    ref = vllm.causal_conv1d_fn(x.contiguous(), w, None, pool.clone(), qsl, idx,
                                activation="silu")
    assert torch.equal(out, ref)
    # causal_conv1d_update: x [batch, dim, seqlen]
    xs = (_rand(2, 3, D, seed=53, **kw).transpose(1, 2) if token_major_storage
          else _rand(2, D, 3, seed=53, **kw))
    p1, p2 = pool.clone(), pool.clone()
    out = vllm.causal_conv1d_update(xs, p1, w, None, "silu", conv_state_indices=idx)
    assert out.stride() == xs.stride()
    ref = vllm.causal_conv1d_update(xs.contiguous(), p2, w, None, "silu", conv_state_indices=idx)
    assert torch.equal(out, ref) and torch.equal(p1, p2)


@pytest.mark.parametrize("device", DEVICES)
def test_update_and_module_follow_x(device):
    kw = dict(dtype=torch.float32, device=device)
    x = LAYOUTS["channel"][0](3, 4, D, seed=60, **kw)  # [N, T, D] steps, channel-major
    cache = _rand(3, D, W, seed=61, **kw)
    w = _rand(D, W, seed=62, **kw)
    c1, c2 = cache.clone(), cache.clone()
    y, _ = shortconv.causal_conv1d_update(x, c1, weight=w, activation="silu")
    assert y.stride() == x.stride()
    yr, _ = shortconv.causal_conv1d_update(x.contiguous(), c2, weight=w, activation="silu")
    assert torch.equal(y, yr) and torch.equal(c1, c2)

    m = shortconv.ShortConvolution(D, W, bias=True).to(device)
    xm = LAYOUTS["channel"][0](B, T, D, seed=63, **kw).requires_grad_()
    ym, _ = m(xm)
    assert ym.stride() == xm.stride()
    dxm, = torch.autograd.grad(ym, [xm], LAYOUTS["channel"][0](B, T, D, seed=64, **kw))
    assert dxm.stride() == xm.stride()
    mask = torch.ones(B, T, device=device)
    mask[0, :3] = 0
    ymm, _ = m(xm, mask=mask)
    assert ymm.stride() == xm.stride()
    # [B, T, H, Dh] heads over channel-major storage [B, H, Dh, T]
    xh = _rand(B, 3, D // 3, T, seed=65, **kw).permute(0, 3, 1, 2)
    yh, _ = shortconv.causal_conv1d(xh, w, activation="silu")
    assert yh.shape == xh.shape and yh.stride() == xh.stride()
    yhr, _ = shortconv.causal_conv1d(xh.contiguous(), w, activation="silu")
    assert torch.equal(yh, yhr)
