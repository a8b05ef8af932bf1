"""causal-conv1d's public API (Dao-AILab/causal-conv1d, the kernels Mamba calls) over shortconv.

    out = causal_conv1d_fn(x, weight, bias, seq_idx, initial_states, return_final_states,
                           final_states_out, activation)
    out = causal_conv1d_update(x, conv_state, weight, bias, activation, cache_seqlens,
                               conv_state_indices)
    states = causal_conv1d_varlen_states(x, cu_seqlens, state_len)

Switching is one import (``from shortconv.dao import ...`` for ``from causal_conv1d import ...``);
positional calls bind in causal-conv1d's order.  Its conventions, which differ from the rest of
shortconv (FLA's):

- activations are channel-first ``[batch, dim, seqlen]`` (any strides: a transposed token-major
  buffer, a slice of a fused projection); outputs have x's shape and x's memory layout;
- states are ``[batch, dim, width - 1]`` (update: ``[batch, dim, state_len]``, any
  ``state_len >= width - 1``);
- ``causal_conv1d_fn`` returns ``out``, or ``(out, final_states)`` when ``return_final_states``;
  ``final_states_out`` is written in place;
- ``causal_conv1d_update`` returns ``out`` only; ``conv_state`` is updated in place; a row whose
  ``conv_state_indices`` entry is -1 is padding: its output is 0 (causal-conv1d's convention; the
  core computes it from a zero state, docs/semantics.md) and no state is read or written.

Errors: an unknown activation is causal-conv1d's NotImplementedError; a bad shape, dtype or
device raises ``CausalConv1dError``, which is both a RuntimeError (what causal-conv1d's
TORCH_CHECKs raise) and a ``shortconv.ShortConvError`` (a ValueError) naming the argument.

Accepted beyond causal-conv1d (everything it accepts is accepted here): any width, float64,
initial/final states with either layout of x, ``seq_idx`` together with states (sequence id n
then uses state row n, as in ``shortconv.causal_conv1d``).
"""


import torch

from . import _fast, _ops
from . import functional as _F
from ._lib import ShortConvError

__all__ = ["causal_conv1d_fn", "causal_conv1d_update", "causal_conv1d_varlen_states",
           "CausalConv1dError"]

_Tensor = torch.Tensor


class CausalConv1dError(ShortConvError, RuntimeError):
    """A bad argument: a RuntimeError like causal-conv1d's TORCH_CHECK failures, and a
    ShortConvError (ValueError) like the rest of shortconv's; the message names the argument."""


def _error(where, message):
    return CausalConv1dError("%s: invalid argument: %s" % (where, message))


def _check_activation(activation):
    if activation not in (None, "silu", "swish"):
        raise NotImplementedError("activation must be None, silu, or swish")


def _check_tensor(where, name, t, rank, expected):
    if not isinstance(t, _Tensor):
        raise TypeError("%s: %s: expected a torch.Tensor %s, got %s"
                        % (where, name, expected, type(t).__name__))
    if t.dim() not in rank:
        raise _error(where, "%s: expected %s, got shape %s" % (name, expected, list(t.shape)))


def _check_state(where, name, t, x, width, rows):
    _check_tensor(where, name, t, (3,), "[batch, dim, width - 1]")
    want = (t.shape[0] if rows is None else rows, x.shape[1], width - 1)
    if tuple(t.shape) != want:
        raise _error(where, "%s: expected shape [batch, dim, width - 1] = %s, got %s"
                     % (name, list(want), list(t.shape)))
    if t.dtype != x.dtype:
        raise _error(where, "%s: expected x's dtype %s, got %s" % (name, x.dtype, t.dtype))


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
                     return_final_states=False, final_states_out=None, activation=None):
    """out[b, d, t] = act(bias[d] + sum_k weight[d, k] * u_b[d, t + k]), u_b = h0_b ++ x_b.

    h0_b = initial_states[b] (zeros when None); the final state is the last width-1 entries of u_b.

    Args:
        x: [batch, dim, seqlen], any strides.
        weight: [dim, width].  bias: [dim] or None, weight's dtype.
        seq_idx: [batch, seqlen] int32/int64 sequence ids (packed sequences; negative = padding
            token, output 0), or None.
        initial_states: [batch, dim, width - 1], x's dtype, or None.
        return_final_states: also return the final states.
        final_states_out: [batch, dim, width - 1], x's dtype: written in place and returned
            when return_final_states (else ignored).
        activation: None, 'silu' or 'swish'.

    Returns out (x's shape, dtype and layout), or (out, final_states) when return_final_states.
    Differentiable in x, weight, bias and initial_states, through out and final_states.
    """
    where = "shortconv.dao.causal_conv1d_fn"
    _check_activation(activation)
    _check_tensor(where, "x", x, (3,), "[batch, dim, seqlen]")
    _check_tensor(where, "weight", weight, (2,), "[dim, width]")
    width = weight.shape[1]
    rows = x.shape[0] if seq_idx is None else None  # with seq_idx: one row per sequence id
    if initial_states is not None:
        _check_state(where, "initial_states", initial_states, x, width, rows)
    want_states = bool(return_final_states)
    if want_states and final_states_out is not None:
        _check_state(where, "final_states_out", final_states_out, x, width, rows)
    try:
        y, final_states = _F.causal_conv1d(
            x.transpose(1, 2), weight, bias, None, initial_states, want_states, activation,
            seq_idx=seq_idx, state_len=width - 1)
    except CausalConv1dError:
        raise
    except ShortConvError as e:
        raise CausalConv1dError("%s: %s" % (where, e), e.status) from None
    out = y.transpose(1, 2)
    if not want_states:
        return out
    if final_states_out is not None:
        # A copy the autograd graph records: gradients reach x and initial_states through it.
        final_states = final_states_out.copy_(final_states)
    return out, final_states


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None, *, overlap=None):
    """One decode step: out = act(bias + sum_k weight[:, k] * window[:, k]); conv_state updated.

    Without cache_seqlens the state row is shifted: the new row is the last state_len entries
    of row ++ x.  With cache_seqlens it is a ring: token i is written at
    (cache_seqlens + i) % state_len and the window before the first token is read from the
    width-1 entries before cache_seqlens % state_len.

    Args:
        x: [batch, dim] (one token) or [batch, dim, seqlen].
        conv_state: [batch, dim, state_len], state_len >= width - 1, x's dtype; or a pool
            [P, dim, state_len] with conv_state_indices.  Updated in place.
        weight: [dim, width].  bias: [dim] or None.  activation: None, 'silu' or 'swish'.
        cache_seqlens: [batch] int32, tokens already in each ring, or None.
        conv_state_indices: [batch] int32 pool rows; -1 = padding (output 0, state untouched:
            the core's zero_padded_outputs, in the step's own kernel on CUDA).
        overlap: shortconv's own (keyword only; causal-conv1d has no such argument): None,
            'launch' or 'reads', the decode kernel launched to overlap the kernel before it in
            the stream (shortconv.causal_conv1d_update's ``overlap``).

    Returns out, x's shape.  Not differentiable (causal-conv1d's is not either).
    """
    where = "shortconv.dao.causal_conv1d_update"
    _check_activation(activation)
    ov = 0 if overlap is None else (
        _F._OVERLAP_FAST.get(overlap) if type(overlap) is str else None)
    if ov is None:
        raise _error(where, "overlap: expected None, 'none', 'launch' or 'reads', got %r"
                     % (overlap,))
    # The common step (no cache_seqlens) in the native module's one pass: the lines below
    # on descriptions instead of views (tests/python/test_fast.py compares both).
    native = _fast._native
    if native is not None and cache_seqlens is None and not _ops.use_custom_op():
        try:
            y = native.update_dao(x, conv_state, weight, bias, conv_state_indices,
                                  _fast._ACTIVATIONS[activation], ov)
        except ShortConvError as e:
            raise CausalConv1dError("%s: %s" % (where, e), e.status) from None
        if y is not None:
            return y
    _check_tensor(where, "x", x, (2, 3), "[batch, dim] or [batch, dim, seqlen]")
    _check_tensor(where, "conv_state", conv_state, (3,), "[batch, dim, state_len]")
    if conv_state.dtype != x.dtype:
        raise _error(where, "conv_state: expected x's dtype %s, got %s"
                     % (x.dtype, conv_state.dtype))
    two_dims = x.dim() == 2
    xt = x if two_dims else x.transpose(1, 2)  # the core's [batch, dim] / [batch, T, dim]
    # causal-conv1d writes 0 for padded rows: the core's zero_padded_outputs (eager), or a
    # masked_fill after a traced call (its op computes them from a zero state)
    traced = _ops.use_custom_op()
    try:
        if conv_state_indices is not None and not traced:
            y = None
            if cache_seqlens is None:  # (without the native module: one pass on descriptions)
                y = _fast.update_fast(xt, conv_state, weight, bias, conv_state_indices, None,
                                      activation, ov, zero_pads=True)
            if y is None:
                y, _ = _F._update_general(xt, conv_state, None, weight, bias, activation,
                                          conv_state_indices, None, None, cache_seqlens, -1,
                                          None, None, None, None, None, None, None, 0, overlap,
                                          zero_pads=True)
        else:
            y, _ = _F.causal_conv1d_update(xt, conv_state, weight=weight, bias=bias,
                                           activation=activation,
                                           cache_indices=conv_state_indices,
                                           cache_seqlens=cache_seqlens, overlap=overlap)
    except CausalConv1dError:
        raise
    except ShortConvError as e:
        raise CausalConv1dError("%s: %s" % (where, e), e.status) from None
    if conv_state_indices is not None and traced:
        y.masked_fill_((conv_state_indices < 0).view(-1, 1) if two_dims
                       else (conv_state_indices < 0).view(-1, 1, 1), 0)
    return y if two_dims else y.transpose(1, 2)


def causal_conv1d_varlen_states(x, cu_seqlens, state_len):
    """states[n, :, j] = x[cu_seqlens[n+1] - state_len + j] if that token belongs to sequence n, else 0.

    The state each packed sequence leaves behind (its last state_len tokens, right-aligned,
    zeros before a sequence shorter than state_len): what causal_conv1d_fn would return as
    final states for the sequence on its own.

    Args:
        x: [total_tokens, dim].
        cu_seqlens: [batch + 1] int32/int64 offsets, sorted, starting at 0.
        state_len: int.

    Returns states [batch, dim, state_len] in x's dtype, stored as [batch, state_len, dim]
    (causal-conv1d's layout).  Device ops only: no host synchronisation.
    """
    where = "shortconv.dao.causal_conv1d_varlen_states"
    _check_tensor(where, "x", x, (2,), "[total_tokens, dim]")
    _check_tensor(where, "cu_seqlens", cu_seqlens, (1,), "[batch + 1]")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise _error(where, "cu_seqlens: expected int32 or int64, got %s" % cu_seqlens.dtype)
    if cu_seqlens.device != x.device:
        raise _error(where, "cu_seqlens is on %s but x is on %s" % (cu_seqlens.device, x.device))
    if isinstance(state_len, bool) or not isinstance(state_len, int):
        raise TypeError("%s: state_len: expected an int, got %s"
                        % (where, type(state_len).__name__))
    if state_len < 0:
        raise _error(where, "state_len: expected >= 0, got %d" % state_len)
    batch, dim = max(cu_seqlens.shape[0] - 1, 0), x.shape[1]
    if x.shape[0] == 0 or batch == 0:
        return x.new_zeros(batch, state_len, dim).transpose(1, 2)
    cu = cu_seqlens.to(torch.long)
    pos = cu[1:, None] + torch.arange(-state_len, 0, device=x.device)  # [batch, state_len]
    outside = (pos < cu[:-1, None]).unsqueeze(-1)
    rows = x.index_select(0, pos.clamp(min=0).flatten()).view(batch, state_len, dim)
    # masked_fill, not a product: a token of another sequence may be inf or NaN.
    return rows.masked_fill(outside, 0).transpose(1, 2)
