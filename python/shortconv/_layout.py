"""Which layout the package gives the outputs it allocates.

y and dx follow x, as torch.empty_like(x) does (preserve_format): x's own strides when x is
dense in any layout (token-major [B, T, D], channel-major [B, D, T] storage viewed as
[B, T, D], a [T, B, D] buffer, ...), and for a view that is not dense, dense strides with
x's order of dimensions (a slice of a fused token-major projection gets a contiguous y, a
slice of a fused channel-major one a channel-major y; broadcast dims go outermost).  So the
kernels write y and dx the way they read x, and causal-conv1d's callers get the layout
causal-conv1d gives (``out = torch.empty_like(x)``).  Gradients of parameters and states
(dweight, dbias, dinitial_state) and final states are contiguous.

The eager calls (_lib.Call.out_like_x / out_like) and the fake (meta) implementations
torch.compile traces (like_x / like_contiguous) allocate the same way, so compiled graphs
see the strides the real calls return.
"""

import torch


def like_x(x):
    """A new tensor for y or dx."""
    return torch.empty_like(x)  # preserve_format


def like_contiguous(t):
    """A new contiguous tensor of t's shape and dtype (dweight like weight, dbias like bias,
    a state like initial_state)."""
    if t.is_contiguous():
        return torch.empty_like(t)  # t's own strides, which are contiguous
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


def contiguous_strides(shape):
    """The strides of a contiguous tensor of this shape (torch's: a size-0 dim counts as 1)."""
    out, step = [], 1
    for size in reversed(shape):
        out.append(step)
        step *= max(size, 1)
    return tuple(reversed(out))
