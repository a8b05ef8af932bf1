"""Where the time of one small PyTorch-API call goes (host overhead vs GPU work).

    python bench/py_overhead.py [--shape 1x2048x2048] [--device cuda]

Prints µs per call (back-to-back calls / n, synchronised at both ends) for:
  floor     a minimal torch.autograd.Function (two elementwise ops) fwd+bwd on
            the same tensors: what any Python-level autograd op costs on this host
  fwd       shortconv.causal_conv1d under no_grad
  fwd+bwd   shortconv.causal_conv1d + torch.autograd.grad (x, weight, bias)
  graph     the same fwd+bwd captured once in a torch.cuda.CUDAGraph and
            replayed: the GPU time through the PyTorch API, host removed
  torch     plain F.conv1d + SiLU fwd+bwd (the reference)
"""
import argparse
import time

import torch
import torch.nn.functional as F

import shortconv


class _Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, (g * x).sum((0, 1))


def per_call(fn, device, budget=0.5):
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()
    for _ in range(20):
        fn()
    sync()
    n, best = 50, []
    t_end = time.perf_counter() + budget
    while time.perf_counter() < t_end or len(best) < 3:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        best.append((time.perf_counter() - t0) / n * 1e6)
    best.sort()
    return best[len(best) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1x2048x2048")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    B, T, D = (int(v) for v in a.shape.split("x"))
    dev, dt, W = a.device, torch.bfloat16, 4
    x = torch.randn(B, T, D, device=dev, dtype=dt, requires_grad=True)
    w = torch.randn(D, W, device=dev, dtype=dt, requires_grad=True)
    b = torch.randn(D, device=dev, dtype=dt, requires_grad=True)
    dy = torch.randn(B, T, D, device=dev, dtype=dt)
    wf = torch.randn(D, device=dev, dtype=dt, requires_grad=True)

    def floor():
        torch.autograd.grad(_Floor.apply(x, wf), [x, wf], dy)

    def fwd():
        with torch.no_grad():
            shortconv.causal_conv1d(x, w, b, activation="silu", state_len=W - 1)

    def fwdbwd():
        y, _ = shortconv.causal_conv1d(x, w, b, activation="silu", state_len=W - 1)
        return torch.autograd.grad(y, [x, w, b], dy)

    def ref():
        y = F.silu(F.conv1d(x.transpose(1, 2), w.unsqueeze(1), b, padding=W - 1,
                            groups=D)[..., :T]).transpose(1, 2)
        torch.autograd.grad(y, [x, w, b], dy)

    rows = [("floor", per_call(floor, dev)), ("fwd", per_call(fwd, dev)),
            ("fwd+bwd", per_call(fwdbwd, dev))]
    if dev == "cuda":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fwdbwd()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fwdbwd()
        rows.append(("graph", per_call(g.replay, dev)))
    rows.append(("torch", per_call(ref, dev)))
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"shape {a.shape} bf16 W=4 SiLU bias, {name}, torch {torch.__version__}")
    for k, v in rows:
        print(f"{k:8} {v:9.1f} us/call")


if __name__ == "__main__":
    main()
