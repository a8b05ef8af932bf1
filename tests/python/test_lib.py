"""The ctypes layer: descriptors written at the right offsets, the CUDA exec fields."""
import torch

from shortconv import _lib


def args_of(call):
    return _lib._Args.from_buffer(call.buf)


def test_descriptors_round_trip():
    base = torch.randn(2, 7, 3 * 5, dtype=torch.float64)
    x = base[:, 1:, 5:10]  # offset, non-contiguous
    c = _lib.Call("t", x, 4, 3, _lib.ACT_SILU)
    c.set("x", x)
    c.set("cu_seqlens", torch.tensor([0, 6], dtype=torch.int64), _lib.INDEX_CODES)
    a = args_of(c)
    assert (a.struct_size, a.width, a.state_len, a.activation) == (_lib.ARGS_SIZE, 4, 3, 1)
    assert a.x.data == x.data_ptr() and a.x.dtype == 3 and a.x.ndim == 3
    assert list(a.x.shape) == [2, 6, 5, 0] and list(a.x.stride) == list(x.stride()) + [0]
    assert a.cu_seqlens.dtype == 5 and a.cu_seqlens.ndim == 1
    assert a.weight.ndim == 0 and a.y.ndim == 0  # absent fields stay absent
    assert a.exec.backend == _lib.SC_BACKEND_CPU
    assert a.exec.num_threads == torch.get_num_threads()


class _FakeCudaTensor:
    """Just enough of a CUDA tensor for Call's constructor (no GPU needed)."""
    is_cuda = True
    device = torch.device("cuda", 1)

    def get_device(self):
        return 1


def test_cuda_exec_fields(monkeypatch):
    seen = []
    monkeypatch.setattr(_lib, "_raw_stream", lambda index: seen.append(index) or 0xABC0)
    c = _lib.Call("t", _FakeCudaTensor(), 4, -1, _lib.ACT_NONE)
    a = args_of(c)
    assert seen == [1]  # the current stream of x's device
    assert a.exec.backend == _lib.SC_BACKEND_CUDA and a.exec.stream == 0xABC0
    assert c.cuda_index == 1
    assert a.exec.workspace is None and a.exec.workspace_bytes == 0
