"""shortconv.dao against causal-conv1d's own test parametrisation (tests/test_causal_conv1d.py).

Each test keeps that suite's axes (widths, dtypes, lengths, dims, layouts, strides, batch
gather, padding, ring buffers, seq_idx, varlen states) and samples their product
deterministically (references.sample); x is a slice of a wider buffer as there (the slice
offset is 4096 channels on CUDA as there, 16 on the CPU to stay in budget).  The reference is
causal-conv1d's documented semantics in float64 (references.py); tolerances are the project's.
"""
import inspect

import pytest
import torch

import shortconv
from shortconv import dao

from helpers import TOL, assert_close, rel
from references import (dao_fn_ref, dao_seq_idx_ref, dao_update_ref, dao_varlen_states_ref, randn,
                        require_arg, require_seq_idx, sample)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SEQLENS = [1, 2, 8, 16, 32, 64, 128, 129, 130, 151, 256, 372, 512, 784, 1024, 1134, 2048, 4096]
UPDATE_DIMS = [2048, 2048 + 16, 4096]


def _pads(device):
    return (4096, 64) if device == "cuda" else (16, 8)


def _x(batch, dim, seqlen, channel_last, dtype, device, gen):
    """x [batch, dim, seqlen] as a slice of a wider buffer, channel-first or channel-last."""
    head, tail = _pads(device)
    if channel_last:
        buf = randn(batch, seqlen, head + dim + tail, dtype=dtype, device=device, gen=gen)
        return buf[:, :, head:head + dim].transpose(1, 2)
    buf = randn(batch, head + dim + tail, seqlen, dtype=dtype, device=device, gen=gen)
    return buf[:, head:head + dim, :]


def _pool_rows(batch, device):
    # The peer's pool of 10 * batch rows; on the CPU a smaller one (generating and comparing
    # 640 rows of 4096 channels dominated the run), still mostly rows no sequence names.
    return 10 * batch if device == "cuda" else 2 * batch
def _leaf(t):
    return None if t is None else t.detach().cpu().double().requires_grad_()


@pytest.mark.parametrize(
    "dim,seqlen,width,has_bias,silu,itype,channel_last,has_initial_states,return_final_states",
    sample(("dim", "seqlen", "width", "has_bias", "silu", "itype", "channel_last", "has_h0",
            "final"),
           ([64, 4096 + 32], SEQLENS, [2, 3, 4], [False, True], [False, True], DTYPES,
            [False, True], [False, True], [False, True]),
           n=64, seed=1, cost=lambda c: 2 * c["dim"] * c["seqlen"], max_cost=2 * 4128 * 130))
def test_causal_conv1d(dim, seqlen, width, has_bias, silu, itype, channel_last,
                       has_initial_states, return_final_states, device):
    # causal-conv1d runs states only with channel-last x; shortconv takes both layouts.
    gen = torch.Generator().manual_seed(0)
    batch = 2
    x = _x(batch, dim, seqlen, channel_last, itype, device, gen).requires_grad_()
    weight = randn(dim, width, device=device, gen=gen).requires_grad_()
    bias = randn(dim, device=device, gen=gen).requires_grad_() if has_bias else None
    h0 = None
    if has_initial_states:
        h0 = randn(batch, width - 1, dim, dtype=itype, device=device, gen=gen).transpose(1, 2)
        h0.requires_grad_()
    activation = "silu" if silu else None
    res = dao.causal_conv1d_fn(x, weight, bias, initial_states=h0,
                               return_final_states=return_final_states, activation=activation)
    out, final = res if return_final_states else (res, None)
    assert out.shape == x.shape and out.dtype == itype and out.device == x.device
    assert (out.stride(1) == 1) == (x.stride(1) == 1), "out is not in x's layout"

    refs = [_leaf(t) for t in (x, weight, bias, h0)]
    out_ref, final_ref = dao_fn_ref(refs[0], refs[1], refs[2], refs[3], activation)
    assert_close(out, out_ref, itype, what="out")
    g = randn(*out.shape, dtype=itype, gen=gen)
    loss_ref = (out_ref * g.double()).sum()
    loss = (out * g.to(device)).sum()
    if return_final_states:
        assert final.shape == (batch, dim, width - 1) and final.dtype == itype
        assert torch.equal(final.cpu().double(), final_ref)  # copies of x / h0 entries
        gf = randn(*final.shape, dtype=itype, gen=gen)
        loss_ref = loss_ref + (final_ref * gf.double()).sum()
        loss = loss + (final * gf.to(device)).sum()
    present = [i for i, t in enumerate((x, weight, bias, h0)) if t is not None]
    grads = torch.autograd.grad(loss, [(x, weight, bias, h0)[i] for i in present])
    grads_ref = torch.autograd.grad(loss_ref, [refs[i] for i in present])
    names = [("dx", "dweight", "dbias", "dinitial_states")[i] for i in present]
    for name, a, b in zip(names, grads, grads_ref):
        assert a.dtype == (itype if name in ("dx", "dinitial_states") else torch.float32)
        # dweight/dbias sum itype products: bounded by itype's rounding as the outputs are.
        assert_close(a, b, itype, what=name)


def _update_case(dim, width, seqlen, has_bias, silu, itype, device, gen, batch=64):
    x = randn(batch, seqlen, dim, dtype=itype, device=device, gen=gen).transpose(-1, -2)
    state_len = int(torch.randint(width - 1, width + 10, (1,), generator=gen))
    weight = randn(dim, width, device=device, gen=gen)
    bias = randn(dim, device=device, gen=gen) if has_bias else None
    return x, state_len, weight, bias, ("silu" if silu else None)


UPDATE_AXES = (("dim", "width", "seqlen", "ring", "has_bias", "silu", "itype"),
               (UPDATE_DIMS, [2, 3, 4], [1, 4, 5], [False, True], [False, True], [False, True],
                DTYPES))


@pytest.mark.parametrize("dim,width,seqlen,has_cache_seqlens,has_bias,silu,itype",
                         sample(*UPDATE_AXES, n=30, seed=2))
def test_causal_conv1d_update(dim, width, seqlen, has_cache_seqlens, has_bias, silu, itype,
                              device):
    if has_cache_seqlens:
        require_arg(shortconv.causal_conv1d_update, "cache_seqlens")
    gen = torch.Generator().manual_seed(0)
    batch = 64
    x, state_len, weight, bias, act = _update_case(dim, width, seqlen, has_bias, silu, itype,
                                                   device, gen, batch)
    conv_state = randn(batch, state_len, dim, dtype=itype, device=device, gen=gen).transpose(-1, -2)
    cache_seqlens = (torch.randint(0, 1024, (batch,), generator=gen, dtype=torch.int32)
                     if has_cache_seqlens else None)
    state_ref = conv_state.cpu().clone()
    out = dao.causal_conv1d_update(x, conv_state, weight, bias, act,
                                   None if cache_seqlens is None else cache_seqlens.to(device))
    out_ref = dao_update_ref(x.cpu(), state_ref, weight.cpu(), None if bias is None else bias.cpu(),
                             act, cache_seqlens)
    assert out.shape == x.shape and out.dtype == itype
    assert torch.equal(conv_state.cpu(), state_ref)
    assert_close(out, out_ref, itype, what="out")


@pytest.mark.parametrize("dim,width,seqlen,has_cache_seqlens,has_bias,silu,itype",
                         sample(*UPDATE_AXES, n=30, seed=3))
def test_causal_conv1d_update_with_batch_gather(dim, width, seqlen, has_cache_seqlens, has_bias,
                                                silu, itype, device):
    if has_cache_seqlens:
        require_arg(shortconv.causal_conv1d_update, "cache_seqlens")
    gen = torch.Generator().manual_seed(0)
    batch = 64
    x, state_len, weight, bias, act = _update_case(dim, width, seqlen, has_bias, silu, itype,
                                                   device, gen, batch)
    total = _pool_rows(batch, device)
    conv_state = randn(total, state_len, dim, dtype=itype, device=device, gen=gen).transpose(-1, -2)
    idx = torch.randperm(total, generator=gen)[:batch].to(torch.int32)
    cache_seqlens = (torch.randint(0, 1024, (batch,), generator=gen, dtype=torch.int32)
                     if has_cache_seqlens else None)
    before = conv_state.cpu().clone()
    rows_ref = before[idx.long()].clone()
    out = dao.causal_conv1d_update(x, conv_state, weight, bias, activation=act,
                                   cache_seqlens=None if cache_seqlens is None
                                   else cache_seqlens.to(device),
                                   conv_state_indices=idx.to(device))
    out_ref = dao_update_ref(x.cpu(), rows_ref, weight.cpu(), None if bias is None else bias.cpu(),
                             act, cache_seqlens)
    after = conv_state.cpu()
    assert torch.equal(after[idx.long()], rows_ref)
    untouched = torch.ones(total, dtype=torch.bool)
    untouched[idx.long()] = False
    assert torch.equal(after[untouched], before[untouched])
    assert_close(out, out_ref, itype, what="out")


@pytest.mark.parametrize("dim,width,seqlen,has_bias,silu,itype", sample(
    ("dim", "width", "seqlen", "has_bias", "silu", "itype"),
    (UPDATE_DIMS, [2, 3, 4], [1, 4, 5], [False, True], [False, True], DTYPES), n=24, seed=4))
def test_causal_conv1d_update_with_padding(dim, width, seqlen, has_bias, silu, itype, device):
    gen = torch.Generator().manual_seed(0)
    batch = 64
    x, state_len, weight, bias, act = _update_case(dim, width, seqlen, has_bias, silu, itype,
                                                   device, gen, batch)
    total = _pool_rows(batch, device)
    conv_state = randn(total, state_len, dim, dtype=itype, device=device, gen=gen).transpose(-1, -2)
    valid = torch.randperm(total, generator=gen)[:batch // 2]
    idx = torch.cat([valid, torch.full((batch - batch // 2,), -1, dtype=torch.long)])
    idx = idx[torch.randperm(batch, generator=gen)].to(torch.int32)
    mask = idx != -1
    expected = conv_state.cpu().clone()
    rows = expected[idx[mask].long()].clone()
    out_valid_ref = dao_update_ref(x.cpu()[mask], rows, weight.cpu(),
                                   None if bias is None else bias.cpu(), act)
    expected[idx[mask].long()] = rows
    out = dao.causal_conv1d_update(x, conv_state, weight, bias, activation=act,
                                   conv_state_indices=idx.to(device))
    assert torch.all(out.cpu()[~mask] == 0)  # causal-conv1d's padded rows: exactly 0
    assert_close(out.cpu()[mask], out_valid_ref, itype, what="out")
    assert torch.equal(conv_state.cpu(), expected)


@pytest.mark.parametrize("dim", UPDATE_DIMS)
@pytest.mark.parametrize("itype", DTYPES)
def test_causal_conv1d_get_states(dim, itype, device):
    gen = torch.Generator().manual_seed(0)
    seqlens = torch.randint(1, 32, (100,), generator=gen)
    x = randn(int(seqlens.sum()), dim, dtype=itype, device=device, gen=gen)
    cu = torch.nn.functional.pad(seqlens.cumsum(0), (1, 0))
    out = dao.causal_conv1d_varlen_states(x, cu.to(device), 20)
    assert out.shape == (100, dim, 20) and out.stride(1) == 1  # (batch, state_len, dim) storage
    assert torch.equal(out.cpu(), dao_varlen_states_ref(x.cpu(), cu, 20))


def _split(seqlen, gen, nmax):
    nsplits = int(torch.randint(1, nmax, (1,), generator=gen))
    eos = torch.randperm(seqlen - 1, generator=gen)[:nsplits].sort().values
    return torch.diff(torch.cat([torch.tensor([-1]), eos, torch.tensor([seqlen - 1])])).tolist()


@pytest.mark.parametrize("dim,seqlen,width,has_bias,silu,itype", sample(
    ("dim", "seqlen", "width", "has_bias", "silu", "itype"),
    ([64, 4096 + 32], [8, 16, 32, 63, 64, 65, 127, 128, 129, 151, 256, 257, 372, 512, 784, 1024,
                       1134, 2048, 4096], [2, 3, 4], [False, True], [False, True], DTYPES),
    n=24, seed=5, cost=lambda c: 3 * c["dim"] * c["seqlen"], max_cost=3 * 4128 * 130))
def test_causal_conv1d_varlen(dim, seqlen, width, has_bias, silu, itype, device):
    require_seq_idx()
    gen = torch.Generator().manual_seed(seqlen + dim + width)
    batch = 3
    seqlens = [_split(seqlen, gen, 5) for _ in range(batch)]
    x = _x(batch, dim, seqlen, True, itype, device, gen).requires_grad_()
    weight = randn(dim, width, device=device, gen=gen).requires_grad_()
    bias = randn(dim, device=device, gen=gen).requires_grad_() if has_bias else None
    seq_idx = torch.stack([torch.cat([torch.full((s,), i, dtype=torch.int32)
                                      for i, s in enumerate(sl)]) for sl in seqlens])
    act = "silu" if silu else None
    out = dao.causal_conv1d_fn(x, weight, bias, seq_idx=seq_idx.to(device), activation=act)
    refs = [_leaf(t) for t in (x, weight, bias)]
    out_ref = dao_seq_idx_ref(refs[0], refs[1], refs[2], seq_idx, act)
    assert_close(out, out_ref, itype, what="out")
    g = randn(*out.shape, dtype=itype, gen=gen)
    present = [i for i, t in enumerate((x, weight, bias)) if t is not None]
    grads = torch.autograd.grad((out * g.to(device)).sum(), [(x, weight, bias)[i] for i in present])
    grads_ref = torch.autograd.grad((out_ref * g.double()).sum(), [refs[i] for i in present])
    for name, a, b in zip([("dx", "dweight", "dbias")[i] for i in present], grads, grads_ref):
        assert_close(a, b, itype, what=name)


@pytest.mark.parametrize("dim,seqlen,width,has_bias,silu,itype", sample(
    ("dim", "seqlen", "width", "has_bias", "silu", "itype"),
    ([64, 4096 + 32], [128, 256, 512, 1024], [2, 3, 4], [False, True], [False, True], DTYPES),
    n=16, seed=6, cost=lambda c: 3 * c["dim"] * c["seqlen"], max_cost=3 * 4128 * 128))
def test_causal_conv1d_varlen_padding(dim, seqlen, width, has_bias, silu, itype, device):
    require_seq_idx()
    gen = torch.Generator().manual_seed(seqlen + dim + width)
    batch = 3
    true_lens = [int(torch.randint(seqlen // 2, seqlen + 1, (1,), generator=gen))
                 for _ in range(batch)]
    # every row keeps at least one padding token, as the peer's test asserts
    true_lens = [min(n, seqlen - 1) for n in true_lens]
    rows, counter = [], 0
    for b in range(batch):
        ids = []
        for s in _split(true_lens[b], gen, 4):
            ids += [counter] * s
            counter += 1
        rows.append(ids + [-1] * (seqlen - true_lens[b]))
    seq_idx = torch.tensor(rows, dtype=torch.int32)
    x = _x(batch, dim, seqlen, True, itype, device, gen)
    weight = randn(dim, width, device=device, gen=gen)
    bias = randn(dim, device=device, gen=gen) if has_bias else None
    act = "silu" if silu else None
    out = dao.causal_conv1d_fn(x, weight, bias, seq_idx=seq_idx.to(device), activation=act)
    out_ref = dao_seq_idx_ref(x.cpu(), weight.cpu(), None if bias is None else bias.cpu(),
                              seq_idx, act)
    assert_close(out, out_ref, itype, what="out")
    assert torch.all(out.cpu()[seq_idx.unsqueeze(1).expand_as(out) < 0] == 0)


@pytest.mark.parametrize("channel_last", [False, True])
def test_causal_conv1d_deterministic(channel_last, device):
    """causal-conv1d's race-condition / determinism tests: repeated fwd+bwd are bitwise equal."""
    gen = torch.Generator().manual_seed(123)
    dim, seqlen = (4096 + 32, 2048) if device == "cuda" else (256 + 32, 256)
    x = _x(2, dim, seqlen, channel_last, torch.bfloat16, device, gen).requires_grad_()
    weight = randn(dim, 4, device=device, gen=gen).requires_grad_()
    bias = randn(dim, device=device, gen=gen).requires_grad_()
    g = randn(2, dim, seqlen, dtype=torch.bfloat16, device=device, gen=gen)
    first = None
    for _ in range(3):
        out = dao.causal_conv1d_fn(x, weight, bias, activation="silu")
        run = (out,) + torch.autograd.grad(out, (x, weight, bias), g)
        if first is None:
            first = run
        for a, b in zip(run, first):
            assert torch.equal(a, b)


# ---- the API itself: signatures, return conventions, in-place outputs, errors ---------------
def _params(fn, keyword_only=False):
    """(name, default) of fn's parameters that causal-conv1d's function has, or with
    keyword_only those after a bare * (shortconv's own additions)."""
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()
            if (p.kind == inspect.Parameter.KEYWORD_ONLY) == keyword_only]


def test_signatures_are_causal_conv1d_s():
    e = inspect.Parameter.empty
    assert _params(dao.causal_conv1d_fn) == [
        ("x", e), ("weight", e), ("bias", None), ("seq_idx", None), ("initial_states", None),
        ("return_final_states", False), ("final_states_out", None), ("activation", None)]
    assert _params(dao.causal_conv1d_update) == [
        ("x", e), ("conv_state", e), ("weight", e), ("bias", None), ("activation", None),
        ("cache_seqlens", None), ("conv_state_indices", None)]
    # shortconv's one addition, keyword only so that no positional call of causal-conv1d's changes
    assert _params(dao.causal_conv1d_update, True) == [("overlap", None)]
    assert _params(dao.causal_conv1d_varlen_states) == [
        ("x", e), ("cu_seqlens", e), ("state_len", e)]


def test_positional_calls_and_final_states_out(device):
    gen = torch.Generator().manual_seed(7)
    B, D, T, W = 2, 16, 9, 4
    x = randn(B, T, D, device=device, gen=gen).transpose(1, 2).requires_grad_()
    w = randn(D, W, device=device, gen=gen).requires_grad_()
    b = randn(D, device=device, gen=gen)
    h0 = randn(B, D, W - 1, device=device, gen=gen).requires_grad_()
    fs = torch.zeros(B, W - 1, D, device=device).transpose(1, 2)  # causal-conv1d's layout
    out, final = dao.causal_conv1d_fn(x, w, b, None, h0, True, fs, "silu")
    assert final is fs  # written in place and returned
    refs = [_leaf(t) for t in (x, w, b, h0)]
    out_ref, final_ref = dao_fn_ref(*refs, activation="silu")
    assert_close(out, out_ref, torch.float32)
    assert torch.equal(fs.cpu().double(), final_ref)
    # gradients reach x and the initial states through the in-place final states
    gx, gh0 = torch.autograd.grad(final.sum(), (x, h0))
    rx, rh0 = torch.autograd.grad(final_ref.sum(), (refs[0], refs[3]))
    assert torch.equal(gx.cpu().double(), rx) and torch.equal(gh0.cpu().double(), rh0)
    # only out unless asked for the states; final_states_out is then left alone
    fs2 = torch.zeros(B, D, W - 1, device=device)
    single = dao.causal_conv1d_fn(x, w, b, None, h0, False, fs2, "silu")
    assert isinstance(single, torch.Tensor) and torch.equal(single, out)
    assert not fs2.any()
    # Mamba-2's decode call, positional; conv_state [B, D, W] (state_len = width) and 2-D x
    state = randn(B, D, W, device=device, gen=gen)
    state_ref = state.cpu().clone()
    xt = randn(B, D, device=device, gen=gen)
    yt = dao.causal_conv1d_update(xt, state, w.detach(), b, "silu")
    assert yt.shape == (B, D)
    assert_close(yt, dao_update_ref(xt.cpu(), state_ref, w.detach().cpu(), b.cpu(), "silu"),
                 torch.float32)
    assert torch.equal(state.cpu(), state_ref)


def test_update_matches_fn(device):
    """A prefill through causal_conv1d_fn, then decode steps, equal one whole call."""
    gen = torch.Generator().manual_seed(8)
    B, D, T, W = 3, 8, 12, 4
    x = randn(B, D, T, dtype=torch.float64, device=device, gen=gen)
    w = randn(D, W, dtype=torch.float64, device=device, gen=gen)
    whole = dao.causal_conv1d_fn(x, w, None, activation="silu")
    pre, state = dao.causal_conv1d_fn(x[:, :, :5], w, None, return_final_states=True,
                                      activation="silu")
    steps = [pre] + [dao.causal_conv1d_update(x[:, :, t], state, w, None, "silu")[..., None]
                     for t in range(5, T)]
    assert rel(torch.cat(steps, 2), whole) <= TOL[torch.float64]


def test_errors_are_causal_conv1d_s(device):
    x = torch.randn(2, 8, 5, device=device)
    w = torch.randn(8, 4, device=device)
    with pytest.raises(NotImplementedError, match="activation must be None, silu, or swish"):
        dao.causal_conv1d_fn(x, w, activation="gelu")
    with pytest.raises(NotImplementedError, match="activation must be None, silu, or swish"):
        dao.causal_conv1d_update(x[:, :, 0], torch.zeros(2, 8, 3, device=device), w,
                                 activation="relu")
    for call in (lambda: dao.causal_conv1d_fn(x, torch.randn(7, 4, device=device)),
                 lambda: dao.causal_conv1d_fn(x, w, initial_states=torch.zeros(2, 8, 3,
                                                                               device=device,
                                                                               dtype=torch.half)),
                 lambda: dao.causal_conv1d_fn(x, w, return_final_states=True,
                                              final_states_out=torch.zeros(2, 8, 4, device=device)),
                 lambda: dao.causal_conv1d_update(x[:, :, 0], torch.zeros(2, 8, 3, device=device,
                                                                          dtype=torch.half), w),
                 lambda: dao.causal_conv1d_update(x[:, :, 0], torch.zeros(2, 8, 2, device=device),
                                                  w)):
        with pytest.raises(RuntimeError) as err:  # causal-conv1d's TORCH_CHECK type
            call()
        assert isinstance(err.value, shortconv.ShortConvError)  # and shortconv's
        assert "shortconv.dao.causal_conv1d_" in str(err.value)
    with pytest.raises(TypeError, match="x: expected a torch.Tensor"):
        dao.causal_conv1d_fn([1.0], w)


def test_cache_seqlens_needs_the_core_argument():
    if "cache_seqlens" in inspect.signature(shortconv.causal_conv1d_update).parameters:
        pytest.skip("the core has cache_seqlens: the ring-buffer tests above cover it")
    x, state, w = torch.randn(2, 8), torch.randn(2, 8, 5), torch.randn(8, 4)
    before = state.clone()
    with pytest.raises(NotImplementedError, match="cache_seqlens"):
        dao.causal_conv1d_update(x, state, w, cache_seqlens=torch.zeros(2, dtype=torch.int32))
    assert torch.equal(state, before)
