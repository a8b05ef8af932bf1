"""ShortConvolution: a drop-in for FLA's module of the same name."""

import importlib.util
import os
import warnings

import torch
import torch.nn as nn

from . import _fast, _ops
from ._args import check_flag, check_tensor
from ._lib import invalid
from ._ops import activation_code
from .functional import causal_conv1d, causal_conv1d_update

__all__ = ["ShortConvolution"]

# FLA's values for ShortConvolution(backend=...); conv.backend is one of them, so a model that
# passes it on to FLA's functional causal_conv1d keeps working.
_BACKENDS = ["cuda", "triton"]

# forward() keywords FLA's ShortConvolution passes on to its functional causal_conv1d.  The
# decode shortcut may ignore the first two (another description of cu_seqlens / a launch-plan
# hint); anything else sends the call through causal_conv1d, which implements or refuses it.
_DECODE_HINTS = ("cu_seqlens_cpu", "chunk_indices")


def _causal_conv1d_cuda_installed():
    return importlib.util.find_spec("causal_conv1d") is not None


class ShortConvolution(nn.Conv1d):
    """y = act(bias + causal depthwise conv of x) + residual, over [B, T, D], with nn.Conv1d's
    parameters.

    The weight is nn.Conv1d's [D, 1, W] (so checkpoints of FLA's module and of a depthwise
    nn.Conv1d load unchanged); the op sees it as a [D, W] view.

    Constructor: FLA's (hidden_size, kernel_size, bias=False, activation='silu',
    backend='triton', device=None, dtype=None, **kwargs).  ``backend`` (or $FLA_CONV_BACKEND)
    must be 'triton' or 'cuda' (FLA's ValueError otherwise) and is kept in ``self.backend`` for
    models that hand it to FLA's functional conv; 'cuda' falls back to 'triton' with FLA's
    warning when the causal-conv1d package is not installed.  shortconv runs the op either way.
    ``use_fast_conv1d`` is deprecated (a warning, as in FLA); any other keyword is a TypeError.

    forward(x, residual=None, mask=None, cache=None, output_final_state=False,
    cu_seqlens=None, chunk_indices=None, **kwargs) returns (y, state):
    - x [B, T, D] (or packed [1, total, D] with cu_seqlens); mask [B, T] zeroes padded tokens
      (x itself is left untouched, unlike FLA);
    - cache [N, D, S] (S >= W-1; FLA's S = W) is the initial state; the new state is returned
      when output_final_state (a fresh tensor);
    - one token per sequence (B*T == N) with a cache is a decode step: ``cache`` itself is
      updated in place, with or without autograd, and returned when output_final_state.  Under
      autograd the update is recorded (gradients flow through the new cache to the old one,
      x and the parameters); a cache that is a leaf requiring grad cannot be written in place,
      so it is left as is and the new state returned, as FLA does;
    - other keywords (seq_idx, cp_context, cu_seqlens_cpu, ...) go to
      ``shortconv.causal_conv1d``, which implements or rejects each: none is dropped.
    """

    def __init__(self, hidden_size, kernel_size, bias=False, activation="silu",
                 backend="triton", device=None, dtype=None, **kwargs):
        if "use_fast_conv1d" in kwargs:
            kwargs.pop("use_fast_conv1d")
            warnings.warn("The `use_fast_conv1d` parameter is deprecated and will be ignored. "
                          "Please use the `backend` parameter instead.", stacklevel=2)
        if kwargs:
            raise TypeError("shortconv.ShortConvolution: unexpected keyword argument(s) %s"
                            % ", ".join(sorted(kwargs)))
        activation_code(activation, "shortconv.ShortConvolution")  # raises for an unknown name
        backend = os.environ.get("FLA_CONV_BACKEND", backend)
        if backend not in _BACKENDS:
            raise ValueError("Invalid backend: %s, must be one of %s" % (backend, _BACKENDS))
        super().__init__(in_channels=hidden_size, out_channels=hidden_size,
                         kernel_size=kernel_size, groups=hidden_size, bias=bias,
                         padding=kernel_size - 1, device=device, dtype=dtype)
        self.hidden_size = hidden_size
        self.activation = activation
        if backend == "cuda" and not _causal_conv1d_cuda_installed():
            warnings.warn("The `backend` parameter is set to `cuda`, but `causal_conv1d_fn` is "
                          "not available. Switching to the Triton implementation instead. "
                          "Consider installing `causal_conv1d` to enable the CUDA backend.",
                          stacklevel=2)
            backend = "triton"
        self.backend = backend

    def extra_repr(self):
        s = "{in_channels}, {out_channels}, kernel_size={kernel_size}"
        if self.bias is None:
            s += ", bias=False"
        if self.activation is not None:
            s += ", activation={activation}"
        s += ", backend={backend}"
        return s.format(**self.__dict__)

    @property
    def state_size(self):
        return self.hidden_size * self.kernel_size[0]

    def _weight2d(self):
        # [D, 1, W] -> [D, W], a view whose backward is a view too (indexing's, weight[:, 0],
        # allocates a zero [D, 1, W] and copies dweight into it: two kernels per step)
        return self.weight.squeeze(1)

    def forward(self, x, residual=None, mask=None, cache=None, output_final_state=False,
                cu_seqlens=None, chunk_indices=None, **kwargs):
        # The decode step without autograd (one token per sequence, a cache) in the native
        # module's one pass: step()'s call, its weight view done on the description
        # (tests/python/test_fast.py compares both).
        # The parameters are read from _parameters (nn.Module.__getattr__ costs a Python
        # call per access); a weight that is not a plain registered parameter (a
        # parametrization, a weight-norm hook's attribute) takes the general path.
        native = _fast._native
        params = self._parameters
        weight = params.get("weight")
        bias = params.get("bias") if "bias" in params else False
        if (native is not None and type(x) is torch.Tensor and type(cache) is torch.Tensor
                and weight is not None and bias is not False
                and residual is None and mask is None
                and cu_seqlens is None and chunk_indices is None and not kwargs
                and (output_final_state is True or output_final_state is False)
                and not _ops.use_custom_op()
                and (not torch.is_grad_enabled() or not (
                    x.requires_grad or cache.requires_grad or weight.requires_grad
                    or (bias is not None and bias.requires_grad)))):
            act = _fast._ACTIVATIONS.get(self.activation)
            if act is not None:
                y = native.update_module(x, cache, weight, bias, act)
                if y is not None:
                    return y, (cache if output_final_state else None)
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
        if output_final_state is not True and output_final_state is not False:
            output_final_state = check_flag(where, "output_final_state", output_final_state)
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
        decode = B * T == N and (not kwargs or all(k in _DECODE_HINTS or v is None
                                                   for k, v in kwargs.items()))
        if decode and cache is not None:
            return self._decode(x, residual, cache, output_final_state, cu_seqlens)
        if decode and not torch.is_grad_enabled():
            return self.step(x, residual, cache, output_final_state, cu_seqlens)
        return causal_conv1d(x, self._weight2d(), self.bias, residual=residual,
                             initial_state=cache, output_final_state=output_final_state,
                             activation=self.activation, cu_seqlens=cu_seqlens,
                             chunk_indices=chunk_indices, **kwargs)

    def _decode(self, x, residual, cache, output_final_state, cu_seqlens):
        """One token per sequence, cache given: cache updated in place, autograd or not."""
        tracked = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad
            for t in (x, residual, cache, self.weight, self.bias))
        if not tracked:
            return self.step(x, residual, cache, output_final_state, cu_seqlens)
        if cache.is_leaf and cache.requires_grad:  # in-place writes to it are forbidden
            return causal_conv1d(x, self._weight2d(), self.bias, residual=residual,
                                 initial_state=cache, output_final_state=output_final_state,
                                 activation=self.activation, cu_seqlens=cu_seqlens)
        # The differentiable forward reads a copy: the graph keeps the old values for the
        # backward while cache itself takes the new ones (a recorded in-place copy).
        y, new = causal_conv1d(x, self._weight2d(), self.bias, residual=residual,
                               initial_state=cache.clone(), output_final_state=True,
                               activation=self.activation, cu_seqlens=cu_seqlens)
        cache.copy_(new)
        return y, (cache if output_final_state else None)

    def step(self, x, residual, cache, output_final_state=False, cu_seqlens=None):
        """One token for each of N sequences; cache (zeros [N, D, W] when None) updated in place."""
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
