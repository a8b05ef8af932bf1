"""Forward against the plain-PyTorch reference (F.conv1d on h0 ++ x), layouts, dtypes."""
import pytest
import torch

import shortconv
from shortconv.reference import causal_conv1d_ref

from helpers import assert_close, make_problem, rel


def run_both(p, activation="silu", output_final_state=True, ref_dtype=torch.float64):
    y, ht = shortconv.causal_conv1d(
        p["x"], p["weight"], p["bias"], p["residual"], p["initial_state"], output_final_state,
        activation, cu_seqlens=p["cu_seqlens"], state_len=p["state_len"])

    def up(t):
        return None if t is None else t.detach().to(ref_dtype)

    yr, htr = causal_conv1d_ref(
        up(p["x"]), up(p["weight"]), up(p["bias"]), up(p["residual"]), up(p["initial_state"]),
        output_final_state, activation, cu_seqlens=p["cu_seqlens"], state_len=p["state_len"])
    return y, ht, yr, htr


@pytest.mark.parametrize("W", [1, 2, 4])
@pytest.mark.parametrize("Sd", [-1, 0, 2])  # S = W + Sd
@pytest.mark.parametrize("activation", [None, "silu"])
def test_dense_matches_reference(W, Sd, activation):
    S = W + Sd
    p = make_problem(B=3, T=6, D=5, W=W, S=S, residual=True, seed=W * 10 + Sd)
    y, ht, yr, htr = run_both(p, activation)
    assert_close(y, yr, what="y")
    assert ht.shape == (3, 5, S)
    assert torch.equal(ht, htr), "final_state is a copy of the last S entries of h0 ++ x"


@pytest.mark.parametrize("S_extra", [-1, 0, 2])
def test_packed_matches_reference(S_extra):
    W = 3
    lengths = [4, 0, 1, 7, 2]  # zero-length and shorter-than-S sequences
    p = make_problem(W=W, S=W + S_extra, lengths=lengths, seed=3)
    y, ht, yr, htr = run_both(p, "silu")
    assert_close(y, yr, what="y")
    assert torch.equal(ht, htr)
    # a zero-length sequence hands its initial state through unchanged
    assert torch.equal(ht[1], p["initial_state"][1])


def test_packed_2d_input_and_int64_offsets():
    p = make_problem(W=4, lengths=[3, 5], seed=4)
    p["x"] = p["x"][0]  # [total, D]
    p["cu_seqlens"] = p["cu_seqlens"].long()
    y, ht, yr, htr = run_both(p, None)
    assert y.shape == p["x"].shape
    assert_close(y, yr, what="y")
    assert torch.equal(ht, htr)


def test_defaults_fla_conventions():
    p = make_problem(B=2, T=5, D=3, W=4, h0=False, bias=False, seed=5)
    y, ht = shortconv.causal_conv1d(p["x"], p["weight"])
    assert ht is None
    yr, _ = causal_conv1d_ref(p["x"], p["weight"])
    assert_close(y, yr)
    # default state: [N, D, W] (FLA); state_len=W-1 gives causal-conv1d's [N, D, W-1]
    _, ht = shortconv.causal_conv1d(p["x"], p["weight"], output_final_state=True)
    assert ht.shape == (2, 3, 4)
    _, ht3 = shortconv.causal_conv1d(p["x"], p["weight"], output_final_state=True, state_len=3)
    assert ht3.shape == (2, 3, 3)
    assert torch.equal(ht3, ht[:, :, 1:])
    # S inferred from initial_state
    h0 = torch.randn(2, 3, 6, dtype=torch.float64)
    _, ht6 = shortconv.causal_conv1d(p["x"], p["weight"], initial_state=h0,
                                     output_final_state=True)
    assert ht6.shape == (2, 3, 6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision(dtype):
    p = make_problem(B=2, T=9, D=6, W=4, dtype=dtype, residual=True, seed=6)
    y, ht, yr, htr = run_both(p, "silu")
    assert y.dtype == dtype and ht.dtype == dtype
    assert_close(y, yr, dtype, what="y")
    assert torch.equal(ht, htr.to(dtype))


def test_mixed_dtypes():
    # activations bf16, parameters fp32, states fp32: three independent dtype groups
    p = make_problem(B=2, T=5, D=4, W=3, dtype=torch.bfloat16, param_dtype=torch.float32,
                     state_dtype=torch.float32, seed=7)
    y, ht, yr, htr = run_both(p, "silu")
    assert y.dtype == torch.bfloat16 and ht.dtype == torch.float32
    assert_close(y, yr, torch.bfloat16, what="y")
    assert rel(ht, htr) == 0.0


def _no_copies(fn):
    """Runs fn under the profiler; fails if any copy kernel ran."""
    with torch.autograd.profiler.profile() as prof:
        out = fn()
    names = {e.name for e in prof.function_events}
    copies = {n for n in names if n in ("aten::copy_", "aten::clone", "aten::contiguous")}
    assert not copies, "unexpected copies: %s" % sorted(copies)
    return out


def test_strided_qkv_slice_without_copies():
    B, T, D, W = 2, 8, 4, 4
    g = torch.Generator().manual_seed(8)
    qkv = torch.randn(B, T, 3 * D, generator=g, dtype=torch.float64)
    k = qkv[:, :, D:2 * D].detach().requires_grad_()  # strides (3TD, 3D, 1), offset D
    w = torch.randn(D, W, generator=g, dtype=torch.float64, requires_grad=True)
    assert not k.is_contiguous()
    y, _ = _no_copies(lambda: shortconv.causal_conv1d(k, w, activation="silu"))
    yr, _ = causal_conv1d_ref(k.detach().contiguous(), w.detach(), activation="silu")
    assert_close(y, yr)
    dy = torch.randn(y.shape, generator=g, dtype=torch.float64)
    dk, dw = _no_copies(lambda: torch.autograd.grad(y, [k, w], dy))
    kr = k.detach().contiguous().requires_grad_()
    wr = w.detach().requires_grad_()
    dkr, dwr = torch.autograd.grad(causal_conv1d_ref(kr, wr, activation="silu")[0], [kr, wr], dy)
    assert_close(dk, dkr)
    assert_close(dw, dwr)


def test_outputs_follow_a_dense_input_layout():
    # y and dx take x's strides when x is dense in any layout (channel-major
    # [B, D, T] storage: the kernels then write with vector stores), and are
    # contiguous for a non-dense x (a slice of a fused projection).
    B, T, D, W = 2, 9, 5, 4
    g = torch.Generator().manual_seed(17)
    w = torch.randn(D, W, generator=g, dtype=torch.float64, requires_grad=True)
    xcm = torch.randn(B, D, T, generator=g, dtype=torch.float64).transpose(1, 2)
    xcm.requires_grad_()
    y, _ = shortconv.causal_conv1d(xcm, w, activation="silu")
    assert y.stride() == xcm.stride()
    dy = torch.randn(B, T, D, generator=g, dtype=torch.float64)  # token-major gradient: read as is
    dx, = torch.autograd.grad(y, [xcm], dy)
    assert dx.stride() == xcm.stride()
    yr, _ = causal_conv1d_ref(xcm.detach().contiguous(), w.detach(), activation="silu")
    assert_close(y, yr)
    qkv = torch.randn(B, T, 3 * D, generator=g, dtype=torch.float64)
    y2, _ = shortconv.causal_conv1d(qkv[:, :, D:2 * D], w.detach(), activation="silu")
    assert y2.is_contiguous()


def test_channel_major_and_heads_layouts():
    B, T, H, Dh, W = 2, 6, 3, 2, 3
    D = H * Dh
    g = torch.Generator().manual_seed(9)
    w = torch.randn(D, W, generator=g, dtype=torch.float64)
    xc = torch.randn(B, D, T, generator=g, dtype=torch.float64).transpose(1, 2)  # channel-major
    y, _ = _no_copies(lambda: shortconv.causal_conv1d(xc, w))
    assert_close(y, causal_conv1d_ref(xc.contiguous(), w)[0])
    x4 = torch.randn(B, T, H, Dh, generator=g, dtype=torch.float64)
    y4, _ = shortconv.causal_conv1d(x4, w, activation="silu")
    assert y4.shape == x4.shape
    assert_close(y4, causal_conv1d_ref(x4.reshape(B, T, D), w, activation="silu")[0].view(x4.shape))


def test_broadcast_residual_and_dy():
    p = make_problem(B=2, T=5, D=3, W=3, bias=False, h0=False, seed=10)
    res = torch.randn(1, 1, 3, dtype=torch.float64).expand(2, 5, 3)  # stride 0 input
    y, _ = shortconv.causal_conv1d(p["x"], p["weight"], residual=res)
    yr, _ = causal_conv1d_ref(p["x"], p["weight"], residual=res.contiguous())
    assert_close(y, yr)
    x = p["x"].clone().requires_grad_()
    y, _ = shortconv.causal_conv1d(x, p["weight"], activation="silu")
    (dx,) = torch.autograd.grad(y.sum(), [x])  # dy is an expanded scalar (strides 0)
    xr = p["x"].clone().requires_grad_()
    (dxr,) = torch.autograd.grad(causal_conv1d_ref(xr, p["weight"], activation="silu")[0].sum(),
                                 [xr])
    assert_close(dx, dxr)


def test_batch_of_any_size_and_empty():
    for B, T in [(1, 1), (5, 3), (3, 0), (0, 4)]:
        p = make_problem(B=B, T=T, D=3, W=4, seed=11)
        y, ht, yr, htr = run_both(p, "silu")
        assert y.shape == (B, T, 3)
        assert_close(y, yr) if y.numel() else None
        assert torch.equal(ht, htr)


def test_no_grad_and_inference_mode():
    p = make_problem(seed=12, requires_grad=True)
    with torch.no_grad():
        y, ht = shortconv.causal_conv1d(p["x"], p["weight"], p["bias"],
                                        initial_state=p["initial_state"], output_final_state=True)
    assert not y.requires_grad and not ht.requires_grad
    if hasattr(torch, "inference_mode"):
        with torch.inference_mode():
            y2, _ = shortconv.causal_conv1d(p["x"], p["weight"], p["bias"],
                                            initial_state=p["initial_state"])
        assert torch.equal(y, y2)


def test_thread_count_does_not_change_results():
    # exec.num_threads follows torch.get_num_threads(); results never depend on it
    p = make_problem(B=3, T=300, D=40, W=4, dtype=torch.float32, residual=True, seed=13,
                     requires_grad=True)
    names = ["x", "weight", "bias", "residual", "initial_state"]
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            y, ht = shortconv.causal_conv1d(*[p[k] for k in names], True, "silu")
            outs.append((y, ht) + torch.autograd.grad([y, ht], [p[k] for k in names],
                                                       [torch.ones_like(y), torch.ones_like(ht)]))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*outs):
        assert torch.equal(a, b)
