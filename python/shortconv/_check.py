"""shortconv.check_contents(): the host backends' checks of index contents, for CUDA calls.

The CUDA backend cannot check what its index tensors hold (cu_seqlens, the state indices,
has_initial_state, ring_offsets, seq_idx, num_accepted, parent_tokens, the block tables,
prefix caching's block indices and computed tokens) without a host synchronisation, so
its kernels clamp: wrong contents give wrong results, never an access out of bounds
(docs/semantics.md, sections 7 and 8).  The host backends check those contents and
refuse the call before writing anything.

Inside ``with shortconv.check_contents():`` (or in a process started with
SHORTCONV_CHECK_CONTENTS=1), a call on CUDA tensors first reads its index tensors back
to the host and has the library validate the call as the CPU backend would, on those
copies and on the call's own descriptions of everything else (sc_validate: data is not
read).  Contents the host backends refuse raise the same error, naming the argument,
and the CUDA run does not start: nothing is written.  The price is one synchronisation
per call.

How: sc_forward / sc_backward are reached through two module globals of _lib, which
every path of the package looks up at call time (Call, the one-pass paths of _fast);
the mode replaces them with checking wrappers and turns the native module off
(_fast._native = None: its C++ calls the library directly), and puts both back when
the last enclosing block exits.  Outside the mode nothing changes and nothing is paid.
A call captured into a CUDA graph is not checked: a capture cannot read device memory,
and each replay may find other contents.
"""

import ctypes
import os
import struct
import threading

import torch

from . import _fast, _lib

__all__ = ["check_contents"]

# The index tensors whose contents the host backends check (sc_conv_args field names).
INDEX_FIELDS = ("cu_seqlens", "initial_state_indices", "final_state_indices",
                "has_initial_state", "ring_offsets", "seq_idx", "num_accepted",
                "parent_tokens", "block_table", "initial_block", "final_block", "first_block",
                "computed_tokens")
_OFFSETS = tuple(_lib.OFF[name] for name in INDEX_FIELDS)
# sc_tensor: data, dtype, ndim, shape[4], stride[4]
_DESC = struct.Struct("<Qii%dq%dq" % (_lib._MAX_DIMS, _lib._MAX_DIMS))
# dtype code -> (torch dtype, array-interface type string, bytes per element)
_INDEX_DTYPES = {4: (torch.int32, "<i4", 4), 5: (torch.int64, "<i8", 8), 6: (torch.bool, "|b1", 1)}
_BACKEND = struct.Struct("<i")
_EXEC_HOST = struct.Struct("<iiqqQQQ")  # backend, threads, tile_t, tile_d, stream, workspace, bytes
_HOST_BACKEND = _lib.SC_BACKEND_CPU if _lib.has_backend("cpu") else _lib.SC_BACKEND_REF

_sc_validate = _lib._lib.sc_validate
_sc_validate.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
_sc_validate.restype = ctypes.c_int


# A storage over memory the library was handed (torch >= 2.1); older torch: the CUDA array
# interface (needs numpy) for device memory, a ctypes buffer for host memory.
_from_pointer = getattr(torch._C, "_construct_storage_from_data_pointer", None)


class _DeviceArray:
    """A strided view of device memory (the CUDA array interface), for torch.as_tensor."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, ptr, typestr, itemsize, shape, strides):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": typestr, "data": (ptr, False),
            "strides": tuple(st * itemsize for st in strides), "version": 2}


def read_copy(ptr, code, shape, strides, device):
    """A host copy of the values of the index tensor described by (ptr, dtype code, shape,
    strides) in ``device``'s memory (a CUDA copy synchronises the current stream, the one
    the call runs on)."""
    dtype, typestr, item = _INDEX_DTYPES[code]
    nbytes = (1 + sum(st * (n - 1) for n, st in zip(shape, strides))) * item
    if _from_pointer is not None:
        view = torch.empty(0, dtype=dtype, device=device).set_(
            _from_pointer(ptr, device, nbytes), 0, tuple(shape), tuple(strides))
    elif device.type == "cuda":
        view = torch.as_tensor(_DeviceArray(ptr, typestr, item, shape, strides), device=device)
    else:
        flat = torch.frombuffer((ctypes.c_char * nbytes).from_address(ptr), dtype=dtype)
        view = flat.as_strided(tuple(shape), tuple(strides))
    return view.to("cpu", copy=True)


def validate_on_host(base, backward, device):
    """sc_validate of the call filled at ``base`` as a host backend would run it: the index
    tensors replaced by host copies of their values (read_copy from ``device``'s memory),
    exec by the host backend's.  Returns (status, the library's message)."""
    buf = _lib._Buf()
    copy = ctypes.addressof(buf)
    ctypes.memmove(copy, base, _lib.ARGS_SIZE)
    copies = {}  # one read per distinct description (the state indices are often one tensor)
    for off in _OFFSETS:
        ptr, code, nd, *rest = _DESC.unpack_from(buf, off)
        shape, strides = rest[:nd], rest[_lib._MAX_DIMS:_lib._MAX_DIMS + nd]
        if (not ptr or code not in _INDEX_DTYPES or not 0 < nd <= _lib._MAX_DIMS
                or 0 in shape or min(strides) < 0):
            continue  # no contents to read, or a description the library refuses as such
        key = (ptr, code, tuple(shape), tuple(strides))
        host = copies.get(key)
        if host is None:
            # broadcast (stride-0) dims read once and described as broadcast again: the
            # library words its errors for those (one row named for all sequences)
            distinct = [1 if st == 0 else n for n, st in zip(shape, strides)]
            host = copies[key] = read_copy(ptr, code, distinct, strides, device).expand(*shape)
        _lib._TENSOR_PACK[nd](buf, off, host.data_ptr(), code, nd, *shape, *host.stride())
    _EXEC_HOST.pack_into(buf, _lib._EXEC_OFF, _HOST_BACKEND, 1,
                         *struct.unpack_from("<qq", buf, _lib._EXEC_OFF + 8), 0, 0, 0)
    status = _sc_validate(copy, backward, copy + _lib.ERR_OFF)
    return status, ctypes.string_at(copy + _lib.ERR_OFF).decode(errors="replace")


def _checking(run, backward):
    """``run`` (sc_forward / sc_backward) preceded, for a CUDA call outside a graph
    capture, by the library's own validation of the call's descriptions (so that no index
    tensor is read through a description it refuses) and validate_on_host; a refusal is
    returned as the run's (the message in the call's sc_error) and the run does not start."""

    def checked(base, err):
        if (_BACKEND.unpack(ctypes.string_at(base + _lib._EXEC_OFF, 4))[0] == _lib.SC_BACKEND_CUDA
                and not torch.cuda.is_current_stream_capturing()):
            status = _sc_validate(base, backward, err)
            if status:
                return status
            device = torch.device("cuda", torch.cuda.current_device())
            status, message = validate_on_host(base, backward, device)
            if status:
                raw = message.encode()[:_lib._ERR_MAX - 1] + b"\0"
                ctypes.memmove(err, raw, len(raw))
                return status
        return run(base, err)

    checked.unchecked = run
    return checked


_lock = threading.Lock()
_depth = 0
_saved = None


def _enter():
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = (_lib._sc_forward, _lib._sc_backward, _fast._native)
            _lib._sc_forward = _checking(_saved[0], 0)
            _lib._sc_backward = _checking(_saved[1], 1)
            _fast._native = None
        _depth += 1


def _exit():
    global _depth, _saved
    with _lock:
        _depth -= 1
        if _depth == 0:
            _lib._sc_forward, _lib._sc_backward, _fast._native = _saved
            _saved = None


def active():
    """True while calls on CUDA tensors have their index contents checked."""
    return _depth > 0


class check_contents:
    """Check the contents of index tensors on CUDA calls as the host backends do.

    ``with shortconv.check_contents():`` -- every call inside (any entry point:
    causal_conv1d, causal_conv1d_update, the modules, shortconv.vllm, shortconv.dao, the
    backward) first copies its index tensors (cu_seqlens / query_start_loc, state and
    cache indices, has_initial_state, ring offsets, seq_idx, accepted counts, parent
    tokens, block tables and block indices, computed tokens) to the host and validates
    them as the CPU backend does: a row out of the pool, an accepted count of 0, a
    parent token after its child, a block index past its table, a final row named
    twice, ... raise ShortConvError naming the argument, before anything is written.
    Without it the CUDA kernels clamp such contents (docs/semantics.md section 7).

    Costs one host synchronisation per call: a debugging and testing mode.  Process-wide
    while any block is open (like torch.autograd.detect_anomaly); nesting is allowed.
    Calls captured into a CUDA graph are not checked.  CPU calls are checked anyway.
    The environment variable SHORTCONV_CHECK_CONTENTS=1 turns it on for the whole
    process at import.

    Args:
        enabled: False makes the block a no-op (``with check_contents(debug):``).
    """

    def __init__(self, enabled=True):
        self.enabled = bool(enabled)
        self._entered = False

    def __enter__(self):
        if self.enabled:
            _enter()
            self._entered = True
        return self

    def __exit__(self, *exc):
        if self._entered:
            self._entered = False
            _exit()
        return False


if os.environ.get("SHORTCONV_CHECK_CONTENTS", "") not in ("", "0"):
    _enter()  # for the whole process
