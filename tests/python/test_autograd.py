"""Autograd: gradcheck in float64, gradients vs the reference, chunked vs whole."""
import random

import pytest
import torch

import shortconv
from shortconv.reference import causal_conv1d_ref

from helpers import TOL, assert_close, make_problem, rel


def _configs():
    rng = random.Random(1234)
    out = []
    for i in range(6):
        W = rng.choice([1, 2, 3, 4])
        out.append(dict(
            W=W, S=W + rng.choice([-1, 0, 2]) if W > 1 else W + rng.choice([0, 2]),
            lengths=rng.choice([None, [3, 0, 2, 5], [1, 4]]),
            bias=rng.random() < 0.7, residual=rng.random() < 0.5, h0=rng.random() < 0.8,
            activation=rng.choice([None, "silu"]), seed=i))
    # always covered: S in {W-1, W, W+2}, packed, dht
    out.append(dict(W=4, S=3, lengths=[2, 5, 0], bias=True, residual=True, h0=True,
                    activation="silu", seed=100))
    out.append(dict(W=3, S=3, lengths=None, bias=True, residual=False, h0=True,
                    activation="silu", seed=101))
    out.append(dict(W=3, S=5, lengths=[1, 6], bias=False, residual=True, h0=True,
                    activation=None, seed=102))
    return out


@pytest.mark.parametrize("cfg", _configs(), ids=lambda c: "W%d-S%d-%s-%s" % (
    c["W"], c["S"], "packed" if c["lengths"] else "dense", c["activation"]))
def test_gradcheck(cfg):
    p = make_problem(B=2, T=4, D=3, W=cfg["W"], S=cfg["S"], lengths=cfg["lengths"],
                     bias=cfg["bias"], residual=cfg["residual"], h0=cfg["h0"], seed=cfg["seed"],
                     requires_grad=True)
    names = [k for k in ("x", "weight", "bias", "residual", "initial_state") if p[k] is not None]

    def fn(*tensors):
        kw = dict(zip(names, tensors))
        y, ht = shortconv.causal_conv1d(
            kw["x"], kw["weight"], kw.get("bias"), kw.get("residual"), kw.get("initial_state"),
            True, cfg["activation"], cu_seqlens=p["cu_seqlens"], state_len=p["state_len"])
        return y, ht  # the final_state output makes gradcheck feed dht too

    assert torch.autograd.gradcheck(fn, [p[k] for k in names], eps=1e-6, atol=1e-9, rtol=1e-7)


def test_gradcheck_without_final_state():
    p = make_problem(B=2, T=5, D=3, W=3, seed=7, requires_grad=True)

    def fn(x, w, b, h0):
        return shortconv.causal_conv1d(x, w, b, initial_state=h0, activation="silu")[0]

    assert torch.autograd.gradcheck(fn, [p["x"], p["weight"], p["bias"], p["initial_state"]])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("packed", [False, True])
def test_gradients_match_reference(dtype, packed):
    lengths = [3, 0, 6, 1] if packed else None
    p = make_problem(B=3, T=6, D=5, W=4, S=4, lengths=lengths, residual=True, dtype=dtype,
                     seed=20, requires_grad=True)
    names = ["x", "weight", "bias", "residual", "initial_state"]
    y, ht = shortconv.causal_conv1d(*[p[k] for k in names], True, "silu",
                                    cu_seqlens=p["cu_seqlens"])
    g = torch.Generator().manual_seed(21)
    dy = torch.randn(y.shape, generator=g, dtype=torch.float64)
    dht = torch.randn(ht.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad([y, ht], [p[k] for k in names], [dy.to(dtype), dht.to(dtype)])

    ref_in = [p[k].detach().double().requires_grad_() for k in names]
    yr, htr = causal_conv1d_ref(*ref_in, True, "silu", cu_seqlens=p["cu_seqlens"])
    ref_grads = torch.autograd.grad([yr, htr], ref_in, [dy.to(dtype).double(), dht.to(dtype).double()])
    for name, a, b in zip(names, grads, ref_grads):
        assert a.dtype == p[name].dtype and a.shape == p[name].shape
        # bf16: dweight/dbias are sums over B*T terms rounded once to bf16 at the end
        assert_close(a, b, dtype, what="d" + name)


def test_only_requested_gradients():
    p = make_problem(B=2, T=4, D=3, W=3, seed=22)
    w = p["weight"].clone().requires_grad_()
    y, _ = shortconv.causal_conv1d(p["x"], w, p["bias"], initial_state=p["initial_state"],
                                   activation="silu")
    (dw,) = torch.autograd.grad(y.sum(), [w])
    wr = p["weight"].clone().requires_grad_()
    yr, _ = causal_conv1d_ref(p["x"], wr, p["bias"], initial_state=p["initial_state"],
                              activation="silu")
    (dwr,) = torch.autograd.grad(yr.sum(), [wr])
    assert_close(dw, dwr)


def _chunked(x, w, b, h0, bounds, activation):
    ys, state = [], h0
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        y, state = shortconv.causal_conv1d(x[:, lo:hi], w, b, initial_state=state,
                                           output_final_state=True, activation=activation)
        ys.append(y)
    return torch.cat(ys, dim=1), state


@pytest.mark.parametrize("S_extra", [-1, 0, 2])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_whole_vs_chunked(S_extra, dtype):
    W, T = 4, 11
    p = make_problem(B=2, T=T, D=4, W=W, S=W + S_extra, dtype=dtype, seed=30, requires_grad=True)
    x, w, b, h0 = p["x"], p["weight"], p["bias"], p["initial_state"]
    y, ht = shortconv.causal_conv1d(x, w, b, initial_state=h0, output_final_state=True,
                                    activation="silu")
    bounds = [0, 1, 2, 5, 5, 9, 11]  # chunks shorter than S, an empty chunk, longer ones
    yc, htc = _chunked(x, w, b, h0, bounds, "silu")
    assert torch.equal(y, yc), "forward must be bit-identical when chunked"
    assert torch.equal(ht, htc)
    g = torch.Generator().manual_seed(31)
    dy = torch.randn(y.shape, generator=g, dtype=torch.float64).to(dtype)
    dht = torch.randn(ht.shape, generator=g, dtype=torch.float64).to(dtype)
    whole = torch.autograd.grad([y, ht], [x, w, b, h0], [dy, dht])
    chunk = torch.autograd.grad([yc, htc], [x, w, b, h0], [dy, dht])
    for name, a, c in zip(["x", "weight", "bias", "initial_state"], whole, chunk):
        # dx and dh0 see the same terms; dweight/dbias sum per chunk, so the order differs
        assert rel(a, c) <= TOL[dtype], name


# ---- double backward ---------------------------------------------------------------
def _paths():
    return ["eager", "custom_op"] if shortconv.HAS_CUSTOM_OPS else ["eager"]


@pytest.fixture(params=_paths())
def path(request, monkeypatch):
    """Route eager calls through the autograd.Function or through the custom ops."""
    monkeypatch.setattr(shortconv._ops, "EAGER_CUSTOM_OP", request.param == "custom_op")
    return request.param


_GG_CONFIGS = [  # S in {W-1, W, W+2}; dense and packed; with and without h0, bias, residual
    dict(W=4, S=3, lengths=None, bias=True, residual=False, h0=True, activation="silu"),
    dict(W=3, S=3, lengths=[2, 0, 4], bias=True, residual=True, h0=True, activation="silu"),
    dict(W=3, S=5, lengths=None, bias=False, residual=True, h0=True, activation=None),
    dict(W=2, S=1, lengths=[3, 1], bias=True, residual=False, h0=False, activation=None),
    dict(W=2, S=4, lengths=[1, 5], bias=True, residual=False, h0=True, activation="silu"),
    dict(W=1, S=0, lengths=None, bias=True, residual=True, h0=False, activation="silu"),
]


@pytest.mark.parametrize("cfg", _GG_CONFIGS, ids=lambda c: "W%d-S%d-%s-%s" % (
    c["W"], c["S"], "packed" if c["lengths"] else "dense", c["activation"]))
def test_gradgradcheck(cfg, path):
    p = make_problem(B=2, T=4, D=2, W=cfg["W"], S=cfg["S"], lengths=cfg["lengths"],
                     bias=cfg["bias"], residual=cfg["residual"], h0=cfg["h0"],
                     seed=cfg["W"] * 10 + cfg["S"], requires_grad=True)
    names = [k for k in ("x", "weight", "bias", "residual", "initial_state") if p[k] is not None]

    def fn(*tensors):
        kw = dict(zip(names, tensors))
        return shortconv.causal_conv1d(
            kw["x"], kw["weight"], kw.get("bias"), kw.get("residual"), kw.get("initial_state"),
            True, cfg["activation"], cu_seqlens=p["cu_seqlens"], state_len=p["state_len"])

    ins = [p[k] for k in names]
    y, ht = fn(*ins)
    gy, ght = torch.randn_like(y).requires_grad_(), torch.randn_like(ht).requires_grad_()
    grads = torch.autograd.grad([y, ht], ins, [gy, ght], create_graph=True)
    # gradgradcheck skips outputs that do not require grad: every first derivative must
    for name, g in zip(names, grads):
        assert g.requires_grad, "d%s is not differentiable" % name
    # the second derivatives in every input and in the first backward's dy and dht
    assert torch.autograd.gradgradcheck(fn, ins, eps=1e-6, atol=1e-8, rtol=1e-6)


def _penalty(conv, x, w, b, h0, cu, activation):
    """A gradient penalty: ||dL/dx||^2 + ||dL/dh0||^2 with L = sum(y^2) + sum(ht)."""
    y, ht = conv(x, w, b, initial_state=h0, output_final_state=True, activation=activation,
                 cu_seqlens=cu)
    gx, gh0 = torch.autograd.grad((y * y).sum() + ht.sum(), [x, h0], create_graph=True)
    return (gx * gx).sum() + (gh0 * gh0).sum()


def _ref_conv(x, w, b, initial_state, output_final_state, activation, cu_seqlens):
    return causal_conv1d_ref(x, w, b, None, initial_state, output_final_state, activation,
                             cu_seqlens)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("packed", [False, True])
def test_gradient_penalty_matches_reference(dtype, activation, packed, path):
    p = make_problem(B=2, T=6, D=4, W=4, S=4, lengths=[4, 0, 7] if packed else None,
                     dtype=dtype, seed=130, requires_grad=True)
    ins = [p["x"], p["weight"], p["bias"], p["initial_state"]]
    pen = _penalty(shortconv.causal_conv1d, *ins, p["cu_seqlens"], activation)
    grads = torch.autograd.grad(pen, ins)
    ref_in = [t.detach().double().requires_grad_() for t in ins]
    pen_r = _penalty(_ref_conv, *ref_in, p["cu_seqlens"], activation)
    ref_grads = torch.autograd.grad(pen_r, ref_in)
    assert_close(pen, pen_r, dtype, "penalty")
    for name, a, r in zip(["x", "weight", "bias", "initial_state"], grads, ref_grads):
        assert a.dtype == dtype
        assert_close(a, r, dtype, what="d penalty / d " + name)


@pytest.mark.skipif(not shortconv.HAS_CUSTOM_OPS, reason="custom ops need torch >= 2.4")
def test_double_backward_paths_agree(monkeypatch):
    p = make_problem(B=2, T=5, D=3, W=3, S=3, lengths=[2, 6, 0], residual=True, seed=131,
                     requires_grad=True)
    ins = [p["x"], p["weight"], p["bias"], p["initial_state"]]
    results = []
    for custom in (False, True):
        monkeypatch.setattr(shortconv._ops, "EAGER_CUSTOM_OP", custom)
        pen = _penalty(shortconv.causal_conv1d, *ins, p["cu_seqlens"], "silu")
        results.append(torch.autograd.grad(pen, ins))
    for a, b in zip(*results):
        assert torch.equal(a, b)  # the same library calls in the same order


def test_third_order(path):
    # The double backward is built from differentiable calls, so the third order is exact
    # too: gradgradcheck of the create_graph first derivatives.
    p = make_problem(B=2, T=3, D=2, W=3, S=3, lengths=[1, 4], residual=True, seed=132,
                     requires_grad=True)
    names = ["x", "weight", "bias", "residual", "initial_state"]
    g = torch.Generator().manual_seed(133)
    N = 2
    gy = torch.randn(1, 5, 2, generator=g, dtype=torch.float64)
    gh = torch.randn(N, 2, 3, generator=g, dtype=torch.float64)

    def first(*tensors):
        y, ht = shortconv.causal_conv1d(*tensors, True, "silu", cu_seqlens=p["cu_seqlens"])
        return torch.autograd.grad([y, ht], tensors, [gy, gh], create_graph=True)

    assert torch.autograd.gradgradcheck(first, [p[k] for k in names], eps=1e-6, atol=1e-7,
                                        rtol=1e-5)


@pytest.mark.skipif(not hasattr(torch.autograd, "forward_ad"), reason="forward AD missing")
@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch's own, from its forward AD code
def test_forward_mode_ad_raises_instead_of_dropping_tangents(path):
    fwAD = torch.autograd.forward_ad
    p = make_problem(B=2, T=4, D=3, W=3, seed=134)
    with fwAD.dual_level():
        x = fwAD.make_dual(p["x"], torch.ones_like(p["x"]))
        with pytest.raises(NotImplementedError, match="jvp"):
            shortconv.causal_conv1d(x, p["weight"], activation="silu")
        with torch.no_grad(), pytest.raises(NotImplementedError, match="jvp"):
            shortconv.causal_conv1d(x, p["weight"], activation="silu")
        y, _ = shortconv.causal_conv1d(p["x"], p["weight"])  # no tangents: fine
    yr, _ = causal_conv1d_ref(p["x"], p["weight"])
    assert_close(y, yr)


@pytest.mark.skipif(not shortconv.HAS_CUSTOM_OPS or not hasattr(torch.library, "opcheck"),
                    reason="custom ops and torch.library.opcheck need torch >= 2.4")
def test_opcheck_of_the_differentiable_backward_op():
    # autograd registration and AOT dispatch of causal_conv1d_bwd's own backward (SiLU: the
    # VJP's every branch; several seconds, so one case)
    p = make_problem(B=2, T=5, D=3, W=3, S=4, lengths=[2, 0, 4], dtype=torch.float32, seed=135,
                     requires_grad=True)
    dy = torch.randn(1, 6, 3, requires_grad=True)
    dht = torch.randn(3, 3, 4, requires_grad=True)
    torch.library.opcheck(torch.ops.shortconv.causal_conv1d_bwd.default,
                          (p["x"], p["weight"], p["bias"], p["initial_state"], p["cu_seqlens"],
                           dy, dht, 4, 1, True, True, True, True))


def _grads(y, ht, leaves, g):
    return torch.autograd.grad([y, ht], leaves, [g, torch.ones_like(ht)], retain_graph=True)


def test_backward_reuses_the_forward_description_only_while_it_holds():
    """The backward starts from the forward's description of x, weight, bias and states
    (one C call and half the Python each way): the same results as a fresh description,
    again on a retained graph, and described afresh when a saved input's storage was
    swapped (``.data =``) or an input was a resolved lazy view."""
    from helpers import library_calls

    p = make_problem(B=2, T=9, D=5, W=4, dtype=torch.float64, seed=90, requires_grad=True)
    leaves = [p["x"], p["weight"], p["bias"], p["initial_state"]]
    g = torch.randn(p["x"].shape, dtype=torch.float64)
    y, ht = shortconv.causal_conv1d(*leaves[:3], initial_state=leaves[3],
                                    output_final_state=True, activation="silu")
    ref = [t.detach().clone().requires_grad_() for t in leaves]
    yr, htr = causal_conv1d_ref(*ref[:3], initial_state=ref[3], output_final_state=True,
                                activation="silu")
    want = _grads(yr, htr, ref, g)
    with library_calls() as calls:
        first = _grads(y, ht, leaves, g)
        second = _grads(y, ht, leaves, g)  # the retained graph: the description again
    for a, b, e in zip(first, second, want):
        assert torch.equal(a, b)
        assert_close(a, e)
    (_, c1), (_, c2) = calls
    assert c1.keys() == c2.keys() and c1["x"][0] == p["x"].data_ptr()
    for field in c1:  # the inputs' descriptions equal, the outputs' new tensors alike
        assert c1[field][1:] == c2[field][1:]
        assert field not in ("x", "weight", "bias", "initial_state") or c1[field] == c2[field]
    # a saved input's storage swapped behind autograd's back: described afresh
    xs = p["x"].detach().clone().requires_grad_()
    y2, ht2 = shortconv.causal_conv1d(xs, *leaves[1:3], initial_state=leaves[3],
                                      output_final_state=True, activation="silu")
    xs.data = p["x"].detach().clone()  # same values, new memory
    with library_calls() as calls:
        swapped = _grads(y2, ht2, [xs] + leaves[1:], g)
    (_, c3), = calls
    assert c3["x"][0] == xs.data_ptr() != c1["x"][0]
    for a, e in zip(swapped, first):
        assert torch.equal(a, e)
    # a lazily negated x is resolved into a copy for the forward, described afresh after
    xn = (-p["x"].detach()).requires_grad_()
    yn, htn = shortconv.causal_conv1d(torch._neg_view(xn), *leaves[1:3], initial_state=leaves[3],
                                      output_final_state=True, activation="silu")
    for a, e in zip(_grads(yn, htn, [xn] + leaves[1:], g), first):
        assert torch.equal(a.abs(), e.abs())
