"""ShortConvolution: a drop-in for FLA's module of the same name."""

import warnings

import torch
import torch.nn as nn

from ._args import check_flag, check_tensor
from ._lib import invalid
from ._ops import activation_code
from .functional import causal_conv1d, causal_conv1d_update

__all__ = ["ShortConvolution"]


class ShortConvolution(nn.Conv1d):
    """Causal depthwise convolution over [B, T, D] with nn.Conv1d's parameters.

    The weight is nn.Conv1d's [D, 1, W] (so checkpoints of FLA's module and of a
    depthwise nn.Conv1d load unchanged); the op sees it as a [D, W] view.

    forward(x, residual=None, mask=None, cache=None, output_final_state=False,
    cu_seqlens=None) returns (y, cache):
    - training / prefill: causal_conv1d with initial_state=cache; the new state
      [N, D, S] is returned when output_final_state (S = cache's last dim, or W);
    - one token per sequence with autograd off (B*T == N): a decode step through
      causal_conv1d_update; ``cache`` (zeros [N, D, W] when None) is updated in
      place and returned when output_final_state.
    """

    def __init__(self, hidden_size, kernel_size, bias=False, activation="silu", backend=None,
                 device=None, dtype=None, **kwargs):
        super().__init__(in_channels=hidden_size, out_channels=hidden_size,
                         kernel_size=kernel_size, groups=hidden_size, bias=bias,
                         padding=kernel_size - 1, device=device, dtype=dtype)
        self.hidden_size = hidden_size
        activation_code(activation, "ShortConvolution")  # raises for an unknown name
        self.activation = activation
        if "use_fast_conv1d" in kwargs:
            warnings.warn("use_fast_conv1d is deprecated and ignored", stacklevel=2)
        self.backend = "shortconv"  # FLA's backend argument is accepted and ignored

    def extra_repr(self):
        s = "{in_channels}, {out_channels}, kernel_size={kernel_size}"
        if self.bias is None:
            s += ", bias=False"
        if self.activation is not None:
            s += ", activation={activation}"
        return s.format(**self.__dict__)

    @property
    def state_size(self):
        return self.hidden_size * self.kernel_size[0]

    def _weight2d(self):
        return self.weight[:, 0]  # [D, 1, W] -> [D, W], a view

    def forward(self, x, residual=None, mask=None, cache=None, output_final_state=False,
                cu_seqlens=None, chunk_indices=None, **kwargs):
        where = "shortconv.ShortConvolution"
        check_tensor(where, "x", x, "[B, T, D]")
        if x.dim() < 2:
            raise invalid(where, "x: expected [B, T, D] or packed [1, total, D], got shape %s"
                          % list(x.shape))
        if cache is not None:
            check_tensor(where, "cache", cache, "[N, D, S] or None")
        if cu_seqlens is not None:
            check_tensor(where, "cu_seqlens", cu_seqlens, "[N+1] (int32/int64) or None")
            if cu_seqlens.dim() != 1:
                raise invalid(where, "cu_seqlens: expected 1 dims, got %d" % cu_seqlens.dim())
        B, T = x.shape[0], x.shape[1]
        N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
        if mask is not None:
            if cu_seqlens is not None:
                raise ValueError("mask and cu_seqlens cannot be given together")
            check_tensor(where, "mask", mask, "[B, T] or None")
            if mask.shape != x.shape[:2]:
                raise invalid(where, "mask: expected shape [B, T] = %s, got %s"
                              % (list(x.shape[:2]), list(mask.shape)))
            x = x * mask.unsqueeze(-1).to(x.dtype)
        if not torch.is_grad_enabled() and B * T == N:
            return self.step(x, residual, cache, output_final_state, cu_seqlens)
        return causal_conv1d(x, self._weight2d(), self.bias, residual=residual,
                             initial_state=cache, output_final_state=output_final_state,
                             activation=self.activation, cu_seqlens=cu_seqlens)

    def step(self, x, residual, cache, output_final_state=False, cu_seqlens=None):
        """One token for each of N sequences; cache updated in place."""
        where = "shortconv.ShortConvolution.step"
        check_tensor(where, "x", x, "[N, D] or [N, 1, D]")
        if cu_seqlens is not None:
            check_tensor(where, "cu_seqlens", cu_seqlens, "[N+1] (int32/int64) or None")
        D, W = self.hidden_size, self.kernel_size[0]
        if output_final_state is not True and output_final_state is not False:
            output_final_state = check_flag(where, "output_final_state", output_final_state)
        N = x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
        if cache is None:
            cache = x.new_zeros(N, D, W)
        y, cache = causal_conv1d_update(x, cache, residual, self._weight2d(), self.bias,
                                        self.activation, cu_seqlens=cu_seqlens)
        return y, (cache if output_final_state else None)
