"""Model blocks whose conv call goes through each drop-in unchanged, against the same block
calling shortconv.causal_conv1d directly: forward, backward, and prefill + decode loops.

Two small blocks written here: a Mamba-2-style block (in_proj -> conv over x|B|C -> selective
scan -> gate -> out_proj) and a Gated DeltaNet-style block (q/k/v projections, one short conv
each, a gated delta-rule recurrence).  Each conv is a shortconv.ShortConvolution holding the
parameters; the ``Conv`` adapters below are the lines a model using each peer's API writes:

    dao     Mamba-2 / causal-conv1d: causal_conv1d_fn(x=xBC.transpose(1, 2), ...), and the
            decode step causal_conv1d_update(x, conv_state, weight, bias, activation) positional
    vllm    vLLM's engine: a packed prefill into a state pool, decode steps into the pool
    module  FLA's layers: conv(x, cache=..., output_final_state=...)
    fla     FLA's fused q/k/v path: causal_conv1d(x=..., weight=..., backend=conv.backend, ...)
    direct  shortconv.causal_conv1d / causal_conv1d_update with explicit state_len (reference)

vLLM's ops are inference-only (no backward there).
"""
import inspect

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import shortconv
from shortconv import dao, vllm

from helpers import TOL, rel

F64 = torch.float64


def _w(conv):
    return conv.weight.squeeze(1)  # "d 1 w -> d w"


class Direct:
    def prefill(self, conv, x):
        return shortconv.causal_conv1d(x, _w(conv), conv.bias, activation="silu",
                                       output_final_state=True, state_len=conv.kernel_size[0] - 1)

    def step(self, conv, x_t, state):
        return shortconv.causal_conv1d_update(x_t, state, weight=_w(conv), bias=conv.bias,
                                              activation="silu")[0]


class Dao:
    def prefill(self, conv, x):
        out, state = dao.causal_conv1d_fn(x=x.transpose(1, 2), weight=_w(conv), bias=conv.bias,
                                          activation="silu", return_final_states=True)
        return out.transpose(1, 2), state

    def step(self, conv, x_t, state):
        return dao.causal_conv1d_update(x_t, state, _w(conv), conv.bias, "silu")


class Vllm:
    def prefill(self, conv, x):
        B, T, D = x.shape
        W = conv.kernel_size[0]
        pool = x.new_zeros(2 * B + 1, D, W + 1)  # rows longer than W-1, as engines allocate
        rows = torch.arange(B, dtype=torch.int32) * 2 + 1
        qsl = torch.arange(B + 1, dtype=torch.int32) * T
        y = vllm.causal_conv1d_fn(x.reshape(B * T, D).t(), _w(conv), conv.bias, conv_states=pool,
                                  query_start_loc=qsl, cache_indices=rows,
                                  has_initial_state=torch.zeros(B, dtype=torch.bool),
                                  activation="silu")
        return y.t().reshape(B, T, D), (pool, rows)

    def step(self, conv, x_t, state):
        pool, rows = state
        return vllm.causal_conv1d_update(x_t, pool, _w(conv), conv.bias, activation=True,
                                         conv_state_indices=rows)


class Module:
    def prefill(self, conv, x):
        return conv(x, output_final_state=True)

    def step(self, conv, x_t, state):
        y, returned = conv(x_t[:, None], cache=state, output_final_state=True)
        assert returned is state  # FLA's in-place decode
        return y[:, 0]


class Fla:
    def prefill(self, conv, x):
        return shortconv.causal_conv1d(x=x, weight=_w(conv), bias=conv.bias,
                                       activation=conv.activation, backend=conv.backend,
                                       output_final_state=True)

    def step(self, conv, x_t, state):
        return shortconv.causal_conv1d_update(x=x_t, cache=state, weight=_w(conv), bias=conv.bias,
                                              activation=conv.activation)[0]


ADAPTERS = {"direct": Direct, "dao": Dao, "vllm": Vllm, "module": Module, "fla": Fla}


class Mamba2Block(nn.Module):
    def __init__(self, conv_api, d_model=12, d_inner=16, d_state=4, width=4):
        super().__init__()
        self.api, self.d_inner, self.d_state = conv_api, d_inner, d_state
        conv_dim = d_inner + 2 * d_state
        self.in_proj = nn.Linear(d_model, d_inner + conv_dim + 1, dtype=F64)
        self.conv1d = shortconv.ShortConvolution(conv_dim, width, bias=True, dtype=F64)
        self.A_log = nn.Parameter(torch.rand(1, dtype=F64))
        self.D = nn.Parameter(torch.randn(d_inner, dtype=F64))
        self.out_proj = nn.Linear(d_inner, d_model, dtype=F64)

    def forward(self, u, cache=None):
        """u [B, T, d_model]; cache None: a prefill from zero states, returns (y, cache);
        otherwise one decode step (T = 1) updating cache."""
        z, xBC, dt = self.in_proj(u).split([self.d_inner, self.in_proj.out_features
                                            - self.d_inner - 1, 1], dim=-1)
        if cache is None:
            xBC, conv_state = self.api.prefill(self.conv1d, xBC)
            ssm = u.new_zeros(u.shape[0], self.d_inner, self.d_state)
        else:
            conv_state, ssm = cache
            xBC = self.api.step(self.conv1d, xBC[:, 0], conv_state)[:, None]
        x, Bm, Cm = xBC.split([self.d_inner, self.d_state, self.d_state], dim=-1)
        decay = torch.exp(-F.softplus(dt) * torch.exp(self.A_log))  # [B, T, 1]
        ys = []
        for t in range(u.shape[1]):
            ssm = decay[:, t, :, None] * ssm + x[:, t, :, None] * Bm[:, t, None, :]
            ys.append((ssm * Cm[:, t, None, :]).sum(-1) + self.D * x[:, t])
        y = torch.stack(ys, 1) * F.silu(z)
        return self.out_proj(y), (conv_state, ssm)


class GatedDeltaNetBlock(nn.Module):
    def __init__(self, conv_api, d_model=12, d_k=8, d_v=10, width=4):
        super().__init__()
        self.api = conv_api
        self.q_proj = nn.Linear(d_model, d_k, bias=False, dtype=F64)
        self.k_proj = nn.Linear(d_model, d_k, bias=False, dtype=F64)
        self.v_proj = nn.Linear(d_model, d_v, bias=False, dtype=F64)
        self.q_conv1d = shortconv.ShortConvolution(d_k, width, bias=True, dtype=F64)
        self.k_conv1d = shortconv.ShortConvolution(d_k, width, bias=True, dtype=F64)
        self.v_conv1d = shortconv.ShortConvolution(d_v, width, bias=True, dtype=F64)
        self.b_proj = nn.Linear(d_model, 1, dtype=F64)
        self.a_proj = nn.Linear(d_model, 1, dtype=F64)
        self.o_proj = nn.Linear(d_v, d_model, bias=False, dtype=F64)
        self.d_k, self.d_v = d_k, d_v

    def forward(self, h, cache=None):
        convs = (self.q_conv1d, self.k_conv1d, self.v_conv1d)
        xs = (self.q_proj(h), self.k_proj(h), self.v_proj(h))
        if cache is None:
            outs = [self.api.prefill(c, x) for c, x in zip(convs, xs)]
            qkv, conv_states = [o[0] for o in outs], [o[1] for o in outs]
            S = h.new_zeros(h.shape[0], self.d_k, self.d_v)
        else:
            conv_states, S = cache
            qkv = [self.api.step(c, x[:, 0], s)[:, None]
                   for c, x, s in zip(convs, xs, conv_states)]
        q, k, v = F.normalize(qkv[0], dim=-1), F.normalize(qkv[1], dim=-1), qkv[2]
        beta, g = torch.sigmoid(self.b_proj(h)), -F.softplus(self.a_proj(h))
        outs = []
        for t in range(h.shape[1]):
            S = torch.exp(g[:, t, :, None]) * S
            kt = k[:, t]
            delta = v[:, t] - torch.einsum("bk,bkv->bv", kt, S)
            S = S + beta[:, t, :, None] * kt[:, :, None] * delta[:, None, :]
            outs.append(torch.einsum("bk,bkv->bv", q[:, t], S))
        return self.o_proj(torch.stack(outs, 1)), (conv_states, S)


BLOCKS = {"mamba2": Mamba2Block, "gated_deltanet": GatedDeltaNetBlock}


def _pair(block, api):
    torch.manual_seed(30)
    ref = BLOCKS[block](Direct())
    torch.manual_seed(30)
    m = BLOCKS[block](ADAPTERS[api]())
    return m, ref


def _skip_unsupported(api):
    if api == "vllm" and "has_initial_state" not in inspect.signature(
            shortconv.causal_conv1d_update).parameters:
        pytest.skip("vLLM's prefill needs shortconv.causal_conv1d_update(has_initial_state=...), "
                    "which this shortconv does not have yet")


def _close(a, b, what):
    assert a.shape == b.shape, what
    assert rel(a, b) <= TOL[F64], "%s: relative error %.3g" % (what, rel(a, b))


@pytest.mark.parametrize("api", ["dao", "vllm", "module", "fla"])
@pytest.mark.parametrize("block", list(BLOCKS))
def test_forward_and_backward(block, api):
    _skip_unsupported(api)
    m, ref = _pair(block, api)
    u = torch.randn(3, 11, 12, dtype=F64, generator=torch.Generator().manual_seed(31))
    u_m, u_r = u.clone().requires_grad_(), u.clone().requires_grad_()
    if api == "vllm":  # inference-only ops
        with torch.no_grad():
            _close(m(u_m)[0], ref(u_r)[0], "y")
        return
    y, _ = m(u_m)
    y_ref, _ = ref(u_r)
    _close(y, y_ref, "y")
    gy = torch.randn(y.shape, dtype=F64, generator=torch.Generator().manual_seed(32))
    grads = torch.autograd.grad(y, [u_m] + list(m.parameters()), gy)
    grads_ref = torch.autograd.grad(y_ref, [u_r] + list(ref.parameters()), gy)
    names = ["u"] + [n for n, _ in m.named_parameters()]
    for name, a, b in zip(names, grads, grads_ref):
        _close(a, b, "d" + name)


@pytest.mark.parametrize("api", ["direct", "dao", "vllm", "module", "fla"])
@pytest.mark.parametrize("block", list(BLOCKS))
def test_prefill_then_decode_equals_whole_sequence(block, api):
    _skip_unsupported(api)
    m, ref = _pair(block, api)
    u = torch.randn(2, 10, 12, dtype=F64, generator=torch.Generator().manual_seed(33))
    with torch.no_grad():
        whole, _ = ref(u)
        y, cache = m(u[:, :4])
        ys = [y]
        for t in range(4, u.shape[1]):
            yt, cache = m(u[:, t:t + 1], cache)
            ys.append(yt)
    _close(torch.cat(ys, 1), whole, "y")
