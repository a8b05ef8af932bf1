"""A plain-PyTorch reference built from F.conv1d on h0 ++ x (tests and bench).

Slow for packed batches (a Python loop over sequences) but obvious, and
differentiable through ordinary autograd.  Same conventions as
shortconv.causal_conv1d: x [B, T, D] or packed [1, total, D] / [total, D] with
cu_seqlens, weight [D, W], states [N, D, S] with S defaulting to
initial_state.shape[-1] or W.
"""

import torch
import torch.nn.functional as F

__all__ = ["causal_conv1d_ref"]


def _conv(u, weight, bias, activation, W, S):
    # u: [N, D, S+L] = h0 ++ x channel-major; only the last W-1 state entries feed outputs.
    D = weight.shape[0]
    if u.shape[2] == S:  # zero-length sequence: no outputs (conv1d rejects it)
        return u.new_zeros(u.shape[0], D, 0)
    pre = F.conv1d(u[:, :, S - (W - 1):], weight.unsqueeze(1), bias, groups=D)  # [N, D, L]
    if activation in ("silu", "swish"):
        pre = F.silu(pre)
    elif activation not in (None, "identity"):
        raise ValueError("activation: expected None, 'identity', 'silu' or 'swish', got %r"
                         % (activation,))
    return pre


def causal_conv1d_ref(x, weight, bias=None, residual=None, initial_state=None,
                      output_final_state=False, activation=None, cu_seqlens=None,
                      state_len=None):
    """Returns (y, final_state) computed with F.conv1d, in x's dtype."""
    shape = x.shape
    D, W = weight.shape
    if x.dim() > 3:
        x = x.flatten(2)
    if residual is not None:
        residual = residual.reshape(x.shape)
    if state_len is None:
        state_len = initial_state.shape[-1] if initial_state is not None else W
    S = state_len
    assert S >= W - 1, "state_len must be >= W-1"
    sdtype = initial_state.dtype if initial_state is not None else x.dtype

    if cu_seqlens is None:
        B, T, _ = x.shape
        h0 = (initial_state.to(x.dtype) if initial_state is not None
              else x.new_zeros(B, D, S))
        u = torch.cat([h0, x.transpose(1, 2)], dim=2)  # [B, D, S+T]
        y = _conv(u, weight.to(x.dtype), None if bias is None else bias.to(x.dtype),
                  activation, W, S).transpose(1, 2)
        ht = u[:, :, u.shape[2] - S:] if S > 0 else u[:, :, :0]
    else:
        xs = x.reshape(-1, D)  # [total, D]
        bounds = [int(v) for v in cu_seqlens.tolist()]
        ys, hts = [], []
        for n in range(len(bounds) - 1):
            xn = xs[bounds[n]:bounds[n + 1]]  # [L, D]
            h0 = (initial_state[n:n + 1].to(x.dtype) if initial_state is not None
                  else x.new_zeros(1, D, S))
            u = torch.cat([h0, xn.t().unsqueeze(0)], dim=2)  # [1, D, S+L]
            ys.append(_conv(u, weight.to(x.dtype), None if bias is None else bias.to(x.dtype),
                            activation, W, S)[0].t())
            hts.append(u[:, :, u.shape[2] - S:] if S > 0 else u[:, :, :0])
        y = torch.cat(ys, dim=0).reshape(x.shape) if ys else x.new_zeros(x.shape)
        ht = torch.cat(hts, dim=0) if hts else x.new_zeros(0, D, S)
    if residual is not None:
        y = y + residual
    return y.reshape(shape), (ht.to(sdtype) if output_final_state else None)
