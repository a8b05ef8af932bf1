"""The decode section of ``python -m shortconv.bench`` (``--decode``): one decode step of a
serving engine through ``shortconv.causal_conv1d_update`` on a state pool.

Each case: bf16, W = 4, SiLU, bias, a pool of 1024 rows updated in place, ``batch``
sequences in distinct rows of which every eighth slot is padded (-1), 1 token per sequence
(rows of W-1 entries) or 1+3 speculative tokens (rows of (W-1) + 3 entries, accepted counts
1..4 as a device tensor), the pool stored [P, D, S] ("rows") or channel-contiguous like
vLLM's pools ([P, S, D] storage, "vllm").

Reported per case, all measured in the same run:
- eager: back-to-back eager calls / n (a host-bound call shows its host path);
- torch_op: the same for one native elementwise op on the step's x (``torch.mul(x, x)``),
  the yardstick of the eager host path (ratio = eager / torch_op);
- GPU (CUDA only): GPU time per step from a CUDA graph of 100 steps (median replay / 100)
  rotating over up to 4 copies of the pool and x (256 MB in all, as the CLI: one step
  replayed on the same rows would run from L2),
  the floor (bytes of x, y and the state entries read and written over the copy bandwidth
  of this run) and the fraction of it, and an "empty" kernel's GPU time from a graph of 100
  launches of the smallest kernel torch launches (a one-element ``add_``), with the ratio;
  then, after every case was timed, the same graphs with ``overlap="reads"`` (each step
  launched to overlap the one before it, which updates another copy's pool: the argument's
  contract), with the ratio.

Then (CUDA; after_projection) each step right after the kernel that writes its x, as in an
engine, where the input projection x = h @ P_in runs just before the convolution: graphs of
100 (projection, step) pairs against graphs of the projections alone, per overlap mode, and
the same with the smallest kernel in place of the step; marginal = (pairs - projections) /
100, the GPU time a step adds to the layer.  batch 1, 8, 64, one token, D = 4096, h of 2048
features, bf16.

Then the host path of one step (host_path: batch 8, one token, 1+3 tokens for the
speculative row; D = 4096 on a GPU, D = 16 on the CPU, where torch.mul of a larger x
computes for longer than its host path) through each entry point -- shortconv.causal_conv1d_update,
shortconv.vllm.causal_conv1d_update (plain and speculative) and
shortconv.dao.causal_conv1d_update -- against ``torch.mul(x, x)`` on the step's x, in
interleaved rounds of the same run (bench.paired): the call with the library validating
every call but computing nothing (bench.validation_only: the host path alone, on either
device), and on a GPU the eager call too.  ratio = ours / torch.mul.
"""

import statistics
import time

import torch

import shortconv

W, POOL, PAD_EVERY, GRAPH_CALLS = 4, 1024, 8, 100
GRAPH_COPIES, ROTATE_BYTES = 4, 256 << 20  # buffer copies rotated in the graph, as the CLI


def default_cases():
    return [(layout, D, T, batch) for layout in ("vllm", "rows") for D in (4096, 8192)
            for T in (1, 4) for batch in (1, 8, 64, 256)]


def make_step(layout, D, T, batch, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    S = W - 1 if T == 1 else W - 2 + T
    if layout == "vllm":
        pool = torch.randn(POOL, S, D, generator=g, dtype=dtype, device=device).transpose(1, 2)
    else:
        pool = torch.randn(POOL, D, S, generator=g, dtype=dtype, device=device)
    rows = torch.randperm(POOL, generator=torch.Generator().manual_seed(batch * 131 + D))[:batch]
    rows[PAD_EVERY - 1::PAD_EVERY] = -1
    x = torch.randn(batch, T, D, generator=g, dtype=dtype, device=device)
    kw = dict(weight=torch.randn(D, W, generator=g, dtype=dtype, device=device),
              bias=torch.randn(D, generator=g, dtype=dtype, device=device), activation="silu",
              cache_indices=rows.to(device=device, dtype=torch.int32))
    if T > 1:
        kw["num_accepted"] = (torch.arange(batch, dtype=torch.int32) % T + 1).to(device)
    real = batch - batch // PAD_EVERY
    es = x.element_size()
    read, written = (S, S) if T == 1 else (W - 1, W - 2 + T)
    floor_bytes = 2 * x.numel() * es + real * D * es * (read + written)
    return x, pool, kw, floor_bytes


def per_call_us(fn, device, budget):
    """Median over rounds of back-to-back calls / n, synchronised at both ends."""
    def rounds(n):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0
    rounds(20)
    n = max(20, int(0.02 / max(rounds(20) / 20, 1e-7)))
    times, spent = [], 0.0
    while spent < budget or len(times) < 3:
        dt = rounds(n)
        spent += dt
        times.append(dt / n * 1e6)
    return statistics.median(times)


def graph_us(fn, reps=20):
    """GPU time per call: GRAPH_CALLS calls captured into one CUDA graph, median replay.
    fn: one callable, or a list of them called in turn (steps on rotating buffer copies)."""
    fns = fn if isinstance(fn, (list, tuple)) else [fn]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns * 3:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(GRAPH_CALLS):
            fns[i % len(fns)]()
    g.replay()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t = []
    for _ in range(reps):
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        t.append(e0.elapsed_time(e1) * 1e3 / GRAPH_CALLS)
    return statistics.median(t)


def after_projection(dtype=torch.bfloat16, D=4096, H=2048, batches=(1, 8, 64), out=print):
    """The decode step after the projection that writes its x (module docstring): a list of
    result dicts (and a table via out).  CUDA only."""
    device = "cuda"
    g = torch.Generator(device=device).manual_seed(7)
    proj = torch.randn(H, D, generator=g, dtype=dtype, device=device) / H ** 0.5
    tiny = torch.zeros(1, device=device)
    results = []
    if out:
        out("\nafter the projection that writes x (x = h @ P, h [batch, %d], P [%d, %d]): GPU us per "
            "(projection, step) pair beyond the projection alone, graphs of %d pairs; the step with "
            "overlap none / launch / reads, and the smallest kernel (empty) in its place"
            % (H, H, D, GRAPH_CALLS))
        out("%-5s %5s %5s | %8s | %7s | %7s %7s %7s | %7s" % (
            "rows", "D", "batch", "proj us", "+empty", "+none", "+launch", "+reads", "reads/e"))
    for layout in ("vllm", "rows"):
        for batch in batches:
            _, pool, kw, _ = make_step(layout, D, 1, batch, dtype, device)
            pool_bytes = pool.numel() * pool.element_size()
            ncopy = max(2, min(GRAPH_COPIES, -(-ROTATE_BYTES // pool_bytes)))
            copies = [make_step(layout, D, 1, batch, dtype, device, seed=i) for i in range(ncopy)]
            hs = [torch.randn(batch, H, generator=g, dtype=dtype, device=device) for _ in copies]
            xs = [c[0][:, 0] for c in copies]  # [batch, D] views of each copy's x

            def pairs(step_of):
                fns = []
                for i, (x, p, k, _) in enumerate(copies):
                    fns.append((lambda h, xo, st: lambda: (torch.mm(h, proj, out=xo), st()))(
                        hs[i], xs[i], step_of(xs[i], p, k)))
                return fns
            alone = graph_us(pairs(lambda x, p, k: (lambda: None)))
            r = dict(rows=layout, D=D, batch=batch, H=H, projection_us=alone,
                     empty_us=graph_us(pairs(lambda x, p, k: (lambda: tiny.add_(0)))) - alone)
            for mode in ("none", "launch", "reads"):
                r[mode + "_us"] = graph_us(pairs(
                    lambda x, p, k, mode=mode: (lambda: shortconv.causal_conv1d_update(
                        x, p, overlap=mode, **k)))) - alone
            r["reads_per_empty"] = r["reads_us"] / r["empty_us"]
            results.append(r)
            if out:
                out("%-5s %5d %5d | %8.2f | %7.2f | %7.2f %7.2f %7.2f | %7.2f" % (
                    layout, D, batch, alone, r["empty_us"], r["none_us"], r["launch_us"],
                    r["reads_us"], r["reads_per_empty"]))
    return results


def _against_mul(m):
    """bench.paired's figures with torch.mul in place of its no-op: ours, torch.mul, their
    ratio, and ours - torch.mul (median of the paired rounds; fastest rounds')."""
    return dict(ours_us=m["ours_us"], torch_mul_us=m["noop_us"],
                ratio=m["ours_us"] / m["noop_us"], beyond_us=m["own_us"],
                beyond_min_us=m["own_min_us"], rounds=m["rounds"])


def host_path(device, budget, dtype=torch.bfloat16, D=None, batch=8, out=print):
    """The host path of one decode step per entry point against torch.mul (module docstring):
    a list of result dicts (and a table via out)."""
    from .bench import paired, validation_only

    if D is None:
        D = 4096 if device == "cuda" else 16

    x, pool, kw, _ = make_step("rows", D, 1, batch, dtype, device)
    x1 = x[:, 0]  # [batch, D]: one token per sequence
    w, b, rows = kw["weight"], kw["bias"], kw["cache_indices"]
    xs, spool, skw, _ = make_step("vllm", D, 4, batch, dtype, device)
    xv = xs.transpose(1, 2)  # vLLM's [batch, dim, seqlen]
    calls = [
        ("shortconv.causal_conv1d_update", x1,
         lambda: shortconv.causal_conv1d_update(x1, pool, **kw)),
        ("vllm.causal_conv1d_update", x1,
         lambda: shortconv.vllm.causal_conv1d_update(x1, pool, w, b, True, rows)),
        ("vllm, 1+3 tokens, num_accepted", xv,
         lambda: shortconv.vllm.causal_conv1d_update(xv, spool, w, b, True, rows,
                                                     num_accepted_tokens=skw["num_accepted"])),
        ("dao.causal_conv1d_update", x1,
         lambda: shortconv.dao.causal_conv1d_update(x1, pool, w, b, "silu", None, rows)),
    ]
    results = []
    if out:
        out("\nhost path of one step (D=%d, batch %d, every %dth slot padded; us per call, "
            "interleaved rounds; ratio = ours / torch.mul(x, x) on the step's x):"
            % (D, batch, PAD_EVERY))
    for name, xt, call in calls:
        mul = (lambda t: lambda: torch.mul(t, t))(xt)
        r = dict(entry=name, D=D, batch=batch)
        with validation_only():
            r["host_path"] = _against_mul(paired(call, mul, device, budget))
        if device == "cuda":
            r["eager"] = _against_mul(paired(call, mul, device, budget))
        results.append(r)
        if out:
            for what in ("host_path", "eager"):
                if what in r:
                    m = r[what]
                    out("  %-34s %-9s ours %7.1f  torch.mul %6.1f  ratio %5.1f" % (
                        name, "host path" if what == "host_path" else "eager", m["ours_us"],
                        m["torch_mul_us"], m["ratio"]))
    return results


def run(device, budget, copy_GBps, dtype=torch.bfloat16, cases=None, out=print):
    """Benchmarks every case; returns a list of result dicts (and prints a table via out)."""
    results = []
    empty = {}
    if device == "cuda":
        tiny = torch.zeros(1, device=device)
        empty = dict(empty_us=graph_us(lambda: tiny.add_(0)),
                     empty_call_us=per_call_us(lambda: tiny.add_(0), device, budget))
    if out:
        out("decode steps: W=%d SiLU bias, pool of %d rows in place, every %dth slot padded; "
            "eager = back-to-back calls, torch_op = torch.mul(x, x) on the step's x%s"
            % (W, POOL, PAD_EVERY, "; GPU us from a CUDA graph of %d steps, empty kernel "
               "%.2f us" % (GRAPH_CALLS, empty["empty_us"]) if empty else ""))
        out("%-5s %5s %2s %5s | %9s %9s %6s | %8s %8s %5s %7s" % (
            "rows", "D", "T", "batch", "eager us", "torch op", "ratio", "GPU us", "floor us",
            "frac", "/empty"))
    for layout, D, T, batch in cases or default_cases():
        x, pool, kw, nbytes = make_step(layout, D, T, batch, dtype, device)
        step = lambda: shortconv.causal_conv1d_update(x, pool, **kw)  # noqa: E731
        r = dict(rows=layout, D=D, T=T, batch=batch, bytes=nbytes,
                 eager_us=per_call_us(step, device, budget),
                 torch_op_us=per_call_us(lambda: torch.mul(x, x), device, budget))
        r["eager_per_torch_op"] = r["eager_us"] / r["torch_op_us"]
        if device == "cuda":
            # Steps on rotating copies of the pool and x: replaying one step on the same
            # rows would time an L2-resident working set (an engine runs the other layers
            # between two steps of one layer); as the CLI's decode bench.
            pool_bytes = pool.numel() * pool.element_size()
            ncopy = max(1, min(GRAPH_COPIES, -(-ROTATE_BYTES // pool_bytes)))
            r["graph_copies"] = ncopy
            r["gpu_us"] = graph_us(_rotating_steps(layout, D, T, batch, dtype, device, ncopy,
                                                   (x, pool, kw)))
            r["floor_us"] = nbytes / (copy_GBps * 1e3)
            r["frac"] = r["floor_us"] / r["gpu_us"]
            r["per_empty"] = r["gpu_us"] / empty["empty_us"]
        r.update(empty)
        results.append(r)
        if out:
            gpu = ("%8.2f %8.2f %5.2f %7.2f" % (r["gpu_us"], r["floor_us"], r["frac"],
                                                r["per_empty"]) if device == "cuda"
                   else "%8s %8s %5s %7s" % ("-", "-", "-", "-"))
            out("%-5s %5d %2d %5d | %9.1f %9.1f %6.2f | %s" % (
                layout, D, T, batch, r["eager_us"], r["torch_op_us"], r["eager_per_torch_op"],
                gpu))
    if device == "cuda":  # overlapped launches, after every plain timing (as the CLI)
        if out:
            out("\nthe same steps with overlap='reads' (GPU us, graphs of %d steps on rotating "
                "copies; /empty: against the empty kernel above)" % GRAPH_CALLS)
            out("%-5s %5s %2s %5s | %8s %5s %7s" % ("rows", "D", "T", "batch", "reads us", "frac",
                                                   "/empty"))
        for r in results:
            if r["graph_copies"] < 2:  # (the step before must not write this step's pool)
                continue
            steps = _rotating_steps(r["rows"], r["D"], r["T"], r["batch"], dtype, device,
                                    r["graph_copies"], None, overlap="reads")
            r["reads_gpu_us"] = graph_us(steps)
            r["reads_per_empty"] = r["reads_gpu_us"] / empty["empty_us"]
            if out:
                out("%-5s %5d %2d %5d | %8.2f %5.2f %7.2f" % (
                    r["rows"], r["D"], r["T"], r["batch"], r["reads_gpu_us"],
                    r["floor_us"] / r["reads_gpu_us"], r["reads_per_empty"]))
    return results


def _rotating_steps(layout, D, T, batch, dtype, device, ncopy, first, **more):
    """Callables of one step each on ncopy copies of the case (``first``: copy 0 as made
    already, or None), with the extra keywords ``more``."""
    copies = [first or make_step(layout, D, T, batch, dtype, device)[:3]]
    for i in range(1, ncopy):
        copies.append(make_step(layout, D, T, batch, dtype, device, seed=i)[:3])
    return [(lambda a, b, k: lambda: shortconv.causal_conv1d_update(a, b, **k))(
        a, b, dict(k, **more)) for a, b, k in copies]
