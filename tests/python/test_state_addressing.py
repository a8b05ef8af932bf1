"""State addressing of inference engines (docs/semantics.md section 5) through the
decode entry point: ring rows (causal-conv1d's cache_seqlens), has_initial_state
flags, a configurable pad slot id.  Each is checked against a plain-torch model
of its rule and against the same step expressed without it (paths agree)."""
import pytest
import torch

import shortconv

from helpers import TOL, assert_close, lengths_to_cu


def _pool(P, D, S, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(P, D, S, generator=g, dtype=torch.float64).to(dtype)


def _ref_ring_step(x, pool, rows, offsets, w, b, act):
    """Plain torch: for each sequence n, the logical state is its row rolled by
    -offset, one shift step per token, the new tokens written at (offset + i) % S."""
    N, T, D = x.shape
    S = pool.shape[-1]
    W = w.shape[1]
    y = torch.empty_like(x)
    out = pool.clone()
    for n in range(N):
        r, c = int(rows[n]), int(offsets[n]) % S
        state = torch.roll(pool[r], -c, dims=-1) if r >= 0 else torch.zeros(D, S, dtype=x.dtype)
        u = torch.cat([state, x[n].t()], dim=1)  # [D, S + T]
        for t in range(T):
            win = u[:, S - (W - 1) + t: S + t + 1]
            pre = (win * w).sum(1) + (b if b is not None else 0)
            y[n, t] = torch.nn.functional.silu(pre) if act == "silu" else pre
        if r >= 0:
            for i in range(T):
                out[r, :, (c + i) % S] = x[n, i]
            # (T >= S: later tokens overwrite earlier ones; the last S remain)
    return y, out


@pytest.mark.parametrize("T", [1, 2, 5])
@pytest.mark.parametrize("S_extra", [0, 3])
def test_ring_rows_follow_cache_seqlens(T, S_extra):
    W, D, P = 4, 6, 7
    S = W - 1 + S_extra
    pool = _pool(P, D, S, 1)
    g = torch.Generator().manual_seed(2)
    N = 4
    x = torch.randn(N, T, D, generator=g, dtype=torch.float64)
    w = torch.randn(D, W, generator=g, dtype=torch.float64)
    b = torch.randn(D, generator=g, dtype=torch.float64)
    rows = torch.tensor([5, -1, 0, 3], dtype=torch.int32)
    offsets = torch.tensor([0, 2, 7, 3 * S + 1], dtype=torch.int32)
    y_ref, pool_ref = _ref_ring_step(x, pool, rows, offsets, w, b, "silu")
    cache = pool.clone()
    y, _ = shortconv.causal_conv1d_update(x, cache, weight=w, bias=b, activation="silu",
                                          cache_indices=rows, cache_seqlens=offsets)
    assert_close(y, y_ref, what="y")
    assert_close(cache, pool_ref, what="pool")
    # paths agree: the ring step == rotate each row, a plain step, rotate back
    rot = pool.clone()
    for n in range(N):
        r = int(rows[n])
        if r >= 0:
            rot[r] = torch.roll(pool[r], -(int(offsets[n]) % S), dims=-1)
    y2, _ = shortconv.causal_conv1d_update(x, rot, weight=w, bias=b, activation="silu",
                                           cache_indices=rows)
    assert torch.equal(y, y2)
    for n in range(N):
        r = int(rows[n])
        if r >= 0:
            back = torch.roll(rot[r], (int(offsets[n]) + T) % S, dims=-1)
            assert torch.equal(cache[r], back), "row %d" % r
    untouched = [r for r in range(P) if r not in rows.tolist()]
    assert torch.equal(cache[untouched], pool[untouched])


def test_has_initial_state_flags():
    W, D, S, P = 3, 5, 2, 6
    pool = _pool(P, D, S, 3)
    g = torch.Generator().manual_seed(4)
    lengths = [3, 1, 4]
    x = torch.randn(1, sum(lengths), D, generator=g, dtype=torch.float64)
    w = torch.randn(D, W, generator=g, dtype=torch.float64)
    cu = lengths_to_cu(lengths)
    rows = torch.tensor([1, 4, 2], dtype=torch.int64)
    flags = torch.tensor([True, False, True])
    cache = pool.clone()
    y, _ = shortconv.causal_conv1d_update(x, cache, weight=w, activation="silu", cu_seqlens=cu,
                                          cache_indices=rows, has_initial_state=flags)
    # the same step with sequence 1 reading a zeroed row
    zeroed = pool.clone()
    zeroed[4] = 0
    y2, _ = shortconv.causal_conv1d_update(x, zeroed, weight=w, activation="silu",
                                           cu_seqlens=cu, cache_indices=rows)
    assert torch.equal(y, y2)
    assert torch.equal(cache, zeroed)  # row 4 written like any row
    for dt in (torch.int32, torch.int64):  # integer flags too
        c3 = pool.clone()
        y3, _ = shortconv.causal_conv1d_update(x, c3, weight=w, activation="silu", cu_seqlens=cu,
                                               cache_indices=rows, has_initial_state=flags.to(dt))
        assert torch.equal(y3, y) and torch.equal(c3, cache)


def test_pad_slot_id_is_padding():
    W, D, S, P = 4, 3, 3, 5
    pool = _pool(P, D, S, 5)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, D, generator=g, dtype=torch.float64)
    w = torch.randn(D, W, generator=g, dtype=torch.float64)
    pad = 99
    rows = torch.tensor([2, pad, 0], dtype=torch.int32)
    cache = pool.clone()
    y, _ = shortconv.causal_conv1d_update(x, cache, weight=w, cache_indices=rows, pad_slot_id=pad)
    c2 = pool.clone()
    y2, _ = shortconv.causal_conv1d_update(x, c2, weight=w,
                                           cache_indices=torch.tensor([2, -1, 0], dtype=torch.int32))
    assert torch.equal(y, y2) and torch.equal(cache, c2)
    # a pad id inside the pool is padding too: that row is neither read nor written
    rows_in = torch.tensor([2, 4, 0], dtype=torch.int32)
    c3 = pool.clone()
    y3, _ = shortconv.causal_conv1d_update(x, c3, weight=w, cache_indices=rows_in, pad_slot_id=4)
    assert torch.equal(y3, y2) and torch.equal(c3, c2)


def test_bad_state_addressing_is_refused_and_writes_nothing():
    W, D, S, P = 3, 4, 2, 4
    pool = _pool(P, D, S, 7)
    x = torch.randn(2, D, dtype=torch.float64)
    w = torch.randn(D, W, dtype=torch.float64)
    rows = torch.tensor([0, 1], dtype=torch.int32)
    cases = [
        (dict(cache_seqlens=torch.tensor([0, -1], dtype=torch.int32)), "ring_offsets|cache_seqlens"),
        (dict(cache_seqlens=torch.tensor([0, 1, 2], dtype=torch.int32)), "ring_offsets|cache_seqlens"),
        (dict(cache_seqlens=torch.tensor([0.0, 1.0])), "cache_seqlens"),
        (dict(has_initial_state=torch.tensor([True])), "has_initial_state"),
        (dict(has_initial_state=torch.tensor([1.0, 0.0])), "has_initial_state"),
        (dict(pad_slot_id=1.5), "pad_slot_id"),
    ]
    for kw, name in cases:
        cache = pool.clone()
        with pytest.raises((TypeError, ValueError), match=name):
            shortconv.causal_conv1d_update(x, cache, weight=w, cache_indices=rows, **kw)
        assert torch.equal(cache, pool), kw
