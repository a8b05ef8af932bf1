"""The common calls in one pass: a decode step and a forward / backward without states.

A call through _lib.Call describes each tensor with a method call, keeps a signature list
and goes through several layers; for the common cases these functions fill the call's
buffer straight away (_lib.describe per tensor: every check of Call.set, one pass) and run
the library.  Each returns None when anything is not its case (a tensor describe() leaves
to Call.set, a rank or an argument it does not take); the caller then takes the general
path (_ops), which describes the call from scratch and takes it or raises its error.
When the native module is built (native.py), update_fast and plain_call hand their case to
its C++ first, which fills the same bytes.  Nothing is written before the library validates, so a None costs only the time spent
here, and the bytes handed to the library are those of the general path (tested:
tests/python/test_fast.py).

- update_fast: causal_conv1d_update's decode step (x [N, D] or [N, T, D], a cache or pool,
  weight, bias, cache_indices, num_accepted);
- plain_call / PlainConv1dFunction: causal_conv1d with x, weight, bias and cu_seqlens
  only (no states, residual or sequence ids): four tensor inputs and one output for
  autograd (the general Function has eleven inputs, and autograd's per-call cost grows
  with them), the backward resumed from the forward's buffer.
"""

import struct

import torch

from . import _lib, _ops
from . import native as _native_module
from ._lib import FLOAT_CODES, INDEX_CODES

_take, _give_back, _describe, _describe_tokens = (_lib._take, _lib._give_back, _lib.describe,
                                                  _lib.describe_tokens)
_exec_fields, _stream_fields = _lib.exec_fields, _lib.stream_fields
_forward_on, _backward_on = _lib.forward_on, _lib.backward_on
_PACK, _PACK3 = _lib._TENSOR_PACK, _lib._TENSOR_PACK[3]
_SCALARS_PACK, _SCALARS_OFF = _lib._SCALARS_PACK, _lib._SCALARS_OFF
_OFF = _lib.OFF
_X, _W, _B, _Y, _CU = _OFF["x"], _OFF["weight"], _OFF["bias"], _OFF["y"], _OFF["cu_seqlens"]
_H0, _HT = _OFF["initial_state"], _OFF["final_state"]
_I0, _IT = _OFF["initial_state_indices"], _OFF["final_state_indices"]
_ACC = _OFF["num_accepted"]
_DY, _DX, _DW, _DB = _OFF["dy"], _OFF["dx"], _OFF["dweight"], _OFF["dbias"]
_INT32_MAX = _lib.INT32_MAX
_OVERLAP_PACK, _OVERLAP_OFF = _lib._OVERLAP_PACK, _lib._OVERLAP_OFF
_INT32_PACK, _ZERO_PADS_OFF = _lib._INT32_PACK, _lib._ZERO_PADS_OFF
_ACTIVATIONS = _ops._ACTIVATIONS
_CACHE_NAMES = _ops._CACHE_NAMES
_Tensor = torch.Tensor
_empty_like = torch.empty_like
_grad_enabled = torch.is_grad_enabled
_increment_version = _ops._increment_version

# The same calls compiled against this torch, when built (native.py); else None.
_native = _native_module.module

_UPDATE = "shortconv.causal_conv1d_update"
_CONV = "shortconv.causal_conv1d"
_CONV_BWD = "shortconv.causal_conv1d (backward)"


def update_fast(x, cache, weight, bias, cache_indices, num_accepted, activation, overlap=0,
                zero_pads=False):
    """update_impl(x, cache, weight, bias, None, cache_indices, None, act,
    num_accepted=num_accepted, overlap=overlap, zero_pads=zero_pads) of the common decode
    step -- x [N, D] (one token per sequence, described as [N, 1, D]) or [N, T, D] with
    D = weight.shape[0]: y (cache updated in place, its version bumped), or None when it is
    not that case.  overlap: exec.overlap's code (0, 1, 2); zero_pads: a padded sequence's
    outputs are 0 (sc_conv_args.zero_padded_outputs; needs cache_indices)."""
    try:
        act = _ACTIVATIONS[activation]
    except (KeyError, TypeError):
        return None
    if type(x) is not _Tensor:  # (before reading its device)
        return None
    if _native is not None and not zero_pads:  # (the native update has no zero_pads)
        y = _native.update(x, cache, weight, bias, cache_indices, num_accepted, act, overlap)
        if y is not None:
            return y
    buf, base = _take()
    cuda = _exec_fields(buf, x)
    if cuda is None:
        return _give_back(buf, base)
    xd = _describe_tokens(buf, _X, x, cuda)
    wd = _describe(buf, _W, weight, FLOAT_CODES, cuda)
    cd = _describe(buf, _HT, cache, FLOAT_CODES, cuda)
    if xd is None or wd is None or cd is None:
        return _give_back(buf, base)
    xs, ws = xd[0], wd[0]
    nd = len(xs)
    # [N, H, Dh] (heads) and FLA's [1, N, D] are for functional.py's views
    if xs[-1] != ws[0] or (nd == 3 and xs[0] == 1 and xs[1] > 1 and cache_indices is None):
        return _give_back(buf, base)
    width = ws[-1]
    try:
        _SCALARS_PACK(buf, _SCALARS_OFF, width, -1, act)
    except struct.error:  # a width beyond int32: Call words the error
        return _give_back(buf, base)
    cs, cst, cptr, ccode = cd
    _PACK[len(cs)](buf, _H0, cptr, ccode, len(cs), *cs, *cst)  # read in place
    bd = idd = ad = None
    if bias is not None:
        bd = _describe(buf, _B, bias, FLOAT_CODES, cuda)
        if bd is None:
            return _give_back(buf, base)
    if cache_indices is not None:
        idd = _describe(buf, _I0, cache_indices, INDEX_CODES, cuda)
        if idd is None:
            return _give_back(buf, base)
        s, st, ptr, code = idd
        _PACK[len(s)](buf, _IT, ptr, code, len(s), *s, *st)
    if num_accepted is not None:
        ad = _describe(buf, _ACC, num_accepted, INDEX_CODES, cuda)
        if ad is None:
            return _give_back(buf, base)
    if overlap:
        _OVERLAP_PACK(buf, _OVERLAP_OFF, overlap)
    if zero_pads:
        _INT32_PACK(buf, _ZERO_PADS_OFF, 1)
    y = _empty_like(x)  # (x's strides when x is dense: _layout.like_x)
    ys = y.stride()
    if nd == 2:
        n, d = xs
        _PACK3(buf, _Y, y.data_ptr(), xd[3], 3, n, 1, d, ys[0], d * ys[1], ys[1])
    else:
        _PACK3(buf, _Y, y.data_ptr(), xd[3], 3, *xs, *ys)
    key = None
    if cuda < 0:  # the workspace size's signature (shapes, dtypes, presence, scalars)
        key = (_UPDATE, width, act, nd, xs, xd[3], ws, wd[3], cs, ccode,
               bd and (bd[0], bd[3]), idd and (idd[0], idd[3]), ad and (ad[0], ad[3]),
               zero_pads)
    _forward_on(buf, base, cuda, key, _UPDATE, _CACHE_NAMES)
    if not cache.is_inference():
        _increment_version(cache)
    return y


def _fill_inputs(x, weight, bias, cu_seqlens, state_len, activation):
    """The buffer of a forward without states, residual or sequence ids, its inputs
    described: (buf, base, cuda index, signature, data pointers of x, weight, bias and
    cu_seqlens), or None when it is not that case."""
    try:
        act = _ACTIVATIONS[activation]
    except (KeyError, TypeError):
        return None
    if type(x) is not _Tensor:  # (before reading its device)
        return None
    buf, base = _take()
    cuda = _exec_fields(buf, x)
    if cuda is None:
        return _give_back(buf, base)
    xd = _describe(buf, _X, x, FLOAT_CODES, cuda)
    wd = _describe(buf, _W, weight, FLOAT_CODES, cuda)
    if xd is None or wd is None or len(xd[0]) == 4:  # [B, T, H, Dh]: functional.py's view
        return _give_back(buf, base)
    ws = wd[0]
    width = ws[-1]
    S = width if state_len is None else state_len  # (FLA's default: S = W)
    if type(S) is not int or S < width - 1 or S > _INT32_MAX:  # _args.check_state_len's
        return _give_back(buf, base)
    try:
        _SCALARS_PACK(buf, _SCALARS_OFF, width, S, act)
    except struct.error:
        return _give_back(buf, base)
    bd = cd = None
    if bias is not None:
        bd = _describe(buf, _B, bias, FLOAT_CODES, cuda)
        if bd is None:
            return _give_back(buf, base)
    if cu_seqlens is not None:
        cd = _describe(buf, _CU, cu_seqlens, INDEX_CODES, cuda)
        if cd is None:
            return _give_back(buf, base)
    key = (_CONV, width, S, act, xd[0], xd[3], ws, wd[3], bd and (bd[0], bd[3]),
           cd and (cd[0], cd[3]))
    return buf, base, cuda, key, xd[2], wd[2], bd and bd[2], cd and cd[2]


def plain_call(x, weight, bias, cu_seqlens, state_len, activation):
    """causal_conv1d(x, weight, bias, activation=, cu_seqlens=, state_len=)'s y (through
    PlainConv1dFunction when autograd records), or None when the call is not that case."""
    if _native is not None and type(x) is _Tensor:
        try:
            act = _ACTIVATIONS[activation]
        except (KeyError, TypeError):
            act = None
        if act is not None:
            # y, or (y, its call) when autograd records (the forward then runs in apply)
            r = _native.conv(x, weight, bias, cu_seqlens, state_len, act)
            if type(r) is tuple:
                return PlainConv1dFunction.apply(x, weight, bias, cu_seqlens, r)
            if r is not None:
                return r
    f = _fill_inputs(x, weight, bias, cu_seqlens, state_len, activation)
    if f is None:
        return None
    buf, base, cuda, key = f[:4]
    grad = _grad_enabled() and (x.requires_grad or weight.requires_grad
                                or (bias is not None and bias.requires_grad))
    # the backward's buffer: the inputs described, before y (as Call.snapshot)
    snapshot = (buf.raw, cuda, key) + f[4:] if grad else None
    y = _empty_like(x)  # (x's strides when x is dense: _layout.like_x)
    xs = key[4]
    _PACK[len(xs)](buf, _Y, y.data_ptr(), key[5], len(xs), *xs, *y.stride())
    if grad:
        return PlainConv1dFunction.apply(x, weight, bias, cu_seqlens,
                                         (buf, base, y, snapshot))
    _forward_on(buf, base, cuda, key, _CONV)
    return y


class PlainConv1dFunction(torch.autograd.Function):
    """CausalConv1dFunction for calls with x, weight, bias and cu_seqlens only; ``filled``
    is plain_call's buffer (inputs and y described) and the snapshot of its inputs.  The
    backward resumes from the snapshot while the saved tensors still hold the memory it
    described, and describes dy and its outputs only.  Differentiable to any order: with
    create_graph=True the backward is _ops.CausalConv1dBackward."""

    @staticmethod
    def forward(ctx, x, weight, bias, cu_seqlens, filled):
        if len(filled) == 2:  # the native module's (y, call)
            y, snapshot = filled
            snapshot.forward()
        else:
            buf, base, y, snapshot = filled
            _forward_on(buf, base, snapshot[1], snapshot[2], _CONV)
        ctx.save_for_backward(x, weight, bias, cu_seqlens)
        ctx.meta = snapshot
        # An unused y's gradient arrives as None instead of zeros (one kernel less).
        ctx.set_materialize_grads(False)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, cu = ctx.saved_tensors
        need = ctx.needs_input_grad
        snapshot = ctx.meta
        native = type(snapshot) is not tuple
        if native:
            S, act = snapshot.state_len, snapshot.activation
        else:
            S, act = snapshot[2][2], snapshot[2][3]
        want_db = need[2] and bias is not None
        if _grad_enabled():  # create_graph=True: a differentiable backward
            dx, dw, db, _ = _ops.CausalConv1dBackward.apply(
                x, weight, bias, None, cu, dy, None, S, act, need[0], need[1],
                want_db, False, None)
            return dx, dw, db, None, None
        # (a native forward's backward takes the general path while the native module is
        # off: shortconv.check_contents() checks the calls that pass through _lib)
        if dy is not None and not (native and _native is None):
            if native:
                grads = snapshot.backward(x, weight, bias, cu, dy, need[0], need[1], want_db)
            else:
                grads = _backward_fast(snapshot, x, weight, bias, cu, dy, need[0], need[1],
                                       want_db)
            if grads is not None:
                return grads
        dx, dw, db, _ = _ops.backward_impl(x, weight, bias, None, cu, dy, None, S, act,
                                           need[0], need[1], want_db, False)
        return dx, dw, db, None, None


def _backward_fast(snapshot, x, weight, bias, cu, dy, need_dx, need_dw, need_db):
    """The backward on the forward's buffer: (dx, dweight, dbias, None, None), or None when
    the saved tensors no longer hold the memory it described (a ``.data`` swap) or dy is not
    the common case."""
    raw, cuda, key, px, pw, pb, pc = snapshot
    if (x.data_ptr() != px or weight.data_ptr() != pw
            or (bias is not None and bias.data_ptr() != pb)
            or (cu is not None and cu.data_ptr() != pc)):
        return None
    buf, base = _take(raw)
    _stream_fields(buf, cuda)
    dd = _describe(buf, _DY, dy, FLOAT_CODES, cuda)
    if dd is None:
        return _give_back(buf, base)
    xs, xcode, ws, wcode = key[4], key[5], key[6], key[7]
    dx = dw = db = None
    if need_dx:
        dx = _empty_like(x)
        _PACK[len(xs)](buf, _DX, dx.data_ptr(), xcode, len(xs), *xs, *dx.stride())
    if need_dw:  # contiguous, like weight (_layout.like_contiguous)
        dw = _empty_like(weight) if weight.is_contiguous() else _ops.like_contiguous(weight)
        _PACK[len(ws)](buf, _DW, dw.data_ptr(), wcode, len(ws), *ws, *dw.stride())
    if need_db:
        bs, bcode = key[8]
        db = _empty_like(bias) if bias.is_contiguous() else _ops.like_contiguous(bias)
        _PACK[len(bs)](buf, _DB, db.data_ptr(), bcode, len(bs), *bs, *db.stride())
    if dx is None and dw is None and db is None:
        _give_back(buf, base)
        return None, None, None, None, None
    _backward_on(buf, base, cuda, x.device,
                 (key, cuda, dd[0], dd[3], need_dx, need_dw, need_db), _CONV_BWD)
    return dx, dw, db, None, None
