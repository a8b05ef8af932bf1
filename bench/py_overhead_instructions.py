"""Instructions of the package's host path per call, under callgrind: a stable figure on a
shared, noisy machine (CONTRIBUTING.md, "Performance is measured").

    SHORTCONV_LIBRARY=build/lib/libshortconv.so PYTHONPATH=python \
        python bench/py_overhead_instructions.py [--calls 100]

Runs itself under `valgrind --tool=callgrind --instr-atstart=no` (torch's import runs
uninstrumented) and switches instrumentation on around `--calls` calls of each phase with
callgrind_control: a forward+backward (shortconv.causal_conv1d + torch.autograd.grad for x,
weight, bias) and a no-grad forward on the small shape 1x2048x2048 bf16, W=4, SiLU, bias, CPU
tensors, and the same with a no-op torch.autograd.Function with the same inputs and outputs
(it saves its inputs and allocates its outputs).  The library validates every call but
computes nothing (the workspace query in place of the run), as in `python -m shortconv.bench
--overhead-only`.  Prints instructions per call and "own" = ours - no-op.  Self-contained, so
it measures any version of the package on PYTHONPATH.
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time

PHASES = ("fb", "fb_noop", "fwd", "fwd_noop")


def child(folder, calls):
    import torch
    import shortconv
    from shortconv import _lib

    torch.set_num_threads(1)
    fq, bq, off = _lib._sc_forward_ws, _lib._sc_backward_ws, _lib.WS_OFF
    _lib._sc_forward = lambda a, e: fq(a, a + off, e)  # validate, compute nothing
    _lib._sc_backward = lambda a, e: bq(a, a + off, e)

    class NoOp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            ctx.save_for_backward(x, weight, bias)
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx, dy):
            x, weight, bias = ctx.saved_tensors
            return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias)

    g = torch.Generator().manual_seed(7)
    B, T, D, W = 1, 2048, 2048, 4
    x, w, b, dy = (torch.randn(*s, generator=g, dtype=torch.bfloat16)
                   for s in ((B, T, D), (D, W), (D,), (B, T, D)))
    leaves = (x, w, b)
    for t in leaves:
        t.requires_grad_(True)

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

    fns = dict(fb=fb, fb_noop=fb_noop, fwd=fwd, fwd_noop=fwd_noop)
    for f in fns.values():
        for _ in range(30):
            f()

    def mark(name):
        open(os.path.join(folder, name), "w").close()

    def wait(name):
        while not os.path.exists(os.path.join(folder, name)):
            time.sleep(0.05)

    for name in PHASES:
        mark(name + ".ready")
        wait(name + ".go")
        for _ in range(calls):
            fns[name]()
        mark(name + ".done")
        wait(name + ".dumped")


def parent(calls):
    folder = tempfile.mkdtemp(prefix="sc-callgrind-")
    env = dict(os.environ, PYTHONHASHSEED="0")
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
           "--callgrind-out-file=" + os.path.join(folder, "cg.%p"),
           sys.executable, os.path.abspath(__file__), "--child", folder, "--calls", str(calls)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(folder, "valgrind.log"), "w"))

    def wait(name):
        while not os.path.exists(os.path.join(folder, name)):
            if proc.poll() is not None:
                sys.exit("the child exited (see %s/valgrind.log)" % folder)
            time.sleep(0.2)

    def control(*args):
        subprocess.run(["callgrind_control", *args, str(proc.pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    for name in PHASES:
        wait(name + ".ready")
        control("-i", "on")
        control("-z")
        open(os.path.join(folder, name + ".go"), "w").close()
        wait(name + ".done")
        control("-d", name)
        control("-i", "off")
        open(os.path.join(folder, name + ".dumped"), "w").close()
    proc.wait()
    per_call = {}
    for path in glob.glob(os.path.join(folder, "cg.*.*")):
        with open(path) as f:
            text = f.read()
        name = text.split("desc: Trigger: dump ", 1)[1].split()[0]
        total = int(text.split("\nsummary: ", 1)[1].split()[0])
        per_call[name] = total / calls
    for name in PHASES:
        print("%-9s %9.0f instructions per call" % (name, per_call[name]))
    print("own fwd+bwd %9.0f   own fwd %9.0f   (ours - no-op; %d calls each)" % (
        per_call["fb"] - per_call["fb_noop"], per_call["fwd"] - per_call["fwd_noop"], calls))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.calls)
    else:
        parent(a.calls)


if __name__ == "__main__":
    main()
