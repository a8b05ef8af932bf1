"""Plain-torch references of the peers' documented semantics, in float64, and test plumbing.

All of them take CPU tensors.  Each reference is written from the peer's documentation (docstrings, reference functions and
tests of causal-conv1d, FLA and vLLM), not from shortconv: loops over sequences and tokens,
F.conv1d over the extended sequence state ++ x.  Inputs are taken as given (already rounded
to their dtype) and computed in float64; callers compare with the project's tolerances.

Also here: the deterministic sampler of the peers' Cartesian products, and the checks for the
core's optional arguments (the tests that need one skip, naming it, until it exists).
"""
import functools
import inspect
import itertools
import os
import random

import pytest
import torch
import torch.nn.functional as F

import shortconv

# SHORTCONV_CONFORMANCE=full runs each peer's whole Cartesian product (minutes; for a GPU
# machine); the default is a deterministic sample of it that fits the CPU CI budget.
FULL = os.environ.get("SHORTCONV_CONFORMANCE", "") == "full"


def _act(z, activation):
    return F.silu(z) if activation in ("silu", "swish", True) else z


def conv_ref(u, weight, bias, activation, n_out):
    """The last n_out outputs of the causal conv over u [B, D, L] (u already holds the window
    before the first output): act(bias + sum_k w[:, k] u[:, t + k]), float64."""
    D, W = weight.shape
    u = u.double()
    if n_out == 0:
        return u.new_zeros(u.shape[0], D, 0)
    pre = F.conv1d(u[:, :, u.shape[2] - (n_out + W - 1):], weight.double().unsqueeze(1),
                   None if bias is None else bias.double(), groups=D)
    return _act(pre, activation)


# ---- causal-conv1d -----------------------------------------------------------------
def dao_fn_ref(x, weight, bias=None, initial_states=None, activation=None):
    """causal_conv1d_ref: x [B, D, T]; returns (out, final_states [B, D, W-1]) in float64."""
    B, D, T = x.shape
    W = weight.shape[1]
    h0 = (initial_states.double() if initial_states is not None
          else x.new_zeros(B, D, W - 1, dtype=torch.float64))
    u = torch.cat([h0, x.double()], dim=2)
    return conv_ref(u, weight, bias, activation, T), u[:, :, u.shape[2] - (W - 1):]


def dao_seq_idx_ref(x, weight, bias, seq_idx, activation):
    """causal_conv1d_fn with seq_idx: within each row, each run of one id is a sequence started
    from a zero state; tokens with a negative id are padding with output 0."""
    B, D, T = x.shape
    out = torch.zeros(B, D, T, dtype=torch.float64)
    for b in range(B):
        ids = seq_idx[b].tolist()
        t = 0
        while t < T:
            e = t
            while e < T and ids[e] == ids[t]:
                e += 1
            if ids[t] >= 0:
                out[b:b + 1, :, t:e] = dao_fn_ref(x[b:b + 1, :, t:e], weight, bias,
                                                  activation=activation)[0]
            t = e
    return out


def dao_update_ref(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None):
    """causal_conv1d_update_ref: x [B, D] or [B, D, T]; conv_state [B, D, S] is updated in place
    (shifted, or as a ring from cache_seqlens: token i at (c + i) % S, the last write to a slot
    wins); returns out (x's shape), float64."""
    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
    B, D, T = x.shape
    W, S = weight.shape[1], conv_state.shape[-1]
    if cache_seqlens is None:
        u = torch.cat([conv_state.double(), x.double()], dim=2)
        conv_state.copy_(u[:, :, u.shape[2] - S:])
    else:
        c = cache_seqlens.long()
        window = (c[:, None] + torch.arange(-(W - 1), 0)).remainder(S)  # [B, W-1]
        before = conv_state.gather(2, window[:, None, :].expand(B, D, W - 1))
        u = torch.cat([before.double(), x.double()], dim=2)
        for i in range(T):  # in token order: a later token overwrites an earlier one's slot
            slot = (c + i).remainder(S)[:, None, None].expand(B, D, 1)
            conv_state.scatter_(2, slot, x[:, :, i:i + 1])
    out = conv_ref(u, weight, bias, activation, T)
    return out[:, :, 0] if squeeze else out


def dao_varlen_states_ref(x, cu_seqlens, state_len):
    """causal_conv1d_varlen_states_ref: x [total, D] -> [N, D, state_len], right-aligned."""
    cu = cu_seqlens.tolist()
    out = torch.zeros(len(cu) - 1, x.shape[1], state_len, dtype=x.dtype)
    for n in range(len(cu) - 1):
        start = max(cu[n], cu[n + 1] - state_len)
        if cu[n + 1] > start:
            out[n, :, state_len - (cu[n + 1] - start):] = x[start:cu[n + 1]].t()
    return out


# ---- FLA ---------------------------------------------------------------------------
def fla_ref(x, weight, bias=None, residual=None, initial_state=None, activation=None,
            cu_seqlens=None):
    """FLA's causal_conv1d: x [B, T, D] (packed [1, total, D] with cu_seqlens); initial_state
    [N, D, S] (its last W-1 entries feed the outputs); returns (y [B, T, D], final [N, D, S]
    = the last S entries of state ++ x), float64."""
    D, W = weight.shape
    S = initial_state.shape[-1] if initial_state is not None else W
    if cu_seqlens is None:
        bounds = [(b, 0, x.shape[1]) for b in range(x.shape[0])]
    else:
        cu = cu_seqlens.tolist()
        bounds = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    y = torch.zeros(x.shape, dtype=torch.float64)
    finals = []
    for n, (b, s, e) in enumerate(bounds):
        h0 = (initial_state[n:n + 1].double() if initial_state is not None
              else torch.zeros(1, D, S, dtype=torch.float64))
        u = torch.cat([h0, x[b:b + 1, s:e].double().transpose(1, 2)], dim=2)
        y[b, s:e] = conv_ref(u, weight, bias, activation, e - s)[0].t()
        finals.append(u[:, :, u.shape[2] - S:])
    if residual is not None:
        y = y + residual.double()
    return y, torch.cat(finals, 0)


# ---- vLLM --------------------------------------------------------------------------
def vllm_fn_ref(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                activation, pad_slot_id=-1):
    """vLLM's causal_conv1d_fn: x (dim, tokens); per sequence n (skipped when its row is
    pad_slot_id) the initial state is conv_states[row, :, :W-1] if has_initial_state[n] else 0,
    and that row's first W-1 entries become the last W-1 of state ++ x.  conv_states is
    updated in place; returns out (dim, tokens) in float64 (x cast to the state dtype first),
    padded sequences' columns left NaN (vLLM leaves them unwritten)."""
    W = weight.shape[1]
    qsl = query_start_loc.tolist()
    rows = cache_indices.tolist() if cache_indices is not None else list(range(len(qsl) - 1))
    out = torch.full(x.shape, float("nan"), dtype=torch.float64)
    xs = x.to(conv_states.dtype)
    for n in range(len(qsl) - 1):
        r = rows[n]
        if r == pad_slot_id:
            continue
        has = has_initial_state is not None and bool(has_initial_state[n])
        h0 = (conv_states[r, :, :W - 1].double() if has
              else torch.zeros(x.shape[0], W - 1, dtype=torch.float64))
        u = torch.cat([h0, xs[:, qsl[n]:qsl[n + 1]].double()], dim=1)[None]
        out[:, qsl[n]:qsl[n + 1]] = conv_ref(u, weight, bias, activation, qsl[n + 1] - qsl[n])[0]
        conv_states[r, :, :W - 1] = u[0, :, u.shape[2] - (W - 1):].to(conv_states.dtype)
    return out


def vllm_fn_apc_ref(x, weight, bias, conv_states, query_start_loc, block_table, has_initial_state,
                    activation, first, last, init, computed, block_size):
    """vLLM's causal_conv1d_fn with prefix caching, from its documentation: sequence n's rows
    are block_table[n, .]; the initial state is row block_table[n, init[n]] (when
    has_initial_state[n], else 0); at every block boundary p = m * block_size strictly inside
    the chunk [computed[n], computed[n] + L) the state so far (the last W-1 entries of
    state ++ tokens up to p) goes to row block_table[n, first[n] + k] (k-th boundary), the
    final state to row block_table[n, last[n]].  Returns out (dim, tokens) in float64; the
    pool is updated in place."""
    W = weight.shape[1]
    qsl = query_start_loc.tolist()
    out = torch.zeros(x.shape, dtype=torch.float64)
    xs = x.to(conv_states.dtype)
    start = conv_states.clone()
    for n in range(len(qsl) - 1):
        L, c = qsl[n + 1] - qsl[n], int(computed[n])
        rows = block_table[n].tolist()
        has = has_initial_state is not None and bool(has_initial_state[n])
        h0 = (start[rows[int(init[n])], :, :W - 1].double() if has
              else torch.zeros(x.shape[0], W - 1, dtype=torch.float64))
        u = torch.cat([h0, xs[:, qsl[n]:qsl[n + 1]].double()], dim=1)
        out[:, qsl[n]:qsl[n + 1]] = conv_ref(u[None], weight, bias, activation, L)[0]
        k = 0
        for p in range((c // block_size + 1) * block_size, c + L, block_size):
            r = p - c  # tokens of the chunk before the boundary
            conv_states[rows[int(first[n]) + k], :, :W - 1] = u[:, r:r + W - 1].to(conv_states.dtype)
            k += 1
        conv_states[rows[int(last[n])], :, :W - 1] = u[:, L:L + W - 1].to(conv_states.dtype)
    return out


def vllm_update_ref(x, conv_state, weight, bias, activation, conv_state_indices, pad_slot_id=-1):
    """vLLM's causal_conv1d_update (no speculative decoding): x [B, D] or [B, D, T]; row
    conv_state_indices[b] (b when None), skipped when pad_slot_id; its first W-1 entries are
    the state.  Updates conv_state in place; returns out (NaN for padded rows), float64."""
    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
    W = weight.shape[1]
    rows = (conv_state_indices.tolist() if conv_state_indices is not None
            else list(range(x.shape[0])))
    out = torch.full(x.shape, float("nan"), dtype=torch.float64)
    xs = x.to(conv_state.dtype)
    for b, r in enumerate(rows):
        if r == pad_slot_id:
            continue
        u = torch.cat([conv_state[r, :, :W - 1].double(), xs[b].double()], dim=1)[None]
        out[b] = conv_ref(u, weight, bias, activation, x.shape[2])[0]
        conv_state[r, :, :W - 1] = u[0, :, u.shape[2] - (W - 1):].to(conv_state.dtype)
    return out[:, :, 0] if squeeze else out


# ---- plumbing ----------------------------------------------------------------------
def sample(names, axes, n, seed, keep=None, cost=None, max_cost=None):
    """A deterministic subset of the product of axes as pytest params: every value of every
    axis appears at least once, then seeded picks up to n; combinations that keep() rejects or
    that cost() puts above max_cost are left out (all of them kept with SHORTCONV_CONFORMANCE=full,
    except those keep() rejects)."""
    combos = [dict(zip(names, values)) for values in itertools.product(*axes)]
    if keep is not None:
        combos = [c for c in combos if keep(c)]
    if not FULL:
        if max_cost is not None:
            combos = [c for c in combos if cost(c) <= max_cost]
        random.Random(seed).shuffle(combos)
        chosen = []
        for name, values in zip(names, axes):
            for v in values:
                if not any(c[name] == v for c in chosen):
                    chosen.extend([c for c in combos if c[name] == v][:1])
        for c in combos:
            if len(chosen) >= n:
                break
            if c not in chosen:
                chosen.append(c)
        combos = chosen

    def ident(c):
        return "-".join("%s%s" % (k, str(v).replace("torch.", "")) for k, v in c.items())

    return [pytest.param(*(c[k] for k in names), id=ident(c)) for c in combos]


def has_arg(fn, name):
    return name in inspect.signature(fn).parameters


def require_arg(fn, name):
    """Skip unless shortconv.<fn> takes the keyword argument `name`."""
    if not has_arg(fn, name):
        pytest.skip("needs shortconv.%s(%s=...), which this shortconv does not have yet"
                    % (fn.__name__, name))


@functools.lru_cache(maxsize=None)
def _seq_idx_supported():
    try:
        shortconv.causal_conv1d(torch.zeros(1, 1, 1), torch.ones(1, 1),
                                seq_idx=torch.zeros(1, 1, dtype=torch.int32))
    except NotImplementedError:
        return False
    return True


def require_seq_idx():
    if not _seq_idx_supported():
        pytest.skip("needs shortconv.causal_conv1d(seq_idx=...), which raises NotImplementedError "
                    "in this shortconv")


def randn(*shape, dtype=torch.float32, device="cpu", gen=None):
    """Seeded normal values drawn on the CPU (the same on every device), in dtype on device."""
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)
