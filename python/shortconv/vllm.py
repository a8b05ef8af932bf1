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

Speculative decoding (``causal_conv1d_update(..., num_accepted_tokens=...)``, dense or with
``query_start_loc``) and tree drafts (``retrieve_parent_token``) are the core's serving steps
(docs/semantics.md section 5), one call each: the state is the width - 1 entries of the row
from ``num_accepted_tokens - 1``, the row's first (width - 2) + L_n entries become the last
ones of state ++ tokens, and a draft token's window follows its chain of parents.  Prefix
caching (``block_idx_first_scheduled_token``, ``block_idx_last_scheduled_token``,
``initial_state_idx``, ``num_computed_tokens``, ``block_size_to_align``, with a 2-D block
table as ``cache_indices`` / ``conv_state_indices``) is the core's block-table addressing and
snapshots (docs/semantics.md section 5): the state at every block boundary inside a prefill
chunk goes to the row of ``block_idx_first_scheduled_token + k``, the final state to the row
of ``block_idx_last_scheduled_token``, the initial state comes from ``initial_state_idx``'s;
given partially it is an error naming the missing ones.  Unlike vLLM's kernel, a chunk
shorter than width - 1 tokens also writes its final state to ``block_idx_last_scheduled_token``'s
row (vLLM writes it to the initial row), and a snapshot within the first width - 1 tokens of
a chunk is taken from the chunk's own initial state (vLLM reads the tokens before the chunk
in x, another sequence's); a sequence whose initial row is ``pad_slot_id`` reads a zero
state but still writes its rows unless they are padding too.

``metadata`` (vLLM's launch-plan cache), ``max_query_len`` (a shape hint) and
``validate_data`` (shortconv validates every call) do not change results and are accepted.  Neither function is
differentiable (neither is vLLM's).
"""


import re

import torch

from . import _fast, _ops
from . import functional as _F
from ._lib import ShortConvError

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


# activation -> the core's code, for the native step (True is silu; None and False none).
_FAST_ACT = {True: _fast._ACTIVATIONS["silu"], False: _fast._ACTIVATIONS[None],
             None: _fast._ACTIVATIONS[None], "silu": _fast._ACTIVATIONS["silu"],
             "swish": _fast._ACTIVATIONS["swish"]}


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
        cache_indices: [batch] int32 pool rows (None: row n), pad_slot_id = skipped; with
            prefix caching the block table [batch, blocks] of pool rows.
        has_initial_state: [batch] bool, or None (no sequence has one).
        activation: 'silu', 'swish', True, None or False.
        pad_slot_id: int (vLLM's PAD_SLOT_ID = -1).
        block_idx_first_scheduled_token, block_idx_last_scheduled_token, initial_state_idx,
            num_computed_tokens: [batch] int32 each, prefix caching (all or none): the blocks
            of the first snapshot, of the final state and of the initial state, and the
            chunk's first absolute position.
        block_size_to_align: the block size (>= 1 with prefix caching).
    Returns out, x's shape, dtype and layout.
    """
    where = "shortconv.vllm.causal_conv1d_fn"
    apc = _prefix_caching(where, (("block_idx_first_scheduled_token", block_idx_first_scheduled_token),
                                  ("block_idx_last_scheduled_token", block_idx_last_scheduled_token),
                                  ("initial_state_idx", initial_state_idx),
                                  ("num_computed_tokens", num_computed_tokens)),
                          block_size_to_align)
    activation = _activation(where, activation)
    _check_tensor(where, "x", x, (2,), "(dim, total_tokens)")
    _check_tensor(where, "weight", weight, (2,), "(dim, width)")
    _check_tensor(where, "conv_states", conv_states, (3,), "(num_cache_lines, dim, state_len)")
    _check_tensor(where, "query_start_loc", query_start_loc, (1,), "[batch + 1]")
    batch = max(query_start_loc.shape[0] - 1, 0)
    if has_initial_state is None:
        has_initial_state = torch.zeros(batch, dtype=torch.bool, device=x.device)
    cache = _state_view(conv_states, weight.shape[1])
    if apc:  # cache_indices is the block table [batch, blocks]
        if cache_indices is None:
            raise ValueError("%s: cache_indices: prefix caching needs the block table "
                             "[batch, blocks] of pool rows" % where)
        extra = dict(block_table=cache_indices, initial_block=initial_state_idx,
                     final_block=block_idx_last_scheduled_token,
                     first_block=block_idx_first_scheduled_token,
                     computed_tokens=num_computed_tokens, block_size=block_size_to_align)
        cache_indices = None
        if pad_slot_id is not None and pad_slot_id != -1:
            extra["pad_slot_id"] = pad_slot_id
    else:
        if cache_indices is None:
            cache = cache.narrow(0, 0, min(batch, cache.shape[0]))
        cache_indices, extra = _pad_args(where, cache_indices, pad_slot_id)
    xs = x if x.dtype == conv_states.dtype else x.to(conv_states.dtype)
    try:
        y, _ = _F.causal_conv1d_update(xs.t(), cache, weight=weight, bias=bias,
                                       activation=activation, cache_indices=cache_indices,
                                       cu_seqlens=query_start_loc,
                                       has_initial_state=has_initial_state, **extra)
    except ShortConvError as e:
        raise _vllm_names(e, _FN_NAMES) from None
    y = y.t()
    return y if y.dtype == x.dtype else y.to(x.dtype)


def _prefix_caching(where, given, block_size_to_align=None):
    """Whether vLLM's prefix-caching arguments are given: all of them, or none (an error
    names the missing ones); with block_size_to_align (causal_conv1d_fn) > 0."""
    names = [name for name, value in given if value is not None]
    if not names:
        return False
    missing = [name for name, value in given if value is None]
    if missing:
        raise ValueError("%s: prefix caching needs %s together; given %s, missing %s"
                         % (where, ", ".join(n for n, _ in given), ", ".join(names),
                            ", ".join(missing)))
    if block_size_to_align is not None and (isinstance(block_size_to_align, bool) or
                                            not isinstance(block_size_to_align, int) or
                                            block_size_to_align < 1):
        raise ValueError("%s: block_size_to_align: expected a block size >= 1 with prefix "
                         "caching, got %r" % (where, block_size_to_align))
    return True


# vLLM's argument names for the core's, in error messages.
_APC_NAMES = (("initial_block", "initial_state_idx"),
              ("final_block", "block_idx_last_scheduled_token"),
              ("first_block", "block_idx_first_scheduled_token"),
              ("computed_tokens", "num_computed_tokens"), ("block_size", "block_size_to_align"))
_UPDATE_NAMES = (("shortconv.causal_conv1d_update", "shortconv.vllm.causal_conv1d_update"),
                 ("num_accepted", "num_accepted_tokens"), ("parent_tokens", "retrieve_parent_token"),
                 ("block_table", "conv_state_indices"), ("cache_indices", "conv_state_indices"),
                 ("cu_seqlens", "query_start_loc"), ("cache", "conv_state")) + _APC_NAMES
_FN_NAMES = (("shortconv.causal_conv1d_update", "shortconv.vllm.causal_conv1d_fn"),
             ("block_table", "cache_indices"), ("cu_seqlens", "query_start_loc"),
             ("cache", "conv_states")) + _APC_NAMES


def _vllm_names(e, names):
    """e (a ShortConvError) with the core's argument names replaced by vLLM's."""
    msg = str(e)
    for core, theirs in names:
        msg = re.sub(r"(?<![A-Za-z0-9_.])%s(?![A-Za-z0-9_])" % re.escape(core), theirs, msg)
    return ShortConvError(msg, e.status)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None,
                         conv_state_indices=None, num_accepted_tokens=None, query_start_loc=None,
                         max_query_len=-1, pad_slot_id=PAD_SLOT_ID,
                         block_idx_last_scheduled_token=None, initial_state_idx=None,
                         retrieve_parent_token=None, validate_data=False, *, overlap=None):
    """Decode step: out[..., t] = act(bias + sum_k weight[:, k] * u[:, q_t(k)]); rows in place.

    u = the state row's window ++ the step's tokens; q_t(k) = the W-1 positions before token
    t, or with retrieve_parent_token its chain of parents.  Without speculative decoding the
    state is the row's first width-1 entries and becomes the last width-1 entries of u; with
    num_accepted_tokens it is the width-1 entries from num_accepted_tokens[n] - 1 and the
    row's first (width-2) + L_n entries become u[1:] (docs/semantics.md section 5).  One call
    of the core, no host synchronisation.

    Args:
        x: [batch, dim] (one token each), [batch, dim, seqlen], or [total_tokens, dim] with
            query_start_loc [batch + 1] int32 (then conv_state_indices is required).
        conv_state: (num_cache_lines, dim, state_len >= width - 1); speculative decoding
            needs state_len >= (width - 1) + (seqlen - 1).
        weight: (dim, width).  bias: (dim,) or None.
        activation: 'silu', 'swish', True, None or False.
        conv_state_indices: [batch] int32 rows (None: row b for sequence b); pad_slot_id =
            padding (state untouched, output unspecified as in vLLM).
        num_accepted_tokens: [batch] int32, tokens of each sequence's previous step that
            were accepted (1 .. seqlen).
        query_start_loc: [batch + 1] int32 offsets of a varlen x.
        max_query_len: the longest sequence with query_start_loc (a hint; not needed here).
        retrieve_parent_token: [batch, seqlen] int32, the parent (an earlier token of the
            step) of every draft token after the first (EAGLE trees).
        block_idx_last_scheduled_token, initial_state_idx: [batch] int32, prefix caching
            (both or none): conv_state_indices is then the block table [batch, blocks], the
            state is read from the row of initial_state_idx and written to the row of
            block_idx_last_scheduled_token.
        overlap: shortconv's own (keyword only; vLLM has no such argument): None, 'launch'
            or 'reads', the decode kernel launched to overlap the kernel before it in the
            stream (shortconv.causal_conv1d_update's ``overlap``).
    Returns out, x's shape, dtype and layout.
    """
    # The common step (no query_start_loc, tree, prefix caching or other pad id; x of
    # conv_state's dtype) in the native module's one pass: what the lines below do with
    # views, done on the descriptions (tests/python/test_fast.py compares both).
    native = _fast._native
    if (native is not None and query_start_loc is None and retrieve_parent_token is None
            and block_idx_last_scheduled_token is None and initial_state_idx is None
            and (pad_slot_id is None or pad_slot_id == -1)
            and (overlap is None or (type(overlap) is str and overlap in _F._OVERLAP_FAST))
            and not _ops.use_custom_op()):
        act = _FAST_ACT.get(activation) if type(activation) in (bool, str, type(None)) else None
        if act is not None:
            try:
                y = native.update_vllm(x, conv_state, weight, bias, conv_state_indices,
                                       num_accepted_tokens, act,
                                       0 if overlap is None else _F._OVERLAP_FAST[overlap])
            except ShortConvError as e:
                raise _vllm_names(e, _UPDATE_NAMES) from None
            if y is not None:
                return y
    where = "shortconv.vllm.causal_conv1d_update"
    _F.overlap_code_of(overlap, where)  # (checked here to carry this function's name)
    apc = ((block_idx_last_scheduled_token is not None or initial_state_idx is not None)
           and _prefix_caching(where, (("block_idx_last_scheduled_token",
                                        block_idx_last_scheduled_token),
                                       ("initial_state_idx", initial_state_idx))))
    activation = _activation(where, activation)
    _check_tensor(where, "x", x, (2, 3), "[batch, dim], [batch, dim, seqlen] or [tokens, dim]")
    _check_tensor(where, "weight", weight, (2,), "(dim, width)")
    _check_tensor(where, "conv_state", conv_state, (3,), "(num_cache_lines, dim, state_len)")
    width = weight.shape[1]
    # vLLM's kernels use entries [0, width-1) of a row, or with speculative decoding the row
    # up to (width-1) + (seqlen-1): the state is that view, or the whole row.
    cache = conv_state if num_accepted_tokens is not None else _state_view(conv_state, width)
    if query_start_loc is not None:
        if conv_state_indices is None:
            raise ValueError("%s: conv_state_indices: required with query_start_loc (as in vLLM)"
                             % where)
        if x.dim() != 2:
            raise ValueError("%s: x: expected [total_tokens, dim] with query_start_loc, got shape %s"
                             % (where, list(x.shape)))
    elif conv_state_indices is None and not apc:
        cache = cache.narrow(0, 0, min(x.shape[0], cache.shape[0]))
    if apc:  # conv_state_indices is the block table [batch, blocks]
        if conv_state_indices is None:
            raise ValueError("%s: conv_state_indices: prefix caching needs the block table "
                             "[batch, blocks] of pool rows" % where)
        extra = dict(block_table=conv_state_indices, initial_block=initial_state_idx,
                     final_block=block_idx_last_scheduled_token)
        conv_state_indices = None
        if pad_slot_id is not None and pad_slot_id != -1:
            extra["pad_slot_id"] = pad_slot_id
    else:
        conv_state_indices, extra = _pad_args(where, conv_state_indices, pad_slot_id)
    xs = x if x.dtype == conv_state.dtype else x.to(conv_state.dtype)
    if xs.dim() == 3:
        xs = xs.transpose(1, 2)  # the core's [batch, seqlen, dim]
    try:
        y, _ = _F.causal_conv1d_update(xs, cache, weight=weight, bias=bias, activation=activation,
                                       cache_indices=conv_state_indices, cu_seqlens=query_start_loc,
                                       num_accepted=num_accepted_tokens,
                                       parent_tokens=retrieve_parent_token, overlap=overlap,
                                       **extra)
    except ShortConvError as e:
        raise _vllm_names(e, _UPDATE_NAMES) from None
    if y.dim() == 3:
        y = y.transpose(1, 2)
    return y if y.dtype == x.dtype else y.to(x.dtype)
