"""shortconv: the short causal depthwise convolution for PyTorch, over libshortconv's C ABI.

    y, final_state = shortconv.causal_conv1d(x, weight, bias, activation="silu",
                                             output_final_state=True)
    y, cache = shortconv.causal_conv1d_update(x_t, cache, weight=weight, activation="silu")
    layer = shortconv.ShortConvolution(hidden_size, kernel_size=4)
    from shortconv.dao import causal_conv1d_fn, causal_conv1d_update   # causal-conv1d's API
    from shortconv.vllm import causal_conv1d_fn, causal_conv1d_update  # vLLM's Mamba ops
    y_local, _ = shortconv.distributed.causal_conv1d(x_local, weight, group=cp_group)  # CP shard
    with shortconv.check_contents(): ...  # CUDA calls: index contents checked as on the CPU

CPU tensors run on the CPU backend, CUDA tensors on the CUDA backend (torch's
current stream, workspace from torch's caching allocator).  The library is
found next to this file (wheel), through $SHORTCONV_LIBRARY, or at
<repo>/build/lib/libshortconv.so (source build).
"""

from ._lib import ShortConvError, has_backend, library_path, version
from ._ops import HAS_CUSTOM_OPS
from .functional import causal_conv1d, causal_conv1d_update
from .modules import ShortConvolution
from . import dao, vllm  # noqa: E402  (causal-conv1d's and vLLM's APIs, for one-import switches)
from ._check import check_contents

__version__ = "0.1.0"

__all__ = [
    "causal_conv1d",
    "causal_conv1d_update",
    "ShortConvolution",
    "distributed",
    "dao",
    "vllm",
    "ShortConvError",
    "check_contents",
    "HAS_CUSTOM_OPS",
    "has_backend",
    "library_path",
    "version",
]


def __getattr__(name):
    """``shortconv.distributed`` (context parallelism over torch.distributed) on first use:
    importing it imports torch._dynamo (torch.compiler.disable), seconds per process."""
    if name == "distributed":
        import importlib

        return importlib.import_module(".distributed", __name__)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
