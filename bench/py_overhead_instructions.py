"""Instructions of the package's host path per call, under callgrind: a stable figure on a
shared, noisy machine (CONTRIBUTING.md, "Performance is measured").

    SHORTCONV_LIBRARY=build/lib/libshortconv.so PYTHONPATH=python \
        python bench/py_overhead_instructions.py [--calls 100] [--phases fb,fb_noop,...]

Runs itself under `valgrind --tool=callgrind --instr-atstart=no` (torch's import runs
uninstrumented) and switches instrumentation on around `--calls` calls of each phase with
callgrind_control.  The library validates every call but computes nothing (the workspace
query in place of the run), as in `python -m shortconv.bench --overhead-only`.  CPU tensors,
one thread, bf16, W=4, SiLU, bias.  Phases:

  small shape 1x2048x2048 (x, weight, bias requiring grad):
    fb        shortconv.causal_conv1d + torch.autograd.grad for x, weight, bias
    fb_noop   the same through a no-op torch.autograd.Function with the same inputs and
              outputs (it saves its inputs and allocates its outputs)
    fwd, fwd_noop    the forward alone under torch.no_grad()
    module_fb        shortconv.ShortConvolution forward + grad for x and its parameters
    dao_fb           shortconv.dao.causal_conv1d_fn (channel-first x) + grad
  decode step: 8 sequences of one token, D = 16, a pool of 1024 rows, the last slot padded:
    mul       torch.mul(x, x) on the step's x (one native elementwise op: the yardstick)
    update    shortconv.causal_conv1d_update(x, pool, ..., cache_indices=...) on [P, D, S] rows
    update_vllm_rows  the same on vLLM's channel-contiguous rows ([P, S, D] storage)
    vllm      shortconv.vllm.causal_conv1d_update(x, conv_state, w, b, True, indices)
    vllm_spec the same with x [8, D, 4] and num_accepted_tokens (rows of W-1+3 entries)
    dao       shortconv.dao.causal_conv1d_update(x, pool, w, b, "silu", None, indices)
    module_step  ShortConvolution.forward of one token per sequence with a cache, no grad

Prints instructions per call and "own" = ours - no-op for the small shape, ours / mul for
the decode steps.  Self-contained, so it measures any version of the package on PYTHONPATH
(a phase the version lacks is reported as missing).
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time

PHASES = ("fb", "fb_noop", "fwd", "fwd_noop", "module_fb", "dao_fb", "mul", "update",
          "update_vllm_rows", "vllm", "vllm_spec", "dao", "module_step")


def phases():
    """{name: zero-argument callable}: the calls each phase makes."""
    import torch
    import shortconv
    from shortconv.bench import small_calls

    g = torch.Generator().manual_seed(7)
    dt, W = torch.bfloat16, 4

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=dt)

    B, T, D = 1, 2048, 2048
    x, w, b, dy = rnd(B, T, D), rnd(D, W), rnd(D), rnd(B, T, D)
    leaves = (x, w, b)
    for t in leaves:
        t.requires_grad_(True)
    xc = rnd(B, D, T).requires_grad_(True)  # causal-conv1d's channel-first x
    conv = shortconv.ShortConvolution(D, W, bias=True, activation="silu").to(dt)
    conv_leaves = (x,) + tuple(conv.parameters())

    N, Dd, P = 8, 16, 1024
    xt, wd, bd = rnd(N, Dd), rnd(Dd, W), rnd(Dd)
    pool = rnd(P, Dd, W - 1)
    vpool = rnd(P, W - 1, Dd).transpose(1, 2)
    spool = rnd(P, W - 1 + 3, Dd).transpose(1, 2)
    xs = rnd(N, Dd, 4)
    rows = torch.randperm(P, generator=g)[:N].to(torch.int32)
    rows[-1] = -1
    accepted = torch.arange(N, dtype=torch.int32) % 4 + 1
    step_conv = shortconv.ShortConvolution(Dd, W, bias=True, activation="silu").to(dt)
    cache = rnd(N, Dd, W)
    x1 = xt.unsqueeze(1)
    small = small_calls(x, w, b, dy)

    def module_fb():
        y, _ = conv(x)
        torch.autograd.grad(y, conv_leaves, dy)

    def dao_fb():
        y = shortconv.dao.causal_conv1d_fn(xc, w, b, activation="silu")
        torch.autograd.grad(y, (xc, w, b), dy.transpose(1, 2))

    def module_step():
        with torch.no_grad():
            step_conv(x1, cache=cache)

    return dict(
        module_fb=module_fb, dao_fb=dao_fb, **small,
        mul=lambda: torch.mul(xt, xt),
        update=lambda: shortconv.causal_conv1d_update(xt, pool, weight=wd, bias=bd,
                                                      activation="silu", cache_indices=rows),
        update_vllm_rows=lambda: shortconv.causal_conv1d_update(
            xt, vpool, weight=wd, bias=bd, activation="silu", cache_indices=rows),
        vllm=lambda: shortconv.vllm.causal_conv1d_update(xt, vpool, wd, bd, True, rows),
        vllm_spec=lambda: shortconv.vllm.causal_conv1d_update(xs, spool, wd, bd, True, rows,
                                                              num_accepted_tokens=accepted),
        dao=lambda: shortconv.dao.causal_conv1d_update(xt, pool, wd, bd, "silu", None, rows),
        module_step=module_step)


def child(folder, calls, names):
    import torch
    from shortconv import _lib

    torch.set_num_threads(1)
    fq, bq, off = _lib._sc_forward_ws, _lib._sc_backward_ws, _lib.WS_OFF
    _lib._sc_forward = lambda a, e: fq(a, a + off, e)  # validate, compute nothing
    _lib._sc_backward = lambda a, e: bq(a, a + off, e)
    try:  # the native module's calls (when built): sc_validate in place of the run
        from shortconv import native
        native.host_only(True)
    except (ImportError, AttributeError):  # a version of the package without it
        pass
    fns = phases()
    for name in names:
        for _ in range(30):
            fns[name]()

    def mark(name):
        open(os.path.join(folder, name), "w").close()

    def wait(name):
        while not os.path.exists(os.path.join(folder, name)):
            time.sleep(0.05)

    for name in names:
        mark(name + ".ready")
        wait(name + ".go")
        for _ in range(calls):
            fns[name]()
        mark(name + ".done")
        wait(name + ".dumped")


def parent(calls, names):
    folder = tempfile.mkdtemp(prefix="sc-callgrind-")
    env = dict(os.environ, PYTHONHASHSEED="0")
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
           "--callgrind-out-file=" + os.path.join(folder, "cg.%p"),
           sys.executable, os.path.abspath(__file__), "--child", folder, "--calls", str(calls),
           "--phases", ",".join(names)]
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

    for name in names:
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
    for name in names:
        print("%-17s %9.0f instructions per call" % (name, per_call[name]))
    if "fb" in per_call and "fb_noop" in per_call:
        print("own fwd+bwd %9.0f (ours - no-op)" % (per_call["fb"] - per_call["fb_noop"]))
    if "fwd" in per_call and "fwd_noop" in per_call:
        print("own fwd     %9.0f (ours - no-op)" % (per_call["fwd"] - per_call["fwd_noop"]))
    if "mul" in per_call:
        for name in ("update", "update_vllm_rows", "vllm", "vllm_spec", "dao", "module_step"):
            if name in per_call:
                print("%-17s %6.1fx torch.mul" % (name, per_call[name] / per_call["mul"]))
    print("(%d calls per phase)" % calls)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--phases", default=",".join(PHASES),
                    help="comma-separated phases (default: all): " + ", ".join(PHASES))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    names = [n for n in a.phases.split(",") if n]
    unknown = [n for n in names if n not in PHASES]
    if unknown:
        ap.error("unknown phase(s) %s" % ", ".join(unknown))
    if a.child:
        child(a.child, a.calls, names)
    else:
        parent(a.calls, names)


if __name__ == "__main__":
    main()
