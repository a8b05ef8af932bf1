"""seq_idx (sequence ids per token) against a loop over its runs, one sequence at a time.

Forward, final states (row = sequence id), and gradients of x, weight, bias, residual and
initial_state; padding tokens (negative ids) give 0 and feed nothing.  The library takes
seq_idx itself (docs/semantics.md section 3); the double backward and torch.compile pass it
through.
"""
import pytest
import torch

import shortconv
from helpers import HAS_CUDA

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def _runs(row):
    """[(start, end, id)] maximal runs of equal ids in one row."""
    out, s = [], 0
    for t in range(1, len(row) + 1):
        if t == len(row) or row[t] != row[s]:
            out.append((s, t, row[s]))
            s = t
    return out


def _loop(x, w, b, seq_idx, h0, act, S):
    """Reference: each run alone through shortconv.causal_conv1d (dense, B = 1)."""
    B, T, D = x.shape
    ys, finals = [], {}
    for bi in range(B):
        y_row = []
        for s, e, i in _runs(seq_idx[bi].tolist()):
            xs = x[bi:bi + 1, s:e]
            if i < 0:
                y_row.append(torch.zeros_like(xs))
                continue
            init = None if h0 is None else h0[i:i + 1]
            y, f = shortconv.causal_conv1d(xs, w, b, initial_state=init, activation=act,
                                           output_final_state=True, state_len=S)
            y_row.append(y)
            finals[i] = f[0]
        ys.append(torch.cat(y_row, 1) if y_row else x[bi:bi + 1, :0])
    return torch.cat(ys, 0), finals


def _ids(B, T, gen, pad=True):
    rows, nxt = [], 0
    for _ in range(B):
        row = []
        while len(row) < T:
            n = int(torch.randint(1, 6, (1,), generator=gen))
            i = -1 if pad and torch.rand(1, generator=gen) < 0.2 else nxt
            nxt += i >= 0
            row += [i] * n
        rows.append(row[:T])
    return torch.tensor(rows, dtype=torch.int64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("W,S", [(1, 0), (3, 2), (4, 5)])
@pytest.mark.parametrize("with_states", [False, True])
def test_seq_idx_equals_loop_over_runs(device, W, S, with_states):
    gen = torch.Generator().manual_seed(W * 10 + S + with_states)
    B, T, D = 3, 17, 5
    seq_idx = _ids(B, T, gen)
    n_ids = int(seq_idx.max()) + 1
    dt = torch.float64
    x = torch.randn(B, T, D, generator=gen, dtype=dt).to(device).requires_grad_()
    w = torch.randn(D, W, generator=gen, dtype=dt).to(device).requires_grad_()
    b = torch.randn(D, generator=gen, dtype=dt).to(device).requires_grad_()
    h0 = (torch.randn(n_ids + 2, D, S, generator=gen, dtype=dt).to(device).requires_grad_()
          if with_states else None)
    y, f = shortconv.causal_conv1d(x, w, b, initial_state=h0, output_final_state=True,
                                   activation="silu", seq_idx=seq_idx.to(device), state_len=S)
    y_ref, finals = _loop(x, w, b, seq_idx, h0, "silu", S)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    assert f.shape[0] == (n_ids + 2 if with_states else n_ids)
    for i in range(f.shape[0]):
        want = finals.get(i, torch.zeros(D, S, dtype=dt, device=device))
        torch.testing.assert_close(f[i], want, rtol=1e-12, atol=1e-12)
    # gradients through y and the final states
    gy = torch.randn(y.shape, generator=gen, dtype=dt).to(device)
    gf = torch.randn(f.shape, generator=gen, dtype=dt).to(device)
    params = [x, w, b] + ([h0] if with_states else [])
    got = torch.autograd.grad((y * gy).sum() + (f * gf).sum(), params)
    loss_ref = (y_ref * gy).sum() + sum((finals[i] * gf[i]).sum() for i in finals)
    want = torch.autograd.grad(loss_ref, params, allow_unused=True)
    for g, r, name in zip(got, want, ["x", "weight", "bias", "initial_state"]):
        r = torch.zeros_like(g) if r is None else r
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10, msg=name)


def test_seq_idx_bad_input():
    x = torch.randn(2, 6, 3)
    w = torch.randn(3, 4)
    with pytest.raises(ValueError, match="seq_idx"):
        shortconv.causal_conv1d(x, w, seq_idx=torch.zeros(2, 5, dtype=torch.int32))
    with pytest.raises(TypeError, match="seq_idx"):
        shortconv.causal_conv1d(x, w, seq_idx=torch.zeros(2, 6))
    with pytest.raises(ValueError, match="seq_idx"):
        shortconv.causal_conv1d(x, w, seq_idx=torch.zeros(2, 6, dtype=torch.int32),
                                cu_seqlens=torch.tensor([0, 12]))
    # an id past the initial_state rows is an error (the library's, naming seq_idx), not
    # another row's state
    with pytest.raises(ValueError, match="seq_idx"):
        shortconv.causal_conv1d(x, w, initial_state=torch.zeros(1, 3, 3),
                                seq_idx=torch.ones(2, 6, dtype=torch.int32))
    # with final states each id is one run
    with pytest.raises(ValueError, match="second run"):
        shortconv.causal_conv1d(x, w, output_final_state=True,
                                seq_idx=torch.tensor([[0, 0, 1, 1, 0, 0]] * 2, dtype=torch.int32))


@pytest.mark.parametrize("device", DEVICES)
def test_residual_gradient_is_zero_on_padding(device):
    gen = torch.Generator().manual_seed(7)
    B, T, D, W = 2, 9, 4, 3
    seq_idx = torch.tensor([[-1, 0, 0, 0, -1, 1, 1, -2, -2], [2, 2, 2, 2, 3, -1, 4, 4, 4]])
    x = torch.randn(B, T, D, generator=gen, dtype=torch.float64).to(device)
    r = torch.randn(B, T, D, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    w = torch.randn(D, W, generator=gen, dtype=torch.float64).to(device)
    y, _ = shortconv.causal_conv1d(x, w, residual=r, activation="silu", seq_idx=seq_idx.to(device))
    pad = (seq_idx < 0).to(device)
    assert torch.all(y[pad] == 0)
    gy = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(device)
    (g,) = torch.autograd.grad((y * gy).sum(), [r])
    torch.testing.assert_close(g, torch.where(pad.unsqueeze(-1), torch.zeros_like(gy), gy),
                               rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_with_seq_idx(device):
    """gradgradcheck through the library's backward with seq_idx (padding and states)."""
    gen = torch.Generator().manual_seed(11)
    B, T, D, W, S = 2, 7, 2, 3, 3
    seq_idx = torch.tensor([[0, 0, -1, 1, 1, 1, -1], [-1, 2, 2, 3, 4, 4, 4]]).to(device)
    f64 = dict(dtype=torch.float64)
    x = torch.randn(B, T, D, generator=gen, **f64).to(device).requires_grad_()
    w = torch.randn(D, W, generator=gen, **f64).to(device).requires_grad_()
    b = torch.randn(D, generator=gen, **f64).to(device).requires_grad_()
    h0 = torch.randn(5, D, S, generator=gen, **f64).to(device).requires_grad_()

    def fn(x, w, b, h0):
        y, f = shortconv.causal_conv1d(x, w, b, initial_state=h0, output_final_state=True,
                                       activation="silu", seq_idx=seq_idx)
        return y, f

    torch.autograd.gradgradcheck(fn, (x, w, b, h0), nondet_tol=0, atol=1e-6, rtol=1e-5)
