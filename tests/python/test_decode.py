"""Decode entry point: steps equal the whole-sequence forward; pools; FLA's shapes."""
import pytest
import torch

import shortconv
from shortconv.reference import causal_conv1d_ref

from helpers import assert_close, lengths_to_cu, make_problem


@pytest.mark.parametrize("S_extra", [-1, 0, 2])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_steps_equal_whole_sequence(S_extra, dtype):
    W, T = 4, 6
    p = make_problem(B=3, T=T, D=5, W=W, S=W + S_extra, dtype=dtype, residual=True, seed=40)
    x, w, b, res, h0 = p["x"], p["weight"], p["bias"], p["residual"], p["initial_state"]
    y, ht = shortconv.causal_conv1d(x, w, b, res, h0, True, "silu")
    cache = h0.clone()
    ptr = cache.data_ptr()
    ys = []
    for t in range(T):
        yt, c = shortconv.causal_conv1d_update(x[:, t], cache, res[:, t], w, b, "silu")
        assert c is cache and cache.data_ptr() == ptr  # updated in place
        assert yt.shape == (3, 5)
        ys.append(yt)
    assert_close(torch.stack(ys, 1), y, what="y")
    assert torch.equal(cache, ht)


def test_multi_token_and_packed_steps():
    W = 3
    p = make_problem(B=2, T=7, D=4, W=W, S=W - 1, seed=41)
    x, w, b, h0 = p["x"], p["weight"], p["bias"], p["initial_state"]
    y, ht = shortconv.causal_conv1d(x, w, b, initial_state=h0, output_final_state=True)
    cache = h0.clone()
    y1, _ = shortconv.causal_conv1d_update(x[:, :3], cache, weight=w, bias=b)  # [N, T, D]
    y2, _ = shortconv.causal_conv1d_update(x[:, 3:], cache, weight=w, bias=b)
    assert_close(torch.cat([y1, y2], 1), y)
    assert torch.equal(cache, ht)
    # packed: sequence 0 gets 2 tokens, sequence 1 gets 0, then the rest
    cache = h0.clone()
    xp = torch.cat([x[0, :2], x[1, :0]], 0).unsqueeze(0)
    yp, _ = shortconv.causal_conv1d_update(xp, cache, weight=w, bias=b,
                                           cu_seqlens=lengths_to_cu([2, 0]))
    assert_close(yp[0], y[0, :2])
    assert torch.equal(cache[1], h0[1])
    xq = torch.cat([x[0, 2:], x[1]], 0).unsqueeze(0)
    yq, _ = shortconv.causal_conv1d_update(xq, cache, weight=w, bias=b,
                                           cu_seqlens=lengths_to_cu([5, 7]))
    assert_close(yq[0, :5], y[0, 2:])
    assert_close(yq[0, 5:], y[1])
    assert torch.equal(cache, ht)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_pool_with_padding(index_dtype):
    W, S, D, P = 4, 4, 3, 5
    g = torch.Generator().manual_seed(42)
    pool = torch.randn(P, D, S, generator=g, dtype=torch.float64)
    w = torch.randn(D, W, generator=g, dtype=torch.float64)
    x = torch.randn(4, D, generator=g, dtype=torch.float64)
    idx = torch.tensor([3, -1, 0, 2], dtype=index_dtype)  # -1: padding slot
    before = pool.clone()
    y, out = shortconv.causal_conv1d_update(x, pool, weight=w, activation="silu",
                                            cache_indices=idx)
    assert out is pool
    for n, r in enumerate(idx.tolist()):
        h0 = before[r:r + 1] if r >= 0 else torch.zeros(1, D, S, dtype=torch.float64)
        yr, htr = causal_conv1d_ref(x[n].view(1, 1, D), w, initial_state=h0,
                                    output_final_state=True, activation="silu")
        assert_close(y[n], yr.view(D), what="y[%d]" % n)
        if r >= 0:
            assert torch.equal(pool[r], htr[0])
    for r in (1, 4):  # rows no sequence names are untouched
        assert torch.equal(pool[r], before[r])


def test_fla_shapes():
    D, W, N = 4, 4, 3
    g = torch.Generator().manual_seed(43)
    w = torch.randn(D, W, generator=g, dtype=torch.float64)
    cache0 = torch.randn(N, D, W, generator=g, dtype=torch.float64)
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    ya, ca = shortconv.causal_conv1d_update(x, cache0.clone(), weight=w)  # [N, D]
    yb, cb = shortconv.causal_conv1d_update(x.unsqueeze(1), cache0.clone(), weight=w)  # [N, 1, D]
    yc, cc = shortconv.causal_conv1d_update(x.unsqueeze(0), cache0.clone(), weight=w)  # [1, N, D]
    assert ya.shape == (N, D) and yb.shape == (N, 1, D) and yc.shape == (1, N, D)
    assert torch.equal(ya, yb.view(N, D)) and torch.equal(ya, yc.view(N, D))
    assert torch.equal(ca, cb) and torch.equal(ca, cc)
    # FLA's cache convention: roll left, current token in the last slot
    assert torch.equal(ca[:, :, :-1], cache0[:, :, 1:])
    assert torch.equal(ca[:, :, -1], x)
    # [N, H, Dh] heads
    yh, _ = shortconv.causal_conv1d_update(x.view(N, 2, 2), cache0.clone(), weight=w)
    assert torch.equal(yh.view(N, D), ya)


def test_update_is_not_recorded_by_autograd():
    p = make_problem(B=2, T=1, D=3, W=3, seed=44, requires_grad=True)
    cache = p["initial_state"].detach().clone()
    y, _ = shortconv.causal_conv1d_update(p["x"], cache, weight=p["weight"])
    assert not y.requires_grad


@pytest.mark.skipif(not hasattr(getattr(torch.autograd, "graph", None), "increment_version"),
                    reason="torch.autograd.graph.increment_version needs torch >= 2.1")
def test_update_of_a_graph_tensor_invalidates_its_backward():
    p = make_problem(B=2, T=3, D=3, W=3, seed=45, requires_grad=True)
    y, state = shortconv.causal_conv1d(p["x"], p["weight"], initial_state=p["initial_state"],
                                       output_final_state=True)
    loss = (state * state).sum()  # saves state for its backward
    shortconv.causal_conv1d_update(torch.randn(2, 3, dtype=torch.float64), state,
                                   weight=p["weight"].detach())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("overlap", ["none", "launch", "reads"])
def test_overlap_changes_no_result(overlap):
    """overlap only decides how a CUDA kernel is launched: every value gives the results of
    the call without it (host backends ignore it; the CUDA runs are in test_cuda.py), through
    the core and the vLLM drop-in."""
    W, D, P = 4, 16, 9
    g = torch.Generator().manual_seed(3)
    pool = torch.randn(P, D, W - 1, generator=g)
    w, b = torch.randn(D, W, generator=g), torch.randn(D, generator=g)
    x = torch.randn(5, D, generator=g)
    idx = torch.tensor([3, -1, 0, 8, 5])
    p0, p1 = pool.clone(), pool.clone()
    y0, _ = shortconv.causal_conv1d_update(x, p0, weight=w, bias=b, activation="silu",
                                           cache_indices=idx)
    y1, _ = shortconv.causal_conv1d_update(x, p1, weight=w, bias=b, activation="silu",
                                           cache_indices=idx, overlap=overlap)
    assert torch.equal(y0, y1) and torch.equal(p0, p1)
    p2 = pool.clone()
    y2 = shortconv.vllm.causal_conv1d_update(x, p2, w, b, "silu", idx.int(), overlap=overlap)
    assert torch.equal(y2, y0) and torch.equal(p2, p0)
    p3 = pool.clone()  # (causal-conv1d's padded rows: output 0)
    y3 = shortconv.dao.causal_conv1d_update(x, p3, w, b, "silu", None, idx.int(), overlap=overlap)
    assert torch.equal(y3, y0.masked_fill((idx < 0).view(-1, 1), 0)) and torch.equal(p3, p0)


@pytest.mark.parametrize("bad", ["ahead", "", 1, True, 2.0])
def test_overlap_rejects_unknown_values(bad):
    D, W = 8, 4
    pool = torch.randn(3, D, W - 1)
    before = pool.clone()
    with pytest.raises(ValueError, match="causal_conv1d_update: overlap: expected None"):
        shortconv.causal_conv1d_update(torch.randn(2, D), pool, weight=torch.randn(D, W),
                                       cache_indices=torch.tensor([0, 2]), overlap=bad)
    with pytest.raises(ValueError, match="vllm.causal_conv1d_update: overlap"):
        shortconv.vllm.causal_conv1d_update(torch.randn(2, D), pool, torch.randn(D, W),
                                            overlap=bad)
    with pytest.raises(shortconv.dao.CausalConv1dError, match="dao.causal_conv1d_update: .*overlap"):
        shortconv.dao.causal_conv1d_update(torch.randn(2, D), pool, torch.randn(D, W),
                                           conv_state_indices=torch.tensor([0, 2], dtype=torch.int32),
                                           overlap=bad)
    assert torch.equal(pool, before)  # nothing written
