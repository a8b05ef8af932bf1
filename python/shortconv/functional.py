"""Public functions: FLA's causal_conv1d and a decode (in-place update) entry point.

Conventions (docs/semantics.md is the law):
- x is [B, T, D] in any strides (a channel-major view, a slice of a fused qkv
  projection, ...), [B, T, H, Dh] (flattened to [B, T, H*Dh] like FLA does,
  a view whenever the strides allow), or a packed batch [1, total, D] /
  [total, D] with cu_seqlens [N+1].
- weight is [D, W]; tap W-1 multiplies the current token.
- states are [N, D, S]; S defaults to W (FLA's convention) or to
  initial_state's last dim when one is given; state_len=W-1 gives
  causal-conv1d's [N, D, W-1] states; any S >= W-1 is allowed.
"""

import torch

from . import _fast, _ops
from ._args import check_flag, check_state_len, check_tensors
from ._lib import INT32_MAX, invalid
from ._ops import activation_code

__all__ = ["causal_conv1d", "causal_conv1d_update"]

# Forward-mode AD: inside a dual level the call goes through the autograd.Function,
# which has no jvp, so torch raises its standard error instead of the tangents
# being dropped (by the direct path, or by the custom op, which has no jvp rule).
_forward_ad = getattr(torch.autograd, "forward_ad", None)
if getattr(_forward_ad, "_current_level", None) is None:
    class _forward_ad:  # noqa: N801  (no forward AD in this torch)
        _current_level = -1

_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
# The defaults of causal_conv1d_update's block_size and pad_slot_id, compared by identity on
# the fast path (another object equal to them, 0.0 or numpy's 0, takes the checked path).
_NO_BLOCKS, _NO_PAD = 0, -1
_OVERLAP_CODES = {None: 0, "none": 0, "launch": 1, "reads": 2}  # sc_overlap
_OVERLAP_FAST = {"none": 0, "launch": 1, "reads": 2}  # (strings: `in` on a dict hashes them)


def overlap_code_of(overlap, where):
    """sc_overlap's value for causal_conv1d_update's ``overlap`` argument."""
    code = _OVERLAP_CODES.get(overlap) if isinstance(overlap, (str, type(None))) else None
    if code is None:
        raise ValueError("%s: overlap: expected None, 'none', 'launch' or 'reads', got %r"
                         % (where, overlap))
    return code


_increment_version = _ops._increment_version


def _flatten_heads(t):
    # [B, T, H, Dh] -> [B, T, H*Dh]: a view when H's stride is Dh times Dh's.
    return t.flatten(2) if t.dim() > 3 else t


def _check_seq_idx(x, initial_state, seq_idx, cu_seqlens, cp_context):
    """Errors the library cannot word in Python's terms (seq_idx's type, device, and shape)."""
    where = "shortconv.causal_conv1d"
    if cu_seqlens is not None or cp_context is not None:
        raise ValueError("%s: seq_idx: give either seq_idx or cu_seqlens/cp_context, not both"
                         % where)
    if not isinstance(seq_idx, _Tensor) or seq_idx.dtype not in (torch.int32, torch.int64):
        raise TypeError("%s: seq_idx: expected an int32/int64 torch.Tensor [B, T], got %s"
                        % (where, getattr(seq_idx, "dtype", type(seq_idx).__name__)))
    if x.dim() < 3 or seq_idx.dim() != 2 or tuple(seq_idx.shape) != tuple(x.shape[:2]):
        raise ValueError("%s: seq_idx: expected shape [B, T] = %s (x's first two dims), got %s"
                         % (where, list(x.shape[:2]), list(seq_idx.shape)))
    if seq_idx.device != x.device:
        raise ValueError("%s: seq_idx is on %s but x is on %s" % (where, seq_idx.device, x.device))
    if initial_state is not None and initial_state.dim() != 3:
        raise ValueError("%s: initial_state: expected [N, D, S] (row = sequence id)" % where)


def _seq_idx_rows(initial_state, output_final_state, seq_idx):
    """The state rows of a call with sequence ids (row i = id i; docs/semantics.md section 3):
    initial_state's, else max id + 1 when a final state is wanted (one host read), else 0."""
    if initial_state is not None:
        return initial_state.shape[0]
    if output_final_state and seq_idx.numel():
        return int(seq_idx.max()) + 1  # one host synchronisation: the row count
    return 0


def causal_conv1d(x, weight=None, bias=None, residual=None, initial_state=None,
                  output_final_state=False, activation=None, *, cu_seqlens=None, state_len=None,
                  backend=None, cu_seqlens_cpu=None, chunk_indices=None, seq_idx=None,
                  cp_context=None, **kwargs):
    """Short causal depthwise convolution: ``(y, final_state)``.

    y[n, t, d] = act(bias[d] + sum_k weight[d, k] * u_n[S-(W-1)+t+k, d]) + residual[n, t, d]
    with u_n = initial_state_n ++ x_n (zeros when initial_state is None) and
    final_state_n = the last S entries of u_n.

    Args:
        x: [B, T, D] (any strides), [B, T, H, Dh], or packed [1, total, D] / [total, D]
            with ``cu_seqlens``.
        weight: [D, W].
        bias: [D], optional, weight's dtype.
        residual: like x, optional; added after the activation.
        initial_state: [N, D, S], optional (zeros when absent).
        output_final_state: return final_state [N, D, S] (else None).
        activation: None, 'silu' or 'swish'.
        cu_seqlens: [N+1] int32/int64 offsets on x's device; x then holds N packed
            sequences (zero-length ones allowed).
        state_len: S; default initial_state.shape[-1] if given, else W (FLA).
            W-1 gives causal-conv1d's states.
        seq_idx: [B, T] int32/int64 sequence ids, instead of cu_seqlens: each run of one
            id in a row is a sequence, negative ids are padding (output 0, read by no
            token, no gradient to residual); initial_state row i and final_state row i
            belong to id i, final_state rows of ids that do not occur are 0
            (docs/semantics.md section 3).  The library finds the runs on the device
            without a host synchronisation, except that output_final_state without
            initial_state reads the number of rows (max id + 1) once.  With
            output_final_state (or a gradient of initial_state) each id must be one run;
            on the CPU an id past initial_state's rows is an error, on CUDA it reads a
            zero state and writes no row.
        backend, cu_seqlens_cpu, chunk_indices: accepted for FLA compatibility and
            ignored (the backend follows x's device).
        cp_context: context parallelism: an object with ``.group`` and ``.cu_seqlens``
            (global offsets), e.g. shortconv.distributed.build_context's; x is then this
            rank's shard and the call is shortconv.distributed.causal_conv1d.

    Differentiable in x, weight, bias, residual, initial_state, and through
    final_state, to any order: the backward is itself a short convolution, so
    gradient penalties (create_graph=True) get exact second derivatives in both
    the eager and the torch.compile paths.  Every tensor must be on x's device.
    Tensors must be dense strided; a lazily negated view is read as its values
    (a copy), sparse / nested / __torch_dispatch__ tensors are a TypeError.
    """
    # x, weight, bias and cu_seqlens only, in one pass (_fast.plain_call); anything else, or
    # anything it does not take, below.
    if (residual is None and initial_state is None and seq_idx is None and cp_context is None
            and output_final_state is False and not kwargs and _forward_ad._current_level < 0
            and not _ops.use_custom_op()):
        y = _fast.plain_call(x, weight, bias, cu_seqlens, state_len, activation)
        if y is not None:
            return y, None
    where = "shortconv.causal_conv1d"
    if weight is None:
        raise ValueError("shortconv.causal_conv1d: weight: required ([D, W])")
    # Tensors (not nested ones where .shape is read below), tested inline: this runs on
    # every call.  Anything else takes check_tensors, which names the argument.
    if (not isinstance(x, _Tensor) or not isinstance(weight, _Tensor) or x.is_nested
            or weight.is_nested or (bias is not None and not isinstance(bias, _Tensor))
            or (residual is not None and not isinstance(residual, _Tensor))
            or (initial_state is not None and (not isinstance(initial_state, _Tensor)
                                               or initial_state.is_nested))
            or (cu_seqlens is not None and not isinstance(cu_seqlens, _Tensor))):
        check_tensors(where, (
            ("x", x, "[B, T, D]"), ("weight", weight, "[D, W]"), ("bias", bias, "[D] or None"),
            ("residual", residual, "like x, or None"),
            ("initial_state", initial_state, "[N, D, S] or None"),
            ("cu_seqlens", cu_seqlens, "[N+1] (int32/int64) or None")))
    if kwargs:
        raise TypeError("shortconv.causal_conv1d: unexpected keyword argument(s) %s"
                        % ", ".join(sorted(kwargs)))
    if seq_idx is not None:
        _check_seq_idx(x, initial_state, seq_idx, cu_seqlens, cp_context)
    elif cp_context is not None:  # context parallelism: x is this rank's shard (distributed.py)
        from .distributed import _from_cp_context
        return _from_cp_context(x, weight, bias, residual, initial_state, output_final_state,
                                activation, cu_seqlens, state_len, cp_context)
    act = activation_code(activation, where)
    heads = None
    if x.dim() > 3:  # [B, T, H, Dh] -> [B, T, H*Dh]; y is viewed back
        heads = x.shape
        x = x.flatten(2)
    if residual is not None:
        residual = _flatten_heads(residual)
    # W beyond int32 is an error when the call is built (Call); S is bounded here, before
    # the final state is allocated with it.
    if state_len is None:
        if initial_state is not None and initial_state.dim() == 3:
            state_len = initial_state.shape[-1]
            if state_len > INT32_MAX:
                check_state_len(where, "initial_state", state_len, None)  # raises
        else:
            state_len = weight.shape[-1] if weight.dim() > 0 else 1
    else:
        state_len = check_state_len(where, "state_len", state_len,
                                    weight.shape[-1] if weight.dim() > 0 else 1)
    if output_final_state is not True and output_final_state is not False:
        output_final_state = check_flag(where, "output_final_state", output_final_state)

    rows = 0  # seq_idx: the state rows (row i = id i)
    if seq_idx is not None:
        rows = _seq_idx_rows(initial_state, output_final_state, seq_idx)

    forward_ad = _forward_ad._current_level >= 0
    final_state = None
    if _ops.use_custom_op() and not forward_ad:
        y, final_state = torch.ops.shortconv.causal_conv1d_fwd(
            x, weight, bias, residual, initial_state, cu_seqlens, state_len, act,
            output_final_state, seq_idx, rows)
        if not output_final_state:
            final_state = None
    elif forward_ad or (_grad_enabled() and (
            x.requires_grad or weight.requires_grad
            or (bias is not None and bias.requires_grad)
            or (residual is not None and residual.requires_grad)
            or (initial_state is not None and initial_state.requires_grad))):
        # (y, final_state), or y alone: an output autograd need not track
        y = _ops.CausalConv1dFunction.apply(x, weight, bias, residual, initial_state,
                                            cu_seqlens, state_len, act, output_final_state,
                                            seq_idx, rows)
        if output_final_state:
            y, final_state = y
    else:
        y, final_state = _ops.forward_impl(x, weight, bias, residual, initial_state, cu_seqlens,
                                           state_len, act, output_final_state, seq_idx=seq_idx,
                                           state_rows=rows)
    if heads is not None:
        y = y.view(heads)
    return y, final_state


def causal_conv1d_update(x, cache, residual=None, weight=None, bias=None, activation=None, *,
                         cache_indices=None, cu_seqlens=None, has_initial_state=None,
                         cache_seqlens=None, pad_slot_id=-1, num_accepted=None,
                         parent_tokens=None, block_table=None, initial_block=None,
                         final_block=None, first_block=None, computed_tokens=None, block_size=0,
                         overlap=None):
    """Decode step: new tokens for N sequences; ``cache`` updated in place.

    Returns ``(y, cache)`` like FLA's causal_conv1d_update.  Not differentiable
    (it mutates its state); use causal_conv1d for training.

    Args:
        x: [N, D] (one token per sequence), [N, T, D] (T tokens each, e.g.
            speculative tokens), [1, total, D] / [total, D] with cu_seqlens
            (packed), or any of these with [H, Dh] in place of D.  FLA's [1, N, D]
            (one token for each of N sequences) is recognised when cache has N
            rows, no cache_indices and no cu_seqlens are given.
        cache: [N, D, S] states, or a pool [P, D, S] with cache_indices; any
            S >= W-1 (FLA: W, causal-conv1d: W-1).  Read, then overwritten in place
            (its version counter is bumped like any in-place op's, so a backward
            through a graph that saved it raises instead of using the new values).
        weight: [D, W].  bias: [D], optional.  residual: like x, optional.
        activation: None, 'silu' or 'swish'.
        cache_indices: [N] int32/int64 pool rows; -1 (or pad_slot_id) = padding:
            zero state read, nothing written, outputs computed from the zero state.
        cu_seqlens: [N+1] offsets of a packed x.
        has_initial_state: [N] bool (or int32/int64), optional: false = sequence n
            starts from a zero state (its row is still written): a fresh prefill.
        cache_seqlens: [N] int32/int64 >= 0, optional: every cache row is a ring
            (causal-conv1d's semantics): entry j of sequence n's state is slot
            (cache_seqlens[n] + j) % S, the new tokens are written at slots
            (cache_seqlens[n] + i) % S; the caller advances cache_seqlens.
        pad_slot_id: an index in cache_indices that means padding, besides -1.
        num_accepted: [N] int32/int64, optional: speculative decoding (vLLM's
            num_accepted_tokens).  Sequence n's window is the W-1 entries of its row from
            num_accepted[n] - 1, and the row's first (W-2) + L_n entries become the last
            ones of window ++ tokens (entries after them are left as they are); rows hold
            S >= (W-2) + L_n entries, counts lie in [1, S - (W-1) + 1].
        parent_tokens: [N, M] int32/int64, optional: tree drafts (vLLM's
            retrieve_parent_token).  Token t >= 1 of sequence n reads the chain of its
            parents parent_tokens[n, t] in [0, t), token 0 the state; the row is updated
            as without it.
        block_table, initial_block, final_block: [N, M] and [N] each, int32/int64,
            optional, all three or none (vLLM's prefix-caching addressing): sequence n
            reads row block_table[n, initial_block[n]] of the pool and writes row
            block_table[n, final_block[n]] (cache_indices is then None).
        first_block, computed_tokens, block_size: prefix caching, with a block table:
            the chunk's first absolute position computed_tokens[n] and, at every block
            boundary (a multiple of block_size) strictly inside the chunk, the state so far
            written to row block_table[n, first_block[n] + k] (k-th boundary).
        overlap: None (or 'none'), 'launch' or 'reads' (the C ABI's exec.overlap; CUDA,
            compute capability 9.0 and newer, the common steps' kernels: docs/layouts.md
            "Serving steps"; results never depend on it).  'launch': the step's kernel starts while the kernel before it
            in the stream finishes and waits for it before touching memory, which hides
            the launch latency (programmatic dependent launch; in a CUDA graph too).
            'reads': it may also read cache, cache_indices, num_accepted, weight and bias
            before that wait, so the kernel right before it must not write them (an engine's input
            projection, which writes x, may precede it; the previous layer's step on
            another cache too).  Every output is written after the wait.

    The state addressing and the serving steps are docs/semantics.md section 5.  On the CPU
    every index tensor's contents are checked (a row out of the pool, an accepted count of 0,
    a parent after its token, ...: ShortConvError naming it, nothing written); on CUDA the
    kernels clamp them instead, unless the call runs inside shortconv.check_contents().
    """
    # The common decode step in one pass (x, cache, weight, bias, cache_indices and
    # num_accepted: _fast.update_fast); anything else, or anything it does not take, below.
    if (residual is None and cu_seqlens is None and has_initial_state is None
            and cache_seqlens is None and parent_tokens is None and block_table is None
            and initial_block is None and final_block is None and first_block is None
            and computed_tokens is None and block_size is _NO_BLOCKS and pad_slot_id is _NO_PAD
            and (overlap is None or (type(overlap) is str and overlap in _OVERLAP_FAST))
            and not _ops.use_custom_op()):
        y = _fast.update_fast(x, cache, weight, bias, cache_indices, num_accepted, activation,
                              0 if overlap is None else _OVERLAP_FAST[overlap])
        if y is not None:
            return y, cache
    return _update_general(x, cache, residual, weight, bias, activation, cache_indices,
                           cu_seqlens, has_initial_state, cache_seqlens, pad_slot_id,
                           num_accepted, parent_tokens, block_table, initial_block, final_block,
                           first_block, computed_tokens, block_size, overlap)


def _update_general(x, cache, residual, weight, bias, activation, cache_indices, cu_seqlens,
                    has_initial_state, cache_seqlens, pad_slot_id, num_accepted, parent_tokens,
                    block_table, initial_block, final_block, first_block, computed_tokens,
                    block_size, overlap, zero_pads=False):
    """causal_conv1d_update described field by field.  zero_pads (eager only; shortconv.dao's
    convention): a padded sequence's outputs are 0 (sc_conv_args.zero_padded_outputs)."""
    where = "shortconv.causal_conv1d_update"
    if weight is None:
        raise ValueError("shortconv.causal_conv1d_update: weight: required ([D, W])")
    if cache is None:
        raise ValueError("shortconv.causal_conv1d_update: cache: required ([N, D, S] or a pool "
                         "[P, D, S] with cache_indices)")
    if (not isinstance(x, _Tensor) or not isinstance(cache, _Tensor)
            or not isinstance(weight, _Tensor) or x.is_nested or cache.is_nested
            or weight.is_nested or (bias is not None and not isinstance(bias, _Tensor))
            or (residual is not None and (not isinstance(residual, _Tensor)
                                          or residual.is_nested))
            or (cache_indices is not None and not isinstance(cache_indices, _Tensor))
            or (cu_seqlens is not None and not isinstance(cu_seqlens, _Tensor))):
        check_tensors(where, (
            ("x", x, "[N, D] or [N, T, D]"), ("cache", cache, "[N, D, S] or a pool [P, D, S]"),
            ("weight", weight, "[D, W]"), ("bias", bias, "[D] or None"),
            ("residual", residual, "like x, or None"),
            ("cache_indices", cache_indices, "[N] (int32/int64) or None"),
            ("cu_seqlens", cu_seqlens, "[N+1] (int32/int64) or None")))
    if isinstance(bias, str) or isinstance(activation, _Tensor):
        raise TypeError(
            "%s: bias: got %r; this function takes FLA's argument order (x, cache, residual, "
            "weight, bias, activation). For causal-conv1d's order (x, conv_state, weight, bias, "
            "activation) use shortconv.dao.causal_conv1d_update" % (where, bias))
    if ((has_initial_state is not None and not isinstance(has_initial_state, _Tensor))
            or (cache_seqlens is not None and not isinstance(cache_seqlens, _Tensor))
            or (num_accepted is not None and not isinstance(num_accepted, _Tensor))
            or (parent_tokens is not None and not isinstance(parent_tokens, _Tensor))
            or any(t is not None and not isinstance(t, _Tensor) for t in (
                block_table, initial_block, final_block, first_block, computed_tokens))):
        check_tensors(where, (
            ("has_initial_state", has_initial_state, "[N] (bool/int32/int64) or None"),
            ("cache_seqlens", cache_seqlens, "[N] (int32/int64) or None"),
            ("num_accepted", num_accepted, "[N] (int32/int64) or None"),
            ("parent_tokens", parent_tokens, "[N, M] (int32/int64) or None"),
            ("block_table", block_table, "[N, M] (int32/int64) or None"),
            ("initial_block", initial_block, "[N] (int32/int64) or None"),
            ("final_block", final_block, "[N] (int32/int64) or None"),
            ("first_block", first_block, "[N] (int32/int64) or None"),
            ("computed_tokens", computed_tokens, "[N] (int32/int64) or None")))
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError("%s: block_size: expected an int, got %r" % (where, block_size))
    if isinstance(pad_slot_id, bool) or not isinstance(pad_slot_id, int):
        raise TypeError("%s: pad_slot_id: expected an int, got %r" % (where, pad_slot_id))
    overlap_code = overlap_code_of(overlap, where)
    if residual is not None and residual.shape != x.shape:
        raise invalid(where, "residual: expected x's shape %s, got %s"
                      % (list(x.shape), list(residual.shape)))
    if x.dim() == 0:
        raise invalid(where, "x: expected [N, D], [N, T, D] or packed [1, total, D], got a "
                             "0-dim tensor")
    act = activation_code(activation, where)
    shape = x.shape
    D = weight.shape[0] if weight.dim() > 0 else 0
    if x.shape[-1] != D:
        if x.dim() == 4:  # [B, T, H, Dh] -> [B, T, D]
            x = x.flatten(2)
            residual = residual.flatten(2) if residual is not None else None
        elif x.dim() == 3 and x.shape[-2] * x.shape[-1] == D:  # [N, H, Dh] -> [N, D]
            x = x.flatten(1)
            residual = residual.flatten(1) if residual is not None else None
    one_token = x.dim() == 2 and cu_seqlens is None  # [N, D]: one token for each of N sequences
    if one_token:
        if _ops.use_custom_op():  # traced: the [N, 1, D] view; eager: described as one directly
            x = x.unsqueeze(1)
            if residual is not None:
                residual = residual.unsqueeze(1)
            one_token = False
    elif (x.dim() == 3 and x.shape[0] == 1 and x.shape[1] > 1 and cu_seqlens is None
          and cache_indices is None and block_table is None and cache.dim() == 3
          and cache.shape[0] == x.shape[1]):
        # FLA's [1, N, D]: one token for each of N sequences -> [N, 1, D] (a view)
        x = x.transpose(0, 1)
        if residual is not None:
            residual = residual.transpose(0, 1)
    if _ops.use_custom_op():
        y = torch.ops.shortconv.causal_conv1d_update(x, cache, weight, bias, residual,
                                                     cache_indices, cu_seqlens, act,
                                                     has_initial_state, cache_seqlens, pad_slot_id,
                                                     num_accepted, parent_tokens, block_table,
                                                     initial_block, final_block, first_block,
                                                     computed_tokens, block_size, overlap_code)
    else:  # (no autograd involved: y is allocated with torch.empty_like, the rest is ctypes)
        y = _ops.update_impl(x, cache, weight, bias, residual, cache_indices, cu_seqlens, act,
                             has_initial_state, cache_seqlens, pad_slot_id, num_accepted,
                             parent_tokens, block_table, initial_block, final_block, first_block,
                             computed_tokens, block_size, one_token=one_token,
                             overlap=overlap_code, zero_pads=zero_pads)
        # The library wrote cache behind autograd's back: bump its version, as
        # every in-place op does, so a backward through a graph that saved
        # cache (e.g. as an initial_state) fails loudly instead of using the
        # new values.  Inference tensors have no version counter.
        if not cache.is_inference():
            _increment_version(cache)
    return (y if y.shape == shape else y.view(shape)), cache
