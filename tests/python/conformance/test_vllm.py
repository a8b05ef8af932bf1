"""shortconv.vllm against vLLM's own test parametrisation (tests/kernels/mamba/test_causal_conv1d.py)
and the rest of its documented arguments.

The reference is vLLM's documented semantics in float64 (references.vllm_fn_ref /
vllm_update_ref): the first width-1 entries of a pool row are the state, padded sequences are
skipped, x is rounded to the state dtype first.  Outputs of padded sequences are not compared
(vLLM leaves them unwritten).  Tolerances are the project's.
"""
import inspect
import itertools

import pytest
import torch

import shortconv
from shortconv import vllm

from helpers import TOL, assert_close, rel
from references import (conv_ref, randn, require_arg, sample, vllm_fn_apc_ref, vllm_fn_ref,
                        vllm_update_ref)

PAD = vllm.PAD_SLOT_ID


def _ids(v):
    return str(v).replace("torch.", "") if isinstance(v, torch.dtype) else None


@pytest.mark.parametrize("itype", [torch.bfloat16], ids=_ids)
@pytest.mark.parametrize("silu_activation", [False, True])
@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("seqlen", [1])
@pytest.mark.parametrize("width", [4])
@pytest.mark.parametrize("dim", [2048, 2048 + 16, 4096])
def test_causal_conv1d_update(dim, width, seqlen, has_bias, silu_activation, itype, device):
    gen = torch.Generator().manual_seed(0)
    batch = 2
    x = randn(batch, dim, seqlen, dtype=itype, device=device, gen=gen)
    conv_state = randn(batch, dim, width - 1, dtype=itype, device=device, gen=gen)
    weight = randn(dim, width, dtype=itype, device=device, gen=gen)
    bias = randn(dim, dtype=itype, device=device, gen=gen) if has_bias else None
    state_ref = conv_state.cpu().clone()
    act = "silu" if silu_activation else None
    idx = torch.arange(batch, dtype=torch.int32)
    out = vllm.causal_conv1d_update(x, conv_state, weight, bias, activation=act,
                                    conv_state_indices=idx.to(device))
    out_ref = vllm_update_ref(x.cpu(), state_ref, weight.cpu(),
                              None if bias is None else bias.cpu(), act, idx)
    assert out.shape == x.shape and out.dtype == itype
    assert torch.equal(conv_state.cpu(), state_ref)
    assert_close(out, out_ref, itype, what="out")


@pytest.mark.parametrize("batch_size,with_padding,dim,width,seqlen,has_bias,silu_activation,itype",
                         sample(("batch", "pad", "dim", "width", "seqlen", "bias", "silu", "itype"),
                                ([3], [True, False], [2048 + 16, 4096], [3, 4], [1, 3],
                                 [False, True], [False, True], [torch.float32, torch.bfloat16]),
                                n=40, seed=11))
def test_causal_conv1d_update_with_batch_gather(batch_size, with_padding, dim, width, seqlen,
                                                has_bias, silu_activation, itype, device):
    gen = torch.Generator().manual_seed(0)
    padding = 5 if with_padding else 0
    total = 10 * batch_size
    x = randn(batch_size + padding, seqlen, dim, dtype=itype, device=device, gen=gen).transpose(1, 2)
    idx = torch.randperm(total, generator=gen)[:batch_size].to(torch.int32)
    padded = torch.cat([idx, torch.full((padding,), PAD, dtype=torch.int32)])
    conv_state = randn(total, width - 1, dim, dtype=itype, device=device, gen=gen).transpose(1, 2)
    weight = randn(dim, width, dtype=itype, device=device, gen=gen)
    bias = randn(dim, dtype=itype, device=device, gen=gen) if has_bias else None
    act = "silu" if silu_activation else None
    expected = conv_state.cpu().clone()
    out_ref = vllm_update_ref(x.cpu(), expected, weight.cpu(), None if bias is None else bias.cpu(),
                              act, padded)
    out = vllm.causal_conv1d_update(x, conv_state, weight, bias, activation=act,
                                    conv_state_indices=padded.to(device), pad_slot_id=PAD)
    assert torch.equal(conv_state.cpu(), expected)  # named rows updated, every other untouched
    assert_close(out[:batch_size], out_ref[:batch_size], itype, what="out")


@pytest.mark.parametrize("batch,with_padding,dim,seqlen,width,has_bias,silu_activation,itype",
                         sample(("batch", "pad", "dim", "seqlen", "width", "bias", "silu", "itype"),
                                ([4, 10], [True, False], [64, 4096], [8, 249, 4096], [4], [True],
                                 [True], [torch.bfloat16]),
                                n=12, seed=12, cost=lambda c: c["dim"] * c["seqlen"],
                                max_cost=4096 * 249))
def test_causal_conv1d_varlen(batch, with_padding, dim, seqlen, width, has_bias, silu_activation,
                              itype, device):
    require_arg(shortconv.causal_conv1d_update, "has_initial_state")
    gen = torch.Generator().manual_seed(0)
    padding = 3 if with_padding else 0
    # vLLM's generator draws at most seqlen - 1 split points, so for seqlen < batch + padding
    # it makes fewer sequences than cache_indices has entries (its kernel reads only the
    # first ones; shortconv refuses the length mismatch): the batch is what fits.
    batch = min(batch, seqlen - padding)
    nseq = batch + padding
    eos = torch.randperm(seqlen - 1, generator=gen)[:nseq - 1].sort().values
    lens = torch.diff(torch.cat([torch.tensor([-1]), eos, torch.tensor([seqlen - 1])]))
    qsl = torch.cat([torch.zeros(1, dtype=torch.int32), lens.cumsum(0).to(torch.int32)])
    total = 10 * batch
    # (1, dim, seqlen) view of a token-major buffer wider than dim, squeezed: vLLM's x
    head = 4096 if device == "cuda" else 16
    x = randn(1, seqlen, head + dim + 64, dtype=itype, device=device, gen=gen)
    x = x.transpose(1, 2)[:, head:head + dim, :].squeeze(0)
    weight = randn(dim, width, dtype=itype, device=device, gen=gen)
    bias = randn(dim, dtype=itype, device=device, gen=gen) if has_bias else None
    act = "silu" if silu_activation else None
    states = randn(total, width - 1, dim, dtype=itype, device=device, gen=gen).transpose(1, 2)
    has_h0 = torch.randint(0, 2, (nseq,), generator=gen, dtype=torch.bool)
    idx = torch.randperm(total, generator=gen)[:batch].to(torch.int32)
    padded = torch.cat([idx, torch.full((padding,), PAD, dtype=torch.int32)])
    expected = states.cpu().clone()
    out_ref = vllm_fn_ref(x.cpu(), weight.cpu(), None if bias is None else bias.cpu(), expected,
                          qsl, padded, has_h0, act)
    out = vllm.causal_conv1d_fn(x, weight, bias=bias, conv_states=states,
                                query_start_loc=qsl.to(device), cache_indices=padded.to(device),
                                has_initial_state=has_h0.to(device), activation=act,
                                pad_slot_id=PAD)
    assert out.shape == x.shape and out.dtype == itype and out.stride(0) == 1
    assert torch.equal(states.cpu(), expected)
    real = int(qsl[batch])  # the padded sequences come last
    assert_close(out[:, :real], out_ref[:, :real], itype, what="out")


# ---- the rest of vLLM's documented arguments --------------------------------------------
def _params(fn, keyword_only=False):
    """(name, default) of fn's parameters that vLLM's function has (positional or keyword),
    or with keyword_only those after a bare * (shortconv's own additions)."""
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()
            if (p.kind == inspect.Parameter.KEYWORD_ONLY) == keyword_only]


def test_signatures_are_vllm_s():
    e = inspect.Parameter.empty
    assert _params(vllm.causal_conv1d_fn) == [
        ("x", e), ("weight", e), ("bias", e), ("conv_states", e), ("query_start_loc", e),
        ("cache_indices", None), ("has_initial_state", None), ("activation", "silu"),
        ("pad_slot_id", -1), ("block_idx_first_scheduled_token", None),
        ("block_idx_last_scheduled_token", None), ("initial_state_idx", None),
        ("num_computed_tokens", None), ("block_size_to_align", 0), ("metadata", None),
        ("validate_data", False)]
    assert _params(vllm.causal_conv1d_update) == [
        ("x", e), ("conv_state", e), ("weight", e), ("bias", None), ("activation", None),
        ("conv_state_indices", None), ("num_accepted_tokens", None), ("query_start_loc", None),
        ("max_query_len", -1), ("pad_slot_id", -1), ("block_idx_last_scheduled_token", None),
        ("initial_state_idx", None), ("retrieve_parent_token", None), ("validate_data", False)]
    # shortconv's one addition, keyword only so that no positional call of vLLM's changes
    assert _params(vllm.causal_conv1d_fn, True) == []
    assert _params(vllm.causal_conv1d_update, True) == [("overlap", None)]


def _decode_case(device, B=4, D=16, W=4, S=3, P=9, T=None, dtype=torch.float32, seed=13):
    gen = torch.Generator().manual_seed(seed)
    shape = (B, D) if T is None else (B, D, T)
    return (randn(*shape, dtype=dtype, device=device, gen=gen),
            randn(P, D, S, device=device, gen=gen), randn(D, W, device=device, gen=gen),
            randn(D, device=device, gen=gen))


def _spec_ref(x, pool, w, b, act, rows, accepted, pad):
    """vLLM's speculative step per sequence, in plain torch (float64): the state is the
    width - 1 entries of the row from accepted - 1; u = state ++ tokens; the row's first
    E = (width - 1) + (seqlen - 1) entries become u[1:]; padded slots are left alone."""
    B, D, T = x.shape
    W = w.shape[1]
    E = W - 1 + T - 1
    pool = pool.clone()
    out = torch.zeros(B, D, T, dtype=torch.float64)
    for n in range(B):
        r = int(rows[n])
        if r == pad or r == -1:
            continue
        a = int(accepted[n])
        u = torch.cat([pool[r, :, a - 1:a - 1 + W - 1].double(), x[n].double()], 1)
        for t in range(T):
            v = (u[:, t:t + W] * w.double()).sum(1) + (0 if b is None else b.double())
            out[n, :, t] = v * torch.sigmoid(v) if act else v
        pool[r, :, :E] = u[:, 1:].to(pool.dtype)
    return out, pool


@pytest.mark.parametrize("T,W,extra", [(1, 4, 0), (3, 4, 2), (4, 3, 0), (2, 2, 1)])
def test_update_speculative_matches_vllm(T, W, extra, device):
    gen = torch.Generator().manual_seed(T * 10 + W)
    B, D, P = 5, 16, 9
    S = W - 1 + T - 1 + extra
    x, pool, w, b = (randn(B, D, T, device=device, gen=gen), randn(P, D, S, device=device, gen=gen),
                     randn(D, W, device=device, gen=gen), randn(D, device=device, gen=gen))
    rows = torch.tensor([3, -1, 0, 7, 5], dtype=torch.int32)
    accepted = torch.tensor([1 + n % T for n in range(B)], dtype=torch.int32)
    accepted = torch.minimum(accepted, torch.tensor(S - (W - 1) + 1))
    out_ref, pool_ref = _spec_ref(x.cpu(), pool.cpu(), w.cpu(), b.cpu(), True, rows, accepted, -1)
    out = vllm.causal_conv1d_update(x, pool, w, b, True, rows.to(device),
                                    num_accepted_tokens=accepted.to(device))
    real = [n for n in range(B) if int(rows[n]) >= 0]
    assert_close(out.cpu()[real], out_ref[real], torch.float32, what="out")
    assert torch.equal(pool.cpu(), pool_ref)  # the rows are copies: exact


def test_update_speculative_one_token_one_accepted_is_the_plain_update(device):
    x, pool, w, b = _decode_case(device, T=1)
    pool2 = pool.clone()
    rows = torch.tensor([0, 1, 2, 3], device=device)
    y1 = vllm.causal_conv1d_update(x, pool, w, b, True, rows)
    y2 = vllm.causal_conv1d_update(x, pool2, w, b, True, rows,
                                   num_accepted_tokens=torch.ones(4, dtype=torch.int32, device=device))
    assert torch.equal(y1, y2) and torch.equal(pool, pool2)


def test_update_speculative_bad_counts_are_errors(device):
    x, pool, w, b = _decode_case(device, T=2, S=5)
    rows = torch.tensor([0, 1, 2, 3], device=device)
    before = pool.clone()
    with pytest.raises(ValueError, match="num_accepted_tokens"):
        vllm.causal_conv1d_update(x, pool, w, b, True, rows,
                                  num_accepted_tokens=torch.ones(3, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="conv_state"):  # rows too short for 2 tokens, W = 4: E = 4
        vllm.causal_conv1d_update(x, pool.narrow(2, 0, 3), w, b, True, rows,
                                  num_accepted_tokens=torch.ones(4, dtype=torch.int32, device=device))
    # contents: checked on host backends; CUDA calls inside shortconv.check_contents()
    # (unchecked, the kernels clamp: section 7)
    for bad in ([1, 0, 1, 1], [1, 1, 4, 1]):  # 0, and past the row (> S - (W-1) + 1 = 3)
        n = next(i for i, v in enumerate(bad) if v != 1)
        with shortconv.check_contents(device != "cpu"):
            with pytest.raises(ValueError, match=r"num_accepted_tokens\[%d\]" % n):
                vllm.causal_conv1d_update(x, pool, w, b, True, rows,
                                          num_accepted_tokens=torch.tensor(bad, dtype=torch.int32,
                                                                           device=device))
    assert torch.equal(pool, before)  # nothing written


@pytest.mark.parametrize("given,missing", [("block_idx_last_scheduled_token", "initial_state_idx"),
                                           ("initial_state_idx", "block_idx_last_scheduled_token")])
def test_update_prefix_caching_given_partially_is_named(given, missing, device):
    x, pool, w, b = _decode_case(device)
    before = pool.clone()
    with pytest.raises(ValueError, match=missing):
        vllm.causal_conv1d_update(x, pool, w, b, True, torch.tensor([0, 1, 2, 3], device=device),
                                  **{given: torch.zeros(4, dtype=torch.int32, device=device)})
    assert torch.equal(pool, before)


def _apc_batch(lengths, computed, B, M, device, gen, has=None):
    """A packed chunk per sequence at absolute positions computed[n] with vLLM's block indices
    (the blocks of the last computed, first and last scheduled tokens), each sequence's blocks
    in distinct rows of a pool of sum(M) + 3 rows, (dim, tokens) x of 16 channels."""
    N, W = len(lengths), 4
    qsl = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32)
    rows = torch.randperm(N * M + 3, generator=gen)[:N * M].view(N, M).int()
    c = torch.tensor(computed, dtype=torch.int32)
    L = torch.tensor(lengths, dtype=torch.int32)
    init = torch.clamp((c + B - 1) // B - 1, min=0).int()
    first = (c // B).int()
    last = torch.clamp((c + L + B - 1) // B - 1, min=0).int()
    x = randn(16, int(qsl[-1]), device=device, gen=gen)
    pool = randn(N * M + 3, 16, W - 1, device=device, gen=gen)
    w, b = randn(16, W, device=device, gen=gen), randn(16, device=device, gen=gen)
    has = torch.tensor([v > 0 for v in computed]) if has is None else has
    return x, pool, w, b, qsl, rows, has, first, last, init, c


# chunks shorter than a block, inside one block, crossing 1-3 boundaries, starting or ending
# at a boundary; block sizes 1, 3, 8
@pytest.mark.parametrize("B,lengths,computed", [
    (8, [5, 16, 3, 20], [0, 8, 13, 4]),
    (8, [8, 1, 9, 24], [8, 15, 0, 16]),
    (3, [7, 2, 6, 1], [1, 2, 0, 9]),
    (1, [4, 3], [0, 5])])
def test_fn_prefix_caching_matches_vllm(B, lengths, computed, device):
    gen = torch.Generator().manual_seed(B * 100 + len(lengths))
    M = max((c + L) // B + 2 for c, L in zip(computed, lengths))
    x, pool, w, b, qsl, rows, has, first, last, init, c = _apc_batch(lengths, computed, B, M,
                                                                      device, gen)
    expected = pool.cpu().clone()
    out_ref = vllm_fn_apc_ref(x.cpu(), w.cpu(), b.cpu(), expected, qsl, rows, has, "silu", first,
                              last, init, c, B)
    out = vllm.causal_conv1d_fn(x, w, b, pool, qsl.to(device), rows.to(device),
                                has.to(device), "silu", block_idx_first_scheduled_token=first.to(device),
                                block_idx_last_scheduled_token=last.to(device),
                                initial_state_idx=init.to(device),
                                num_computed_tokens=c.to(device), block_size_to_align=B)
    assert_close(out, out_ref, torch.float32, what="out")
    assert torch.equal(pool.cpu(), expected)  # every snapshot and final row, nothing else


def test_fn_prefix_cached_restart_equals_the_whole_prefill(device):
    """Prefill 40 tokens with snapshots every 8, then restart at every snapshot: the outputs
    from there and every later row equal the whole prefill's, bitwise."""
    gen = torch.Generator().manual_seed(7)
    B, T, W = 8, 40, 4
    x = randn(16, T, device=device, gen=gen)
    w, b = randn(16, W, device=device, gen=gen), randn(16, device=device, gen=gen)
    rows = torch.arange(T // B + 1, dtype=torch.int32).view(1, -1).to(device)
    i32 = lambda *v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    pool = torch.zeros(T // B + 1, 16, W - 1, device=device)
    whole = vllm.causal_conv1d_fn(x, w, b, pool, i32(0, T), rows, torch.zeros(1, dtype=torch.bool,
                                  device=device), "silu", block_idx_first_scheduled_token=i32(0),
                                  block_idx_last_scheduled_token=i32((T - 1) // B),
                                  initial_state_idx=i32(0), num_computed_tokens=i32(0),
                                  block_size_to_align=B)
    for m in range(1, T // B):
        again = pool.clone()
        out = vllm.causal_conv1d_fn(x[:, m * B:], w, b, again, i32(0, T - m * B), rows,
                                    torch.ones(1, dtype=torch.bool, device=device), "silu",
                                    block_idx_first_scheduled_token=i32(m),
                                    block_idx_last_scheduled_token=i32((T - 1) // B),
                                    initial_state_idx=i32(m - 1), num_computed_tokens=i32(m * B),
                                    block_size_to_align=B)
        assert torch.equal(out, whole[:, m * B:]), m
        assert torch.equal(again, pool), m


def test_update_prefix_caching_reads_and_writes_table_rows(device):
    """vLLM's update with prefix caching: conv_state_indices is the block table, the state comes
    from its initial_state_idx block and goes to its block_idx_last_scheduled_token block."""
    gen = torch.Generator().manual_seed(8)
    N, M, D, W = 3, 4, 16, 4
    x = randn(N, D, device=device, gen=gen)
    pool, w = randn(N * M, D, W - 1, device=device, gen=gen), randn(D, W, device=device, gen=gen)
    table = torch.randperm(N * M, generator=gen).view(N, M).int()
    init, last = torch.tensor([0, 2, 1], dtype=torch.int32), torch.tensor([1, 2, 3], dtype=torch.int32)
    expected = pool.cpu().clone()
    rows_in = table[torch.arange(N), init.long()]
    rows_out = table[torch.arange(N), last.long()]
    out_ref = torch.zeros(N, D, dtype=torch.float64)
    for n in range(N):
        u = torch.cat([expected[rows_in[n]].double(), x[n].cpu().double()[:, None]], 1)
        out_ref[n] = conv_ref(u[None], w.cpu(), None, "silu", 1)[0, :, 0]
        expected[rows_out[n]] = u[:, 1:].to(pool.dtype)
    out = vllm.causal_conv1d_update(x, pool, w, None, True, table.to(device),
                                    block_idx_last_scheduled_token=last.to(device),
                                    initial_state_idx=init.to(device))
    assert_close(out, out_ref, torch.float32, what="out")
    assert torch.equal(pool.cpu(), expected)


@pytest.mark.parametrize("missing", ["block_idx_first_scheduled_token",
                                     "block_idx_last_scheduled_token", "initial_state_idx",
                                     "num_computed_tokens"])
def test_fn_prefix_caching_arguments_given_partially_are_named(missing, device):
    gen = torch.Generator().manual_seed(9)
    x, pool, w, b, qsl, rows, has, first, last, init, c = _apc_batch([5, 9], [3, 8], 4, 6,
                                                                      device, gen)
    kw = dict(block_idx_first_scheduled_token=first, block_idx_last_scheduled_token=last,
              initial_state_idx=init, num_computed_tokens=c)
    kw = {k: v.to(device) for k, v in kw.items() if k != missing}
    before = pool.clone()
    with pytest.raises(ValueError, match=missing):
        vllm.causal_conv1d_fn(x, w, b, pool, qsl.to(device), rows.to(device), has.to(device),
                              "silu", block_size_to_align=4, **kw)
    assert torch.equal(pool, before)


@pytest.mark.parametrize("defect,name", [("table", "block_idx_first_scheduled_token"),
                                         ("last", "block_idx_last_scheduled_token"),
                                         ("init", "initial_state_idx"),
                                         ("computed", "num_computed_tokens"),
                                         ("twice", "cache_indices"),
                                         ("block", "block_size_to_align")])
def test_fn_prefix_caching_bad_input_is_named_and_writes_nothing(defect, name, device):
    """Block indices past the table, a row written twice, a negative computed count, a block
    size of 0: a clear error naming vLLM's argument, the pool unchanged (index contents:
    checked on host backends, and on CUDA inside shortconv.check_contents())."""
    gen = torch.Generator().manual_seed(10)
    x, pool, w, b, qsl, rows, has, first, last, init, c = _apc_batch([5, 9], [3, 8], 4, 6,
                                                                      device, gen)
    B = 4
    if defect == "table":
        first = first.clone()
        first[1] = 6  # past the table of 6 blocks
    elif defect == "last":
        last = last.clone()
        last[0] = -1
    elif defect == "init":
        init = init.clone()
        init[1] = 6
    elif defect == "computed":
        c = c.clone()
        c[0] = -1
    elif defect == "twice":
        rows = rows.clone()
        rows[1, int(last[1])] = rows[0, int(last[0])]
    else:
        B = 0
    before = pool.clone()
    with shortconv.check_contents(device != "cpu"), pytest.raises(ValueError, match=name):
        vllm.causal_conv1d_fn(x, w, b, pool, qsl.to(device), rows.to(device), has.to(device),
                              "silu", block_idx_first_scheduled_token=first.to(device),
                              block_idx_last_scheduled_token=last.to(device),
                              initial_state_idx=init.to(device), num_computed_tokens=c.to(device),
                              block_size_to_align=B)
    assert torch.equal(pool, before)


@pytest.mark.parametrize("activation", [True, False, None, "silu", "swish"])
@pytest.mark.parametrize("state_len", [3, 6])
@pytest.mark.parametrize("tokens", [None, 2])
def test_update_activation_state_len_and_layouts(activation, state_len, tokens, device):
    """activation True/False; a row longer than width-1 (only its first width-1 entries are
    the state, as in vLLM's kernel); [B, D] and [B, D, T] x; rows by index or by position."""
    x, pool, w, b = _decode_case(device, S=state_len, T=tokens)
    act = "silu" if activation in (True, "silu", "swish") else None
    for idx in (torch.tensor([5, 0, 8, 2], dtype=torch.int32), None):
        expected = pool.cpu().clone()
        out_ref = vllm_update_ref(x.cpu(), expected, w.cpu(), b.cpu(), act, idx)
        out = vllm.causal_conv1d_update(x, pool, w, b, activation,
                                        None if idx is None else idx.to(device))
        assert out.shape == x.shape
        assert_close(out, out_ref, torch.float32)
        assert torch.equal(pool.cpu(), expected)


def test_update_pad_slot_id_other_than_minus_one(device):
    x, pool, w, b = _decode_case(device)
    big = 1000
    idx = torch.tensor([3, big, 7, big], dtype=torch.int32)
    expected = pool.cpu().clone()
    out_ref = vllm_update_ref(x.cpu(), expected, w.cpu(), b.cpu(), "silu", idx, pad_slot_id=big)
    out = vllm.causal_conv1d_update(x, pool, w, b, "silu", idx.to(device), pad_slot_id=big)
    assert torch.equal(pool.cpu(), expected)
    keep = idx != big
    assert_close(out.cpu()[keep], out_ref[keep], torch.float32)


def test_update_rounds_x_to_the_state_dtype(device):
    """vLLM computes in conv_state's dtype (x cast first) and returns x's dtype."""
    x, pool, w, b = _decode_case(device)
    pool = pool.to(torch.bfloat16)
    idx = torch.tensor([1, 4, 6, 0], dtype=torch.int32)
    expected = pool.cpu().clone()
    out_ref = vllm_update_ref(x.cpu(), expected, w.cpu(), b.cpu(), None, idx)
    out = vllm.causal_conv1d_update(x, pool, w, b, None, idx.to(device))
    assert out.dtype == torch.float32
    assert torch.equal(pool.cpu(), expected)
    # both sides round x and the output to bf16: compared at bf16's tolerance
    assert_close(out, out_ref, torch.bfloat16)


def test_update_varlen_decode(device):
    """query_start_loc with [tokens, dim] x, one token per sequence (vLLM's decode batches)."""
    x, pool, w, b = _decode_case(device)
    idx = torch.tensor([2, 6, PAD, 4], dtype=torch.int32)
    qsl = torch.arange(5, dtype=torch.int32)
    expected = pool.cpu().clone()
    out_ref = vllm_update_ref(x.cpu(), expected, w.cpu(), b.cpu(), "silu", idx)
    out = vllm.causal_conv1d_update(x, pool, w, b, "silu", idx.to(device),
                                    query_start_loc=qsl.to(device), max_query_len=1)
    assert torch.equal(pool.cpu(), expected)
    keep = idx != PAD
    assert_close(out.cpu()[keep], out_ref[keep], torch.float32)
    with pytest.raises(ValueError, match="conv_state_indices: required with query_start_loc"):
        vllm.causal_conv1d_update(x, pool, w, b, "silu", query_start_loc=qsl.to(device))


def test_update_bad_activation_is_an_error(device):
    x, pool, w, b = _decode_case(device)
    with pytest.raises(ValueError, match="activation"):
        vllm.causal_conv1d_update(x, pool, w, b, "gelu", torch.arange(4, device=device))


def test_fn_then_update_equal_one_sequence(device):
    """A packed prefill into the pool, then decode steps, equal the whole sequences."""
    require_arg(shortconv.causal_conv1d_update, "has_initial_state")
    gen = torch.Generator().manual_seed(14)
    D, W, lens, T_dec = 16, 4, [5, 1, 9], 3
    xs = [randn(D, n + T_dec, dtype=torch.float64, device=device, gen=gen) for n in lens]
    w = randn(D, W, dtype=torch.float64, device=device, gen=gen)
    pool = randn(6, D, W + 2, dtype=torch.float64, device=device, gen=gen)  # state_len > W-1
    idx = torch.tensor([4, 1, 3], dtype=torch.int32, device=device)
    qsl = torch.tensor([0, 5, 6, 15], dtype=torch.int32, device=device)
    prefill = torch.cat([xi[:, :n] for xi, n in zip(xs, lens)], 1)
    out = vllm.causal_conv1d_fn(prefill, w, None, pool, qsl, idx, None, True)
    outs = [[out[:, s:e]] for s, e in zip(qsl[:-1].tolist(), qsl[1:].tolist())]
    for t in range(T_dec):
        xt = torch.stack([xi[:, n + t] for xi, n in zip(xs, lens)])
        yt = vllm.causal_conv1d_update(xt, pool, w, None, True, idx)
        for i in range(3):
            outs[i].append(yt[i][:, None])
    for i, xi in enumerate(xs):
        whole = vllm_fn_ref(xi.cpu(), w.cpu(), None, torch.zeros(1, D, W - 1, dtype=torch.float64),
                            torch.tensor([0, xi.shape[1]]), None, None, "silu")
        assert rel(torch.cat(outs[i], 1), whole) <= TOL[torch.float64]


def test_speculative_steps_equal_replaying_the_accepted_tokens(device):
    """Engine invariant: a speculative step of T drafts followed by a step that says a_n were
    accepted gives, bitwise, the outputs of decoding the a_n accepted tokens one by one and
    then the new step's tokens from the plain state."""
    gen = torch.Generator().manual_seed(77)
    B, D, W, T, P = 4, 8, 4, 3, 6
    E = W - 1 + T - 1
    w, b = randn(D, W, device=device, gen=gen), randn(D, device=device, gen=gen)
    start = randn(P, D, W - 1, device=device, gen=gen)
    rows = torch.tensor([4, 0, 2, 5], dtype=torch.int32, device=device)
    pool = torch.zeros(P, D, E, device=device)
    pool[:, :, :W - 1] = start
    drafts = randn(B, D, T, device=device, gen=gen)
    vllm.causal_conv1d_update(drafts, pool, w, b, True, rows,
                              num_accepted_tokens=torch.ones(B, dtype=torch.int32, device=device))
    accepted = torch.tensor([1, 3, 2, 3], dtype=torch.int32)
    step2 = randn(B, D, T, device=device, gen=gen)
    out = vllm.causal_conv1d_update(step2, pool, w, b, True, rows,
                                    num_accepted_tokens=accepted.to(device))
    for n in range(B):
        state = start[int(rows[n])].clone().unsqueeze(0)  # the plain W-1 state of this sequence
        r = torch.zeros(1, dtype=torch.int32, device=device)
        for t in range(int(accepted[n])):
            vllm.causal_conv1d_update(drafts[n:n + 1, :, t], state, w, b, True, r)
        ref = vllm.causal_conv1d_update(step2[n:n + 1], state, w, b, True, r)
        assert torch.equal(out[n], ref[0]), n
        # and the row's state after step 2 is the plain state after those tokens
        assert torch.equal(pool[int(rows[n]), :, T - 1:T - 1 + W - 1], state[0]), n
