"""The C ABI (include/shortconv/shortconv.h) through ctypes.

No compilation against torch: one libshortconv serves every torch version.

Where the library is looked for, first hit wins:
  1. $SHORTCONV_LIBRARY (a path to the .so),
  2. next to this file (the wheel installs libshortconv.so into the package),
  3. <repo>/build/lib/libshortconv.so (a source build with python/ on PYTHONPATH).

Host overhead matters (a small call should cost a few µs of Python), so an
sc_conv_args is not built field by field through ctypes attributes: each call
takes a ctypes buffer from a free list, copies a pre-initialised byte template
(sc_conv_args_init's output) into it and writes each present tensor description
with a single precompiled struct.pack_into at the field's offset (describe()).
The buffer also holds the size_t the workspace query writes and the sc_error
message; it goes back to the free list when the library has returned, so a call
shares nothing with other threads or with a call made while it is being filled.
More savings:
  - the workspace size of a call signature (shapes, dtypes, which tensors are
    present, scalars) is remembered, so a repeated signature makes one C call
    (the run, which checks the size again) instead of two;
  - a backward starts from a snapshot of its forward's buffer (x, weight, bias,
    cu_seqlens, initial_state already described) instead of describing them again;
  - the common calls skip Call altogether (_fast.py: one pass over the buffer with
    describe(), the same bytes).

Layout of the per-call buffer:
  [0, ARGS_SIZE)                 sc_conv_args
  [WS_OFF, WS_OFF + 8)           size_t workspace bytes (query output)
  [ERR_OFF, ERR_OFF + 512)       sc_error
"""

import ctypes
import os
import re
import struct

import torch

from ._layout import contiguous_strides, like_contiguous

__all__ = ["ShortConvError", "library_path", "version", "has_backend"]

# ---- status and dtype codes (shortconv.h) --------------------------------------
SC_OK = 0
SC_ERR_INVALID_ARGUMENT = 1
SC_ERR_UNSUPPORTED = 2
SC_ERR_WORKSPACE = 3
SC_ERR_BACKEND = 4

SC_BACKEND_CPU = 0
SC_BACKEND_CUDA = 1
SC_BACKEND_REF = 2

ACT_NONE = 0
ACT_SILU = 1

# Float groups (activation, parameter, state) and index tensors.
FLOAT_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}
INDEX_CODES = {torch.int32: 4, torch.int64: 5}
FLAG_CODES = {torch.bool: 6, torch.int32: 4, torch.int64: 5}


class ShortConvError(ValueError):
    """An error reported by libshortconv (bad shape, stride, dtype, ... or a
    backend failure).  ``status`` is the sc_status code; the message names the
    argument, the expected and the given value."""

    def __init__(self, message, status=SC_ERR_INVALID_ARGUMENT):
        super().__init__(message)
        self.status = status


INT32_MAX = 2**31 - 1


def type_name(v):
    """'list', 'numpy.ndarray', ...: how error messages name a wrong Python type."""
    t = type(v)
    mod = t.__module__.split(".")[0]
    return t.__name__ if mod == "builtins" else "%s.%s" % (mod, t.__name__)


def invalid(where, message):
    """A ShortConvError worded like the library's own (status SC_ERR_INVALID_ARGUMENT)."""
    return ShortConvError("%s: invalid argument: %s" % (where, message))


def int32_error(where, width, state_len, activation):
    """The error for scalars the C ABI's int32 fields cannot hold (struct.error)."""
    named = (("weight: width W = weight.shape[-1]", width),
             ("state_len: state length S", state_len), ("activation", activation))
    for name, v in named:
        if not isinstance(v, int) or isinstance(v, bool):
            return TypeError("%s: %s: expected an int, got %s" % (where, name, type_name(v)))
        if not -INT32_MAX - 1 <= v <= INT32_MAX:
            return invalid(where, "%s = %d exceeds the C ABI's int32 (at most %d)"
                           % (name, v, INT32_MAX))
    return invalid(where, "scalar arguments out of range")


# ---- the struct layout, mirrored once to get offsets -------------------------
_MAX_DIMS = 4


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * _MAX_DIMS),
        ("stride", ctypes.c_int64 * _MAX_DIMS),
    ]


class _Exec(ctypes.Structure):
    _fields_ = [
        ("backend", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
        ("tile_t", ctypes.c_int64),
        ("tile_d", ctypes.c_int64),
        ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("overlap", ctypes.c_int32),
    ]


# Field order of sc_conv_args after the four int32 scalars.
TENSOR_FIELDS = (
    "x", "weight", "bias", "residual", "cu_seqlens", "initial_state", "initial_state_indices",
    "y", "final_state", "final_state_indices",
    "dy", "dfinal_state", "dx", "dweight", "dbias", "dinitial_state",
    "has_initial_state", "ring_offsets",
)
# Tensor fields after pad_index (sequence ids), then the serving group (forward only).
TENSOR_FIELDS_AFTER_PAD = ("seq_idx",)
SERVING_FIELDS = ("num_accepted", "parent_tokens", "block_table", "initial_block", "final_block",
                  "first_block", "computed_tokens")


class _Args(ctypes.Structure):
    _fields_ = (
        [("struct_size", ctypes.c_uint32), ("width", ctypes.c_int32),
         ("state_len", ctypes.c_int32), ("activation", ctypes.c_int32)]
        + [(name, _Tensor) for name in TENSOR_FIELDS]
        + [("pad_index", ctypes.c_int64)]
        + [(name, _Tensor) for name in TENSOR_FIELDS_AFTER_PAD]
        + [(name, _Tensor) for name in SERVING_FIELDS]
        + [("block_size", ctypes.c_int64), ("zero_padded_outputs", ctypes.c_int32),
           ("exec", _Exec)]
    )


ARGS_SIZE = ctypes.sizeof(_Args)
OFF = {name: getattr(_Args, name).offset
       for name in TENSOR_FIELDS + TENSOR_FIELDS_AFTER_PAD + SERVING_FIELDS}
_SCALARS_OFF = _Args.width.offset
_EXEC_OFF = _Args.exec.offset
_PAD_OFF = _Args.pad_index.offset
_PAD_PACK = struct.Struct("<q").pack_into  # pad_index, block_size
_BLOCK_SIZE_OFF = _Args.block_size.offset
_ZERO_PADS_OFF = _Args.zero_padded_outputs.offset
_INT32_PACK = struct.Struct("<i").pack_into  # zero_padded_outputs, exec.overlap
_OVERLAP_OFF = _EXEC_OFF + _Exec.overlap.offset
_OVERLAP_PACK = _INT32_PACK
_WORKSPACE_OFF = _EXEC_OFF + _Exec.workspace.offset
WS_OFF = (ARGS_SIZE + 7) // 8 * 8
ERR_OFF = WS_OFF + 8
_ERR_MAX = 512
_BUF_SIZE = ERR_OFF + _ERR_MAX
_Buf = ctypes.c_char * _BUF_SIZE

# One precompiled packer per rank: data, dtype, ndim, shape[0..nd), padding to
# shape[4], stride[0..nd) (unused shape/stride slots stay 0 from the template).
_TENSOR_PACK = [None] + [
    struct.Struct("<Qii%dq%dx%dq" % (nd, 8 * (_MAX_DIMS - nd), nd)).pack_into
    for nd in range(1, _MAX_DIMS + 1)
]
_SCALARS_PACK = struct.Struct("<iii").pack_into          # width, state_len, activation
_EXEC_PACK = struct.Struct("<iiqqQ").pack_into           # backend .. stream
_WORKSPACE_PACK = struct.Struct("<QQ").pack_into         # workspace, workspace_bytes
_SIZE_UNPACK = struct.Struct("<Q").unpack_from


# ---- loading --------------------------------------------------------------------
def _candidates():
    env = os.environ.get("SHORTCONV_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    return [
        os.path.join(here, "libshortconv.so"),
        os.path.join(repo, "build", "lib", "libshortconv.so"),
    ]


def _load():
    tried = []
    for path in _candidates():
        if os.path.exists(path):
            return ctypes.CDLL(path), path
        tried.append(path)
    raise ImportError(
        "shortconv: libshortconv.so not found (looked at %s). Build it with "
        "`cmake -S . -B build -G Ninja && cmake --build build`, install the package with "
        "`pip install .`, or point SHORTCONV_LIBRARY at the library." % ", ".join(tried))


_lib, library_path = _load()

for _name in ("sc_forward", "sc_backward"):
    getattr(_lib, _name).argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    getattr(_lib, _name).restype = ctypes.c_int
for _name in ("sc_forward_workspace_size", "sc_backward_workspace_size"):
    getattr(_lib, _name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    getattr(_lib, _name).restype = ctypes.c_int
_lib.sc_conv_args_init.argtypes = [ctypes.c_void_p]
_lib.sc_conv_args_init.restype = None
_lib.sc_status_string.argtypes = [ctypes.c_int]
_lib.sc_status_string.restype = ctypes.c_char_p
_lib.sc_version_string.argtypes = []
_lib.sc_version_string.restype = ctypes.c_char_p
_lib.sc_has_backend.argtypes = [ctypes.c_int32]
_lib.sc_has_backend.restype = ctypes.c_int32
for _name in ("sc_backend_name", "sc_activation_name"):
    getattr(_lib, _name).argtypes = [ctypes.c_int32]
    getattr(_lib, _name).restype = ctypes.c_char_p


def _names(fn):
    """{name: id} of the ids 0, 1, ... the library names (the list ends at NULL)."""
    out, i = {}, 0
    while True:
        name = fn(i)
        if name is None:
            return out
        out[name.decode()] = i
        i += 1


# The library's own lists (src/core/backend.cpp, src/core/activation.hpp).
BACKENDS = _names(_lib.sc_backend_name)        # {"cpu": 0, "cuda": 1, "ref": 2}
ACTIVATIONS = _names(_lib.sc_activation_name)  # {"identity": 0, "silu": 1}

_sc_forward = _lib.sc_forward
_sc_backward = _lib.sc_backward
_sc_forward_ws = _lib.sc_forward_workspace_size
_sc_backward_ws = _lib.sc_backward_workspace_size


def entry_points():
    """The addresses of sc_forward, sc_backward and their workspace queries, for the native
    module (shortconv/native.py), which calls the library this module loaded."""
    return tuple(ctypes.cast(f, ctypes.c_void_p).value
                 for f in (_sc_forward, _sc_backward, _sc_forward_ws, _sc_backward_ws))

# The template: sc_conv_args_init's bytes followed by zeroed ws / error slots.
_init = _Buf()
_lib.sc_conv_args_init(ctypes.addressof(_init))
if struct.unpack_from("<I", _init, 0)[0] != ARGS_SIZE:
    raise ImportError(
        "shortconv: %s has sizeof(sc_conv_args) = %d but this package expects %d; the library "
        "and the Python package come from different versions"
        % (library_path, struct.unpack_from("<I", _init, 0)[0], ARGS_SIZE))
_TEMPLATE = bytes(_init)
del _init


def version():
    """The library's version string, "MAJOR.MINOR.PATCH"."""
    return _lib.sc_version_string().decode()


def has_backend(backend):
    """True if the backend (an id or one of the library's names: "cpu", "cuda",
    "ref") is compiled in."""
    if isinstance(backend, str):
        if backend not in BACKENDS:
            raise ValueError("has_backend: expected one of %s, got %r"
                             % (", ".join(sorted(BACKENDS)), backend))
        backend = BACKENDS[backend]
    return bool(_lib.sc_has_backend(backend))


# ---- building one call ----------------------------------------------------------
_TorchTensor = torch.Tensor
_Parameter = torch.nn.Parameter
_STRIDED = torch.strided
_PLAIN_DISPATCH = getattr(torch.Tensor, "__torch_dispatch__", None)


if hasattr(torch._C, "_cuda_getCurrentRawStream"):
    _raw_stream = torch._C._cuda_getCurrentRawStream  # (device index) -> cudaStream_t as int
else:  # pragma: no cover - very old torch
    def _raw_stream(index):
        return torch.cuda.current_stream(index).cuda_stream

_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
_empty = torch.empty
_zeros = torch.zeros
_empty_like = torch.empty_like

if hasattr(torch._C, "StorageBase"):
    class _Storage(torch._C.StorageBase):
        """A workspace: untyped storage from torch's allocator (the caching allocator on
        CUDA), without torch.UntypedStorage's Python-level constructor (a quarter of its
        cost)."""
else:  # pragma: no cover - older torch
    _Storage = torch.UntypedStorage


# Workspace bytes by call signature (Call._run_here): a workspace query is a full validation
# in C, as long again as the run's own, so a signature seen before skips it.  Bounded: cleared
# when full (a stream of new shapes costs what it cost without the cache).
_WS_BYTES = {}
_WS_BYTES_MAX = 4096


# Per-call buffers: a call takes one from this free list and gives it back once the library
# has returned (list.pop / append are atomic, so each thread, and a call made from inside
# another -- e.g. by a torch function mode --, holds its own); a buffer taken starts over
# from the template (one memcpy through .raw), so a call shares nothing with another.
_FREE = []
_FREE_MAX = 16


def _take(state=_TEMPLATE):
    """(buffer, its address), holding ``state`` (the template, or a forward's snapshot)."""
    try:
        buf, base = _FREE.pop()
    except IndexError:
        buf = _Buf()
        base = ctypes.addressof(buf)
    buf.raw = state
    return buf, base


def _give_back(buf, base):
    if len(_FREE) < _FREE_MAX:
        _FREE.append((buf, base))


def describe(buf, off, t, codes, cuda_index):
    """Pack the description of ``t`` at ``off`` when it is the common case: a plain tensor
    (or Parameter) on the call's device (``cuda_index``: -1 for the CPU), of a dtype in
    ``codes``, with strided memory holding its values and 1 to 4 dims.  Returns (shape,
    strides, data pointer, dtype code), or None for anything else, which Call.set then
    handles (a copy of a lazy view) or refuses with its error."""
    tt = type(t)
    if (tt is not _TorchTensor and tt is not _Parameter) or t.is_neg():
        return None
    if cuda_index < 0:
        if not t.is_cpu:
            return None
    elif t.get_device() != cuda_index or not t.is_cuda:  # (-1 for a CPU tensor)
        return None
    code = codes.get(t.dtype)
    if code is None:
        return None
    try:
        shape = t.shape
        strides = t.stride()
        ptr = t.data_ptr()
    except (RuntimeError, NotImplementedError):  # no strided memory: Call.set says why
        return None
    nd = len(shape)
    if nd == 0 or nd > _MAX_DIMS:
        return None
    _TENSOR_PACK[nd](buf, off, ptr, code, nd, *shape, *strides)
    return shape, strides, ptr, code


def describe_tokens(buf, off, t, cuda_index):
    """describe() for an activation of a decode step: [N, D] (one token per sequence) is
    described as [N, 1, D] (the view unsqueeze(1) would make, without making it), [N, T, D]
    as it is; None for anything else."""
    tt = type(t)
    if (tt is not _TorchTensor and tt is not _Parameter) or t.is_neg():
        return None
    if cuda_index < 0:
        if not t.is_cpu:
            return None
    elif t.get_device() != cuda_index or not t.is_cuda:
        return None
    code = FLOAT_CODES.get(t.dtype)
    if code is None:
        return None
    try:
        shape = t.shape
        strides = t.stride()
        ptr = t.data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    nd = len(shape)
    if nd == 2:
        n, d = shape
        sn, sd = strides
        _TENSOR_PACK[3](buf, off, ptr, code, 3, n, 1, d, sn, d * sd, sd)
    elif nd == 3:
        _TENSOR_PACK[3](buf, off, ptr, code, 3, *shape, *strides)
    else:
        return None
    return shape, strides, ptr, code


def exec_fields(buf, x):
    """Write exec for a call on x's device; x's CUDA device index, -1 for the CPU, or None
    when x is on another kind of device (nothing written)."""
    if x.is_cuda:
        index = x.get_device()
        _EXEC_PACK(buf, _EXEC_OFF, SC_BACKEND_CUDA, 0, 0, 0, _raw_stream(index))
        return index
    if x.is_cpu:
        _EXEC_PACK(buf, _EXEC_OFF, SC_BACKEND_CPU, _num_threads(), 0, 0, 0)
        return -1
    return None


_num_threads = torch.get_num_threads


class Call:
    """One sc_conv_args being filled for a call on x's device.

    set() describes an input (its own shape and strides), out_*() allocate an
    output and describe it, run_forward()/run_backward() allocate the workspace
    through torch (the caching allocator; inside a CUDA-graph capture it comes
    from the graph's pool) and run.  Errors are raised with ``where`` (the public
    function's name) in front of the library's message, with argument names
    translated through ``rename``.  The buffer goes back to the free list when the
    library returns: a Call runs once.

    CUDA: exec.stream is torch's current stream on x's device, and the call
    runs with x's device current (kernels cannot be launched on another
    device's stream).
    """

    __slots__ = ("buf", "base", "device", "cuda_index", "where", "rename", "keep", "sig")

    def __init__(self, where, x, width, state_len, activation, rename=None):
        buf, self.base = _take()
        self.buf = buf
        self.where = where
        self.rename = rename
        self.keep = None
        try:
            _SCALARS_PACK(buf, _SCALARS_OFF, width, state_len, activation)
        except struct.error:
            raise int32_error(where, width, state_len, activation) from None
        self.sig = [width, state_len, activation]  # what the workspace size depends on
        self._exec(x)

    @classmethod
    def resume(cls, where, snapshot):
        """A Call holding a snapshot()'s descriptions (a backward after its forward), with
        the execution fields of now (torch's current stream, thread count)."""
        self = cls.__new__(cls)
        buf_bytes, sig, self.device, index = snapshot
        buf, self.base = _take(buf_bytes)
        self.buf = buf
        self.where = where
        self.rename = None
        self.keep = None
        self.sig = list(sig)
        self.cuda_index = index
        stream_fields(buf, index)
        return self

    def snapshot(self):
        """The descriptions so far, for Call.resume; None when an input was resolved into a
        copy (that copy is not kept alive until a backward)."""
        if self.keep is not None:
            return None
        return self.buf.raw, tuple(self.sig), self.device, self.cuda_index

    def _exec(self, x):
        self.device = x.device
        index = exec_fields(self.buf, x)
        if index is None:
            raise ValueError("%s: x is on device %s; shortconv runs on cpu and cuda tensors"
                             % (self.where, x.device))
        self.cuda_index = index

    def name(self, field):
        if self.rename:
            return self.rename.get(field, field)
        return field

    def set(self, field, t, codes=FLOAT_CODES, output=False):
        """Describe tensor ``t`` (present) in ``field``: its own shape and strides.
        Returns (shape, strides, data pointer); strides None when ``t`` was resolved into a
        copy (out_like*() then read the new tensor's strides).

        ``output``: the library writes ``t`` (the decode cache), so its memory
        must hold exactly its values (no lazily negated view to resolve).
        """
        d = describe(self.buf, OFF[field], t, codes, self.cuda_index)
        if d is None:
            return self._set(field, t, codes, output)
        shape, strides, ptr, code = d
        self.sig.append((field, shape, code))
        return shape, strides, ptr

    def _set(self, field, t, codes, output):
        """set() for what describe() leaves: a resolved copy, or the error naming why not."""
        tt = type(t)
        resolved = (tt is not _TorchTensor and tt is not _Parameter) or t.is_neg()
        if resolved:
            t = self._resolve(field, t, output)
        if (not t.is_cpu if self.cuda_index < 0
                else not t.is_cuda or t.get_device() != self.cuda_index):
            raise ValueError("%s: %s is on %s but x is on %s; every tensor must be on x's device"
                             % (self.where, self.name(field), t.device, self.device))
        code = codes.get(t.dtype)
        if code is None:
            raise TypeError("%s: %s has dtype %s; expected %s" % (
                self.where, self.name(field), t.dtype,
                " or ".join(str(d) for d in codes)))
        try:
            shape = t.shape
            strides = t.stride()
            ptr = t.data_ptr()
        except (RuntimeError, NotImplementedError) as e:
            # Tensors without strided storage (sparse, mkldnn, nested, functorch-batched,
            # ...) refuse data_ptr / shape / stride: their memory is not their values.
            self._resolve(field, t, output)  # names the layout when that is the reason
            raise TypeError("%s: %s: expected a dense strided tensor whose memory holds its "
                            "values; this one has none shortconv can read (%s)"
                            % (self.where, self.name(field), str(e).split("\n")[0])) from None
        nd = len(shape)
        if nd < 1 or nd > _MAX_DIMS:
            raise ValueError("%s: %s has %d dims; expected 1 to %d"
                             % (self.where, self.name(field), nd, _MAX_DIMS))
        _TENSOR_PACK[nd](self.buf, OFF[field], ptr, code, nd, *shape, *strides)
        self.sig.append((field, shape, code))
        return shape, None if resolved else strides, ptr

    def _resolve(self, field, t, output):
        """The uncommon cases of set(): subclasses, non-strided layouts, lazy views.

        The library reads and writes raw memory, so every flag that changes what
        the memory of ``t`` means is either resolved (inputs: a copy holding the
        values, kept alive until the call ends) or rejected.
        """
        name = self.name(field)
        if not isinstance(t, _TorchTensor):
            raise TypeError("%s: %s: expected a torch.Tensor, got %s"
                            % (self.where, name, type_name(t)))
        if getattr(type(t), "__torch_dispatch__", _PLAIN_DISPATCH) is not _PLAIN_DISPATCH:
            raise TypeError(
                "%s: %s is a %s, a tensor subclass with __torch_dispatch__ whose memory is not "
                "its values; shortconv reads memory directly: pass a plain torch.Tensor"
                % (self.where, name, type(t).__name__))
        if t.layout is not _STRIDED:
            raise TypeError("%s: %s has layout %s; expected a dense strided tensor (torch.strided)"
                            % (self.where, name, t.layout))
        if t.is_neg() or t.is_conj():
            if output:
                raise TypeError(
                    "%s: %s is a lazily %s view (its memory holds other values) and cannot be "
                    "updated in place; pass a tensor with its own memory (e.g. .resolve_neg())"
                    % (self.where, name, "negated" if t.is_neg() else "conjugated"))
            t = t.resolve_neg().resolve_conj()
            if self.keep is None:
                self.keep = []
            self.keep.append(t)  # its memory must outlive the call
        return t

    def set_out(self, field, t, codes=FLOAT_CODES):
        """Describe a tensor set() has already checked for another field (the aliased
        decode cache and its indices)."""
        nd = t.dim()
        _TENSOR_PACK[nd](self.buf, OFF[field], t.data_ptr(), codes[t.dtype], nd,
                         *t.shape, *t.stride())
        self.sig.append((field, t.shape))

    # ---- outputs the package allocates (docs in _layout.py) ----
    def _describe(self, field, t, shape, strides):
        nd = len(shape)
        _TENSOR_PACK[nd](self.buf, OFF[field], t.data_ptr(), FLOAT_CODES[t.dtype], nd,
                         *shape, *strides)
        self.sig.append((field, shape))

    def out_like_x(self, field, x, x_layout):
        """y or dx: torch.empty_like(x) (_layout.like_x); x_layout is set()'s for x."""
        shape, strides, _ = x_layout
        t = _empty_like(x)
        if strides is None or not x.is_contiguous():  # else exactly x's strides
            strides = t.stride()
        self._describe(field, t, shape, strides)
        return t

    def out_like(self, field, src, src_layout):
        """A contiguous output of the shape and dtype of the input ``src`` (dweight, dbias,
        a state like initial_state): _layout.like_contiguous; src_layout is set()'s."""
        shape, strides, _ = src_layout
        if strides is not None and src.is_contiguous():
            t = _empty_like(src)  # exactly src's (contiguous) strides
        else:
            t = like_contiguous(src)
            shape, strides = t.shape, t.stride()
        self._describe(field, t, shape, strides)
        return t

    def out_new(self, field, shape, dtype, zeros=False):
        """A new contiguous output (zero-filled when ``zeros``: rows the library may leave
        unwritten)."""
        t = (_zeros if zeros else _empty)(shape, dtype=dtype, device=self.device)
        self._describe(field, t, tuple(shape), contiguous_strides(shape))
        return t

    # ---- one token per sequence: [N, D] described as [N, 1, D] ----
    # (the view unsqueeze(1) would make, without making it: a decode step's x, residual, y)
    def _describe_tokens(self, field, ptr, code, shape, strides):
        n, d = shape
        sn, sd = strides
        _TENSOR_PACK[3](self.buf, OFF[field], ptr, code, 3, n, 1, d, sn, d * sd, sd)

    def set_tokens(self, field, t):
        """set() for a 2-D [N, D] input (every check; a lazy view resolved into a copy),
        described as [N, 1, D].  Returns set()'s (shape, strides, data pointer)."""
        seen = shape, strides, ptr = self.set(field, t)
        if strides is None:  # a resolved copy (kept in self.keep until the call ends)
            strides = self.keep[-1].stride()
        self._describe_tokens(field, ptr, FLOAT_CODES[t.dtype], shape, strides)
        return seen

    def out_tokens(self, field, x, x_layout):
        """y of a one-token step: out_like_x's tensor ([N, D] like x), described as
        [N, 1, D]; x_layout is set_tokens()'s for x."""
        shape, strides, _ = x_layout
        t = _empty_like(x)
        if strides is None or not x.is_contiguous():  # else exactly x's strides
            strides = t.stride()
        self._describe_tokens(field, t.data_ptr(), FLOAT_CODES[t.dtype], shape, strides)
        self.sig.append((field, shape))
        return t

    def set_pad_index(self, pad):
        """The state index that means "no row" besides -1 (an engine's pad slot id)."""
        _PAD_PACK(self.buf, _PAD_OFF, pad)
        self.sig.append(pad)

    def set_overlap(self, overlap):
        """exec.overlap (sc_overlap: 1 launch, 2 reads): the decode path's kernel may start
        while the kernel before it in the stream finishes."""
        _OVERLAP_PACK(self.buf, _OVERLAP_OFF, overlap)

    def set_block_size(self, block_size):
        """Prefix caching's block size (block boundaries get state snapshots)."""
        _PAD_PACK(self.buf, _BLOCK_SIZE_OFF, block_size)
        self.sig.append(("block_size", block_size))

    def set_zero_padded_outputs(self):
        """A padded sequence's outputs are 0 (causal-conv1d's convention for its padded
        rows), not computed from the zero state."""
        _INT32_PACK(self.buf, _ZERO_PADS_OFF, 1)
        self.sig.append("zero_pads")

    def _raise(self, status):
        raise library_error(self.base, self.where, self.rename, status)

    def _finish(self, status):
        """The buffer back to the free list (this Call is done), after raising the library's
        error when ``status`` is one."""
        try:
            if status:
                self._raise(status)
        finally:
            _give_back(self.buf, self.base)
            self.buf = None

    def _run(self, direction, query, run):
        if self.cuda_index >= 0 and self.cuda_index != _current_device():
            with torch.cuda.device(self.cuda_index):
                return self._run_here(direction, query, run)
        return self._run_here(direction, query, run)

    def _run_here(self, direction, query, run):
        key = (direction, self.cuda_index, *self.sig)
        self._finish(run_call(self.buf, self.base, key, self.cuda_index, self.device, query,
                              run))

    def run_forward(self):
        """sc_forward.  A CUDA forward needs no workspace (its size is 0 for every problem),
        so it runs without the size query or the signature lookup of _run; a host forward
        takes _run's remembered size (and a CUDA forward that reports SC_ERR_WORKSPACE
        after all, before writing anything, is redone that way)."""
        if self.cuda_index < 0:
            return self._run(0, _sc_forward_ws, _sc_forward)
        if self.cuda_index != _current_device():
            with torch.cuda.device(self.cuda_index):
                return self._forward_cuda()
        return self._forward_cuda()

    def _forward_cuda(self):
        base = self.base
        status = _sc_forward(base, base + ERR_OFF)  # (exec.workspace: NULL, 0 bytes)
        if status == SC_ERR_WORKSPACE:
            return self._run_here(0, _sc_forward_ws, _sc_forward)
        self._finish(status)

    def run_backward(self):
        self._run(1, _sc_backward_ws, _sc_backward)


def library_error(base, where, rename, status):
    """The ShortConvError of a failed call: ``where``, the status and the library's message
    (argument names translated through ``rename``)."""
    msg = ctypes.string_at(base + ERR_OFF).decode(errors="replace")
    return library_error_from(msg, where, rename, status)


def library_error_from(msg, where, rename, status):
    """library_error() of a message already read (the native module's calls)."""
    if rename:  # whole words only: initial_state is not inside has_initial_state
        msg = re.sub(r"(?<![A-Za-z0-9_])(%s)(?![A-Za-z0-9_])"
                     % "|".join(re.escape(k) for k in rename),
                     lambda m: rename[m.group(1)], msg)
    kind = _lib.sc_status_string(status).decode()
    return ShortConvError("%s: %s: %s" % (where, kind, msg), status)


def forward_on(buf, base, cuda_index, key, where, rename=None):
    """sc_forward on a buffer filled without a Call (a fast path), which is then given
    back; raises the library's error.  ``key``: the call signature (run_call), needed on
    the CPU only: a CUDA forward needs no workspace, so it runs without a size query (and a
    CUDA forward that reports SC_ERR_WORKSPACE after all is redone with a queried one)."""
    try:
        if cuda_index < 0:
            status = run_call(buf, base, key, -1, None, _sc_forward_ws, _sc_forward)
        elif cuda_index != _current_device():
            with torch.cuda.device(cuda_index):
                status = _forward_cuda_on(buf, base, cuda_index)
        else:
            status = _forward_cuda_on(buf, base, cuda_index)
        if status:
            raise library_error(base, where, rename, status)
    finally:
        _give_back(buf, base)


def _forward_cuda_on(buf, base, cuda_index):
    status = _sc_forward(base, base + ERR_OFF)  # (exec.workspace: NULL, 0 bytes)
    if status == SC_ERR_WORKSPACE:
        device = torch.device("cuda", cuda_index)
        return run_call(buf, base, None, cuda_index, device, _sc_forward_ws, _sc_forward)
    return status


def backward_on(buf, base, cuda_index, device, key, where):
    """sc_backward on a buffer filled without a Call, which is then given back (the
    workspace size remembered for ``key``, run_call); raises the library's error."""
    try:
        if cuda_index >= 0 and cuda_index != _current_device():
            with torch.cuda.device(cuda_index):
                status = run_call(buf, base, key, cuda_index, device, _sc_backward_ws,
                                  _sc_backward)
        else:
            status = run_call(buf, base, key, cuda_index, device, _sc_backward_ws,
                              _sc_backward)
        if status:
            raise library_error(base, where, None, status)
    finally:
        _give_back(buf, base)


def stream_fields(buf, cuda_index):
    """exec's backend, threads and stream now (a buffer resumed from a snapshot)."""
    if cuda_index >= 0:
        _EXEC_PACK(buf, _EXEC_OFF, SC_BACKEND_CUDA, 0, 0, 0, _raw_stream(cuda_index))
    else:
        _EXEC_PACK(buf, _EXEC_OFF, SC_BACKEND_CPU, _num_threads(), 0, 0, 0)


def run_call(buf, base, key, cuda_index, device, query, run):
    """Run ``run`` (sc_forward / sc_backward) on a filled buffer with a workspace from torch
    of the size remembered for ``key`` (queried with ``query`` and remembered when new);
    returns the status.

    The workspace size is a function of shapes, dtypes, which tensors are present and the
    scalars (CONTRIBUTING.md), all in ``key``; the run checks it again and reports
    SC_ERR_WORKSPACE, before writing anything, if it falls short (then the size is queried
    afresh).  The scratch is a torch storage (the cheapest allocation); it may be freed when
    the call returns: the caching allocator hands it out again only for work queued later on
    the same stream (or, inside a CUDA-graph capture, later in the same graph).  ``key``
    None: queried every time.  ``device``: the CUDA device (a torch.device), None on the
    CPU."""
    nbytes = _WS_BYTES.get(key) if key is not None else None
    cached = nbytes is not None
    if not cached:
        status = query(base, base + WS_OFF, base + ERR_OFF)
        if status:
            return status
        nbytes = _SIZE_UNPACK(buf, WS_OFF)[0]
        if key is not None:
            if len(_WS_BYTES) >= _WS_BYTES_MAX:
                _WS_BYTES.clear()
            _WS_BYTES[key] = nbytes
    while True:
        ws = None
        if nbytes:
            ws = _Storage(nbytes) if cuda_index < 0 else _Storage(nbytes, device=device)
            _WORKSPACE_PACK(buf, _WORKSPACE_OFF, ws.data_ptr(), nbytes)
        else:
            _WORKSPACE_PACK(buf, _WORKSPACE_OFF, 0, 0)
        status = run(base, base + ERR_OFF)
        if status != SC_ERR_WORKSPACE or not cached:  # else a size the key did not determine
            return status
        cached = False
        status = query(base, base + WS_OFF, base + ERR_OFF)
        if status:
            return status
        nbytes = _SIZE_UNPACK(buf, WS_OFF)[0]
        if key is not None:
            _WS_BYTES[key] = nbytes
