"""python -m shortconv.bench: the PyTorch API against a plain F.conv1d reference.

For each shape (the CLI's defaults, `shortconv bench`): forward and
forward+backward through shortconv.causal_conv1d and through plain PyTorch
(depthwise F.conv1d with W-1 left padding, SiLU; states by concatenating
h0 ++ x; packed batches one F.conv1d per sequence), in µs per call and as the
fraction of the copy-bandwidth floor.

- per call = wall time of n back-to-back calls / n, synchronised at both ends,
  median over rounds.  The GPU work of one call overlaps the host work of the
  next, so a host-bound call (small shapes) shows its host overhead and a
  GPU-bound one its kernel time; compare the latter with the CLI's kernel figures.
- forward: under torch.no_grad().  forward+backward: the forward with grad
  plus torch.autograd.grad for x, weight, bias (and initial_state with states),
  no .grad accumulation.
- floor: the bytes that must move / the copy bandwidth measured in the same
  run (torch copy_ of a large buffer, read + write): forward 2 x-sized tensors,
  forward+backward 5.  frac = floor / time (1.0 = copy speed).
- Small working sets rotate over several copies of their buffers, so they are
  not timed out of cache (like the CLI).
- --decode: the decode section instead (shortconv/bench_decode.py).
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import shortconv
from shortconv.reference import causal_conv1d_ref

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "fp64": torch.float64}
ROTATE_BYTES = {"cuda": 256 << 20, "cpu": 128 << 20}  # working set to reach by rotating copies
MAX_COPIES = {"cuda": 16, "cpu": 8}
BUDGET_S = {"cuda": 1.0, "cpu": 1.0}  # per measurement, after warm-up


class Shape:
    def __init__(self, name, B, T, D, seqs=0, states=False, layout="token", W=4, dtypes=("bf16",)):
        self.name, self.B, self.T, self.D = name, B, T, D
        self.seqs, self.states, self.layout, self.W, self.dtypes = seqs, states, layout, W, dtypes


def default_shapes(device, W):
    if device == "cuda":
        return [
            Shape("dense 8x4096x4096", 8, 4096, 4096, W=W, dtypes=("bf16", "fp32")),
            Shape("packed 1x32768x8192 /16 +states", 1, 32768, 8192, seqs=16, states=True, W=W),
            Shape("long 1x65536x4096", 1, 65536, 4096, W=W),
            Shape("small 1x2048x2048", 1, 2048, 2048, W=W),
            Shape("dense 8x4096x4096 chan-major", 8, 4096, 4096, layout="channel", W=W),
            Shape("dense 8x4096x4096 W=8", 8, 4096, 4096, W=8),
        ]
    return [
        Shape("dense 4x4096x2048", 4, 4096, 2048, W=W, dtypes=("bf16", "fp32")),
        Shape("packed 1x16384x2048 /16 +states", 1, 16384, 2048, seqs=16, states=True, W=W,
              dtypes=("bf16", "fp32")),
        Shape("long 1x32768x1024", 1, 32768, 1024, W=W, dtypes=("bf16", "fp32")),
    ]


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def copy_GBps(device):
    """Copy bandwidth (read + write bytes / s) of a large torch copy_."""
    n = (1 << 30) if device == "cuda" else (512 << 20)
    a = torch.ones(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    sync(device)
    times = []
    for _ in range(10 if device == "cuda" else 4):
        if device == "cuda":  # device time of the copy alone, like the CLI's cudaEvents
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            b.copy_(a)
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) * 1e-3)
        else:
            t0 = time.perf_counter()
            b.copy_(a)
            times.append(time.perf_counter() - t0)
    return 2.0 * n / statistics.median(times) / 1e9


def make_inputs(s, dtype, device, seed, grad):
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape):  # generated on the device: the large shapes take seconds on a host
        return torch.randn(*shape, generator=g, dtype=dtype, device=device)

    B, T, D, W = s.B, s.T, s.D, s.W
    x = rnd(B, D, T).transpose(1, 2) if s.layout == "channel" else rnd(B, T, D)
    cu = None
    N = B
    if s.seqs:
        L = [T // s.seqs] * s.seqs
        L[-1] += T - sum(L)
        cu = torch.tensor([0] + [sum(L[:i + 1]) for i in range(len(L))], dtype=torch.int32,
                          device=device)
        N = s.seqs
    inp = dict(x=x, weight=rnd(D, W), bias=rnd(D), cu_seqlens=cu,
               initial_state=rnd(N, D, W - 1) if s.states else None,
               dy=rnd(B, T, D))
    if grad:
        for k in ("x", "weight", "bias", "initial_state"):
            if inp[k] is not None:
                inp[k].requires_grad_(True)
    return inp


def ours(p, backward):
    y, ht = shortconv.causal_conv1d(p["x"], p["weight"], p["bias"],
                                    initial_state=p["initial_state"],
                                    output_final_state=p["initial_state"] is not None,
                                    activation="silu", cu_seqlens=p["cu_seqlens"],
                                    state_len=p["weight"].shape[1] - 1)
    if backward:
        leaves = [t for t in (p["x"], p["weight"], p["bias"], p["initial_state"]) if t is not None]
        torch.autograd.grad(y, leaves, p["dy"])


def plain_torch(p, backward):
    x, w, b = p["x"], p["weight"], p["bias"]
    D, W = w.shape
    if p["initial_state"] is None and p["cu_seqlens"] is None:
        T = x.shape[1]
        y = F.silu(F.conv1d(x.transpose(1, 2), w.unsqueeze(1), b, padding=W - 1,
                            groups=D)[..., :T]).transpose(1, 2)
    else:  # h0 ++ x through F.conv1d; packed: one call per sequence
        y, _ = causal_conv1d_ref(x, w, b, initial_state=p["initial_state"],
                                 output_final_state=True, activation="silu",
                                 cu_seqlens=p["cu_seqlens"], state_len=W - 1)
    if backward:
        leaves = [t for t in (x, w, b, p["initial_state"]) if t is not None]
        torch.autograd.grad(y, leaves, p["dy"])


def measure(fn, copies, device, budget_s):
    """Median per-call µs of rounds of back-to-back calls over the rotating copies."""
    def rounds(n):
        t0 = time.perf_counter()
        for i in range(n):
            fn(copies[i % len(copies)])
        sync(device)
        return time.perf_counter() - t0

    sync(device)
    rounds(len(copies))  # warm-up: first touch, workspace, lazy init
    # Size rounds from a warm round of at least 8 calls: sized from the cold
    # first call, rounds shrink to ~1 call and per-call time becomes host + GPU
    # (no overlap) instead of the steady state.
    warm = max(8, len(copies))
    n = max(warm, int(0.02 / max(rounds(warm) / warm, 1e-7)))  # rounds of ~20 ms
    per_call, spent = [], 0.0
    while spent < budget_s or len(per_call) < 3:
        dt = rounds(n)
        spent += dt
        per_call.append(dt / n * 1e6)
        if len(per_call) >= 3 and spent > 4 * budget_s:
            break
    return statistics.median(per_call)


def bench_case(s, dtype_name, device, budget_s, with_torch):
    dtype = DTYPES[dtype_name]
    x_bytes = s.B * s.T * s.D * torch.empty(0, dtype=dtype).element_size()
    copies_n = max(1, min(MAX_COPIES[device], -(-ROTATE_BYTES[device] // (2 * x_bytes))))
    out = dict(shape=s.name, dtype=dtype_name, W=s.W, layout=s.layout, x_bytes=x_bytes)
    nograd = [make_inputs(s, dtype, device, i + 1, False) for i in range(copies_n)]
    grad = [make_inputs(s, dtype, device, i + 1, True) for i in range(copies_n)]

    def fwd(f):
        def run(p):
            with torch.no_grad():
                f(p, False)
        return run

    out["fwd_us"] = measure(fwd(ours), nograd, device, budget_s)
    out["fwdbwd_us"] = measure(lambda p: ours(p, True), grad, device, budget_s)
    if with_torch:
        out["torch_fwd_us"] = measure(fwd(plain_torch), nograd, device, budget_s)
        out["torch_fwdbwd_us"] = measure(lambda p: plain_torch(p, True), grad, device, budget_s)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m shortconv.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"],
                    default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", help="bench this dense shape BxTxD instead of the defaults")
    ap.add_argument("--seqs", type=int, default=0, help="with --shape: N packed sequences (B=1)")
    ap.add_argument("--states", action="store_true", help="with --shape: initial/final states")
    ap.add_argument("--dtype", choices=sorted(DTYPES), help="only this dtype")
    ap.add_argument("--width", type=int, default=4, help="W (default 4)")
    ap.add_argument("--layout", choices=["token", "channel"], default="token")
    ap.add_argument("--budget", type=float, default=None, help="seconds per measurement")
    ap.add_argument("--no-torch", action="store_true", help="skip the F.conv1d reference")
    ap.add_argument("--threads", type=int, help="CPU: torch.set_num_threads")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    ap.add_argument("--decode", action="store_true",
                    help="only the decode section (shortconv.bench_decode): one decode step on "
                         "a pool of 1024 rows, eager and (GPU) graph-replay times against a torch "
                         "elementwise op, the floor and an empty kernel; with --shape BxTxD one "
                         "step of B sequences of T tokens of D channels")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = a.device
    if a.shape:
        try:
            B, T, D = (int(v) for v in a.shape.lower().split("x"))
        except ValueError:
            ap.error("--shape: expected BxTxD, got %r" % a.shape)
        name = ("packed " if a.seqs else "dense ") + a.shape + (" +states" if a.states else "")
        shapes = [Shape(name, B, T, D, seqs=a.seqs, states=a.states, layout=a.layout, W=a.width)]
    else:
        shapes = default_shapes(device, a.width)
    if a.dtype:
        for s in shapes:
            s.dtypes = (a.dtype,)
    budget = a.budget if a.budget is not None else BUDGET_S[device]
    bw = copy_GBps(device)
    if a.decode:
        from . import bench_decode
        dtype = DTYPES[a.dtype] if a.dtype else torch.bfloat16
        cases = None
        if a.shape:  # one step: batch x tokens x D, both pool layouts
            B, T, D = (int(v) for v in a.shape.lower().split("x"))
            cases = [(layout, D, T, B) for layout in ("vllm", "rows")]
        rows = bench_decode.run(device, budget, bw, dtype, cases=cases,
                                out=None if a.json else print)
        if a.json:
            print(json.dumps(dict(device=device, torch=torch.__version__, copy_GBps=bw,
                                  library=shortconv.library_path, decode=rows), indent=1))
        return 0
    devname = torch.cuda.get_device_name() if device == "cuda" else "cpu (%d threads)" % (
        torch.get_num_threads())
    results = []
    if not a.json:
        print("shortconv %s (library %s) via torch %s on %s; copy bandwidth %.1f GB/s (read+write)"
              % (shortconv.__version__, shortconv.library_path, torch.__version__, devname, bw))
        print("per call = back-to-back calls / n; floor = bytes / copy bandwidth (fwd 2 x-sized "
              "tensors, fwd+bwd 5); frac = floor / time\n")
        print("%-34s %-5s %2s %-7s | %10s %5s %10s %5s | %10s %5s %10s %5s" % (
            "shape", "dtype", "W", "layout", "fwd us", "frac", "f+b us", "frac",
            "torch fwd", "frac", "torch f+b", "frac"))
    for s in shapes:
        for dt in s.dtypes:
            try:
                r = bench_case(s, dt, device, budget, not a.no_torch)
            except (RuntimeError, ValueError) as e:  # e.g. out of memory, backend missing
                r = dict(shape=s.name, dtype=dt, W=s.W, layout=s.layout, error=str(e))
            if "error" not in r:
                fb = 2 * r["x_bytes"] / (bw * 1e3)  # µs at copy speed
                bb = 5 * r["x_bytes"] / (bw * 1e3)
                r["floor_fwd_us"], r["floor_fwdbwd_us"] = fb, bb
            results.append(r)
            if a.json:
                continue
            if "error" in r:
                print("%-34s %-5s %2d %-7s | ERROR %s" % (s.name, dt, s.W, s.layout, r["error"]))
                continue

            def cell(key, floor):
                v = r.get(key)
                return ("%10.1f %5.2f" % (v, floor / v)) if v else "%10s %5s" % ("-", "-")

            print("%-34s %-5s %2d %-7s | %s %s | %s %s" % (
                s.name, dt, s.W, s.layout, cell("fwd_us", fb), cell("fwdbwd_us", bb),
                cell("torch_fwd_us", fb), cell("torch_fwdbwd_us", bb)))
            sys.stdout.flush()
    if a.json:
        print(json.dumps(dict(device=devname, torch=torch.__version__, copy_GBps=bw,
                              library=shortconv.library_path, results=results), indent=1))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
