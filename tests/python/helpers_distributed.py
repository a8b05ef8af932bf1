"""Multi-process checks of shortconv.distributed, run by test_distributed.py: gloo on CPU
tensors, or NCCL on one GPU per rank with SHORTCONV_CP_BACKEND=nccl.

One spawn of the largest world size runs every check of every size (importing torch costs
seconds per process): the checks of size k run on a group of the last k ranks (the largest on
the default group), so every size but the largest is a context-parallel group inside a larger
world whose group ranks differ from the global ones, as in a job with data parallelism too.
Each rank writes {size: {check: "ok" | failure text, reports, seconds}} to <dir>/rank<r>.json.
Every check first does all of its collective work, then asserts, so a failure on one rank does
not leave the others waiting in a collective.  The reference is the single-process
shortconv.causal_conv1d on the concatenated input, computed on every rank.
"""
import json
import os
import random
import tempfile
import time
import traceback
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
BACKEND = os.environ.get("SHORTCONV_CP_BACKEND", "gloo")
DEV = torch.device("cpu")  # this rank's device (set in _worker)
GROUP = None  # the group of the world size being checked (None: the default group, all ranks)
SUBGROUP = None  # that group without its first rank (check_errors' group this rank is not in)


# ---- launcher ------------------------------------------------------------------------------------
def run_worlds(worlds, timeout=300):
    """One spawn of max(worlds) ranks for every world size: the checks of size k run on a group
    of k ranks (the last k; the largest size on the default group, the whole world), one size
    after the other.  Returns {k: namespace(world, results {check: [status per rank]}, reports,
    seconds, crashed)}.  `timeout` bounds the whole run."""
    worlds = sorted(set(worlds))
    n = worlds[-1]
    tmp = tempfile.mkdtemp(prefix="sc-cp-")
    # CPU: forkserver (one server imports torch once per test session and forks the ranks;
    # forking this process instead breaks once it has run autograd, whose worker threads a
    # fork cannot carry); a CUDA process cannot fork, so NCCL ranks are spawned.
    method = "spawn" if BACKEND == "nccl" or torch.cuda.is_initialized() else "forkserver"
    pc = mp.start_processes(_worker, args=(n, worlds, tmp, timeout), nprocs=n, join=False,
                            start_method=method)
    deadline = time.time() + timeout
    crashed = None
    try:
        while not pc.join(timeout=1):
            if time.time() > deadline:
                crashed = "timed out after %d s (all world sizes together)" % timeout
                break
    except Exception as e:  # a worker died outside a check (e.g. during init)
        crashed = "%s: %s" % (type(e).__name__, e)
    finally:
        for p in pc.processes:
            if p.is_alive():
                p.terminate()
    ranks = []
    for r in range(n):
        path = os.path.join(tmp, "rank%d.json" % r)
        ranks.append(json.load(open(path)) if os.path.exists(path) else {})
    return {k: _world_results(k, n, ranks, crashed) for k in worlds}


def _world_results(k, n, ranks, crashed):
    """What the k members of world size k wrote (group rank r = global rank n - k + r)."""
    results, reports, seconds, done = {}, {}, {}, True
    for r in range(k):
        data = ranks[n - k + r].get(str(k), {})
        done = done and data.get("done", False)
        for name, st in data.get("status", {}).items():
            results.setdefault(name, [None] * k)[r] = st
        for name, rep in data.get("reports", {}).items():
            reports.setdefault(name, rep)
        for name, sec in data.get("seconds", {}).items():
            seconds[name] = max(seconds.get(name, 0), sec)
    return SimpleNamespace(world=k, results=results, reports=reports, seconds=seconds,
                           crashed=None if done else crashed or "a rank stopped early")


def _groups(n, worlds):
    """{k: the group of the last k of n ranks} for every size the checks use: each world size
    below n and the one below each size (check_errors' group without the first rank).  Every
    rank creates every group, in the same order, as torch.distributed requires."""
    sizes = {k for k in worlds if k < n} | {k - 1 for k in worlds if k > 1}
    groups = {n: None}  # the largest: the default group (group=None), the whole world
    for k in sorted(sizes):
        groups[k] = dist.new_group(ranks=list(range(n - k, n)))
    return groups


def _worker(rank, n, worlds, tmp, timeout):
    global DEV, GROUP, SUBGROUP
    import shortconv.distributed  # noqa: F401  (up front: a rank importing inside its first
    # check would hold up the others of its group for the seconds the import takes)
    torch.set_num_threads(1)
    if BACKEND == "nccl":
        DEV = torch.device("cuda", rank)
        torch.cuda.set_device(DEV)
    dist.init_process_group(BACKEND, init_method="file://" + os.path.join(tmp, "rdzv"),
                            rank=rank, world_size=n, timeout=timedelta(seconds=60))
    groups = _groups(n, worlds)
    # between two sizes the ranks outside the smaller group wait for it: as long as its checks
    # take, so on a group of their own with the whole run's timeout
    between = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout))
    out = {}
    path = os.path.join(tmp, "rank%d.json" % rank)
    for k in worlds:
        if rank >= n - k:
            GROUP, SUBGROUP = groups[k], groups.get(k - 1)
            _run_checks(rank - (n - k), k, out.setdefault(str(k), {}), path, out)
        dist.barrier(group=between)
    dist.destroy_process_group()


def _run_checks(rank, world, res, path, out):
    """Every check of world size `world` as group rank `rank` into res (status, reports,
    seconds, then done); all of `out` is written to `path` after each check."""
    res.update(status={}, reports={}, seconds={}, done=False)
    for name, fn in _checks(world):
        t0 = time.time()
        try:
            rep = fn(rank, world)
            res["status"][name] = "ok"
            if rep is not None:
                res["reports"][name] = rep
        except Exception:
            res["status"][name] = "rank %d: %s" % (rank, traceback.format_exc())
        res["seconds"][name] = round(time.time() - t0, 2)
        _save(path, out)
    res["done"] = True
    _save(path, out)


def _save(path, out):
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)


def _checks(world):
    return _filter(_all_checks(world))


def _filter(checks):
    only = os.environ.get("SHORTCONV_CP_CHECKS")  # a comma-separated subset, for debugging
    return [c for c in checks if not only or c[0] in only.split(",")]


def _all_checks(world):
    import shortconv
    out = [("cases", check_cases), ("context", check_context), ("no_grad", check_no_grad)]
    if world in (2, 3):
        out.append(("gradcheck", check_gradcheck))
    if world >= 2:
        out += [("ratio_table", check_ratio_table), ("errors", check_errors)]
    if world == 2 and shortconv.HAS_CUSTOM_OPS:
        out.append(("compile", check_compile))
    return out


# ---- problems ------------------------------------------------------------------------------------
def _shards(rng, world, W):
    """Shard lengths with 0, 1 and runs of shards shorter than W-1."""
    short = [0, 1, max(W - 2, 0), max(W - 1, 0)]
    kind = rng.choice(["random", "short", "short", "one_long"])
    if kind == "random":
        return [rng.choice(short + [W, rng.randint(0, 12)]) for _ in range(world)]
    if kind == "short":
        return [rng.choice(short) for _ in range(world - 1)] + [rng.randint(1, 9)]
    lens = [rng.choice(short) for _ in range(world)]
    lens[rng.randrange(world)] = rng.randint(W, 14)
    return lens


def _seqlens(rng, total):
    """Global cu_seqlens over `total` tokens: random cuts (repeats = zero-length sequences)."""
    n = rng.randint(0, 4)
    cuts = sorted(rng.randint(0, total) for _ in range(n))
    if rng.random() < 0.3:
        cuts = [0] + cuts  # a zero-length first sequence
    return [0] + cuts + [total]


def make_case(seed, world, W=None, S=None, packed=None, dtype=None):
    rng = random.Random(seed)
    W = W if W is not None else rng.choice([1, 2, 4, 7])
    S = S if S is not None else W + rng.choice([-1, 0, 2] if W > 1 else [0, 2])
    lens = _shards(rng, world, W)
    packed = rng.random() < 0.5 if packed is None else packed
    cu = _seqlens(rng, sum(lens)) if packed else None
    return dict(seed=seed, W=W, S=S, lens=lens, cu=cu, B=1 if packed else rng.choice([1, 2]),
                D=rng.choice([1, 3, 5]),
                dtype=dtype if dtype is not None else rng.choice([torch.float32, torch.float64]),
                sdtype=None, bias=rng.random() < 0.7, residual=rng.random() < 0.4,
                h0=rng.random() < 0.7, ofs=rng.random() < 0.7,
                act=rng.choice([None, "silu"]), use_backward=rng.random() < 0.5,
                dht_ranks=rng.choice(["all", "one"]))


def _global_inputs(c, world):
    g = torch.Generator().manual_seed(1000 + c["seed"])
    dt, sdt = c["dtype"], c["sdtype"] or c["dtype"]
    total, D, W, S = sum(c["lens"]), c["D"], c["W"], c["S"]
    N = len(c["cu"]) - 1 if c["cu"] is not None else c["B"]

    def rnd(*shape, dtype=dt):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(DEV, dtype)

    X = rnd(c["B"], total, D)
    p = dict(X=X, w=rnd(D, W), b=rnd(D) if c["bias"] else None,
             res=rnd(*X.shape) if c["residual"] else None,
             h0=rnd(N, D, S, dtype=sdt) if c["h0"] else None,
             cu=torch.tensor(c["cu"], dtype=torch.int32, device=DEV) if c["cu"] is not None
             else None,
             GY=rnd(*X.shape), N=N)
    # dht per rank: small dyadic values, so the group sum is exact in every dtype
    ght = torch.randint(-6, 7, (world, N, D, S), generator=g).to(torch.float64) / 8
    if c["dht_ranks"] == "one":
        keep = torch.zeros(world, 1, 1, 1, dtype=torch.float64)
        keep[c["seed"] % world] = 1
        ght = ght * keep
    p["ght"] = ght.to(DEV, sdt)
    return p


def _leaf(t):
    return None if t is None else t.detach().clone().requires_grad_(True)


def run_case(c, rank, world, context=None, via=None):
    """Distributed and single-process results of case c; every collective happens here."""
    import shortconv
    import shortconv.distributed as scd
    p = _global_inputs(c, world)
    lens = c["lens"]
    off, T = sum(lens[:rank]), lens[rank]
    sl = slice(off, off + T)
    x, w, b, h0 = _leaf(p["X"][:, sl]), _leaf(p["w"]), _leaf(p["b"]), _leaf(p["h0"])
    res = _leaf(p["res"][:, sl]) if p["res"] is not None else None
    if c["cu"] is not None and c.get("flat"):
        x = _leaf(x.detach()[0])
        res = _leaf(res.detach()[0]) if res is not None else None
    x_in = x
    layout = {}
    if c.get("channel_major"):  # x a [B, T, D] view of [B, D, T] memory
        x = _leaf(x.detach().transpose(1, 2).contiguous())
        x_in = x.transpose(1, 2)
        layout["x"] = significant_strides(x_in)

        def record_dx(g):  # the gradient arriving at x_in: the op's dx
            layout["dx"] = significant_strides(g)

        x_in.register_hook(record_dx)
    kw = dict(initial_state=h0, output_final_state=c["ofs"], activation=c["act"],
              state_len=c["S"])
    if via == "cp_context":
        y, ht = shortconv.causal_conv1d(x_in, w, b, res, cp_context=context, **kw)
    elif context is not None:
        y, ht = scd.causal_conv1d(x_in, w, b, res, context=context, **kw)
    else:
        y, ht = scd.causal_conv1d(x_in, w, b, res, group=GROUP, cu_seqlens=p["cu"], **kw)
    layout["y"] = significant_strides(y)
    ins = [t for t in (x, w, b, res, h0) if t is not None]
    gy = p["GY"][:, sl].reshape(y.shape)
    outs, gouts = [y], [gy]
    if c["ofs"]:
        outs.append(ht)
        gouts.append(p["ght"][rank])
    if c.get("use_backward"):
        torch.autograd.backward(outs, gouts)
        grads = [t.grad for t in ins]
    else:
        grads = list(torch.autograd.grad(outs, ins, gouts, allow_unused=True))
    got = dict(zip(["x", "w", "b", "res", "h0"], [None] * 5))
    names = [k for k, t in zip(["x", "w", "b", "res", "h0"], (x, w, b, res, h0)) if t is not None]
    got.update(zip(names, grads))
    if c.get("channel_major") and got["x"] is not None:
        got["x"] = got["x"].transpose(1, 2)
    # partial sums of the replicated inputs, summed over the group in float64
    sums = {}
    for k in ("w", "b", "h0"):
        if got[k] is not None:
            t = got[k].to(torch.float64)
            dist.all_reduce(t, group=GROUP)
            sums[k] = t.to(got[k].dtype)

    # the single process on the concatenated input
    X, wr, br, hr = _leaf(p["X"]), _leaf(p["w"]), _leaf(p["b"]), _leaf(p["h0"])
    rr = _leaf(p["res"])
    yr, htr = shortconv.causal_conv1d(X, wr, br, rr, cu_seqlens=p["cu"],
                                      **dict(kw, initial_state=hr))
    rins = [t for t in (X, wr, br, rr, hr) if t is not None]
    routs, rg = [yr], [p["GY"]]
    if c["ofs"]:
        routs.append(htr)
        rg.append(p["ght"].to(torch.float64).sum(0).to(htr.dtype))
    rgrads = dict(zip(names, torch.autograd.grad(routs, rins, rg, allow_unused=True)))
    return dict(y=y, ht=ht, grads=got, sums=sums, yr=yr[:, sl].reshape(y.shape), htr=htr,
                rgrads=rgrads, sl=sl, layout=layout)


def significant_strides(t):
    """Strides of the dims with more than one element (the others address nothing)."""
    return tuple(s if n > 1 else None for n, s in zip(t.shape, t.stride()))


def assert_case(c, out):
    """Bitwise where the contract says so; dweight/dbias within the dtype's tolerance."""
    what = "case %s" % ({k: (str(v) if isinstance(v, torch.dtype) else v) for k, v in c.items()},)
    y, yr = out["y"], out["yr"]
    assert torch.equal(y, yr), "%s: y differs (max %g)" % (what, (y - yr).abs().max())
    lay = out["layout"]
    if "x" in lay:  # y and dx in x's layout (channel-major shards)
        assert lay["y"] == lay["x"] and lay["dx"] == lay["x"], "%s: %s" % (what, lay)
    if c["ofs"]:
        assert torch.equal(out["ht"], out["htr"]), "%s: final_state differs" % what
    else:
        assert out["ht"] is None
    g, rg, sl = out["grads"], out["rgrads"], out["sl"]
    dx_ref = rg["x"][:, sl].reshape(g["x"].shape)
    assert torch.equal(g["x"], dx_ref), "%s: dx differs (max %g)" % (
        what, (g["x"] - dx_ref).abs().max())
    if g["res"] is not None:
        assert torch.equal(g["res"], rg["res"][:, sl].reshape(g["res"].shape)), what
    if g["h0"] is not None:
        assert torch.equal(out["sums"]["h0"], rg["h0"]), "%s: dinitial_state differs (max %g)" % (
            what, (out["sums"]["h0"] - rg["h0"]).abs().max())
    for k in ("w", "b"):
        if g[k] is not None:
            e = rel(out["sums"][k], rg[k])
            assert e <= TOL[rg[k].dtype], "%s: sum of d%s: rel error %.3g" % (what, k, e)


def gather_rows(t, lens):
    """Concatenate every rank's [B, T_r, ...] along dim 1 (gloo's all_gather needs equal
    sizes: pad to the longest shard)."""
    m = max(lens)
    pad = t.new_zeros((t.shape[0], m) + tuple(t.shape[2:]))
    pad[:, :t.shape[1]] = t
    parts = [torch.empty_like(pad) for _ in lens]
    dist.all_gather(parts, pad, group=GROUP)
    return torch.cat([q[:, :n] for q, n in zip(parts, lens)], dim=1)


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    den = b.norm().item()
    return (a - b).norm().item() / den if den > 0 else (a - b).norm().item()


# ---- checks --------------------------------------------------------------------------------------
def _case_list(world):
    cases = []
    seed = 100 * world
    # the grid: every W with S in {W-1, W, W+2}, dense and packed
    for W in (1, 2, 4, 7):
        for S in ((0, 1, 3) if W == 1 else (W - 1, W, W + 2)):
            for packed in (False, True):
                seed += 1
                cases.append(make_case(seed, world, W=W, S=S, packed=packed))
    for _ in range(4 if world > 1 else 0):  # more random shardings
        seed += 1
        cases.append(make_case(seed, world))
    # everything on, mixed dtypes: bf16 x with fp32 states, fp32 x with fp64 states
    for dt, sdt in ((torch.bfloat16, torch.float32), (torch.float32, torch.float64)):
        seed += 1
        c = make_case(seed, world, W=4, S=5, packed=True, dtype=dt)
        c.update(sdtype=sdt, h0=True, ofs=True, bias=True, residual=True, act="silu")
        cases.append(c)
    seed += 1
    c = make_case(seed, world, W=3, S=3, packed=True)
    c.update(flat=True)  # [T, D] shards
    cases.append(c)
    seed += 1
    c = make_case(seed, world, W=4, S=4, packed=False)
    c.update(channel_major=True, B=2, D=5)
    cases.append(c)
    for packed in (False, True):  # no tokens at all: final_state = initial_state, dh0 = dht
        seed += 1
        c = make_case(seed, world, W=3, S=4, packed=packed)
        c.update(lens=[0] * world, cu=[0, 0, 0] if packed else None, h0=True, ofs=True)
        cases.append(c)
    return cases


def check_cases(rank, world):
    failures = []
    for c in _case_list(world):
        out = run_case(c, rank, world)
        try:
            assert_case(c, out)
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)
    return "%d cases" % len(_case_list(world))


def check_no_grad(rank, world):
    import shortconv
    import shortconv.distributed as scd
    c = make_case(7000 + world, world, W=4, S=4, packed=True)
    p = _global_inputs(c, world)
    off, T = sum(c["lens"][:rank]), c["lens"][rank]
    h0 = p["h0"] if p["h0"] is not None else None
    with torch.no_grad():
        y, ht = scd.causal_conv1d(p["X"][:, off:off + T], p["w"], p["b"], initial_state=h0,
                                  output_final_state=True, activation="silu", group=GROUP,
                                  cu_seqlens=p["cu"])
        yr, htr = shortconv.causal_conv1d(p["X"], p["w"], p["b"], initial_state=h0,
                                          output_final_state=True, activation="silu",
                                          cu_seqlens=p["cu"])
    assert torch.equal(y, yr[:, off:off + T]) and torch.equal(ht, htr)


def check_context(rank, world):
    """One context, several calls (two layers, a second D), through both entry points."""
    import shortconv.distributed as scd
    c = make_case(8000 + world, world, W=4, S=4, packed=True, dtype=torch.float64)
    c.update(h0=True, ofs=True)
    p = _global_inputs(c, world)
    off, T = sum(c["lens"][:rank]), c["lens"][rank]
    ctx = scd.build_context(p["X"][:, off:off + T], p["cu"], GROUP, kernel_size=4, state_len=4)
    assert ctx.cu_seqlens is p["cu"]
    assert ctx.group is (GROUP if GROUP is not None else dist.group.WORLD)
    assert list(ctx.lengths) == c["lens"] and ctx.offset == off
    outs = [run_case(c, rank, world, context=ctx), run_case(c, rank, world, context=ctx),
            run_case(c, rank, world, context=ctx, via="cp_context"),
            run_case(c, rank, world, context=SimpleNamespace(group=GROUP, cu_seqlens=p["cu"]),
                     via="cp_context")]
    c2 = dict(c, D=7, seed=c["seed"] + 1)  # another layer: other D, same token structure
    outs.append(run_case(c2, rank, world, context=ctx))
    for o in outs[:4]:
        assert_case(c, o)
    assert_case(c2, outs[4])


def _global_fn(rank, world, lens, cu, S, act):
    """f(X, w, b, h0, R) -> (Y, final_state), the same function on every rank, through the
    distributed op: X sliced to the shard (backward: gradients summed over the group), Y
    all-gathered (backward: this rank's rows), final_state's gradient taken once (rank 0)."""
    import shortconv.distributed as scd
    off, T = sum(lens[:rank]), lens[rank]
    ctx = scd.build_context(torch.empty(1 if cu is not None else 2, T, 1, device=DEV), cu,
                            GROUP)

    class Shard(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t[:, off:off + T].clone()

        @staticmethod
        def backward(ctx, g):
            full = g.new_zeros((g.shape[0], sum(lens)) + tuple(g.shape[2:]))
            full[:, off:off + T] = g
            dist.all_reduce(full, group=GROUP)
            return full

    class Replicated(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.clone()

        @staticmethod
        def backward(ctx, g):
            g = g.clone()
            dist.all_reduce(g, group=GROUP)
            return g

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            return gather_rows(y, lens)

        @staticmethod
        def backward(ctx, g):
            return g[:, off:off + T].contiguous()

    class Once(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.clone()

        @staticmethod
        def backward(ctx, g):
            return g if rank == 0 else torch.zeros_like(g)

    def fn(X, w, b, h0, R):
        y, ht = scd.causal_conv1d(Shard.apply(X), Replicated.apply(w), Replicated.apply(b),
                                  Shard.apply(R) if R is not None else None,
                                  Replicated.apply(h0), True, act, context=ctx, state_len=S)
        return Gather.apply(y), Once.apply(ht)
    return fn


def check_gradcheck(rank, world):
    """torch.autograd.gradcheck in fp64 through the whole distributed op, states included:
    dense (B=2, S > W: the state passes through a short shard) and packed (a sequence across
    an empty shard, a zero-length sequence, S = W-1)."""
    cases = {2: [([3, 2], None, 3, 4, 1), ([2, 4], [0, 1, 1, 4, 6], 4, 3, 2)],
             3: [([2, 1, 3], None, 3, 4, 1), ([2, 0, 4], [0, 1, 1, 4, 6], 4, 3, 2)]}[world]
    ok = []
    for lens, cu, W, S, D in cases:
        total = sum(lens)
        g = torch.Generator().manual_seed(5 + W)
        B = 1 if cu else 2
        N = len(cu) - 1 if cu else B

        def rnd(*s):
            return torch.randn(*s, generator=g, dtype=torch.float64).to(DEV).requires_grad_(True)

        args = (rnd(B, total, D), rnd(D, W), rnd(D), rnd(N, D, S),
                rnd(B, total, D) if cu is None else None)
        fn = _global_fn(rank, world, lens, torch.tensor(cu, device=DEV) if cu else None, S,
                        "silu")
        ok.append(torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-9, rtol=1e-7))
    assert all(ok)


def check_ratio_table(rank, world):
    """shortconv check's chunk table, distributed: one sequence cut at every rank boundary,
    the loss on the last shard's outputs only; ratio = ||grad at the W-1 positions before the
    last shard|| distributed / whole (those positions are dx rows of earlier, possibly
    length-1, shards, or initial_state entries)."""
    import shortconv
    import shortconv.distributed as scd
    rows, bad = [], []
    for W in (2, 4, 8):
        heads = {"len-1 shards": [1] * (world - 1), "cut inside W-1": [max(W - 2, 1)] +
                 [1] * (world - 2), "empty + short": [0] + [W - 1] * (world - 2),
                 "long head": [37] + [1] * (world - 2)}
        for name, head in heads.items():
            lens = head + [64]
            off, T = sum(lens[:rank]), lens[rank]
            g = torch.Generator().manual_seed(W * 100 + len(name))
            total, D, S = sum(lens), 8, W
            X, w, b, h0, GY = (torch.randn(*s, generator=g).to(DEV) for s in (
                (2, total, D), (D, W), (D,), (2, D, S), (2, total, D)))
            GY[:, :total - 64] = 0  # loss on the tail only
            xs, hs = _leaf(X[:, off:off + T]), _leaf(h0)
            y, _ = scd.causal_conv1d(xs, w, b, initial_state=hs, activation="silu", group=GROUP)
            dx, dh = torch.autograd.grad(y, (xs, hs), GY[:, off:off + T])
            dx_all = gather_rows(dx, lens)
            dist.all_reduce(dh, group=GROUP)
            Xr, hr = _leaf(X), _leaf(h0)
            yr, _ = shortconv.causal_conv1d(Xr, w, b, initial_state=hr, activation="silu")
            rdx, rdh = torch.autograd.grad(yr, (Xr, hr), GY)
            # du at u positions [cut - (W-1), cut) of u = h0 ++ x, cut = the tail's first token
            du_d = torch.cat([dh, dx_all.transpose(1, 2)], 2)
            du_r = torch.cat([rdh, rdx.transpose(1, 2)], 2)
            cut = S + total - 64
            gd, gr = du_d[..., cut - (W - 1):cut], du_r[..., cut - (W - 1):cut]
            ratio = gd.norm().item() / gr.norm().item()
            err = rel(gd, gr)
            rows.append("%-2d  %-15s %-22s %.4f  %.1e  %s" % (
                W, name, lens, ratio, err, "bitwise" if torch.equal(du_d, du_r) else "DIFFERS"))
            if ratio != 1.0 or not torch.equal(du_d, du_r):
                bad.append(rows[-1])
    table = "W   cut             shards                 ratio   err      du\n" + "\n".join(rows)
    assert not bad, "rows not exact:\n" + "\n".join(bad)
    return table


def _expect_error(fn, *needles):
    try:
        fn()
    except (ValueError, TypeError) as e:
        msg = str(e)
        for n in needles:
            assert n in msg, "message %r lacks %r" % (msg, n)
        return msg
    raise AssertionError("no error raised (expected one naming %s)" % (needles,))


def check_errors(rank, world):
    """Bad input raises on every rank, naming the argument, the rank and the expected value."""
    import shortconv
    import shortconv.distributed as scd
    last = world - 1
    D, W = 4, 3

    def x_(T=3, B=1, d=D, dt=torch.float32):
        return torch.randn(B, T, d, dtype=dt, device=DEV)

    def t_(*v):
        return torch.tensor(v, device=DEV)

    w = torch.randn(D, W, device=DEV)
    cu = t_(0, 2, 3 * world).int()
    msgs = []

    def cc(*args, **kw):  # the distributed op on the group of this world size
        return scd.causal_conv1d(*args, group=GROUP, **kw)

    cases = [
        (lambda: cc(x_(d=D + 1 if rank == last else D),
                    torch.randn(D + 1 if rank == last else D, W, device=DEV)),
         ("x: D (last dim) is %d on rank %d but %d on rank 0" % (D + 1, last, D),)),
        (lambda: cc(x_(B=2 if rank == last else 1), w),
         ("x: B (dim 0) is 2 on rank %d but 1 on rank 0" % last,)),
        (lambda: cc(x_(dt=torch.float64 if rank == last else torch.float32), w),
         ("x: dtype is torch.float64 on rank %d but torch.float32 on rank 0" % last,)),
        (lambda: cc(x_(), w, cu_seqlens=cu + (1 if rank == last else 0)),
         ("cu_seqlens", "rank %d" % last)),
        (lambda: cc(x_(), w, cu_seqlens=t_(0, 1 if rank == last else 2, 3 * world)),
         ("cu_seqlens: the offsets on rank %d differ from rank 0's" % last,)),
        (lambda: cc(x_(), w, cu_seqlens=t_(0, 2, 3 * world + 1)),
         ("cu_seqlens[-1] is %d on every rank; expected %d" % (3 * world + 1, 3 * world),)),
        (lambda: cc(x_(), w, cu_seqlens=t_(0, 3)),  # FLA's rank-local offsets
         ("cu_seqlens",) if world > 1 else ()),
        (lambda: cc(x_() if rank != last else "x", w), ("on rank %d" % last, "x")),
        (lambda: cc(x_(), w, initial_state=torch.randn(1, D, W + (rank == last), device=DEV)),
         ("initial_state", "rank %d" % last)),
        (lambda: cc(x_(), w, activation="relu" if rank == last else None),
         ("activation", "rank %d" % last)),
        (lambda: cc(x_(), w, state_len=W - 2 if rank == last else W),
         ("state_len", "rank %d" % last)),
        (lambda: cc(x_(), w, output_final_state=rank == last),
         ("output_final_state", "rank %d" % last)),
        (lambda: cc(x_(), w.clone().requires_grad_(rank == last)),
         ("autograd", "rank %d" % last)),
        (lambda: shortconv.causal_conv1d(x_(), w, cp_context=object()), ("cp_context",)),
    ]
    for fn, needles in cases:
        msgs.append(_expect_error(fn, *needles))
    # a group this rank is not in (this size's group without its rank 0): only that rank
    # calls, and it raises without a collective
    if world > 1 and rank == 0:
        msgs.append(_expect_error(lambda: scd.causal_conv1d(x_(), w, group=SUBGROUP),
                                  "group", "not a member"))
    if world > 1 and rank != 0:  # the members still work
        y, _ = scd.causal_conv1d(x_(), w, group=SUBGROUP)
        assert y.shape == (1, 3, D)
    dist.barrier(group=GROUP)
    return "\n".join(msgs) if rank == 0 else None


def check_compile(rank, world):
    """torch.compile(fullgraph=True) over a prebuilt context: no graph break, same results."""
    import shortconv.distributed as scd
    torch._dynamo.reset()
    c = make_case(9100, world, W=4, S=4, packed=True, dtype=torch.float32)
    p = _global_inputs(c, world)
    off, T = sum(c["lens"][:rank]), c["lens"][rank]
    ctx = scd.build_context(p["X"][:, off:off + T], p["cu"], GROUP, kernel_size=4, state_len=4)

    def loss(x, w, b, h0):
        y, ht = scd.causal_conv1d(x, w, b, initial_state=h0, output_final_state=True,
                                  activation="silu", context=ctx)
        return (y * y).sum() + (ht * ht).sum()

    g = torch.Generator().manual_seed(9101)
    args = [_leaf(p["X"][:, off:off + T]), _leaf(p["w"]),
            _leaf(torch.randn(c["D"], generator=g).to(DEV)),
            _leaf(torch.randn(p["N"], c["D"], 4, generator=g).to(DEV))]
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    lc = compiled(*args)
    gc = torch.autograd.grad(lc, args)
    le = loss(*args)
    ge = torch.autograd.grad(le, args)
    # without a context the call plans on the host each time: a graph break, same results
    def loss_plain(x, w, b, h0):
        y, ht = scd.causal_conv1d(x, w, b, initial_state=h0, output_final_state=True,
                                  activation="silu", group=GROUP, cu_seqlens=p["cu"])
        return (y * y).sum() + (ht * ht).sum()

    lp = torch.compile(loss_plain, backend="aot_eager")(*args)
    gp = torch.autograd.grad(lp, args)
    assert torch.equal(lc, le) and torch.equal(lp, le)
    for a, b, c2 in zip(gc, ge, gp):
        assert torch.equal(a, b) and torch.equal(c2, b)
    _check_cp_fakes(rank, world)


def _check_cp_fakes(rank, world):
    """The custom ops' fake implementations give the real outputs' shapes, dtypes and
    strides (what torch.compile plans with): a channel-major x, the halo state as the view
    the forward returns, the gradients."""
    import shortconv.distributed as scd
    from torch._subclasses.fake_tensor import FakeTensorMode
    if not scd.HAS_CP_CUSTOM_OPS:
        return
    B, D, S, W = 2, 5, 4, 4
    lens = [6] * world  # every shard >= S tokens: the halo fills the state (a strided view)
    g = torch.Generator().manual_seed(9200)
    X = torch.randn(B, D, sum(lens), generator=g).to(DEV)
    off = sum(lens[:rank])
    x = X[:, :, off:off + lens[rank]].contiguous().transpose(1, 2)  # channel-major shard
    w, b = torch.randn(D, W, generator=g).to(DEV), torch.randn(D, generator=g).to(DEV)
    h0 = torch.randn(B, D, S, generator=g).to(DEV)
    ctx = scd.build_context(x, None, GROUP, kernel_size=W, state_len=S)
    pat = ctx.pattern(S, W)
    fwd_args = (x, w, b, None, h0, pat.cu_local, pat.own_final, pat.own_start, pat.ints,
                ctx.group_name, S, 1, True)
    y, ht, E = torch.ops.shortconv.cp_fwd(*fwd_args)
    dy = torch.randn(B, D, lens[rank], generator=g).to(DEV).transpose(1, 2)
    bwd_args = (x, w, b, h0, E, pat.cu_local, pat.own_start, dy, None, pat.ints, ctx.group_name,
                S, 1, True, True, True, True, True)
    bwd = torch.ops.shortconv.cp_bwd(*bwd_args)
    mode = FakeTensorMode()
    for op, args, real in ((torch.ops.shortconv.cp_fwd, fwd_args, (y, ht, E)),
                           (torch.ops.shortconv.cp_bwd, bwd_args, bwd)):
        with mode:
            fake = op(*[mode.from_tensor(a) if torch.is_tensor(a) else a for a in args])
        for i, (r, f) in enumerate(zip(real, fake)):
            got = (tuple(f.shape), f.dtype, significant_strides(f))
            want = (tuple(r.shape), r.dtype, significant_strides(r))
            assert got == want, "%s output %d: fake %s, real %s" % (op, i, got, want)
    assert significant_strides(y) == significant_strides(x) == significant_strides(bwd[0])
