"""The three operations over the C ABI, and how autograd / torch.compile see them.

forward_impl / backward_impl / update_impl allocate outputs with torch, describe
every tensor with its own shape and strides (no .contiguous() copies) and call
the library on x's device (CUDA: torch's current stream, workspace from torch's
caching allocator, so CUDA-graph capture works).

On torch >= 2.4 they are registered as custom ops
    torch.ops.shortconv.causal_conv1d_fwd / causal_conv1d_bwd / causal_conv1d_update
with fake (meta) implementations and autograd, so torch.compile(fullgraph=True)
traces them with no graph break.  In eager mode the public functions call the
same implementations through a torch.autograd.Function instead (the custom-op
dispatch costs tens of µs of Python per call, which would dominate small
calls); set SHORTCONV_EAGER_CUSTOM_OP=1 to route eager calls through the custom
ops too.  On torch < 2.4 (or SHORTCONV_DISABLE_CUSTOM_OP=1) only the
autograd.Function exists.

Both paths differentiate the backward too (a double backward, e.g. a gradient
penalty): its VJP is built from forward and backward calls of the same path
(_double_backward.py), so the two agree and every order is exact.

Absent outputs cross the custom-op boundary as empty tensors (a schema cannot
return None); the public functions turn them back into None.
"""

import os

import torch

from ._double_backward import backward_vjp
from ._layout import like_contiguous, like_x
from ._lib import ACT_NONE, ACT_SILU, ACTIVATIONS, FLAG_CODES, INDEX_CODES, Call

# Argument names of the decode entry point, for the library's messages.
_CACHE_NAMES = {
    "initial_state_indices": "cache_indices",
    "final_state_indices": "cache_indices",
    "initial_state": "cache",
    "final_state": "cache",
    "ring_offsets": "cache_seqlens",
}

# The library's activation names, None for identity, and the aliases models use.
_ALIASES = {"swish": "silu"}
_ACTIVATIONS = dict(ACTIVATIONS)
_ACTIVATIONS.update({alias: ACTIVATIONS[name] for alias, name in _ALIASES.items()
                     if name in ACTIVATIONS})
_ACTIVATIONS[None] = ACTIVATIONS["identity"]
_NAMES = [repr(k) for k in _ACTIVATIONS if k is not None]
_EXPECTED = "None, " + ", ".join(_NAMES[:-1]) + " or " + _NAMES[-1]


def activation_code(activation, where="shortconv"):
    try:
        return _ACTIVATIONS[activation]
    except (KeyError, TypeError):
        raise ValueError("%s: activation: expected %s, got %r"
                         % (where, _EXPECTED, activation)) from None


def _num_seqs(x, cu_seqlens, seq_idx=None, state_rows=0):
    """Rows of the states a call returns: N, or with seq_idx the id rows (row i = id i)."""
    if seq_idx is not None:
        return state_rows
    if cu_seqlens is not None:
        return max(cu_seqlens.shape[0] - 1, 0) if cu_seqlens.dim() == 1 else 0
    return x.shape[0]


def _width(weight):
    return weight.shape[-1] if weight.dim() > 0 else 1


# ---- implementations (eager, real tensors) -------------------------------------
# Outputs follow _layout.py: y and dx like x (x's strides when x is dense), the others
# contiguous.  The fake implementations below allocate the same way.
def _call(where, x, weight, bias, cu_seqlens, initial_state, state_len, activation, seq_idx):
    """A Call with the inputs both directions read, and what set() returned for each
    (x, weight, bias, cu_seqlens, initial_state, seq_idx; None when absent)."""
    c = Call(where, x, _width(weight), state_len, activation)
    seen = (c.set("x", x), c.set("weight", weight),
            c.set("bias", bias) if bias is not None else None,
            c.set("cu_seqlens", cu_seqlens, INDEX_CODES) if cu_seqlens is not None else None,
            c.set("seq_idx", seq_idx, INDEX_CODES) if seq_idx is not None else None,
            c.set("initial_state", initial_state) if initial_state is not None else None)
    return c, seen


def _state_out(c, seen, field, x, cu_seqlens, initial_state, state_len, dtype, seq_idx, rows,
               zeros=False):
    """A state output [N, D, S] (seq_idx: [rows, D, S]): like initial_state when there is
    one (the same shape once validated), else new; zero-filled when ``zeros``."""
    if initial_state is not None and initial_state.dtype == dtype and not zeros:
        return c.out_like(field, initial_state, seen[5])
    shape = (_num_seqs(x, cu_seqlens, seq_idx, rows), x.shape[-1], state_len)
    return c.out_new(field, shape, dtype, zeros)


def _run_forward(c, seen, x, residual, initial_state, cu_seqlens, state_len,
                 output_final_state, seq_idx, state_rows):
    if residual is not None:
        c.set("residual", residual)
    y = c.out_like_x("y", x, seen[0])
    final_state = None
    if output_final_state:
        sdtype = initial_state.dtype if initial_state is not None else x.dtype
        # (seq_idx: the library leaves rows of ids that do not occur unwritten)
        final_state = _state_out(c, seen, "final_state", x, cu_seqlens, initial_state,
                                 state_len, sdtype, seq_idx, state_rows, seq_idx is not None)
    c.run_forward()
    return y, final_state


def forward_impl(x, weight, bias, residual, initial_state, cu_seqlens, state_len, activation,
                 output_final_state, where="shortconv.causal_conv1d", seq_idx=None,
                 state_rows=0):
    """y [like x] and final_state [N, D, S] (None unless requested).

    seq_idx [B, T]: sequence ids (docs/semantics.md section 3); final_state is then
    [state_rows, D, S], row i = id i's final state, zeros for ids that do not occur."""
    c, seen = _call(where, x, weight, bias, cu_seqlens, initial_state, state_len, activation,
                    seq_idx)
    return _run_forward(c, seen, x, residual, initial_state, cu_seqlens, state_len,
                        output_final_state, seq_idx, state_rows)


def _run_backward(c, seen, x, weight, bias, initial_state, cu_seqlens, dy, dht, state_len,
                  need_dx, need_dweight, need_dbias, need_dinitial_state, seq_idx):
    if dy is not None:
        c.set("dy", dy)
    if dht is not None:
        c.set("dfinal_state", dht)
    dx = dweight = dbias = dh0 = None
    if need_dx:
        dx = c.out_like_x("dx", x, seen[0])
    if need_dweight:
        dweight = c.out_like("dweight", weight, seen[1])
    if need_dbias and bias is not None:
        dbias = c.out_like("dbias", bias, seen[2])
    if need_dinitial_state:
        sdtype = (initial_state.dtype if initial_state is not None
                  else dht.dtype if dht is not None else x.dtype)
        rows = initial_state.shape[0] if initial_state is not None else 0
        dh0 = _state_out(c, seen, "dinitial_state", x, cu_seqlens, initial_state, state_len,
                         sdtype, seq_idx, rows)
    if dx is None and dweight is None and dbias is None and dh0 is None:
        return None, None, None, None
    c.run_backward()
    return dx, dweight, dbias, dh0


def backward_impl(x, weight, bias, initial_state, cu_seqlens, dy, dht, state_len, activation,
                  need_dx, need_dweight, need_dbias, need_dinitial_state,
                  where="shortconv.causal_conv1d (backward)", seq_idx=None):
    """(dx, dweight, dbias, dinitial_state), each None unless requested.

    seq_idx: dinitial_state has initial_state's rows (row i = id i's, zeros for ids
    that do not occur)."""
    c, seen = _call(where, x, weight, bias, cu_seqlens, initial_state, state_len, activation,
                    seq_idx)
    return _run_backward(c, seen, x, weight, bias, initial_state, cu_seqlens, dy, dht,
                         state_len, need_dx, need_dweight, need_dbias, need_dinitial_state,
                         seq_idx)


def _same_memory(seen, x, weight, bias, cu_seqlens, initial_state, seq_idx):
    """Whether the saved inputs are still the memory set() described (an input whose storage
    was swapped since, e.g. by ``.data =``, must be described again)."""
    sx, sw, sb, scu, sid, sh0 = seen
    return (x.data_ptr() == sx[2] and weight.data_ptr() == sw[2]
            and (bias is None or bias.data_ptr() == sb[2])
            and (cu_seqlens is None or cu_seqlens.data_ptr() == scu[2])
            and (seq_idx is None or seq_idx.data_ptr() == sid[2])
            and (initial_state is None or initial_state.data_ptr() == sh0[2]))


def _backward_from(snapshot, seen, x, weight, bias, initial_state, cu_seqlens, dy, dht,
                   state_len, activation, need_dx, need_dweight, need_dbias, need_dinitial_state,
                   seq_idx):
    """backward_impl for the forward that took ``snapshot`` (and set() returned ``seen``):
    its inputs are already described, when the saved tensors still hold that memory."""
    where = "shortconv.causal_conv1d (backward)"
    if snapshot is not None and _same_memory(seen, x, weight, bias, cu_seqlens, initial_state,
                                             seq_idx):
        c = Call.resume(where, snapshot)
    else:
        c, seen = _call(where, x, weight, bias, cu_seqlens, initial_state, state_len,
                        activation, seq_idx)
    return _run_backward(c, seen, x, weight, bias, initial_state, cu_seqlens, dy, dht,
                         state_len, need_dx, need_dweight, need_dbias, need_dinitial_state,
                         seq_idx)


def update_impl(x, cache, weight, bias, residual, cache_indices, cu_seqlens, activation,
                has_initial_state=None, cache_seqlens=None, pad_slot_id=-1, num_accepted=None,
                parent_tokens=None, block_table=None, initial_block=None, final_block=None,
                first_block=None, computed_tokens=None, block_size=0,
                where="shortconv.causal_conv1d_update", one_token=False, overlap=0,
                zero_pads=False):
    """y [like x]; cache (a state [N, D, S] or pool [P, D, S]) updated in place.
    has_initial_state [N] (false: zero state read), cache_seqlens [N] (ring rows),
    pad_slot_id, num_accepted [N] (speculative rows), parent_tokens [N, M] (tree drafts),
    block_table [N, M] with initial_block / final_block [N] (rows through a table) and
    first_block / computed_tokens [N] with block_size (prefix-caching snapshots):
    docs/semantics.md section 5.  one_token: x, residual (and y) are [N, D], one token per
    sequence, described to the library as [N, 1, D] (no view made).  overlap: exec.overlap
    (0 none, 1 launch, 2 reads).  zero_pads: padded sequences' outputs are 0
    (zero_padded_outputs: shortconv.dao's convention)."""
    c = Call(where, x, _width(weight), -1, activation, _CACHE_NAMES)
    if overlap:
        c.set_overlap(overlap)
    x_layout = c.set_tokens("x", x) if one_token else c.set("x", x)
    c.set("weight", weight)
    if bias is not None:
        c.set("bias", bias)
    if residual is not None:
        if one_token:
            c.set_tokens("residual", residual)
        else:
            c.set("residual", residual)
    if cu_seqlens is not None:
        c.set("cu_seqlens", cu_seqlens, INDEX_CODES)
    c.set("final_state", cache, output=True)
    c.set_out("initial_state", cache)  # checked just above
    if cache_indices is not None:
        c.set("initial_state_indices", cache_indices, INDEX_CODES)
        c.set_out("final_state_indices", cache_indices, INDEX_CODES)
    if block_table is not None or initial_block is not None or final_block is not None:
        for field, t in (("block_table", block_table), ("initial_block", initial_block),
                         ("final_block", final_block)):
            if t is not None:
                c.set(field, t, INDEX_CODES)
    if first_block is not None:
        c.set("first_block", first_block, INDEX_CODES)
    if computed_tokens is not None:
        c.set("computed_tokens", computed_tokens, INDEX_CODES)
    if block_size:
        c.set_block_size(block_size)
    if has_initial_state is not None:
        c.set("has_initial_state", has_initial_state, FLAG_CODES)
    if cache_seqlens is not None:
        c.set("ring_offsets", cache_seqlens, INDEX_CODES)
    if num_accepted is not None:
        c.set("num_accepted", num_accepted, INDEX_CODES)
    if parent_tokens is not None:
        c.set("parent_tokens", parent_tokens, INDEX_CODES)
    if pad_slot_id != -1:
        c.set_pad_index(pad_slot_id)
    if zero_pads:
        c.set_zero_padded_outputs()
    y = c.out_tokens("y", x, x_layout) if one_token else c.out_like_x("y", x, x_layout)
    c.run_forward()
    return y


_increment_version = getattr(getattr(torch.autograd, "graph", None), "increment_version", None)
if _increment_version is None:  # torch < 2.1
    def _increment_version(t):
        # An in-place op on an empty view bumps the version counter t shares
        # with its base and every other view, and touches no memory.
        with torch.no_grad():
            t[:0].zero_()


# ---- autograd -------------------------------------------------------------------
# Inputs of the forward, in order: x, weight, bias, residual, initial_state,
# cu_seqlens, state_len, activation, output_final_state, seq_idx, state_rows.
def _backward_grads(ctx, dy, dht):
    x, weight, bias, initial_state, cu_seqlens, seq_idx = ctx.saved_tensors
    need = ctx.needs_input_grad
    if dht is not None and dht.numel() == 0:
        dht = None  # final_state was not requested (an empty placeholder)
    return x, weight, bias, initial_state, cu_seqlens, seq_idx, dy, dht, need


def _dresidual(x, dy, seq_idx):
    """dresidual = dy (zeros when no dy); with seq_idx 0 on padding tokens, whose y is 0."""
    if dy is None:
        return torch.zeros_like(x)
    if seq_idx is None:
        return dy
    real = (seq_idx >= 0).view(*seq_idx.shape, *([1] * (dy.dim() - 2)))
    return torch.where(real, dy, torch.zeros((), dtype=dy.dtype, device=dy.device))


def _fwd_eager(x, weight, bias, residual, initial_state, cu_seqlens, state_len, activation,
               output_final_state, seq_idx=None, state_rows=0):
    """The forward as a differentiable call while autograd records (a double backward)."""
    if torch.is_grad_enabled():
        out = CausalConv1dFunction.apply(x, weight, bias, residual, initial_state, cu_seqlens,
                                         state_len, activation, output_final_state, seq_idx,
                                         state_rows)
        return out if output_final_state else (out, None)
    return forward_impl(x, weight, bias, residual, initial_state, cu_seqlens, state_len,
                        activation, output_final_state, seq_idx=seq_idx, state_rows=state_rows)


def _bwd_eager(x, weight, bias, initial_state, cu_seqlens, dy, dht, state_len, activation,
               need_dx, need_dweight, need_dbias, need_dinitial_state, seq_idx=None):
    """The backward; differentiable (CausalConv1dBackward) when autograd records, i.e.
    inside a backward with create_graph=True."""
    if torch.is_grad_enabled():
        return CausalConv1dBackward.apply(x, weight, bias, initial_state, cu_seqlens, dy, dht,
                                          state_len, activation, need_dx, need_dweight,
                                          need_dbias, need_dinitial_state, seq_idx)
    return backward_impl(x, weight, bias, initial_state, cu_seqlens, dy, dht, state_len,
                         activation, need_dx, need_dweight, need_dbias, need_dinitial_state,
                         seq_idx=seq_idx)


class CausalConv1dFunction(torch.autograd.Function):
    """Eager autograd (every torch version): the forward and backward calls.

    The backward starts from the forward's description of the inputs both read (a
    snapshot), so it describes only dy, dfinal_state and its outputs.  Differentiable to
    any order: the backward is CausalConv1dBackward when autograd records it
    (create_graph=True), whose own backward is built from these two Functions
    (_double_backward.py).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, residual, initial_state, cu_seqlens, state_len, activation,
                output_final_state, seq_idx=None, state_rows=0):
        c, seen = _call("shortconv.causal_conv1d", x, weight, bias, cu_seqlens, initial_state,
                        state_len, activation, seq_idx)
        snapshot = c.snapshot()
        y, final_state = _run_forward(c, seen, x, residual, initial_state, cu_seqlens,
                                      state_len, output_final_state, seq_idx, state_rows)
        ctx.save_for_backward(x, weight, bias, initial_state, cu_seqlens, seq_idx)
        # one attribute: each costs a dictionary entry on the node, set here and read back
        ctx.meta = (snapshot, seen, state_len, activation, residual is not None)
        # An unused output's gradient arrives as None (absent in the ABI = zeros)
        # instead of a zero-filled tensor: one kernel and one allocation less.
        ctx.set_materialize_grads(False)
        # Without a final state y is the only output (a second, None output costs autograd
        # more host time than the whole description of a tensor).
        return (y, final_state) if output_final_state else y

    @staticmethod
    def backward(ctx, dy, dht=None):
        x, weight, bias, h0, cu, sid, dy, dht, need = _backward_grads(ctx, dy, dht)
        snapshot, seen, state_len, activation, has_residual = ctx.meta
        want_db = need[2] and bias is not None
        want_dh0 = need[4] and h0 is not None
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward
            dx, dw, db, dh0 = CausalConv1dBackward.apply(
                x, weight, bias, h0, cu, dy, dht, state_len, activation, need[0], need[1],
                want_db, want_dh0, sid)
        else:
            dx, dw, db, dh0 = _backward_from(
                snapshot, seen, x, weight, bias, h0, cu, dy, dht, state_len, activation,
                need[0], need[1], want_db, want_dh0, sid)
        dres = _dresidual(x, dy, sid) if has_residual and need[3] else None
        return dx, dw, db, dres, dh0, None, None, None, None, None, None


class CausalConv1dBackward(torch.autograd.Function):
    """The backward as a differentiable function of (x, weight, bias, initial_state, dy, dht)."""

    @staticmethod
    def forward(ctx, x, weight, bias, initial_state, cu_seqlens, dy, dht, state_len, activation,
                need_dx, need_dweight, need_dbias, need_dinitial_state, seq_idx=None):
        grads = backward_impl(x, weight, bias, initial_state, cu_seqlens, dy, dht, state_len,
                              activation, need_dx, need_dweight, need_dbias, need_dinitial_state,
                              seq_idx=seq_idx)
        ctx.save_for_backward(x, weight, bias, initial_state, cu_seqlens, dy, dht, seq_idx)
        ctx.state_len = state_len
        ctx.activation = activation
        ctx.computed = tuple(g is not None for g in grads)
        ctx.set_materialize_grads(False)
        return grads

    @staticmethod
    def backward(ctx, gdx, gdw, gdb, gdh0):
        n = ctx.needs_input_grad
        g = backward_vjp(_fwd_eager, _bwd_eager, ctx.saved_tensors, ctx.state_len,
                         ctx.activation, ctx.computed, (n[0], n[1], n[2], n[3], n[5], n[6]),
                         (gdx, gdw, gdb, gdh0))
        return (g[0], g[1], g[2], g[3], None, g[4], g[5]) + (None,) * 7


# ---- custom ops (torch >= 2.4) -----------------------------------------------------
HAS_CUSTOM_OPS = (
    hasattr(torch, "library") and hasattr(torch.library, "custom_op")
    and hasattr(torch.library, "register_autograd")
    and os.environ.get("SHORTCONV_DISABLE_CUSTOM_OP", "0") != "1"
)
EAGER_CUSTOM_OP = HAS_CUSTOM_OPS and os.environ.get("SHORTCONV_EAGER_CUSTOM_OP", "0") == "1"

if HAS_CUSTOM_OPS:
    _is_compiling = torch.compiler.is_compiling

    def use_custom_op():
        """True while torch.compile traces (or when eager calls are routed through the ops)."""
        return EAGER_CUSTOM_OP or _is_compiling()

    def _empty(x, dtype=None):
        return torch.empty((0,), dtype=dtype if dtype is not None else x.dtype, device=x.device)

    def _state_fake(x, cu_seqlens, initial_state, state_len, dtype, seq_idx, rows):
        """_state_out's allocation (zero-filling aside)."""
        if initial_state is not None and initial_state.dtype == dtype:
            return like_contiguous(initial_state)
        return torch.empty((_num_seqs(x, cu_seqlens, seq_idx, rows), x.shape[-1], state_len),
                           dtype=dtype, device=x.device)

    @torch.library.custom_op(
        "shortconv::causal_conv1d_fwd", mutates_args=(),
        schema="(Tensor x, Tensor weight, Tensor? bias, Tensor? residual, Tensor? initial_state, "
               "Tensor? cu_seqlens, int state_len, int activation, bool output_final_state, "
               "Tensor? seq_idx=None, int state_rows=0) -> (Tensor, Tensor)")
    def _fwd_op(x, weight, bias, residual, initial_state, cu_seqlens, state_len, activation,
                output_final_state, seq_idx=None, state_rows=0):
        y, ht = forward_impl(x, weight, bias, residual, initial_state, cu_seqlens, state_len,
                             activation, output_final_state, seq_idx=seq_idx,
                             state_rows=state_rows)
        if ht is None:
            ht = _empty(x, initial_state.dtype if initial_state is not None else None)
        return y, ht

    @_fwd_op.register_fake
    def _fwd_fake(x, weight, bias, residual, initial_state, cu_seqlens, state_len, activation,
                  output_final_state, seq_idx=None, state_rows=0):
        y = like_x(x)
        sdtype = initial_state.dtype if initial_state is not None else x.dtype
        if output_final_state:
            ht = _state_fake(x, cu_seqlens, initial_state, state_len, sdtype, seq_idx,
                             state_rows)
        else:
            ht = _empty(x, sdtype)
        return y, ht

    @torch.library.custom_op(
        "shortconv::causal_conv1d_bwd", mutates_args=(),
        schema="(Tensor x, Tensor weight, Tensor? bias, Tensor? initial_state, Tensor? cu_seqlens, "
               "Tensor? dy, Tensor? dht, int state_len, int activation, bool need_dx, "
               "bool need_dweight, bool need_dbias, bool need_dinitial_state, "
               "Tensor? seq_idx=None) -> (Tensor, Tensor, Tensor, Tensor)")
    def _bwd_op(x, weight, bias, initial_state, cu_seqlens, dy, dht, state_len, activation,
                need_dx, need_dweight, need_dbias, need_dinitial_state, seq_idx=None):
        dx, dw, db, dh0 = backward_impl(x, weight, bias, initial_state, cu_seqlens, dy, dht,
                                        state_len, activation, need_dx, need_dweight, need_dbias,
                                        need_dinitial_state, seq_idx=seq_idx)
        sdtype = initial_state.dtype if initial_state is not None else x.dtype
        return (dx if dx is not None else _empty(x),
                dw if dw is not None else _empty(x, weight.dtype),
                db if db is not None else _empty(x, weight.dtype),
                dh0 if dh0 is not None else _empty(x, sdtype))

    @_bwd_op.register_fake
    def _bwd_fake(x, weight, bias, initial_state, cu_seqlens, dy, dht, state_len, activation,
                  need_dx, need_dweight, need_dbias, need_dinitial_state, seq_idx=None):
        sdtype = (initial_state.dtype if initial_state is not None
                  else dht.dtype if dht is not None else x.dtype)
        dx = like_x(x) if need_dx else _empty(x)
        dw = like_contiguous(weight) if need_dweight else _empty(x, weight.dtype)
        db = (like_contiguous(bias) if need_dbias and bias is not None
              else _empty(x, weight.dtype))
        if need_dinitial_state:
            rows = initial_state.shape[0] if initial_state is not None else 0
            dh0 = _state_fake(x, cu_seqlens, initial_state, state_len, sdtype, seq_idx, rows)
        else:
            dh0 = _empty(x, sdtype)
        return dx, dw, db, dh0

    def _fwd_setup_context(ctx, inputs, output):
        (x, weight, bias, residual, initial_state, cu_seqlens, state_len, activation,
         _output_final_state, seq_idx, state_rows) = inputs
        ctx.save_for_backward(x, weight, bias, initial_state, cu_seqlens, seq_idx)
        ctx.state_len = state_len
        ctx.state_rows = state_rows
        ctx.activation = activation
        ctx.has_residual = residual is not None

    def _fwd_backward(ctx, dy, dht):
        x, weight, bias, h0, cu, sid, dy, dht, need = _backward_grads(ctx, dy, dht)
        want_db = need[2] and bias is not None
        want_dh0 = need[4] and h0 is not None
        dx, dw, db, dh0 = torch.ops.shortconv.causal_conv1d_bwd(
            x, weight, bias, h0, cu, dy, dht, ctx.state_len, ctx.activation,
            need[0], need[1], want_db, want_dh0, sid)
        dres = _dresidual(x, dy, sid) if ctx.has_residual and need[3] else None
        return (dx if need[0] else None, dw if need[1] else None, db if want_db else None,
                dres, dh0 if want_dh0 else None, None, None, None, None, None, None)

    torch.library.register_autograd("shortconv::causal_conv1d_fwd", _fwd_backward,
                                    setup_context=_fwd_setup_context)

    # The backward op is differentiable too (a double backward), through the
    # same VJP as the eager path, built from the two ops.
    def _fwd_op_call(x, weight, bias, residual, initial_state, cu_seqlens, state_len, activation,
                     output_final_state, seq_idx=None, state_rows=0):
        y, ht = torch.ops.shortconv.causal_conv1d_fwd(x, weight, bias, residual, initial_state,
                                                      cu_seqlens, state_len, activation,
                                                      output_final_state, seq_idx, state_rows)
        return y, (ht if output_final_state else None)

    def _bwd_op_call(x, weight, bias, initial_state, cu_seqlens, dy, dht, state_len, activation,
                     need_dx, need_dweight, need_dbias, need_dinitial_state, seq_idx=None):
        grads = torch.ops.shortconv.causal_conv1d_bwd(
            x, weight, bias, initial_state, cu_seqlens, dy, dht, state_len, activation, need_dx,
            need_dweight, need_dbias, need_dinitial_state, seq_idx)
        computed = (need_dx, need_dweight, need_dbias and bias is not None, need_dinitial_state)
        return tuple(g if c else None for g, c in zip(grads, computed))

    def _bwd_setup_context(ctx, inputs, output):
        (x, weight, bias, initial_state, cu_seqlens, dy, dht, state_len, activation, need_dx,
         need_dweight, need_dbias, need_dinitial_state, seq_idx) = inputs
        ctx.save_for_backward(x, weight, bias, initial_state, cu_seqlens, dy, dht, seq_idx)
        ctx.state_len = state_len
        ctx.activation = activation
        ctx.computed = (need_dx, need_dweight, need_dbias and bias is not None,
                        need_dinitial_state)

    def _bwd_backward(ctx, gdx, gdw, gdb, gdh0):
        n = ctx.needs_input_grad
        g = backward_vjp(_fwd_op_call, _bwd_op_call, ctx.saved_tensors, ctx.state_len,
                         ctx.activation, ctx.computed, (n[0], n[1], n[2], n[3], n[5], n[6]),
                         (gdx, gdw, gdb, gdh0))
        return (g[0], g[1], g[2], g[3], None, g[4], g[5]) + (None,) * 7

    torch.library.register_autograd("shortconv::causal_conv1d_bwd", _bwd_backward,
                                    setup_context=_bwd_setup_context)

    @torch.library.custom_op(
        "shortconv::causal_conv1d_update", mutates_args=("cache",),
        schema="(Tensor x, Tensor(a!) cache, Tensor weight, Tensor? bias, Tensor? residual, "
               "Tensor? cache_indices, Tensor? cu_seqlens, int activation, "
               "Tensor? has_initial_state, Tensor? cache_seqlens, int pad_slot_id, "
               "Tensor? num_accepted=None, Tensor? parent_tokens=None, "
               "Tensor? block_table=None, Tensor? initial_block=None, Tensor? final_block=None, "
               "Tensor? first_block=None, Tensor? computed_tokens=None, int block_size=0, "
               "int overlap=0) -> Tensor")  # (the serving arguments and overlap default to
    # absent: the older schemas' calls)
    def _update_op(x, cache, weight, bias, residual, cache_indices, cu_seqlens, activation,
                   has_initial_state, cache_seqlens, pad_slot_id, num_accepted=None,
                   parent_tokens=None, block_table=None, initial_block=None, final_block=None,
                   first_block=None, computed_tokens=None, block_size=0, overlap=0):
        return update_impl(x, cache, weight, bias, residual, cache_indices, cu_seqlens, activation,
                           has_initial_state, cache_seqlens, pad_slot_id, num_accepted,
                           parent_tokens, block_table, initial_block, final_block, first_block,
                           computed_tokens, block_size, overlap=overlap)

    @_update_op.register_fake
    def _update_fake(x, cache, weight, bias, residual, cache_indices, cu_seqlens, activation,
                     has_initial_state, cache_seqlens, pad_slot_id, num_accepted=None,
                     parent_tokens=None, block_table=None, initial_block=None, final_block=None,
                     first_block=None, computed_tokens=None, block_size=0, overlap=0):
        return like_x(x)

else:

    def use_custom_op():
        return False
