"""The vector-Jacobian product of the backward (double backward), from short convolutions.

Per sequence and channel (docs/semantics.md sections 1-2), with u = h0 ++ x,
off = S-(W-1) and conv(v; w)[t] = sum_k w[k] v[off+t+k] (v's first S entries
are its state, the rest its tokens), the backward maps (x, w, b, h0, dy, dht) to

    pre    = conv(u; w) + b
    dpre   = dy * a'(pre)
    du[p]  = sum_{off+t+k=p} w[k] dpre[t] + (p >= L ? dht[p-L] : 0)     (dx, dh0) = split(du)
    dw[k]  = sum_t dpre[t] u[off+t+k]          db = sum_t dpre[t]

Given cotangents (gdx, gdw, gdb, gdh0) of (dx, dw, db, dh0), let g_u = gdh0 ++ gdx.
The scalar <g_u, du> + <gdw, dw> + <gdb, db> equals

    sum_t dpre[t] G[t] + sum_j g_u[L+j] dht[j],    G = conv(g_u; w) + conv(u; gdw) + gdb

so its gradient with respect to each input of the backward is

    dht: g_u[L:]            (the final state of the forward of g_u)
    dy:  G * a'(pre)
    u:   sum_{off+t+k=p} gdw[k] dpre[t]    (a backward with weight gdw, dy := dpre)
         + the backward of pre = conv(u; w) + b fed with g_pre = G * dy * a''(pre)
    w:   sum_t dpre[t] g_u[off+t+k]        (dweight of a backward of g_u, dy := dpre)
         + dweight of that same backward of pre
    b:   sum_t g_pre[t]

For the identity a' = 1 and a'' = 0; for SiLU, with s = sigmoid(z), s_ = sigmoid(-z),
a'(z) = s (1 + z s_) and a''(z) = s s_ (2 + z (s_ - s)).  Every term is a forward
or backward call of the library (identity activation) or an elementwise torch
op, so with differentiable fwd/bwd the result is itself differentiable.

``fwd`` and ``bwd`` are the calls to use (the autograd.Function's or the custom
ops'), with the signatures of forward_impl / backward_impl and None for absent.
With sequence ids every call takes the same seq_idx: padding tokens then
contribute nothing to any term (their y, dx and G are 0), and state rows are
ids in each call (the final state of g_u has dht's rows).
"""

import torch

from ._lib import ACT_NONE, ACT_SILU


def _silu_derivatives(pre):
    """a'(pre), a''(pre) in fp32 at least (16-bit pre would lose both to cancellation)."""
    z = pre.float() if pre.dtype in (torch.float16, torch.bfloat16) else pre
    s, s_ = torch.sigmoid(z), torch.sigmoid(-z)
    return s * (1 + z * s_), s * s_ * (2 + z * (s_ - s))


def backward_vjp(fwd, bwd, saved, state_len, activation, computed, needs, grads):
    """Gradients of the backward's inputs (x, weight, bias, initial_state, dy, dht).

    saved: (x, weight, bias, initial_state, cu_seqlens, dy, dht, seq_idx), None for absent.
    computed: which of (dx, dweight, dbias, dinitial_state) the backward returned.
    needs: which of the six inputs need a gradient.  grads: the cotangents of the
    four outputs (None = zero, or the output was not computed).
    """
    x, w, b, h0, cu, dy, dht, sid = saved
    rows = dht.shape[0] if dht is not None else 0  # (seq_idx: the final state's rows)
    gdx, gdw, gdb, gdh0 = (g if c and g is not None else None for g, c in zip(grads, computed))
    nx, nw, nb, nh0, ndy, ndht = needs
    S = state_len
    out = [None] * 6
    if gdx is None and gdw is None and gdb is None and gdh0 is None:
        return out
    g_u = gdx is not None or gdh0 is not None
    gx_in = gdx if gdx is not None else x.new_zeros(()).expand(x.shape)  # a zero g_u token part

    # G = conv(g_u; w) + (conv(u; gdw) + gdb); the second term rides along as the residual.
    G2 = None
    if gdw is not None:
        G2, _ = fwd(x, gdw, gdb, None, h0, cu, S, ACT_NONE, False, sid, rows)
    elif gdb is not None:
        G2 = gdb.to(x.dtype).expand(x.shape)
    G, ht_g = G2, None
    if g_u:
        G, ht_g = fwd(gx_in, w, None, G2, gdh0, cu, S, ACT_NONE, ndht, sid, rows)
    if sid is not None and G is not None and not g_u:  # gdb alone: padding tokens get no term
        real = (sid >= 0).view(*sid.shape, *([1] * (G.dim() - 2)))
        G = torch.where(real, G, torch.zeros((), dtype=G.dtype, device=G.device))
    if ndht and ht_g is not None:
        out[5] = ht_g.to(dht.dtype)

    need_u = nx or nh0
    if activation == ACT_SILU:
        pre, _ = fwd(x, w, b, None, h0, cu, S, ACT_NONE, False, sid, rows)
        a1, a2 = _silu_derivatives(pre)
        dpre = (dy * a1).to(x.dtype) if dy is not None else None
        if ndy:
            out[4] = (G * a1).to(x.dtype)
        if dy is not None and (need_u or nw or nb):
            g_pre = (G * dy * a2).to(x.dtype)
            gx, gw, gb, gh0 = bwd(x, w, b, h0, cu, g_pre, None, S, ACT_NONE,
                                  nx, nw, nb and b is not None, nh0 and h0 is not None, sid)
            out[0], out[1], out[2], out[3] = gx, gw, gb, gh0
    else:
        dpre = dy
        if ndy:
            out[4] = G

    if dpre is not None:
        if gdw is not None and need_u:  # u in conv(u; gdw)
            gx, _, _, gh0 = bwd(x, gdw, None, h0, cu, dpre, None, S, ACT_NONE,
                                nx, False, False, nh0 and h0 is not None, sid)
            out[0] = _add(out[0], gx)
            out[3] = _add(out[3], gh0)
        if g_u and nw:  # w in conv(g_u; w)
            _, gw, _, _ = bwd(gx_in, w, None, gdh0, cu, dpre, None, S, ACT_NONE,
                              False, True, False, False, sid)
            out[1] = _add(out[1], gw)
    return out


def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a + b
