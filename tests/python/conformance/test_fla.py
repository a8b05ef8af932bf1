"""shortconv (FLA's causal_conv1d / causal_conv1d_update / ShortConvolution) against FLA's own
test parametrisation (tests/modules/test_conv.py): every case of its lists, FLA's 'triton',
'cuda' and 'mix' backends included (shortconv runs the same op for each).

The reference is FLA's documented semantics in float64 (references.fla_ref); tolerances are the
project's.  Cases of 30M+ elements run on CUDA only (the CPU budget of CI).
"""
import warnings

import pytest
import torch

import shortconv
from shortconv import ShortConvolution, causal_conv1d, causal_conv1d_update
from shortconv import modules as sc_modules

from helpers import assert_close, lengths_to_cu
from references import dao_update_ref, fla_ref, randn

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def _leaf(t):
    return None if t is None else t.detach().cpu().double().requires_grad_()


def _conv(D, W, has_bias, activation, backend, device, dtype):
    # FLA's module warns and keeps 'triton' when backend='cuda' finds no causal-conv1d package.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Switching to the Triton implementation")
        return ShortConvolution(hidden_size=D, kernel_size=W, bias=has_bias, activation=activation,
                                backend=backend, device=device, dtype=dtype)


def _grads_match(outputs, inputs, ref_outputs, ref_inputs, cotangents, dtype, names):
    present = [i for i, t in enumerate(inputs) if t is not None]
    grads = torch.autograd.grad(outputs, [inputs[i] for i in present],
                                [c.to(o.device) for c, o in zip(cotangents, outputs)])
    grads_ref = torch.autograd.grad(ref_outputs, [ref_inputs[i] for i in present],
                                    [c.double() for c in cotangents])
    for i, a, b in zip(present, grads, grads_ref):
        assert_close(a, b, dtype, what=names[i])


def _cu(T, N, gen, device):
    cu = torch.cat([torch.tensor([0]), torch.arange(16, T)[torch.randperm(T - 16, generator=gen)[:N - 1]],
                    torch.tensor([T])]).sort()[0]
    return cu.to(device)


CONV = [
    (2, 64, 128, 3, "swish", True, True, F32, "triton"),
    (2, 128, 128, 4, "swish", False, True, F32, "triton"),
    (2, 64, 128, 3, "swish", True, False, F32, "triton"),
    (2, 128, 128, 4, "swish", False, False, F32, "triton"),
    (2, 500, 1024, 3, None, True, True, F32, "cuda"),
    (2, 1024, 1024, 4, None, False, True, F32, "triton"),
    (2, 64, 128, 3, None, True, False, F16, "triton"),
    (2, 128, 128, 4, None, False, False, F16, "triton"),
    (2, 64, 128, 3, "swish", True, True, F32, "cuda"),
    (2, 128, 128, 4, "swish", False, True, F32, "cuda"),
    (2, 64, 128, 3, "swish", True, False, F32, "cuda"),
    (2, 128, 128, 4, "swish", False, False, F32, "cuda"),
]


@pytest.mark.parametrize("B,T,D,W,activation,has_bias,has_residual,dtype,backend", CONV)
def test_conv(B, T, D, W, activation, has_bias, has_residual, dtype, backend, device):
    gen = torch.Generator().manual_seed(42)
    x = randn(B, T, D, dtype=dtype, device=device, gen=gen).requires_grad_()
    weight = randn(D, W, dtype=dtype, device=device, gen=gen).requires_grad_()
    bias = randn(D, dtype=dtype, device=device, gen=gen).requires_grad_() if has_bias else None
    residual = x.detach().clone().requires_grad_() if has_residual else None
    dy = randn(B, T, D, dtype=dtype, gen=gen)
    y, ht = causal_conv1d(x, weight, bias, residual=residual, activation=activation,
                          backend=backend)
    assert ht is None
    refs = [_leaf(t) for t in (x, weight, bias, residual)]
    y_ref, _ = fla_ref(refs[0], refs[1], refs[2], refs[3], activation=activation)
    assert_close(y, y_ref, dtype, what="y")
    _grads_match([y], [x, weight, bias, residual], [y_ref], refs, [dy], dtype,
                 ("dx", "dw", "db", "dr"))


VARLEN = [
    (4, 500, 128, 3, "swish", True, True, F32, "triton"),
    (4, 1024, 200, 4, "swish", False, True, F32, "triton"),
    (4, 500, 128, 3, None, True, False, F16, "triton"),
    (4, 1024, 1024, 4, None, False, False, F16, "triton"),
    (4, 500, 128, 3, "swish", True, True, F32, "cuda"),
    (4, 1024, 200, 4, "swish", False, True, F32, "cuda"),
    (4, 500, 128, 3, None, True, False, F16, "cuda"),
    (4, 1024, 1024, 4, None, False, False, F16, "cuda"),
]


@pytest.mark.parametrize("N,T,D,W,activation,has_bias,has_residual,dtype,backend", VARLEN)
def test_conv_varlen(N, T, D, W, activation, has_bias, has_residual, dtype, backend, device):
    gen = torch.Generator().manual_seed(42)
    cu = _cu(T, N, gen, device)
    x = randn(1, T, D, dtype=dtype, device=device, gen=gen).requires_grad_()
    weight = randn(D, W, dtype=dtype, device=device, gen=gen).requires_grad_()
    bias = randn(D, dtype=dtype, device=device, gen=gen).requires_grad_() if has_bias else None
    residual = x.detach().clone().requires_grad_() if has_residual else None
    dy = randn(1, T, D, dtype=dtype, gen=gen)
    y, _ = causal_conv1d(x, weight, bias, residual=residual, activation=activation,
                         cu_seqlens=cu, backend=backend)
    refs = [_leaf(t) for t in (x, weight, bias, residual)]
    y_ref, _ = fla_ref(refs[0], refs[1], refs[2], refs[3], activation=activation,
                       cu_seqlens=cu.cpu())
    assert_close(y, y_ref, dtype, what="y")
    _grads_match([y], [x, weight, bias, residual], [y_ref], refs, [dy], dtype,
                 ("dx", "dw", "db", "dr"))


DECODING = [
    (2, 64, 128, 3, "swish", True, True, F32),
    (2, 128, 128, 4, "swish", False, True, F32),
    (2, 64, 128, 3, "swish", True, False, F32),
    (2, 128, 128, 4, "swish", False, False, F32),
    (2, 500, 1024, 3, None, True, True, F32),
    (2, 1024, 1024, 4, None, False, True, F32),
    (2, 64, 128, 3, None, True, False, F16),
    (2, 128, 128, 4, None, False, False, F16),
]


@pytest.mark.parametrize("B,T,D,W,activation,has_bias,has_residual,dtype", DECODING)
@torch.no_grad()
def test_conv_decoding(B, T, D, W, activation, has_bias, has_residual, dtype, device):
    gen = torch.Generator().manual_seed(42)
    x = randn(B, T, D, dtype=dtype, device=device, gen=gen)
    # FLA zeroes the weights here (y = act(bias)); random ones make the check mean something
    weight = randn(D, W, dtype=dtype, device=device, gen=gen)
    bias = randn(D, dtype=dtype, device=device, gen=gen) if has_bias else None
    residual = x.clone() if has_residual else None
    y_ref, cache_ref = fla_ref(x.cpu(), weight.cpu(), None if bias is None else bias.cpu(),
                               None if residual is None else residual.cpu(),
                               activation=activation)
    y = torch.zeros_like(x)
    cache = x.new_zeros(B, D, W)
    for i in range(T):
        yi, cache = causal_conv1d_update(x=x[:, i:i + 1], cache=cache,
                                         residual=residual[:, i:i + 1] if has_residual else None,
                                         weight=weight, bias=bias, activation=activation)
        y[:, i:i + 1] = yi
    assert_close(y, y_ref, dtype, what="y")
    assert torch.equal(cache.cpu().double(), cache_ref)


PREFILL = [
    (2, 64, 128, 3, "swish", True, True, F32, "triton"),
    (2, 128, 128, 4, "swish", False, True, F32, "triton"),
    (2, 64, 128, 3, "swish", True, False, F32, "triton"),
    (2, 128, 128, 4, "swish", False, False, F32, "triton"),
    (2, 500, 1024, 3, None, True, True, F32, "triton"),
    (2, 1024, 1024, 4, None, False, True, F32, "triton"),
    (2, 64, 128, 3, None, True, False, F16, "triton"),
    (2, 128, 128, 4, None, False, False, F16, "triton"),
    (2, 64, 128, 3, "swish", True, True, F32, "cuda"),
    (2, 128, 128, 4, "swish", False, True, F32, "cuda"),
    (2, 64, 128, 3, "swish", True, False, F32, "cuda"),
    (2, 128, 128, 4, "swish", False, False, F32, "cuda"),
    (2, 2, 128, 4, "swish", True, True, F32, "cuda"),
    (2, 2, 128, 4, "swish", True, True, F32, "triton"),
    (2, 3, 128, 4, "swish", True, True, F32, "triton"),
    (2, 4, 128, 4, "swish", True, True, F32, "triton"),
    (2, 2, 128, 3, "swish", True, True, F32, "triton"),
]


@pytest.mark.parametrize("B,T,D,W,activation,has_bias,has_residual,dtype,backend", PREFILL)
@torch.no_grad()
def test_conv_with_cache_prefill_fwd(B, T, D, W, activation, has_bias, has_residual, dtype,
                                     backend, device):
    gen = torch.Generator().manual_seed(42)
    x = randn(B, T, D, dtype=dtype, device=device, gen=gen)
    residual = randn(B, T, D, dtype=dtype, device=device, gen=gen) if has_residual else None
    conv = _conv(D, W, has_bias, activation, backend, device, dtype)
    cache = torch.cat([torch.zeros(B, D, 1), randn(B, D, W - 1, gen=gen)], -1).to(device, dtype)
    y_ref, final_ref = fla_ref(x.cpu(), conv.weight[:, 0].cpu(),
                               None if conv.bias is None else conv.bias.cpu(),
                               None if residual is None else residual.cpu(),
                               initial_state=cache.cpu(), activation=activation)
    y, cache_out = conv(x, residual=residual, cache=cache.clone(), output_final_state=True)
    assert_close(y, y_ref, dtype, what="y")
    assert torch.equal(cache_out.cpu().double(), final_ref)


VARLEN_PREFILL = [
    (3, 128, 64, 4, "swish", True, True, F32, "triton"),
    (4, 256, 128, 3, None, False, True, F32, "triton"),
    (2, 64, 128, 4, "swish", True, False, F16, "cuda"),
    (3, 200, 64, 3, None, False, False, F16, "cuda"),
    (2, 3, 64, 4, "swish", True, True, F32, "triton"),
    (2, 3, 64, 3, None, False, True, F32, "cuda"),
]


@pytest.mark.parametrize("N,T,D,W,activation,has_bias,has_residual,dtype,backend", VARLEN_PREFILL)
@torch.no_grad()
def test_conv_varlen_with_cache_prefill_fwd(N, T, D, W, activation, has_bias, has_residual,
                                            dtype, backend, device):
    gen = torch.Generator().manual_seed(42)
    lengths = [max(1, T // N)] * N
    lengths[-1] += T % N
    T = sum(lengths)
    cu = lengths_to_cu(lengths, device=device)
    x = randn(1, T, D, dtype=dtype, device=device, gen=gen)
    residual = randn(1, T, D, dtype=dtype, device=device, gen=gen) if has_residual else None
    conv = _conv(D, W, has_bias, activation, backend, device, dtype)
    cache = torch.cat([torch.zeros(N, D, 1), randn(N, D, W - 1, gen=gen)], -1).to(device, dtype)
    y_ref, final_ref = fla_ref(x.cpu(), conv.weight[:, 0].cpu(),
                               None if conv.bias is None else conv.bias.cpu(),
                               None if residual is None else residual.cpu(),
                               initial_state=cache.cpu(), activation=activation,
                               cu_seqlens=cu.cpu())
    y, cache_out = conv(x, residual=residual, cache=cache.clone(), cu_seqlens=cu,
                        output_final_state=True)
    assert_close(y, y_ref, dtype, what="y")
    assert torch.equal(cache_out.cpu().double(), final_ref)


DECODING_WITH_CACHE = [
    (2, 128, 3, True, True, "swish", F32, "triton"),
    (2, 128, 4, False, True, "swish", F32, "triton"),
    (2, 128, 3, True, False, "swish", F32, "triton"),
    (2, 128, 4, False, False, "swish", F32, "triton"),
    (2, 128, 3, True, True, "swish", F32, "cuda"),
    (2, 128, 4, False, True, "swish", F32, "cuda"),
    (2, 128, 3, True, False, "swish", F32, "cuda"),
    (2, 128, 4, False, False, "swish", F32, "cuda"),
    (2, 128, 4, False, False, None, F32, "cuda"),
    (2, 128, 4, False, False, None, F32, "triton"),
]


@pytest.mark.parametrize("B,D,W,has_bias,has_residual,activation,dtype,backend",
                         DECODING_WITH_CACHE)
@torch.no_grad()
def test_conv_decoding_with_cache(B, D, W, has_bias, has_residual, activation, dtype, backend,
                                  device):
    gen = torch.Generator().manual_seed(42)
    x = randn(B, 1, D, dtype=dtype, device=device, gen=gen)
    residual = x.clone() if has_residual else None
    conv = _conv(D, W, has_bias, activation, backend, device, dtype)
    state = randn(B, D, W, dtype=dtype, device=device, gen=gen)
    state_ref = state.cpu().clone()
    y_ref = dao_update_ref(x.cpu()[:, 0], state_ref, conv.weight[:, 0].cpu(),
                           None if conv.bias is None else conv.bias.cpu(), activation)[:, None]
    if has_residual:
        y_ref = y_ref + residual.cpu().double()
    cache = state.clone()
    y, returned = conv.step(x, residual, cache)
    assert returned is None  # FLA's step returns the cache only when output_final_state
    assert_close(y, y_ref, dtype, what="y")
    assert torch.equal(cache.cpu(), state_ref)  # updated in place


VARLEN_DECODING = [
    (4, 128, 3, "swish", True, True, F32),
    (4, 128, 4, "swish", False, True, F32),
    (4, 128, 3, "swish", True, False, F32),
    (2, 128, 3, None, True, True, F16),
]


@pytest.mark.parametrize("N,D,W,activation,has_bias,has_residual,dtype", VARLEN_DECODING)
@torch.no_grad()
def test_conv_varlen_decoding(N, D, W, activation, has_bias, has_residual, dtype, device):
    """Per-sequence decode loops (FLA's test compares the loop with itself; here with the
    whole-sequence reference)."""
    gen = torch.Generator().manual_seed(42)
    T = 64
    lengths = [max(1, T // N)] * N
    lengths[-1] += T % N
    weight = randn(D, W, dtype=dtype, device=device, gen=gen)
    bias = randn(D, dtype=dtype, device=device, gen=gen) if has_bias else None
    for n in range(N):
        xs = randn(1, lengths[n], D, dtype=dtype, device=device, gen=gen)
        res = xs.clone() if has_residual else None
        y_ref, cache_ref = fla_ref(xs.cpu(), weight.cpu(), None if bias is None else bias.cpu(),
                                   None if res is None else res.cpu(), activation=activation)
        cache = xs.new_zeros(1, D, W)
        ys = []
        for t in range(lengths[n]):
            yt, cache = causal_conv1d_update(x=xs[:, t:t + 1], cache=cache,
                                             residual=res[:, t:t + 1] if has_residual else None,
                                             weight=weight, bias=bias, activation=activation)
            ys.append(yt)
        assert_close(torch.cat(ys, 1), y_ref, dtype, what="y[%d]" % n)
        assert torch.equal(cache.cpu().double(), cache_ref)


NON_CONTIGUOUS_X = [
    (2, 64, 128, 3, "swish", True, True, F32),
    (2, 128, 128, 4, "swish", False, True, F32),
    (2, 64, 128, 3, "swish", True, False, F32),
    (2, 128, 128, 4, None, False, False, F16),
]


@pytest.mark.parametrize("B,T,D,W,activation,has_bias,has_residual,dtype", NON_CONTIGUOUS_X)
@torch.no_grad()
def test_conv_decoding_non_contiguous_x(B, T, D, W, activation, has_bias, has_residual, dtype,
                                        device):
    gen = torch.Generator().manual_seed(42)
    x = randn(B, 2 * T, D, dtype=dtype, device=device, gen=gen)[:, ::2]
    assert not x.is_contiguous()
    residual = x if has_residual else None
    weight = randn(D, W, dtype=dtype, device=device, gen=gen)
    bias = randn(D, dtype=dtype, device=device, gen=gen) if has_bias else None
    # FLA's start: a cache already holding the last tokens of x
    cache0 = x.new_zeros(B, D, W)
    cache0[:, :, -min(W, T):] = x[:, -min(W, T):].transpose(1, 2)
    y_ref, final_ref = fla_ref(x.cpu(), weight.cpu(), None if bias is None else bias.cpu(),
                               None if residual is None else residual.cpu(),
                               initial_state=cache0.cpu(), activation=activation)
    cache = cache0.clone()
    ys = []
    for i in range(T):
        yi, cache = causal_conv1d_update(x=x[:, i:i + 1], cache=cache,
                                         residual=residual[:, i:i + 1] if has_residual else None,
                                         weight=weight, bias=bias, activation=activation)
        ys.append(yi)
    assert_close(torch.cat(ys, 1), y_ref, dtype, what="y")
    assert torch.equal(cache.cpu().double(), final_ref)


FAST_VARLEN = [
    (4, 1024, 4096, 3, "swish", True, False, F32),
    (4, 1024, 4096, 4, "swish", False, False, F32),
    (4, 1024, 4096, 3, None, True, False, F16),
    (4, 1024, 4096, 4, None, False, False, F16),
]


@pytest.mark.parametrize("N,T,D,W,activation,has_bias,has_residual,dtype", FAST_VARLEN)
def test_fast_conv_varlen(N, T, D, W, activation, has_bias, has_residual, dtype, device):
    """FLA's fast_causal_conv1d_fn is its backend='mix' (with cu_seqlens_cpu)."""
    gen = torch.Generator().manual_seed(42)
    cu = _cu(T, N, gen, device)
    x = randn(1, T, D, dtype=dtype, device=device, gen=gen).requires_grad_()
    weight = randn(D, W, dtype=dtype, device=device, gen=gen).requires_grad_()
    bias = randn(D, dtype=dtype, device=device, gen=gen).requires_grad_() if has_bias else None
    dy = randn(1, T, D, dtype=dtype, gen=gen)
    y, _ = causal_conv1d(x, weight, bias, activation=activation, cu_seqlens=cu,
                         cu_seqlens_cpu=cu.cpu(), backend="mix")
    refs = [_leaf(t) for t in (x, weight, bias)]
    y_ref, _ = fla_ref(*refs, activation=activation, cu_seqlens=cu.cpu())
    assert_close(y, y_ref, dtype, what="y")
    _grads_match([y], [x, weight, bias], [y_ref], refs, [dy], dtype, ("dx", "dw", "db"))


CACHE_BACKWARD = [
    (2, 64, 100, 3, True, True, "swish", F32),
    (2, 128, 128, 4, True, True, "swish", F32),
    (3, 128, 128, 4, True, True, "swish", F32),
    (3, 128, 256, 4, True, True, "swish", F32),
    (3, 128, 512, 4, True, True, "swish", F32),
    (2, 128, 1024, 4, True, True, "swish", F32),
    (2, 128, 2048, 3, True, True, "swish", F32),
    (2, 128, 4096, 4, True, True, "swish", F32),
    (2, 128, 8192, 4, True, True, "swish", F32),
    (1, 1, 128, 4, True, True, "swish", F32),
    (2, 2, 128, 4, True, True, "swish", F32),
    (1, 1, 64, 3, True, True, "swish", F32),
]


@pytest.mark.parametrize("B,T,D,W,has_bias,has_residual,activation,dtype", CACHE_BACKWARD)
def test_conv_cache_backward(B, T, D, W, has_bias, has_residual, activation, dtype, device):
    gen = torch.Generator().manual_seed(42)
    x = randn(B, T, D, dtype=dtype, device=device, gen=gen).requires_grad_()
    weight = randn(D, W, dtype=dtype, device=device, gen=gen).requires_grad_()
    bias = randn(D, dtype=dtype, device=device, gen=gen).requires_grad_() if has_bias else None
    residual = (randn(B, T, D, dtype=dtype, device=device, gen=gen).requires_grad_()
                if has_residual else None)
    cache = randn(B, D, W - 1, dtype=dtype, device=device, gen=gen).requires_grad_()
    dy = randn(B, T, D, dtype=dtype, gen=gen)
    dcache = randn(B, D, W - 1, dtype=dtype, gen=gen)
    # FLA's [N, D, W] cache layout: a zero slot 0, then the W-1 live entries
    full = torch.cat([torch.zeros(B, D, 1, device=device, dtype=dtype), cache], -1)
    y, final = causal_conv1d(x, weight=weight, bias=bias, residual=residual, initial_state=full,
                             output_final_state=True, activation=activation)
    refs = [_leaf(t) for t in (x, weight, bias, residual, cache)]
    full_ref = torch.cat([torch.zeros(B, D, 1, dtype=torch.float64), refs[4]], -1)
    y_ref, final_ref = fla_ref(refs[0], refs[1], refs[2], refs[3], initial_state=full_ref,
                               activation=activation)
    assert_close(y, y_ref, dtype, what="y")
    _grads_match([y, final[..., 1:]], [x, weight, bias, residual, cache],
                 [y_ref, final_ref[..., 1:]], refs, [dy, dcache], dtype,
                 ("dx", "dw", "db", "dr", "dcache"))


@pytest.mark.parametrize("T,lengths,D", [(256, None, 128), (None, [32] * 128 + [8192], 4096),
                                         (None, [32] * 128 + [8192], 8192)],
                         ids=["random_split_T256", "packed_128x32_D4096", "packed_128x32_D8192"])
def test_conv_varlen_initial_state_backward_random(T, lengths, D, device):
    if lengths is not None and device != "cuda":
        pytest.skip("50M+ elements: runs on CUDA only (CPU time budget)")
    gen = torch.Generator().manual_seed(1234)
    W = 4
    if lengths is None:
        l1 = int(torch.randint(W, T - W, (1,), generator=gen))
        lengths = [l1, T - l1]
    cu = lengths_to_cu(lengths, device=device)
    T, N = sum(lengths), len(lengths)
    x = randn(1, T, D, device=device, gen=gen).requires_grad_()
    weight = randn(D, W, device=device, gen=gen).requires_grad_()
    bias = randn(D, device=device, gen=gen).requires_grad_()
    h0 = torch.cat([torch.zeros(N, D, 1), randn(N, D, W - 1, gen=gen)], -1).to(device)
    h0.requires_grad_()
    dy = randn(1, T, D, gen=gen)
    y, _ = causal_conv1d(x=x, weight=weight, bias=bias, activation="swish", cu_seqlens=cu,
                         initial_state=h0)
    refs = [_leaf(t) for t in (x, weight, bias, h0)]
    y_ref, _ = fla_ref(refs[0], refs[1], refs[2], initial_state=refs[3], activation="swish",
                       cu_seqlens=cu.cpu())
    _grads_match([y], [x, weight, bias, h0], [y_ref], refs, [dy], F32, ("dx", "dw", "db", "dh0"))


@pytest.mark.parametrize("B,T,D", [(1, 8192, 4096), (1, 8192, 8192)],
                         ids=["B1_T8192_D4096", "B1_T8192_D8192"])
def test_conv_dense_initial_state_backward_large_nt(B, T, D, device):
    if device != "cuda":
        pytest.skip("33M+ elements: runs on CUDA only (CPU time budget)")
    gen = torch.Generator().manual_seed(1234)
    W = 4
    x = randn(B, T, D, device=device, gen=gen).requires_grad_()
    weight = randn(D, W, device=device, gen=gen).requires_grad_()
    bias = randn(D, device=device, gen=gen).requires_grad_()
    h0 = torch.cat([torch.zeros(B, D, 1), randn(B, D, W - 1, gen=gen)], -1).to(device)
    h0.requires_grad_()
    dy = randn(B, T, D, gen=gen)
    y, _ = causal_conv1d(x=x, weight=weight, bias=bias, activation="swish", initial_state=h0)
    refs = [_leaf(t) for t in (x, weight, bias, h0)]
    y_ref, _ = fla_ref(refs[0], refs[1], refs[2], initial_state=refs[3], activation="swish")
    _grads_match([y], [x, weight, bias, h0], [y_ref], refs, [dy], F32, ("dx", "dw", "db", "dh0"))


NO_FINAL_STATE = [
    (2, 64, 100, 3, True, False, "swish", F32),
    (2, 128, 128, 4, True, False, "swish", F32),
    (3, 128, 128, 4, False, False, "swish", F32),
    (2, 64, 256, 4, True, True, "swish", F32),
    (2, 128, 512, 4, True, False, None, F32),
    (2, 64, 128, 3, True, False, "swish", F16),
]


@pytest.mark.parametrize("B,T,D,W,has_bias,has_residual,activation,dtype", NO_FINAL_STATE)
def test_conv_cache_backward_no_final_state(B, T, D, W, has_bias, has_residual, activation, dtype,
                                            device):
    gen = torch.Generator().manual_seed(42)
    x = randn(B, T, D, dtype=dtype, device=device, gen=gen).requires_grad_()
    weight = randn(D, W, dtype=dtype, device=device, gen=gen).requires_grad_()
    bias = randn(D, dtype=dtype, device=device, gen=gen).requires_grad_() if has_bias else None
    residual = (randn(B, T, D, dtype=dtype, device=device, gen=gen).requires_grad_()
                if has_residual else None)
    cache = randn(B, D, W - 1, dtype=dtype, device=device, gen=gen).requires_grad_()
    dy = randn(B, T, D, dtype=dtype, gen=gen)
    full = torch.cat([torch.zeros(B, D, 1, device=device, dtype=dtype), cache], -1)
    y, final = causal_conv1d(x, weight=weight, bias=bias, residual=residual, initial_state=full,
                             output_final_state=False, activation=activation)
    assert final is None
    refs = [_leaf(t) for t in (x, weight, bias, residual, cache)]
    full_ref = torch.cat([torch.zeros(B, D, 1, dtype=torch.float64), refs[4]], -1)
    y_ref, _ = fla_ref(refs[0], refs[1], refs[2], refs[3], initial_state=full_ref,
                       activation=activation)
    _grads_match([y], [x, weight, bias, residual, cache], [y_ref], refs, [dy], dtype,
                 ("dx", "dw", "db", "dr", "dcache"))


QKV = [(2, 64, 128, 3, "swish", True, F32), (2, 128, 128, 4, "swish", False, F32),
       (2, 64, 128, 3, None, True, F16)]
QKV_VARLEN = [(4, 128, 64, 3, "swish", True, F32), (4, 256, 128, 4, "swish", False, F32),
              (2, 64, 128, 3, None, True, F16)]


def _qkv_case(B, T, D, W, activation, has_bias, dtype, device, cu):
    gen = torch.Generator().manual_seed(42)
    qkv = randn(B, T, 3 * D, dtype=dtype, device=device, gen=gen)
    weight = randn(D, W, dtype=dtype, device=device, gen=gen).requires_grad_()
    bias = randn(D, dtype=dtype, device=device, gen=gen).requires_grad_() if has_bias else None
    N = B if cu is None else cu.shape[0] - 1
    for part in (qkv[:, :, :D], qkv[:, :, D:2 * D], qkv[:, :, 2 * D:]):
        assert not part.is_contiguous()
        x = part.detach().requires_grad_()
        residual = randn(B, T, D, dtype=dtype, device=device, gen=gen).requires_grad_()
        h0 = randn(N, D, W, dtype=dtype, device=device, gen=gen).requires_grad_()
        dy = randn(B, T, D, dtype=dtype, gen=gen)
        dht = randn(N, D, W, dtype=dtype, gen=gen)
        y, ht = causal_conv1d(x, weight, bias, residual=residual, initial_state=h0,
                              output_final_state=True, activation=activation, cu_seqlens=cu)
        refs = [_leaf(t) for t in (x, weight, bias, residual, h0)]
        y_ref, ht_ref = fla_ref(*refs, activation=activation,
                                cu_seqlens=None if cu is None else cu.cpu())
        assert_close(y, y_ref, dtype, what="y")
        assert torch.equal(ht.cpu().double(), ht_ref.detach())
        _grads_match([y, ht], [x, weight, bias, residual, h0], [y_ref, ht_ref], refs, [dy, dht],
                     dtype, ("dx", "dw", "db", "dr", "dh0"))


@pytest.mark.parametrize("B,T,D,W,activation,has_bias,dtype", QKV)
def test_conv_non_contiguous_qkv(B, T, D, W, activation, has_bias, dtype, device):
    _qkv_case(B, T, D, W, activation, has_bias, dtype, device, None)


@pytest.mark.parametrize("N,T,D,W,activation,has_bias,dtype", QKV_VARLEN)
def test_conv_varlen_non_contiguous_qkv(N, T, D, W, activation, has_bias, dtype, device):
    lengths = [max(1, T // N)] * N
    lengths[-1] += T % N
    _qkv_case(1, sum(lengths), D, W, activation, has_bias, dtype, device,
              lengths_to_cu(lengths, device=device))


@pytest.mark.parametrize("B,T,D,W,activation,dtype", [
    (2, 64, 128, 4, None, F32), (2, 128, 128, 3, "silu", F32), (1, 15, 64, 2, None, BF16),
    (4, 300, 32, 4, "silu", BF16)])
def test_conv_non_contiguous_dy(B, T, D, W, activation, dtype, device):
    gen = torch.Generator().manual_seed(42)
    weight = randn(D, W, dtype=dtype, device=device, gen=gen).requires_grad_()
    h0 = randn(B, D, W, dtype=dtype, device=device, gen=gen).requires_grad_()
    x = randn(B, T, D, dtype=dtype, device=device, gen=gen).requires_grad_()
    dy = randn(B, T, D, dtype=dtype, device=device, gen=gen)
    dy_nc = torch.cat([dy, torch.zeros_like(dy), torch.zeros_like(dy)], -1)[:, :, :D]
    assert not dy_nc.is_contiguous()
    refs = [_leaf(t) for t in (x, weight, h0)]
    y_ref, _ = fla_ref(refs[0], refs[1], initial_state=refs[2], activation=activation)
    y, _ = causal_conv1d(x, weight, initial_state=h0, activation=activation)
    _grads_match([y], [x, weight, h0], [y_ref], refs, [dy_nc.cpu()], dtype, ("dx", "dw", "dh0"))
    # an expanded gradient (y.sum()) has stride 0 everywhere; it equals ones
    y2, _ = causal_conv1d(x, weight, initial_state=h0, activation=activation)
    g_sum = torch.autograd.grad(y2.sum(), (x, weight, h0))
    y3, _ = causal_conv1d(x, weight, initial_state=h0, activation=activation)
    g_ones = torch.autograd.grad(y3, (x, weight, h0), torch.ones_like(y3))
    for a, b in zip(g_sum, g_ones):
        assert torch.equal(a, b)


def test_conv_varlen_decode_detection_with_zero_len_seq(device):
    gen = torch.Generator().manual_seed(42)
    D, W = 16, 4
    cu = torch.tensor([0, 0, 2], device=device, dtype=torch.int32)  # lengths 0 and 2: N == B*T
    x = randn(1, 2, D, device=device, gen=gen)
    conv = ShortConvolution(hidden_size=D, kernel_size=W, bias=False, activation="silu",
                            device=device)
    cache = torch.cat([torch.zeros(2, D, 1), randn(2, D, W - 1, gen=gen)], -1).to(device)
    y_ref, final_ref = fla_ref(x.cpu(), conv.weight[:, 0].detach().cpu(), initial_state=cache.cpu(),
                               activation="silu", cu_seqlens=cu.cpu())
    y, cache_out = conv(x, cache=cache.clone(), cu_seqlens=cu, output_final_state=True)
    assert_close(y, y_ref, F32, what="y")
    assert torch.equal(cache_out.detach().cpu().double(), final_ref)


def test_conv_backend_override(monkeypatch):
    monkeypatch.setenv("FLA_CONV_BACKEND", "bogus")
    with pytest.raises(ValueError, match="Invalid backend"):
        ShortConvolution(hidden_size=8, kernel_size=3)
    monkeypatch.setenv("FLA_CONV_BACKEND", "cuda")
    monkeypatch.setattr(sc_modules, "_causal_conv1d_cuda_installed", lambda: False)
    with pytest.warns(UserWarning, match="Switching to the Triton implementation"):
        conv = ShortConvolution(hidden_size=8, kernel_size=3, backend="triton")
    assert conv.backend == "triton"


# ---- FLA parity beyond its tests: backends, keywords, the in-place decode under autograd ----
def test_backend_values(monkeypatch):
    monkeypatch.delenv("FLA_CONV_BACKEND", raising=False)
    with pytest.raises(ValueError, match=r"Invalid backend: bogus, must be one of \['cuda', 'triton'\]"):
        ShortConvolution(8, 3, backend="bogus")
    with pytest.raises(ValueError, match="Invalid backend: None"):
        ShortConvolution(8, 3, backend=None)
    assert ShortConvolution(8, 3).backend == "triton"
    assert "backend=triton" in repr(ShortConvolution(8, 3))
    monkeypatch.setattr(sc_modules, "_causal_conv1d_cuda_installed", lambda: True)
    assert ShortConvolution(8, 3, backend="cuda").backend == "cuda"


def test_functional_backend_values():
    x, w = torch.randn(1, 5, 8), torch.randn(8, 3)
    y, _ = causal_conv1d(x, w)
    for backend in ("triton", "cuda", "mix"):
        assert torch.equal(causal_conv1d(x, w, backend=backend)[0], y)
    try:
        causal_conv1d(x, w, backend="bogus")
    except ValueError as e:
        assert "Unsupported backend: bogus" in str(e)
    else:
        pytest.skip("shortconv.causal_conv1d accepts any backend value: FLA's check "
                    "(ValueError 'Unsupported backend: bogus') is not in this shortconv yet")


def test_constructor_and_forward_keywords():
    with pytest.raises(TypeError, match="bogus"):
        ShortConvolution(8, 3, bogus=1)
    with pytest.warns(UserWarning, match="use_fast_conv1d"):
        ShortConvolution(8, 3, use_fast_conv1d=True)
    conv = ShortConvolution(8, 3)
    x = torch.randn(2, 5, 8)
    with pytest.raises(TypeError, match="bogus"):
        conv(x, bogus=1)
    with torch.no_grad():
        with pytest.raises(TypeError, match="bogus"):  # not dropped by the decode shortcut
            conv(x[:, :1], cache=torch.zeros(2, 8, 3), bogus=1)
    # seq_idx reaches shortconv.causal_conv1d, which implements or refuses it; never ignored
    seq_idx = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.int32)
    try:
        y, _ = conv(x, seq_idx=seq_idx)
    except NotImplementedError as e:
        assert "seq_idx" in str(e)
    else:
        y0, _ = conv(x[0:1, :2])
        y1, _ = conv(x[0:1, 2:])
        assert_close(y[0], torch.cat([y0, y1], 1)[0], F32)


@pytest.mark.parametrize("output_final_state", [False, True])
def test_decode_updates_cache_in_place_under_autograd(output_final_state):
    gen = torch.Generator().manual_seed(9)
    D, W, B = 8, 4, 3
    conv = ShortConvolution(D, W, bias=True, activation="silu", dtype=torch.float64)
    x = randn(B, 1, D, dtype=torch.float64, gen=gen).requires_grad_()
    cache0 = randn(B, D, W, dtype=torch.float64, gen=gen)
    cache = cache0.clone()
    y, returned = conv(x, cache=cache, output_final_state=output_final_state)
    assert (returned is cache) if output_final_state else returned is None
    y_ref, final_ref = conv(x, cache=cache0.clone().requires_grad_(), output_final_state=True)
    assert torch.equal(y, y_ref)
    assert torch.equal(cache, final_ref)  # written in place although autograd records
    # gradients flow through the new cache to x and the weights, as through the fresh state
    loss = (y * y).sum() + (cache * cache).sum()
    loss_ref = (y_ref * y_ref).sum() + (final_ref * final_ref).sum()
    params = [x, conv.weight, conv.bias]
    for a, b in zip(torch.autograd.grad(loss, params), torch.autograd.grad(loss_ref, params)):
        assert torch.equal(a, b)


def test_decode_steps_under_autograd_equal_one_call():
    gen = torch.Generator().manual_seed(10)
    D, W, B, T = 6, 3, 2, 5
    conv = ShortConvolution(D, W, activation="silu", dtype=torch.float64)
    x = randn(B, T, D, dtype=torch.float64, gen=gen).requires_grad_()
    y_all, final = conv(x, output_final_state=True)
    cache = torch.zeros(B, D, W, dtype=torch.float64)
    ys = [conv(x[:, t:t + 1], cache=cache)[0] for t in range(T)]
    assert_close(torch.cat(ys, 1), y_all, torch.float64)
    assert_close(cache, final, torch.float64)
    g = torch.autograd.grad(torch.cat(ys, 1).sum() + cache.sum(), (x, conv.weight))
    g_ref = torch.autograd.grad(y_all.sum() + final.sum(), (x, conv.weight))
    for a, b in zip(g, g_ref):
        assert_close(a, b, torch.float64)


def test_positional_causal_conv1d_order_points_to_dao():
    """causal_conv1d_update(x, conv_state, weight, bias, "silu") is causal-conv1d's order (Mamba-2's
    decode step); the top-level function has FLA's (x, cache, residual, weight, bias, ...)."""
    x, state, w, b = torch.randn(2, 8), torch.randn(2, 8, 4), torch.randn(8, 4), torch.randn(8)
    before = state.clone()
    for args in ((x, state, w, b, "silu"), (x, state, w, None, "silu")):
        with pytest.raises((TypeError, ValueError)) as err:
            causal_conv1d_update(*args)
        if "shortconv.dao" not in str(err.value):
            pytest.skip("the top-level causal_conv1d_update does not point to shortconv.dao for "
                        "causal-conv1d's positional order yet (got: %s)" % err.value)
        assert isinstance(err.value, TypeError)
        assert err.value.args[0].startswith("shortconv.causal_conv1d_update: bias: ")
        assert "got str 'silu'" in str(err.value)
        assert "shortconv.dao.causal_conv1d_update" in str(err.value)
        assert torch.equal(state, before)  # nothing written
