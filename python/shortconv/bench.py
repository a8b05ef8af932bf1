"""python -m shortconv.bench: the PyTorch API against the CLI's kernels and plain F.conv1d.

For each shape (the CLI's defaults, `shortconv bench`, plus on the CPU the small and
channel-major rows): forward and forward+backward through shortconv.causal_conv1d, the
CLI's figures for the same case (its own run, where the CLI is found), and plain PyTorch
(depthwise F.conv1d with W-1 left padding, SiLU; states by concatenating h0 ++ x; packed
batches one F.conv1d per sequence), in µs per call and as the fraction of the
copy-bandwidth floor; beside them F.silu(x), an elementwise op that moves the forward's
bytes (read x, write y): what a plain elementwise kernel of this torch reaches on the
shape, the practical ceiling of a forward.  Then a torch.compile'd row for the small shape and the package's
host overhead.

- per call = wall time of n back-to-back calls / n, synchronised at both ends,
  median over rounds.  The GPU work of one call overlaps the host work of the
  next, so a host-bound call (small shapes) shows its host overhead and a
  GPU-bound one its kernel time; compare the latter with the CLI's kernel figures.
- forward: under torch.no_grad().  forward+backward: the forward with grad
  plus torch.autograd.grad for x, weight, bias (and initial_state with states),
  no .grad accumulation; dy in x's layout (a channel-major x gets a channel-major dy,
  as the gradient of its channel-major y would be).
- floor: the bytes that must move / the copy bandwidth measured in the same
  run (torch copy_ of a large buffer, read + write): forward 2 x-sized tensors,
  forward+backward 5.  frac = floor / time (1.0 = copy speed).  The CLI's fraction
  is against the copy bandwidth of its own run.
- Small working sets rotate over several copies of their buffers, so they are
  not timed out of cache (like the CLI).
- host overhead (small shape, bf16, forward+backward): the package's own host cost
  = our eager call - a no-op torch.autograd.Function with the same inputs and outputs
  (it saves its inputs and allocates its outputs, as any autograd op must), measured in
  the same run, interleaved; the median of the paired differences over rounds.  On a GPU
  the eager call is host-bound at this size (its kernels run asynchronously); on the
  CPU the kernels run in the calling thread, so the row is measured with the library
  validating every call but computing nothing (the host path alone: every Python step,
  the C validation, the allocations).  On a GPU both are reported.
- --decode: the decode section instead (shortconv/bench_decode.py), with the host path of
  one step per entry point against torch.mul (--no-overhead leaves it out).
"""

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
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
SMALL = (1, 2048, 2048)  # the small shape: compiled row and host overhead


class Shape:
    def __init__(self, name, B, T, D, seqs=0, states=False, layout="token", W=4, dtypes=("bf16",)):
        self.name, self.B, self.T, self.D = name, B, T, D
        self.seqs, self.states, self.layout, self.W, self.dtypes = seqs, states, layout, W, dtypes


def default_shapes(device, W):
    """The CLI's default shapes (tools/bench.cpp), plus on the CPU the small shape and the
    dense shape channel-major."""
    if device == "cuda":
        return [
            Shape("dense 8x4096x4096", 8, 4096, 4096, W=W, dtypes=("bf16", "fp32")),
            Shape("packed 1x32768x8192 /16 +states", 1, 32768, 8192, seqs=16, states=True, W=W),
            Shape("long 1x65536x4096", 1, 65536, 4096, W=W),
            Shape("small 1x2048x2048", *SMALL, W=W),
            Shape("dense 8x4096x4096 chan-major", 8, 4096, 4096, layout="channel", W=W),
            Shape("dense 8x4096x4096 W=8", 8, 4096, 4096, W=8),
            Shape("dense 8x4096x4096 W=16", 8, 4096, 4096, W=16, dtypes=("bf16", "fp32")),
        ]
    return [
        Shape("dense 4x4096x2048", 4, 4096, 2048, W=W, dtypes=("bf16", "fp32")),
        Shape("packed 1x16384x2048 /16 +states", 1, 16384, 2048, seqs=16, states=True, W=W,
              dtypes=("bf16", "fp32")),
        Shape("long 1x32768x1024", 1, 32768, 1024, W=W, dtypes=("bf16", "fp32")),
        Shape("small 1x2048x2048", *SMALL, W=W),
        Shape("dense 4x4096x2048 chan-major", 4, 4096, 2048, layout="channel", W=W,
              dtypes=("bf16", "fp32")),
    ]


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def copy_GBps(device):
    """Copy bandwidth (read + write bytes / s) of a large torch copy_ (CUDA: the median of
    10, host: the fastest of 4)."""
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
    # the GPU's copy is stable: the median; a shared host's bandwidth moves by 2x within
    # seconds: the fastest copy, what the memory gives at best (the CLI's rule)
    return 2.0 * n / (statistics.median(times) if device == "cuda" else min(times)) / 1e9


def make_inputs(s, dtype, device, seed, grad):
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape):  # generated on the device: the large shapes take seconds on a host
        return torch.randn(*shape, generator=g, dtype=dtype, device=device)

    def act(B, T, D):  # an activation-like tensor in the shape's layout
        return rnd(B, D, T).transpose(1, 2) if s.layout == "channel" else rnd(B, T, D)

    B, T, D, W = s.B, s.T, s.D, s.W
    x = act(B, T, D)
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
               dy=act(B, T, D))
    if grad:
        for k in ("x", "weight", "bias", "initial_state"):
            if inp[k] is not None:
                inp[k].requires_grad_(True)
    return inp


def _leaves(p):
    return [t for t in (p["x"], p["weight"], p["bias"], p["initial_state"]) if t is not None]


def ours(p, backward, fn=None):
    fn = fn or shortconv.causal_conv1d
    y, ht = fn(p["x"], p["weight"], p["bias"], initial_state=p["initial_state"],
               output_final_state=p["initial_state"] is not None, activation="silu",
               cu_seqlens=p["cu_seqlens"], state_len=p["weight"].shape[1] - 1)
    if backward:
        torch.autograd.grad(y, _leaves(p), p["dy"])


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
        torch.autograd.grad(y, _leaves(p), p["dy"])


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


def _copies(s, dtype, device):
    x_bytes = s.B * s.T * s.D * torch.empty(0, dtype=dtype).element_size()
    n = max(1, min(MAX_COPIES[device], -(-ROTATE_BYTES[device] // (2 * x_bytes))))
    return x_bytes, n


def _fwd(f):
    def run(p):
        with torch.no_grad():
            f(p, False)
    return run


def bench_case(s, dtype_name, device, budget_s, with_torch):
    dtype = DTYPES[dtype_name]
    x_bytes, copies_n = _copies(s, dtype, device)
    out = dict(shape=s.name, dtype=dtype_name, W=s.W, layout=s.layout, x_bytes=x_bytes)
    nograd = [make_inputs(s, dtype, device, i + 1, False) for i in range(copies_n)]
    grad = [make_inputs(s, dtype, device, i + 1, True) for i in range(copies_n)]
    out["fwd_us"] = measure(_fwd(ours), nograd, device, budget_s)
    out["fwdbwd_us"] = measure(lambda p: ours(p, True), grad, device, budget_s)
    if with_torch:
        out["torch_fwd_us"] = measure(_fwd(plain_torch), nograd, device, budget_s)
        out["torch_fwdbwd_us"] = measure(lambda p: plain_torch(p, True), grad, device, budget_s)
        out["silu_us"] = measure(_fwd(lambda p, _: F.silu(p["x"])), nograd, device, budget_s)
    return out


def bench_compiled(s, dtype_name, device, budget_s, mode=None, backend="inductor"):
    """The case through torch.compile(fullgraph=True) (the custom ops, torch >= 2.4)."""
    dtype = DTYPES[dtype_name]
    x_bytes, copies_n = _copies(s, dtype, device)
    out = dict(shape=s.name + " compiled", dtype=dtype_name, W=s.W, layout=s.layout,
               x_bytes=x_bytes, mode=mode or "default")
    if not shortconv.HAS_CUSTOM_OPS:
        out["skipped"] = "torch.compile needs the custom ops (torch >= 2.4), this is torch %s" % (
            torch.__version__)
        return out
    torch._dynamo.reset()
    fn = torch.compile(shortconv.causal_conv1d, fullgraph=True, dynamic=False, mode=mode,
                       backend=backend)
    nograd = [make_inputs(s, dtype, device, i + 1, False) for i in range(copies_n)]
    grad = [make_inputs(s, dtype, device, i + 1, True) for i in range(copies_n)]
    out["fwd_us"] = measure(_fwd(lambda p, b: ours(p, b, fn)), nograd, device, budget_s)
    out["fwdbwd_us"] = measure(lambda p: ours(p, True, fn), grad, device, budget_s)
    return out


# ---- the CLI's figures ------------------------------------------------------------------
def find_cli():
    """$SHORTCONV_CLI, the CLI beside the library (build/bin/shortconv for
    build/lib/libshortconv.so), or `shortconv` on PATH; None if there is none."""
    env = os.environ.get("SHORTCONV_CLI")
    if env:
        return env if os.path.exists(env) else None
    lib_dir = os.path.dirname(os.path.abspath(shortconv.library_path))
    near = os.path.join(os.path.dirname(lib_dir), "bin", "shortconv")
    if os.path.exists(near):
        return near
    return shutil.which("shortconv")


def cli_case(cli, s, dtype_name, device, threads):
    """The CLI's result for this case: `shortconv bench --json` on exactly this shape."""
    cmd = [cli, "bench", "--backend", device, "--json", "--shape", "%dx%dx%d" % (s.B, s.T, s.D),
           "--dtype", dtype_name, "--width", str(s.W), "--layout", s.layout]
    if s.seqs:
        cmd += ["--seqs", str(s.seqs)]
    if s.states:
        cmd += ["--states"]
    if threads:
        cmd += ["--threads", str(threads)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        (res,) = json.loads(r.stdout)["results"]
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
        return dict(error="%s: %s" % (" ".join(cmd), e))
    return res


_CLI_LAYOUT = {"token": "token-major", "channel": "channel-major"}  # the CLI's names


def cli_from_json(path):
    """{(shape, dtype, W, layout): result} of a saved `shortconv bench --json` run (layout
    in this module's names)."""
    names = {v: k for k, v in _CLI_LAYOUT.items()}
    with open(path) as f:
        results = json.load(f)["results"]
    return {(r["shape"], r["dtype"], r["W"], names.get(r["layout"], r["layout"])): r
            for r in results}


# ---- host overhead ----------------------------------------------------------------------
class NoOp(torch.autograd.Function):
    """shortconv.causal_conv1d's inputs and outputs, no work: it saves its inputs and
    allocates its outputs, as any autograd Function of this op must."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight, bias)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias)


def small_calls(x, w, b, dy):
    """{fb, fb_noop, fwd, fwd_noop}: a SiLU forward+backward (gradients of x, w and b
    from dy, x a leaf) and a no-grad forward, each beside NoOp's same inputs and outputs."""
    leaves = (x, w, b)
    W = w.shape[1]

    def fb():
        y, _ = shortconv.causal_conv1d(x, w, b, activation="silu", state_len=W - 1)
        torch.autograd.grad(y, leaves, dy)

    def fb_noop():
        torch.autograd.grad(NoOp.apply(x, w, b), leaves, dy)

    def fwd():
        with torch.no_grad():
            shortconv.causal_conv1d(x, w, b, activation="silu", state_len=W - 1)

    def fwd_noop():
        with torch.no_grad():
            NoOp.apply(x, w, b)

    return dict(fb=fb, fb_noop=fb_noop, fwd=fwd, fwd_noop=fwd_noop)


@contextlib.contextmanager
def validation_only():
    """Every call of the package validated by the library but not computed (the workspace
    query in place of the run): the host path of a call without its kernels."""
    from shortconv import _lib, native
    saved = _lib._sc_forward, _lib._sc_backward
    fq, bq, off = _lib._sc_forward_ws, _lib._sc_backward_ws, _lib.WS_OFF
    _lib._sc_forward = lambda a, e: fq(a, a + off, e)
    _lib._sc_backward = lambda a, e: bq(a, a + off, e)
    native.host_only(True)  # the native module's calls: sc_validate in place of the run
    try:
        yield
    finally:
        _lib._sc_forward, _lib._sc_backward = saved
        native.host_only(False)


def paired(a, b, device, budget_s):
    """Per-call µs of a and b in interleaved rounds of about a millisecond (short rounds: on
    a shared host a long one is rarely left alone): medians, the median of the per-round
    differences a - b, and the difference of the fastest rounds."""
    for f in (a, b):
        for _ in range(20):
            f()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        a()
    sync(device)
    n = max(1, int(1e-3 / max((time.perf_counter() - t0) / 10, 1e-7)))
    ta, tb = [], []
    spent = 0.0
    while spent < budget_s or len(ta) < 5:
        for f, out in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            sync(device)
            dt = time.perf_counter() - t0
            spent += dt
            out.append(dt / n * 1e6)
    return dict(ours_us=statistics.median(ta), noop_us=statistics.median(tb),
                own_us=statistics.median([x - y for x, y in zip(ta, tb)]),
                own_min_us=min(ta) - min(tb), rounds=len(ta), calls_per_round=n)


def host_overhead(device, budget_s, W=4, dtype=torch.bfloat16):
    """The package's own host cost per forward+backward and per forward on the small
    shape (see the module docstring); on a GPU the eager and validation-only figures."""
    g = torch.Generator(device=device).manual_seed(7)
    B, T, D = SMALL
    x, w, b, dy = (torch.randn(*sh, generator=g, dtype=dtype, device=device)
                   for sh in ((B, T, D), (D, W), (D,), (B, T, D)))
    for t in (x, w, b):
        t.requires_grad_(True)
    c = small_calls(x, w, b, dy)

    def both():
        return dict(fwdbwd=paired(c["fb"], c["fb_noop"], device, budget_s),
                    fwd=paired(c["fwd"], c["fwd_noop"], device, budget_s))

    out = {}
    if device == "cuda":
        out["eager"] = both()
    with validation_only():
        out["host path"] = both()
    return out


# ---- output -----------------------------------------------------------------------------
def _cell(v, floor):
    return ("%10.1f %5.2f" % (v, floor / v)) if v else "%10s %5s" % ("-", "-")


def _cli_cell(c, key):
    v = c.get(key + "_us") if c else None
    if not v or c.get("error"):
        return "%10s %5s" % ("-", "-")
    return "%10.1f %5.2f" % (v, c.get(key + "_frac") or float("nan"))


def print_row(r, bw):
    if "error" in r or "skipped" in r:
        print("%-36s %-5s %2d %-7s | %s" % (
            r["shape"], r["dtype"], r["W"], r["layout"],
            "ERROR " + r["error"] if "error" in r else "skipped: " + r["skipped"]))
        return
    fb, bb = r["floor_fwd_us"], r["floor_fwdbwd_us"]
    c = r.get("cli")
    print("%-36s %-5s %2d %-7s | %s %s | %s %s | %s %s | %s" % (
        r["shape"], r["dtype"], r["W"], r["layout"], _cell(r.get("fwd_us"), fb),
        _cell(r.get("fwdbwd_us"), bb), _cli_cell(c, "fwd"), _cli_cell(c, "fwdbwd"),
        _cell(r.get("torch_fwd_us"), fb), _cell(r.get("torch_fwdbwd_us"), bb),
        _cell(r.get("silu_us"), fb)))
    sys.stdout.flush()


def print_overhead(h, device):
    print("\nhost overhead, small %dx%dx%d bf16 W=4 SiLU bias (µs per call; own = ours - "
          "no-op Function, median of paired rounds; min-based in brackets):" % SMALL)
    for method, rows in h.items():
        label = {"eager": "eager (the kernels run asynchronously)",
                 "host path": "host path (library validates, computes nothing)"}[method]
        for what in ("fwdbwd", "fwd"):
            m = rows[what]
            print("  %-46s %-8s ours %7.1f  no-op %7.1f  own %6.1f (%5.1f)" % (
                label, "fwd+bwd" if what == "fwdbwd" else "fwd", m["ours_us"], m["noop_us"],
                m["own_us"], m["own_min_us"]))
    if device == "cpu":
        print("  (CPU: the kernels run in the calling thread, so only the host path is a host "
              "cost)")


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
    ap.add_argument("--no-torch", action="store_true",
                    help="skip the F.conv1d reference and the F.silu ceiling")
    ap.add_argument("--no-cli", action="store_true", help="skip the CLI's figures")
    ap.add_argument("--cli-json", help="the CLI's figures from this `shortconv bench --json` "
                    "output (matched by shape name, dtype, W, layout) instead of running it")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile row")
    ap.add_argument("--compile-mode", default=None,
                    help="torch.compile mode of the compiled row (default: torch's default)")
    ap.add_argument("--no-overhead", action="store_true", help="skip the host overhead")
    ap.add_argument("--overhead-only", action="store_true",
                    help="only the host overhead (no table, no compiled row)")
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
    custom = bool(a.shape)
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
    cli = None if a.no_cli or a.cli_json else find_cli()
    cli_saved = cli_from_json(a.cli_json) if a.cli_json else None
    bw = copy_GBps(device)
    if a.decode:
        from . import bench_decode
        dtype = DTYPES[a.dtype] if a.dtype else torch.bfloat16
        cases, step = None, {}
        if a.shape:  # one step: batch x tokens x D, both pool layouts
            B, T, D = (int(v) for v in a.shape.lower().split("x"))
            cases = [(layout, D, T, B) for layout in ("vllm", "rows")]
            step = dict(D=D, batch=B)
        rows = bench_decode.run(device, budget, bw, dtype, cases=cases,
                                out=None if a.json else print)
        proj = None
        if device == "cuda" and not a.shape:
            proj = bench_decode.after_projection(dtype, out=None if a.json else print)
        host = None
        if not a.no_overhead:
            host = bench_decode.host_path(device, budget, dtype, out=None if a.json else print,
                                          **step)
        if a.json:
            print(json.dumps(dict(device=device, torch=torch.__version__, copy_GBps=bw,
                                  library=shortconv.library_path, decode=rows,
                                  decode_after_projection=proj, decode_host_path=host), indent=1))
        return 0
    devname = torch.cuda.get_device_name() if device == "cuda" else "cpu (%d threads)" % (
        torch.get_num_threads())
    results = []
    if not a.json:
        print("shortconv %s (library %s) via torch %s on %s; copy bandwidth %.1f GB/s (read+write)"
              % (shortconv.__version__, shortconv.library_path, torch.__version__, devname, bw))
        print("per call = back-to-back calls / n; floor = bytes / copy bandwidth (fwd 2 x-sized "
              "tensors, fwd+bwd 5); frac = floor / time; CLI: %s\n"
              % (cli or a.cli_json or "not run"))
        print("%-36s %-5s %2s %-7s | %10s %5s %10s %5s | %10s %5s %10s %5s | %10s %5s %10s %5s | %10s %5s"
              % ("shape", "dtype", "W", "layout", "fwd us", "frac", "f+b us", "frac",
                 "CLI fwd", "frac", "CLI f+b", "frac", "torch fwd", "frac", "torch f+b", "frac",
                 "F.silu", "frac"))

    def finish(r):
        if "error" not in r and "skipped" not in r:
            r["floor_fwd_us"] = 2 * r["x_bytes"] / (bw * 1e3)  # µs at copy speed
            r["floor_fwdbwd_us"] = 5 * r["x_bytes"] / (bw * 1e3)
        results.append(r)
        if not a.json:
            print_row(r, bw)

    if a.overhead_only:
        shapes = []
    for s in shapes:
        for dt in s.dtypes:
            try:
                r = bench_case(s, dt, device, budget, not a.no_torch)
            except (RuntimeError, ValueError) as e:  # e.g. out of memory, backend missing
                r = dict(shape=s.name, dtype=dt, W=s.W, layout=s.layout, error=str(e))
            if cli is not None:
                r["cli"] = cli_case(cli, s, dt, device, a.threads)
            elif cli_saved is not None:
                r["cli"] = cli_saved.get((s.name, dt, s.W, s.layout))
            finish(r)
    if not custom and not a.no_compile and not a.overhead_only:
        small = [s for s in shapes if (s.B, s.T, s.D) == SMALL][0]
        try:
            r = bench_compiled(small, "bf16", device, budget, a.compile_mode)
        except Exception as e:  # noqa: BLE001  (a compiler failure is reported, not fatal)
            r = dict(shape=small.name + " compiled", dtype="bf16", W=small.W,
                     layout=small.layout, error="%s: %s" % (type(e).__name__, e))
        finish(r)
    overhead = None
    if not custom and not a.no_overhead:
        overhead = host_overhead(device, budget)
        if not a.json:
            print_overhead(overhead, device)
    if a.json:
        print(json.dumps(dict(device=devname, torch=torch.__version__, copy_GBps=bw,
                              library=shortconv.library_path, cli=cli or a.cli_json,
                              results=results, host_overhead=overhead), indent=1))
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
