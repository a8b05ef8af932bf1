"""Custom ops (torch >= 2.4): opcheck, autograd through the op, torch.compile(fullgraph=True).

On CPU these run on every CI run with PyPI's torch; on older torch (the
autograd.Function fallback) they are skipped.
"""
import pytest
import torch

import shortconv

from helpers import TORCH_VERSION, assert_close, make_problem

pytestmark = pytest.mark.skipif(
    not shortconv.HAS_CUSTOM_OPS,
    reason="custom ops need torch >= 2.4 (this is torch %s: autograd.Function fallback)"
    % torch.__version__)


def _fwd_args(p, act=1, ofs=True):
    return (p["x"], p["weight"], p["bias"], p["residual"], p["initial_state"], p["cu_seqlens"],
            p["state_len"], act, ofs)


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck missing")
@pytest.mark.parametrize("packed", [False, True])
def test_opcheck(packed):
    p = make_problem(B=2, T=5, D=3, W=3, S=4, lengths=[2, 0, 4] if packed else None,
                     residual=True, dtype=torch.float32, seed=70, requires_grad=True)
    torch.library.opcheck(torch.ops.shortconv.causal_conv1d_fwd.default, _fwd_args(p))
    torch.library.opcheck(torch.ops.shortconv.causal_conv1d_fwd.default, _fwd_args(p, 0, False))
    d = {k: (v.detach() if torch.is_tensor(v) else v) for k, v in p.items()}
    N = 3 if packed else 2
    dy = torch.randn(d["x"].shape)
    dht = torch.randn(N, 3, 4)
    torch.library.opcheck(torch.ops.shortconv.causal_conv1d_bwd.default,
                          (d["x"], d["weight"], d["bias"], d["initial_state"], d["cu_seqlens"],
                           dy, dht, 4, 1, True, True, True, True))
    torch.library.opcheck(torch.ops.shortconv.causal_conv1d_bwd.default,
                          (d["x"], d["weight"], None, None, d["cu_seqlens"],
                           dy, None, 4, 0, True, False, False, False))
    x1 = torch.randn(N, 1, 3) if not packed else torch.randn(1, 6, 3)
    torch.library.opcheck(torch.ops.shortconv.causal_conv1d_update.default,
                          (x1, d["initial_state"].clone(), d["weight"], d["bias"], None, None,
                           d["cu_seqlens"], 1, None, None, -1, None, None, None, None, None,
                           None, None, 0))
    pool = torch.randn(5, 3, 4)
    torch.library.opcheck(torch.ops.shortconv.causal_conv1d_update.default,
                          (torch.randn(2, 1, 3), pool, d["weight"], None, None,
                           torch.tensor([4, -1]), None, 0, None, None, -1, None, None, None, None,
                           None, None, None, 0))
    # exec.overlap (the schema's last argument; ignored on the host)
    torch.library.opcheck(torch.ops.shortconv.causal_conv1d_update.default,
                          (torch.randn(2, 1, 3), pool.clone(), d["weight"], None, None,
                           torch.tensor([4, -1]), None, 0, None, None, -1, None, None, None, None,
                           None, None, None, 0, 2))
    # state addressing: flags, ring rows, a pad slot id
    torch.library.opcheck(torch.ops.shortconv.causal_conv1d_update.default,
                          (torch.randn(3, 2, 3), pool.clone(), d["weight"], d["bias"], None,
                           torch.tensor([4, 7, 0]), None, 1, torch.tensor([True, False, True]),
                           torch.tensor([0, 5, 2], dtype=torch.int32), 7, None, None, None, None,
                           None, None, None, 0))
    # serving steps: a speculative tree step of 3 tokens on rows of (W-1) + 2 = 4 entries
    torch.library.opcheck(torch.ops.shortconv.causal_conv1d_update.default,
                          (torch.randn(2, 3, 3), pool.clone(), d["weight"], d["bias"], None,
                           torch.tensor([4, 1]), None, 1, None, None, -1,
                           torch.tensor([2, 1], dtype=torch.int32),
                           torch.tensor([[-1, 0, 0], [-1, 0, 1]]), None, None, None, None, None, 0))
    # prefix caching: a packed chunk of 2 sequences, blocks of 2 tokens, snapshots via a table
    pool8 = torch.randn(8, 3, 4)
    torch.library.opcheck(torch.ops.shortconv.causal_conv1d_update.default,
                          (torch.randn(1, 7, 3), pool8, d["weight"], d["bias"], None, None,
                           torch.tensor([0, 3, 7]), 1, None, None, -1, None, None,
                           torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]]), torch.tensor([0, 0]),
                           torch.tensor([1, 3]), torch.tensor([0, 1]), torch.tensor([1, 3]), 2))


def test_gradcheck_through_the_custom_op():
    p = make_problem(B=2, T=4, D=3, W=3, S=3, lengths=[3, 1], residual=True, seed=71,
                     requires_grad=True)

    def fn(x, w, b, r, h0):
        return torch.ops.shortconv.causal_conv1d_fwd(x, w, b, r, h0, p["cu_seqlens"], 3, 1, True)

    assert torch.autograd.gradcheck(
        fn, [p["x"], p["weight"], p["bias"], p["residual"], p["initial_state"]])


def _loss(x, w, b, h0, cu):
    y, ht = shortconv.causal_conv1d(x, w, b, initial_state=h0, output_final_state=True,
                                    activation="silu", cu_seqlens=cu)
    return (y * y).sum() + (ht * ht.detach().sign()).sum()


@pytest.mark.parametrize("packed", [False, True])
def test_compile_fullgraph_matches_eager(packed):
    torch._dynamo.reset()
    p = make_problem(B=2, T=6, D=4, W=4, lengths=[2, 5, 0] if packed else None,
                     dtype=torch.float32, seed=72, requires_grad=True)
    args = [p["x"], p["weight"], p["bias"], p["initial_state"]]
    compiled = torch.compile(_loss, fullgraph=True, backend="aot_eager")
    lc = compiled(*args, p["cu_seqlens"])
    gc = torch.autograd.grad(lc, args)
    le = _loss(*args, p["cu_seqlens"])
    ge = torch.autograd.grad(le, args)
    assert torch.equal(lc, le)
    for a, b in zip(gc, ge):
        assert torch.equal(a, b)


def _loss_ids(x, w, b, r, h0, seq_idx):
    y, ht = shortconv.causal_conv1d(x, w, b, r, initial_state=h0, output_final_state=True,
                                    activation="silu", seq_idx=seq_idx)
    return (y * y).sum() + (ht * ht.detach().sign()).sum()


def test_compile_fullgraph_seq_idx():
    """seq_idx (with states: rows by id) through the custom ops, no graph break; the op's
    schema takes it (opcheck), and gradients equal eager ones bitwise."""
    torch._dynamo.reset()
    torch.manual_seed(75)
    B, T, D, W = 2, 7, 4, 3
    seq_idx = torch.tensor([[0, 0, -1, 1, 1, 1, 1], [-1, -1, 2, 2, 3, 4, 4]], dtype=torch.int32)
    x, r = torch.randn(B, T, D, requires_grad=True), torch.randn(B, T, D, requires_grad=True)
    w, b = torch.randn(D, W, requires_grad=True), torch.randn(D, requires_grad=True)
    h0 = torch.randn(6, D, W, requires_grad=True)
    args = [x, w, b, r, h0]
    compiled = torch.compile(_loss_ids, fullgraph=True, backend="aot_eager")
    lc, le = compiled(*args, seq_idx), _loss_ids(*args, seq_idx)
    assert torch.equal(lc, le)
    for a, e in zip(torch.autograd.grad(lc, args), torch.autograd.grad(le, args)):
        assert torch.equal(a, e)
    if hasattr(torch.library, "opcheck"):
        d = [t.detach() for t in args]
        torch.library.opcheck(torch.ops.shortconv.causal_conv1d_fwd.default,
                              (d[0], d[1], d[2], d[3], d[4], None, 3, 1, True, seq_idx, 6))
        torch.library.opcheck(torch.ops.shortconv.causal_conv1d_bwd.default,
                              (d[0], d[1], d[2], d[4], None, torch.randn(B, T, D),
                               torch.randn(6, D, 3), 3, 1, True, True, True, True, seq_idx))


def test_compile_dynamic_shapes():
    torch._dynamo.reset()
    compiled = torch.compile(_loss, fullgraph=True, backend="aot_eager", dynamic=True)
    for T in (5, 9):
        p = make_problem(B=2, T=T, D=4, W=3, dtype=torch.float32, seed=73 + T, requires_grad=True)
        args = [p["x"], p["weight"], p["bias"], p["initial_state"]]
        gc = torch.autograd.grad(compiled(*args, None), args)
        ge = torch.autograd.grad(_loss(*args, None), args)
        for a, b in zip(gc, ge):
            assert torch.equal(a, b)


def test_compile_module_and_decode_step():
    torch._dynamo.reset()
    torch.manual_seed(74)
    m = shortconv.ShortConvolution(4, 3, bias=True, activation="silu")
    x = torch.randn(2, 5, 4, requires_grad=True)
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    y, _ = cm(x)
    ye, _ = m(x)
    assert torch.equal(y, ye)
    gc = torch.autograd.grad(y.sum(), [x, m.weight, m.bias])
    ge = torch.autograd.grad(ye.sum(), [x, m.weight, m.bias])
    for a, b in zip(gc, ge):
        assert torch.equal(a, b)

    def step(xt, cache):  # in-place decode update inside a compiled graph
        return shortconv.causal_conv1d_update(xt, cache, weight=m.weight[:, 0], bias=m.bias,
                                              activation="silu")[0]

    cstep = torch.compile(step, fullgraph=True, backend="aot_eager")
    cache_c = torch.randn(2, 4, 3)
    cache_e = cache_c.clone()
    with torch.no_grad():
        for t in range(3):
            xt = torch.randn(2, 4)
            yc = cstep(xt, cache_c)
            ye = step(xt, cache_e)
            assert torch.equal(yc, ye)
            assert torch.equal(cache_c, cache_e)


@pytest.mark.skipif(TORCH_VERSION < (2, 4), reason="inductor with custom ops")
def test_inductor_fullgraph():
    """One graph through inductor (the default backend) as users run it.  Only the op in
    the graph: surrounding pointwise ops would make inductor compile C++ kernels, ~30 s
    on a 2-core machine; the CUDA tests compile a larger graph."""
    torch._dynamo.reset()
    p = make_problem(B=2, T=6, D=4, W=4, residual=True, dtype=torch.float32, seed=75,
                     requires_grad=True)

    def f(x, w, b, r, h0):
        return shortconv.causal_conv1d(x, w, b, r, h0, True, "silu")

    args = [p["x"], p["weight"], p["bias"], p["residual"], p["initial_state"]]
    yc, hc = torch.compile(f, fullgraph=True)(*args)
    ye, he = f(*args)
    assert_close(yc, ye, what="y")
    assert torch.equal(hc, he)
    gc = torch.autograd.grad([yc, hc], args, [torch.ones_like(yc), torch.ones_like(hc)])
    ge = torch.autograd.grad([ye, he], args, [torch.ones_like(ye), torch.ones_like(he)])
    for a, b in zip(gc, ge):
        assert_close(a, b)


@pytest.mark.skipif(TORCH_VERSION < (2, 4), reason="inductor with custom ops")
@pytest.mark.parametrize("overlap", [None, "reads"])
def test_inductor_decode_mutates_the_pool(overlap):
    """The in-place update through inductor (auto-functionalized, then re-inplaced); overlap
    travels through the custom op (ignored on the host)."""
    torch._dynamo.reset()
    torch.manual_seed(76)
    D, W = 8, 4
    w = torch.randn(D, W)
    idx = torch.tensor([2, -1, 0])

    def step(x, pool):
        return shortconv.causal_conv1d_update(x, pool, weight=w, activation="silu",
                                              cache_indices=idx, overlap=overlap)[0]

    cstep = torch.compile(step, fullgraph=True)
    pool_c = torch.randn(4, D, W)
    pool_e = pool_c.clone()
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(3, D)
            assert torch.equal(cstep(x, pool_c), step(x, pool_e))
            assert torch.equal(pool_c, pool_e)
