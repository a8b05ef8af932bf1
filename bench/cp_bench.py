"""Context parallelism: correctness and time of shortconv.distributed.causal_conv1d.

    SHORTCONV_LIBRARY=build/lib/libshortconv.so PYTHONPATH=python \\
        torchrun --nproc_per_node 2 bench/cp_bench.py           # NCCL, one GPU per rank
    PYTHONPATH=python python bench/cp_bench.py --nproc 2 --tiny # gloo on CPU (spawns itself)

Each shape is split evenly over the ranks (the long one also unevenly with a 1-token shard).
For each, every rank first checks its slice against the single-process op on the whole
input (y, final_state and dx bitwise, dweight/dbias summed over the group within 1e-2), then
times, per call (median of repeats of back-to-back calls, slowest rank):

  local      shortconv.causal_conv1d on this rank's shard alone (no communication): the
             compute a context-parallel call cannot avoid
  cp         shortconv.distributed.causal_conv1d with a prebuilt context
  cp/local   the ratio (goal: <= 1.05 plus the latency of one small collective)
  p2p        the forward's halo exchange alone (S rows to the next rank)
  allreduce  the final-state all-reduce alone (N x D x S), when the shape returns states

fwd is under torch.no_grad; f+b is forward + torch.autograd.grad of (x, weight, bias and,
when present, initial_state).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

import shortconv
import shortconv.distributed as scd

# (name, B, T, D, N packed sequences or 0 for dense, with states, uneven split)
SHAPES = [("long 1x65536x4096", 1, 65536, 4096, 0, False, False),
          ("long, shards T-1 / 1", 1, 65536, 4096, 0, False, True),
          ("packed 1x32768x8192, 16 seqs, h0+ht", 1, 32768, 8192, 16, True, False)]
TINY = [("tiny 1x64x32", 1, 64, 32, 0, False, False),
        ("tiny, shards T-1 / 1", 1, 64, 32, 0, False, True),
        ("tiny packed 1x64x32, 5 seqs, h0+ht", 1, 64, 32, 5, True, False)]


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def per_call(fn, dev, n, reps):
    """Median µs per call over `reps` runs of `n` back-to-back calls; the same counts on
    every rank (the calls hold collectives), so the ranks stay in step."""
    for _ in range(3):
        fn()
    _sync(dev)
    out = []
    for _ in range(reps):
        dist.barrier()
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        _sync(dev)
        out.append((time.perf_counter() - t0) / n * 1e6)
    out.sort()
    return out[len(out) // 2]


def slowest(v, dev):
    t = torch.tensor([v], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def shard_lengths(T, R, uneven):
    if uneven:
        return [T - (R - 1)] + [1] * (R - 1)
    return [T // R + (1 if r < T % R else 0) for r in range(R)]


def run_shape(spec, rank, R, dev, dt, n, reps):
    name, B, T, D, N, states, uneven = spec
    W = 4
    g = torch.Generator().manual_seed(7)
    lens = shard_lengths(T, R, uneven)
    off, Tr = sum(lens[:rank]), lens[rank]
    cu = None
    if N:
        cuts = sorted(torch.randint(1, T, (N - 1,), generator=g).tolist())
        cu = torch.tensor([0] + cuts + [T], dtype=torch.int32, device=dev)
    Nseq = N or B
    X = torch.randn(B, T, D, generator=g).to(dev, dt)
    w = torch.randn(D, W, generator=g).to(dev, dt)
    b = torch.randn(D, generator=g).to(dev, dt)
    h0 = torch.randn(Nseq, D, W, generator=g).to(dev, dt) if states else None
    GY = torch.randn(B, T, D, generator=g).to(dev, dt)

    def leaf(t):
        return None if t is None else t.detach().clone().requires_grad_(True)

    # correctness: the slice of the single-process result
    x, wl, bl, hl = leaf(X[:, off:off + Tr]), leaf(w), leaf(b), leaf(h0)
    ctx = scd.build_context(x, cu)
    kw = dict(activation="silu", output_final_state=states)
    y, ht = scd.causal_conv1d(x, wl, bl, initial_state=hl, context=ctx, **kw)
    ins = [t for t in (x, wl, bl, hl) if t is not None]
    grads = torch.autograd.grad(y, ins, GY[:, off:off + Tr])
    Xr, wr, br, hr = leaf(X), leaf(w), leaf(b), leaf(h0)
    yr, htr = shortconv.causal_conv1d(Xr, wr, br, initial_state=hr, cu_seqlens=cu, **kw)
    rins = [t for t in (Xr, wr, br, hr) if t is not None]
    rgrads = torch.autograd.grad(yr, rins, GY)
    ok = torch.equal(y, yr[:, off:off + Tr]) and torch.equal(grads[0], rgrads[0][:, off:off + Tr])
    ok = ok and (not states or torch.equal(ht, htr))
    worst = 0.0
    for gd, gr in zip(grads[1:], rgrads[1:]):
        s = gd.double()
        dist.all_reduce(s)
        worst = max(worst, ((s - gr.double()).norm() / gr.double().norm()).item())
    ok = ok and worst <= 1e-2  # bf16 partial sums, rounded per rank
    okt = torch.tensor([int(ok)], device=dev)
    dist.all_reduce(okt, op=dist.ReduceOp.MIN)
    del Xr, yr, rgrads, grads, y
    torch.cuda.empty_cache() if dev.type == "cuda" else None

    # timing
    pat = ctx.pattern(W, W)
    loc_cu = pat.cu_local
    hloc = None
    if states:  # the local call with the states of its sequences (as the cp call has)
        hloc = h0
    dy = GY[:, off:off + Tr].contiguous()

    def local_fwd():
        with torch.no_grad():
            shortconv.causal_conv1d(x, wl, bl, initial_state=hloc, cu_seqlens=loc_cu, **kw)

    def local_fb():
        yy, _ = shortconv.causal_conv1d(x, wl, bl, initial_state=hl, cu_seqlens=loc_cu, **kw)
        torch.autograd.grad(yy, ins, dy)

    def cp_fwd():
        with torch.no_grad():
            scd.causal_conv1d(x, wl, bl, initial_state=hloc, context=ctx, **kw)

    def cp_fb():
        yy, _ = scd.causal_conv1d(x, wl, bl, initial_state=hl, context=ctx, **kw)
        torch.autograd.grad(yy, ins, dy)

    send = torch.randn(W, B, D, generator=g).to(dev, dt)
    recv = torch.empty_like(send)

    def p2p():
        ops = []
        if rank + 1 < R:
            ops.append(dist.P2POp(dist.isend, send, rank + 1))
        if rank > 0:
            ops.append(dist.P2POp(dist.irecv, recv, rank - 1))
        for wk in dist.batch_isend_irecv(ops):
            wk.wait()

    st = torch.zeros(Nseq, D, W, dtype=dt, device=dev).view(torch.uint8)

    def allreduce():
        dist.all_reduce(st)

    row = dict(name=name, lens=lens, ok=bool(okt.item()))
    for key, fn in (("local fwd", local_fwd), ("cp fwd", cp_fwd), ("local f+b", local_fb),
                    ("cp f+b", cp_fb), ("p2p", p2p)) + ((("allreduce", allreduce),) if states
                                                        else ()):
        row[key] = slowest(per_call(fn, dev, n, reps), dev)
    return row


def main(rank, R, a):
    dev = torch.device("cpu")
    backend = "gloo"
    if torch.cuda.is_available() and not a.tiny:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(dev)
        backend = "nccl"
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=R)
    dt = torch.bfloat16
    shapes = TINY if a.tiny else SHAPES
    rows = [run_shape(s, rank, R, dev, dt, a.n, a.reps) for s in shapes]
    if rank == 0:
        where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
        print("shortconv.distributed: %d ranks, %s on %s, bf16 W=4 SiLU bias, torch %s"
              % (R, backend, where, torch.__version__))
        print("µs per call, slowest rank; shards split evenly unless named")
        hdr = ("shape", "check", "local fwd", "cp fwd", "ratio", "local f+b", "cp f+b", "ratio",
               "p2p", "allreduce")
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
        for r in rows:
            print("| %s | %s | %.1f | %.1f | %.3f | %.1f | %.1f | %.3f | %.1f | %s |" % (
                r["name"], "bitwise" if r["ok"] else "FAILED", r["local fwd"], r["cp fwd"],
                r["cp fwd"] / r["local fwd"], r["local f+b"], r["cp f+b"],
                r["cp f+b"] / r["local f+b"], r["p2p"],
                "%.1f" % r["allreduce"] if "allreduce" in r else "-"))
    ok = all(r["ok"] for r in rows)
    dist.barrier()
    dist.destroy_process_group()
    if not ok:
        raise SystemExit("shortconv.distributed: a result differs from the single-process op")


def _spawned(rank, R, a):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    main(rank, R, a)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes, gloo on CPU")
    ap.add_argument("--nproc", type=int, default=2, help="ranks to spawn without torchrun")
    ap.add_argument("--n", type=int, default=20, help="back-to-back calls per repeat")
    ap.add_argument("--reps", type=int, default=5, help="repeats (the median is reported)")
    args = ap.parse_args()
    if "RANK" in os.environ:  # torchrun
        main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    else:
        import socket

        import torch.multiprocessing as mp
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        mp.spawn(_spawned, args=(args.nproc, args), nprocs=args.nproc)
