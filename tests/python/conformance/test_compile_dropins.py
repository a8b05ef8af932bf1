"""torch.compile(fullgraph=True) through every drop-in entry point: no graph break, results
(and in-place state writes) equal to eager.  torch >= 2.4 (the custom ops); skipped before."""
import pytest
import torch

import shortconv
from shortconv import dao, vllm

from references import randn, require_arg

pytestmark = pytest.mark.skipif(
    not shortconv.HAS_CUSTOM_OPS,
    reason="custom ops need torch >= 2.4 (this is torch %s: autograd.Function fallback)"
    % torch.__version__)


def _compile(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


def test_dao_fn_forward_backward(device):
    gen = torch.Generator().manual_seed(20)
    B, D, T, W = 2, 16, 7, 4

    def f(x, w, b, h0, fs):
        out, final = dao.causal_conv1d_fn(x, w, b, None, h0, True, fs, "silu")
        return (out * out).sum() + (final * final).sum()

    args = [randn(B, T, D, device=device, gen=gen).transpose(1, 2).requires_grad_(),
            randn(D, W, device=device, gen=gen).requires_grad_(),
            randn(D, device=device, gen=gen).requires_grad_(),
            randn(B, D, W - 1, device=device, gen=gen).requires_grad_()]
    fs_c, fs_e = torch.zeros(B, D, W - 1, device=device), torch.zeros(B, D, W - 1, device=device)
    lc = _compile(f)(*args, fs_c)
    le = f(*args, fs_e)
    assert torch.equal(lc, le) and torch.equal(fs_c, fs_e)
    for a, b in zip(torch.autograd.grad(lc, args), torch.autograd.grad(le, args)):
        assert torch.equal(a, b)


def test_dao_update_with_padding(device):
    gen = torch.Generator().manual_seed(21)
    B, D, W, P = 4, 16, 4, 7
    w, b = randn(D, W, device=device, gen=gen), randn(D, device=device, gen=gen)
    idx = torch.tensor([3, -1, 0, 5], dtype=torch.int32, device=device)

    def step(x, pool):
        return dao.causal_conv1d_update(x, pool, w, b, "silu", None, idx)

    cstep = _compile(step)
    pool_c = randn(P, D, W - 1, device=device, gen=gen)
    pool_e = pool_c.clone()
    for t in range(3):
        x = randn(B, D, 2, device=device, gen=gen)
        yc, ye = cstep(x, pool_c), step(x, pool_e)
        assert torch.equal(yc, ye) and not yc[1].any()
        assert torch.equal(pool_c, pool_e)


def test_dao_update_ring(device):
    require_arg(shortconv.causal_conv1d_update, "cache_seqlens")
    gen = torch.Generator().manual_seed(22)
    B, D, W, S = 3, 8, 4, 6
    w = randn(D, W, device=device, gen=gen)

    def step(x, state, c):
        return dao.causal_conv1d_update(x, state, w, None, "silu", c)

    cstep = _compile(step)
    state_c = randn(B, D, S, device=device, gen=gen)
    state_e = state_c.clone()
    c = torch.tensor([0, 5, 17], dtype=torch.int32, device=device)
    for t in range(3):
        x = randn(B, D, device=device, gen=gen)
        assert torch.equal(cstep(x, state_c, c), step(x, state_e, c))
        assert torch.equal(state_c, state_e)
        c = c + 1


def test_dao_varlen_states(device):
    gen = torch.Generator().manual_seed(23)
    x = randn(20, 8, device=device, gen=gen)
    cu = torch.tensor([0, 3, 3, 12, 20], device=device)
    f = lambda x, cu: dao.causal_conv1d_varlen_states(x, cu, 5)  # noqa: E731
    assert torch.equal(_compile(f)(x, cu), f(x, cu))


def test_vllm_update(device):
    gen = torch.Generator().manual_seed(24)
    B, D, W, P = 4, 16, 4, 9
    w, b = randn(D, W, device=device, gen=gen), randn(D, device=device, gen=gen)
    idx = torch.tensor([3, 77, 0, 5], dtype=torch.int32, device=device)  # 77: a pad slot id

    def step(x, pool):
        return vllm.causal_conv1d_update(x, pool, w, b, True, idx, pad_slot_id=77)

    cstep = _compile(step)
    pool_c = randn(P, D, W + 1, device=device, gen=gen)
    pool_e = pool_c.clone()
    for t in range(3):
        x = randn(B, D, device=device, gen=gen)
        yc, ye = cstep(x, pool_c), step(x, pool_e)
        keep = torch.tensor([True, False, True, True])
        assert torch.equal(yc[keep], ye[keep])
        assert torch.equal(pool_c, pool_e)


def test_vllm_fn(device):
    require_arg(shortconv.causal_conv1d_update, "has_initial_state")
    gen = torch.Generator().manual_seed(25)
    D, W, P = 16, 4, 6
    w = randn(D, W, device=device, gen=gen)
    qsl = torch.tensor([0, 4, 5, 11], dtype=torch.int32, device=device)
    idx = torch.tensor([2, -1, 4], dtype=torch.int32, device=device)
    has = torch.tensor([True, False, False], device=device)

    def prefill(x, pool):
        return vllm.causal_conv1d_fn(x, w, None, pool, qsl, idx, has, "silu")

    pool_c = randn(P, D, W - 1, device=device, gen=gen)
    pool_e = pool_c.clone()
    x = randn(11, D, device=device, gen=gen).t()
    yc, ye = _compile(prefill)(x, pool_c), prefill(x, pool_e)
    assert torch.equal(yc[:, :4], ye[:, :4]) and torch.equal(yc[:, 5:], ye[:, 5:])
    assert torch.equal(pool_c, pool_e)


def test_short_convolution_decode_under_autograd(device):
    gen = torch.Generator().manual_seed(26)
    conv = shortconv.ShortConvolution(8, 4, bias=True, device=device)
    x = randn(3, 1, 8, device=device, gen=gen).requires_grad_()

    def step(x, cache):
        y, _ = conv(x, cache=cache)
        return y

    cache_c = randn(3, 8, 4, device=device, gen=gen)
    cache_e = cache_c.clone()
    yc, ye = _compile(step)(x, cache_c), step(x, cache_e)
    assert torch.equal(yc, ye) and torch.equal(cache_c, cache_e)
    params = [x, conv.weight, conv.bias]
    lc = (yc * yc).sum() + (cache_c * cache_c).sum()
    le = (ye * ye).sum() + (cache_e * cache_e).sum()
    for a, b in zip(torch.autograd.grad(lc, params), torch.autograd.grad(le, params)):
        assert torch.equal(a, b)
