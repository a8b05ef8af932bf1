"""vLLM's Mamba conv ops (vllm/model_executor/layers/mamba/ops/causal_conv1d.py) over shortconv.

    out = causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, cache_indices,
                           has_initial_state, activation, pad_slot_id)       # packed prefill
    out = causal_conv1d_update(x, conv_state, weight, bias, activation,
                               conv_state_indices=..., pad_slot_id=...)      # decode step

Switching is one import (``from shortconv.vllm import ...``).  vLLM's conventions:

- ``causal_conv1d_fn``: x is ``(dim, total_tokens)``, the sequences of a batch side by side
  (usually a transposed view of a token-major buffer); ``query_start_loc`` ``[batch + 1]``
  offsets; the states live in a pool ``conv_states`` ``(num_cache_lines, dim, state_len)``;
  sequence n reads and writes row ``cache_indices[n]`` (row n when None);
  ``has_initial_state[n]`` False (or ``has_initial_state`` None) means a zero initial state,
  the row is written all the same; a sequence whose ``cache_indices`` entry is ``pad_slot_id``
  is skipped (nothing read or written; its output is left as the core computes it, from a
  zero state -- vLLM leaves it unwritten, so no value is promised);
- ``causal_conv1d_update``: x is ``[batch, dim]``, ``[batch, dim, seqlen]`` or, with
  ``query_start_loc``, ``[total_tokens, dim]``; ``conv_state`` a pool updated in place
  (rows ``conv_state_indices``, or 0..batch-1 when None);
- both: the first ``width - 1`` entries of a state row are the state (vLLM reads and writes
  only those, whatever ``state_len``); x is cast to the state dtype for the computation and the
  output back to x's dtype (vLLM's rounding); ``activation`` True means 'silu', False/None none.

Speculative decoding (``causal_conv1d_update(..., num_accepted_tokens=...)`` with x
``[batch, dim, seqlen]``) follows vLLM: the state is the width - 1 entries of the row from
``num_accepted_tokens - 1``, and the row's first (width - 1) + (seqlen - 1) entries become the
last ones of state ++ tokens.  Arguments vLLM takes for speculative decoding with
``query_start_loc``, tree drafts (``retrieve_parent_token``) and prefix caching (``block_idx_first_scheduled_token``,
``block_idx_last_scheduled_token``, ``initial_state_idx``, ``num_computed_tokens``) raise
NotImplementedError naming them.  ``metadata`` (vLLM's launch-plan cache), ``max_query_len``
(a shape hint), ``block_size_to_align`` (used by prefix caching only) and ``validate_data``
(shortconv validates every call) do not change results and are accepted.  Neither function is
differentiable (neither is vLLM's).
"""


import torch

from . import functional as _F

__all__ = ["causal_conv1d_fn", "causal_conv1d_update", "PAD_SLOT_ID"]

PAD_SLOT_ID = -1  # vllm.attention.backends.utils.PAD_SLOT_ID

_Tensor = torch.Tensor


def _activation(where, activation):
    if activation is True:
        return "silu"
    if activation is False or activation is None:
        return None
    if activation in ("silu", "swish"):
        return activation
    # vLLM asserts (update) or silently runs no activation (fn): refuse instead.
    raise ValueError("%s: activation: expected True, False, None, 'silu' or 'swish', got %r"
                     % (where, activation))


def _not_implemented(where, given, what):
    names = [name for name, value in given if value is not None]
    if names:
        raise NotImplementedError(
            "%s: %s (%s) is not supported by shortconv yet" % (where, what, ", ".join(names)))


def _check_tensor(where, name, t, rank, expected):
    if not isinstance(t, _Tensor):
        raise TypeError("%s: %s: expected a torch.Tensor %s, got %s"
                        % (where, name, expected, type(t).__name__))
    if t.dim() not in rank:
        raise ValueError("%s: %s: expected %s, got shape %s"
                         % (where, name, expected, list(t.shape)))


def _state_view(conv_state, width):
    # vLLM's kernels use entries [0, width-1) of a row: the state is that view.
    if conv_state.shape[-1] != width - 1 and width >= 1:
        return conv_state.narrow(-1, 0, width - 1)
    return conv_state


def _pad_args(where, indices, pad_slot_id):
    """(indices, extra core kwargs) with pad_slot_id expressed for the core."""
    if indices is None or pad_slot_id is None or pad_slot_id == -1:
        return indices, {}
    return indices, {"pad_slot_id": pad_slot_id}


def causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, cache_indices=None,
                     has_initial_state=None, activation="silu", pad_slot_id=PAD_SLOT_ID,
                     block_idx_first_scheduled_token=None, block_idx_last_scheduled_token=None,
                     initial_state_idx=None, num_computed_tokens=None, block_size_to_align=0,
                     metadata=None, validate_data=False):
    """Packed prefill: out[:, t] = act(bias + sum_k weight[:, k] * u_n[:, t - start_n + k]).

    u_n = h0_n ++ x[:, start_n:end_n] with h0_n = conv_states[cache_indices[n], :, :width-1]
    when has_initial_state[n], else zeros; that row then holds the last width-1 entries of u_n.

    Args:
        x: (dim, total_tokens), any strides.  weight: (dim, width).  bias: (dim,) or None.
        conv_states: (num_cache_lines, dim, state_len >= width - 1), updated in place.
        query_start_loc: [batch + 1] int32 offsets of the sequences in x.
        cache_indices: [batch] int32 pool rows (None: row n), pad_slot_id = skipped.
        has_initial_state: [batch] bool, or None (no sequence has one).
        activation: 'silu', 'swish', True, None or False.
        pad_slot_id: int (vLLM's PAD_SLOT_ID = -1).
    Returns out, x's shape, dtype and layout.
    """
    where = "shortconv.vllm.causal_conv1d_fn"
    _not_implemented(where, (("block_idx_first_scheduled_token", block_idx_first_scheduled_token),
                             ("block_idx_last_scheduled_token", block_idx_last_scheduled_token),
                             ("initial_state_idx", initial_state_idx),
                             ("num_computed_tokens", num_computed_tokens)), "prefix caching")
    activation = _activation(where, activation)
    _check_tensor(where, "x", x, (2,), "(dim, total_tokens)")
    _check_tensor(where, "weight", weight, (2,), "(dim, width)")
    _check_tensor(where, "conv_states", conv_states, (3,), "(num_cache_lines, dim, state_len)")
    _check_tensor(where, "query_start_loc", query_start_loc, (1,), "[batch + 1]")
    batch = max(query_start_loc.shape[0] - 1, 0)
    if has_initial_state is None:
        has_initial_state = torch.zeros(batch, dtype=torch.bool, device=x.device)
    cache = _state_view(conv_states, weight.shape[1])
    if cache_indices is None:
        cache = cache.narrow(0, 0, min(batch, cache.shape[0]))
    cache_indices, extra = _pad_args(where, cache_indices, pad_slot_id)
    xs = x.to(conv_states.dtype)
    y, _ = _F.causal_conv1d_update(xs.t(), cache, weight=weight, bias=bias, activation=activation,
                                   cache_indices=cache_indices, cu_seqlens=query_start_loc,
                                   has_initial_state=has_initial_state, **extra)
    return y.t().to(x.dtype)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None,
                         conv_state_indices=None, num_accepted_tokens=None, query_start_loc=None,
                         max_query_len=-1, pad_slot_id=PAD_SLOT_ID,
                         block_idx_last_scheduled_token=None, initial_state_idx=None,
                         retrieve_parent_token=None, validate_data=False):
    """Decode step: each sequence's tokens after its state row; the row updated in place.

    The new row (its first width-1 entries) is the last width-1 entries of row ++ tokens.

    Args:
        x: [batch, dim] (one token each), [batch, dim, seqlen], or [total_tokens, dim] with
            query_start_loc [batch + 1] int32 (then conv_state_indices is required).
        conv_state: (num_cache_lines, dim, state_len >= width - 1).
        weight: (dim, width).  bias: (dim,) or None.
        activation: 'silu', 'swish', True, None or False.
        conv_state_indices: [batch] int32 rows (None: row b for sequence b); pad_slot_id =
            padding (state untouched, output unspecified as in vLLM).
        max_query_len: the longest sequence with query_start_loc (a hint; not needed here).
    Returns out, x's shape, dtype and layout.
    """
    where = "shortconv.vllm.causal_conv1d_update"
    if num_accepted_tokens is not None and query_start_loc is not None:
        _not_implemented(where, (("num_accepted_tokens", num_accepted_tokens),),
                         "speculative decoding with query_start_loc (varlen)")
    _not_implemented(where, (("retrieve_parent_token", retrieve_parent_token),),
                     "tree-shaped speculative drafts")
    _not_implemented(where, (("block_idx_last_scheduled_token", block_idx_last_scheduled_token),
                             ("initial_state_idx", initial_state_idx)), "prefix caching")
    activation = _activation(where, activation)
    _check_tensor(where, "x", x, (2, 3), "[batch, dim], [batch, dim, seqlen] or [tokens, dim]")
    _check_tensor(where, "weight", weight, (2,), "(dim, width)")
    _check_tensor(where, "conv_state", conv_state, (3,), "(num_cache_lines, dim, state_len)")
    cache = _state_view(conv_state, weight.shape[1])
    if query_start_loc is not None:
        if conv_state_indices is None:
            raise ValueError("%s: conv_state_indices: required with query_start_loc (as in vLLM)"
                             % where)
        if x.dim() != 2:
            raise ValueError("%s: x: expected [total_tokens, dim] with query_start_loc, got shape %s"
                             % (where, list(x.shape)))
    elif conv_state_indices is None:
        cache = cache.narrow(0, 0, min(x.shape[0], cache.shape[0]))
    if num_accepted_tokens is not None:
        return _speculative_update(where, x, conv_state, weight, bias, activation,
                                   conv_state_indices, num_accepted_tokens, pad_slot_id)
    conv_state_indices, extra = _pad_args(where, conv_state_indices, pad_slot_id)
    xs = x.to(conv_state.dtype)
    if xs.dim() == 3:
        xs = xs.transpose(1, 2)  # the core's [batch, seqlen, dim]
    y, _ = _F.causal_conv1d_update(xs, cache, weight=weight, bias=bias, activation=activation,
                                   cache_indices=conv_state_indices, cu_seqlens=query_start_loc,
                                   **extra)
    if y.dim() == 3:
        y = y.transpose(1, 2)
    return y.to(x.dtype)


def _speculative_update(where, x, conv_state, weight, bias, activation, indices, accepted,
                        pad_slot_id):
    """vLLM's speculative decode step, in the core's terms (docs/semantics.md section 5).

    A row holds E = (width - 1) + (seqlen - 1) entries or more.  After the previous step
    accepted a_n of its tokens, the state of sequence n is the width - 1 entries of its row
    starting at a_n - 1; with u_n = that window ++ x_n, the outputs are the convolution of
    u_n and the row's first E entries become the last E entries of u_n (u_n[1:]); entries past
    E are left as they are.  Done with device ops (no host synchronisation): the windows are
    gathered into initial states of length E (width - 1 entries at the end, the rest zeros,
    which feed no output), one core forward returns the final states u_n[-E:], and they are
    written back into the rows.  Padded slots (``pad_slot_id``, -1) read and write nothing.
    """
    _check_tensor(where, "num_accepted_tokens", accepted, (1,), "[batch] int32")
    if accepted.dtype not in (torch.int32, torch.int64):
        raise TypeError("%s: num_accepted_tokens: expected int32 or int64, got %s"
                        % (where, accepted.dtype))
    xs = x.to(conv_state.dtype)
    if xs.dim() == 2:
        xs = xs.unsqueeze(-1)
    batch, dim, seqlen = xs.shape
    width = weight.shape[1]
    rows_total, _, row_len = conv_state.shape
    E = width - 1 + seqlen - 1
    if accepted.shape[0] != batch:
        raise ValueError("%s: num_accepted_tokens: expected shape [batch] = [%d], got %s"
                         % (where, batch, list(accepted.shape)))
    if E > row_len or width < 2:
        raise ValueError("%s: conv_state: speculative decoding of %d tokens with width %d needs "
                         "rows of at least (width - 1) + (seqlen - 1) = %d entries, got %d"
                         % (where, seqlen, width, E, row_len))
    if indices is None:
        rows = torch.arange(batch, device=xs.device)
        if batch > rows_total:
            raise ValueError("%s: conv_state: expected at least batch = %d rows, got %d"
                             % (where, batch, rows_total))
    else:
        _check_tensor(where, "conv_state_indices", indices, (1,), "[batch] int32")
        rows = indices.long()
    pad = (rows == pad_slot_id) | (rows == -1)
    safe_rows = torch.where(pad, torch.zeros_like(rows), rows)
    a = accepted.to(xs.device).long()
    # 1 <= a_n and the window inside the row: checked on the device (no synchronisation)
    torch._assert_async((((a >= 1) & (a - 1 + width - 1 <= row_len)) | pad).all())
    torch._assert_async((((safe_rows >= 0) & (safe_rows < rows_total)) | pad).all())
    window = (a - 1).clamp(min=0).view(-1, 1, 1) + torch.arange(width - 1, device=xs.device)
    window = window.clamp(max=row_len - 1).expand(batch, dim, width - 1)
    h0_window = conv_state[safe_rows].gather(2, window)            # [batch, dim, width - 1]
    h0 = torch.cat([h0_window.new_zeros(batch, dim, E - (width - 1)), h0_window], 2)
    y, final = _F.causal_conv1d(xs.transpose(1, 2), weight, bias, None, h0, True, activation,
                                state_len=E)
    # Rows of real sequences <- u_n[-E:].  A padded slot must write nothing, but one
    # index_copy_ writes every entry: each pad entry repeats a real sequence's write (the
    # same row, the same values, so the order of duplicate writes cannot matter); with no
    # real sequence at all, row 0 gets its own contents back.
    pad3 = pad.view(-1, 1, 1)
    vals = torch.where(pad3, conv_state[safe_rows, :, :E], final.to(conv_state.dtype))
    donor = torch.argmax((~pad).to(torch.int8))  # the first real sequence (0 if none)
    target = torch.where(pad, safe_rows[donor], safe_rows)
    vals = torch.where(pad3, vals[donor].unsqueeze(0), vals)
    conv_state[:, :, :E].index_copy_(0, target, vals)
    y = y.transpose(1, 2)
    if x.dim() == 2:
        y = y.squeeze(-1)
    return y.to(x.dtype)
