"""ShortConvolution against an nn.Conv1d-based reference; decode steps; FLA's cache."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import shortconv

from helpers import assert_close, lengths_to_cu


def conv1d_reference(conv, x, activation):
    """FLA's definition: depthwise nn.Conv1d with W-1 left padding, cut to T, then act."""
    T = x.shape[1]
    y = conv(x.transpose(1, 2))[..., :T].transpose(1, 2)
    return F.silu(y) if activation in ("silu", "swish") else y


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_matches_conv1d(bias, activation):
    torch.manual_seed(50)
    D, W = 6, 4
    m = shortconv.ShortConvolution(D, W, bias=bias, activation=activation, dtype=torch.float64)
    assert m.weight.shape == (D, 1, W)
    ref = nn.Conv1d(D, D, W, groups=D, padding=W - 1, bias=bias, dtype=torch.float64)
    ref.load_state_dict(m.state_dict())  # same parameters, nn.Conv1d's layout
    x = torch.randn(2, 9, D, dtype=torch.float64, requires_grad=True)
    y, cache = m(x)
    assert cache is None
    yr = conv1d_reference(ref, x, activation)
    assert_close(y, yr)
    dy = torch.randn_like(y)
    params = [x, m.weight] + ([m.bias] if bias else [])
    rparams = [x, ref.weight] + ([ref.bias] if bias else [])
    for a, b in zip(torch.autograd.grad(y, params, dy), torch.autograd.grad(yr, rparams, dy)):
        assert_close(a, b)


def test_loads_fla_and_conv1d_checkpoints():
    conv = nn.Conv1d(8, 8, 3, groups=8, padding=2, bias=True)
    m = shortconv.ShortConvolution(8, 3, bias=True)
    m.load_state_dict(conv.state_dict())
    assert torch.equal(m.weight, conv.weight) and torch.equal(m.bias, conv.bias)
    assert m.state_size == 8 * 3


def test_prefill_then_decode_steps():
    torch.manual_seed(51)
    D, W, T, B = 4, 4, 8, 2
    m = shortconv.ShortConvolution(D, W, bias=True, activation="silu", dtype=torch.float64)
    x = torch.randn(B, T, D, dtype=torch.float64)
    with torch.no_grad():
        y_full, _ = m(x)
        y_pre, cache = m(x[:, :5], output_final_state=True)  # prefill
        assert cache.shape == (B, D, W)  # FLA: [N, D, W]
        ptr = cache.data_ptr()
        ys = [y_pre]
        for t in range(5, T):
            yt, c = m(x[:, t:t + 1], cache=cache, output_final_state=True)  # decode path
            assert c.data_ptr() == ptr  # cache updated in place
            ys.append(yt)
    assert_close(torch.cat(ys, 1), y_full)


def test_decode_step_with_a_parametrized_weight():
    """A weight that is not a plain registered parameter (a parametrization) is read
    through the module's attribute on the decode step too: the step equals that of a
    module holding the transformed weight."""
    import torch.nn.utils.parametrize as parametrize

    class Doubled(nn.Module):
        def forward(self, w):
            return 2 * w

    torch.manual_seed(52)
    D, W, B = 4, 4, 3
    m = shortconv.ShortConvolution(D, W, bias=True, activation="silu", dtype=torch.float64)
    plain = shortconv.ShortConvolution(D, W, bias=True, activation="silu", dtype=torch.float64)
    with torch.no_grad():
        plain.weight.copy_(2 * m.weight)
        plain.bias.copy_(m.bias)
    parametrize.register_parametrization(m, "weight", Doubled())
    x = torch.randn(B, 1, D, dtype=torch.float64)
    cache = torch.randn(B, D, W, dtype=torch.float64)
    cache_plain = cache.clone()
    with torch.no_grad():
        y, c = m(x, cache=cache, output_final_state=True)
        yp, cp = plain(x, cache=cache_plain, output_final_state=True)
    assert torch.equal(y, yp) and torch.equal(c, cp)


def test_decode_without_cache_and_packed():
    torch.manual_seed(52)
    D, W = 3, 3
    m = shortconv.ShortConvolution(D, W, activation=None, dtype=torch.float64)
    x = torch.randn(3, 1, D, dtype=torch.float64)
    with torch.no_grad():
        y, cache = m(x, output_final_state=True)  # cache None: zeros [N, D, W], then updated
    conv = nn.Conv1d(D, D, W, groups=D, padding=W - 1, bias=False, dtype=torch.float64)
    conv.load_state_dict(m.state_dict())
    assert_close(y, conv1d_reference(conv, x, None).detach())
    assert torch.equal(cache[:, :, -1], x[:, 0])
    # packed single tokens (B=1, cu_seqlens of ones) go through the decode path too
    cache2 = torch.zeros(3, D, W, dtype=torch.float64)
    with torch.no_grad():
        yp, c2 = m(x.transpose(0, 1), cache=cache2, output_final_state=True,
                   cu_seqlens=lengths_to_cu([1, 1, 1]))
    assert torch.equal(yp.view(3, D), y.view(3, D))
    assert torch.equal(c2, cache)


def test_training_with_cache_returns_new_state():
    torch.manual_seed(53)
    D, W = 4, 3
    m = shortconv.ShortConvolution(D, W, dtype=torch.float64)
    cache = torch.randn(2, D, W, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 1, D, dtype=torch.float64, requires_grad=True)
    y, new = m(x, cache=cache, output_final_state=True)  # grad enabled: not the in-place path
    assert new is not cache and new.shape == cache.shape
    assert torch.autograd.gradcheck(
        lambda x_, c_: m(x_, cache=c_, output_final_state=True), [x, cache])


def test_mask():
    torch.manual_seed(54)
    m = shortconv.ShortConvolution(3, 2, activation=None, dtype=torch.float64)
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    x0 = x.clone()
    mask = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1]], dtype=torch.bool)
    y, _ = m(x, mask=mask)
    yr, _ = m(x * mask.unsqueeze(-1))
    assert torch.equal(y, yr)
    assert torch.equal(x, x0)  # the input is left untouched (FLA masks it in place)
