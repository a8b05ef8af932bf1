"""CUDA tensors: the CUDA backend through the package (skipped without a GPU).

Checked against the float64 reference on the CPU; on torch's current stream;
CUDA-graph replay and torch.compile (inductor, reduce-overhead) equal to eager.
"""
import pytest
import torch

import shortconv
from shortconv.reference import causal_conv1d_ref

from helpers import assert_close, lengths_to_cu, make_problem

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(torch.cuda.is_available() and not shortconv.has_backend("cuda"),
                       reason="libshortconv was built without the CUDA backend"),
]

NAMES = ("x", "weight", "bias", "residual", "initial_state")


def to_cuda(p, dtype, requires_grad=False):
    q = dict(p)
    for k in NAMES:
        if p[k] is not None:
            q[k] = p[k].detach().to("cuda", dtype).requires_grad_(requires_grad)
    if p["cu_seqlens"] is not None:
        q["cu_seqlens"] = p["cu_seqlens"].cuda()
    return q


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("S_extra", [-1, 0, 2])
def test_matches_reference(dtype, packed, S_extra):
    W = 4
    p = make_problem(B=3, T=37, D=80, W=W, S=W + S_extra,
                     lengths=[5, 0, 33, 1, 70] if packed else None, residual=True, seed=80)
    q = to_cuda(p, dtype, requires_grad=True)
    y, ht = shortconv.causal_conv1d(*[q[k] for k in NAMES], True, "silu",
                                    cu_seqlens=q["cu_seqlens"], state_len=q["state_len"])
    assert y.is_cuda and ht.is_cuda
    g = torch.Generator().manual_seed(81)
    dy = torch.randn(y.shape, generator=g, dtype=torch.float64).to(dtype)
    dht = torch.randn(ht.shape, generator=g, dtype=torch.float64).to(dtype)
    grads = torch.autograd.grad([y, ht], [q[k] for k in NAMES], [dy.cuda(), dht.cuda()])

    ref_in = [q[k].detach().cpu().double().requires_grad_() for k in NAMES]
    yr, htr = causal_conv1d_ref(*ref_in, True, "silu", cu_seqlens=p["cu_seqlens"],
                                state_len=p["state_len"])
    ref_grads = torch.autograd.grad([yr, htr], ref_in, [dy.double(), dht.double()])
    assert_close(y, yr, dtype, what="y")
    assert torch.equal(ht.cpu().double(), htr)
    for k, a, b in zip(NAMES, grads, ref_grads):
        assert_close(a, b, dtype, what="d" + k)


def test_strided_inputs_on_cuda():
    B, T, D, W = 2, 50, 64, 4
    qkv = torch.randn(B, T, 3 * D, device="cuda")
    w = torch.randn(D, W, device="cuda")
    k = qkv[:, :, D:2 * D]
    y, _ = shortconv.causal_conv1d(k, w, activation="silu")
    yr, _ = causal_conv1d_ref(k.double().cpu(), w.double().cpu(), activation="silu")
    assert_close(y, yr, torch.float32)


def test_runs_on_the_current_stream():
    p = make_problem(B=2, T=300, D=256, W=4, seed=82)
    q = to_cuda(p, torch.float32)
    y0, h0 = shortconv.causal_conv1d(q["x"], q["weight"], q["bias"], initial_state=q["initial_state"],
                                     output_final_state=True, activation="silu")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x = q["x"] * 1.0  # produced on s: the op must be ordered after it on s
        y1, h1 = shortconv.causal_conv1d(x, q["weight"], q["bias"], initial_state=q["initial_state"],
                                         output_final_state=True, activation="silu")
    s.synchronize()
    assert torch.equal(y0, y1) and torch.equal(h0, h1)


def test_device_mismatch_is_an_error():
    x = torch.randn(1, 4, 8, device="cuda")
    with pytest.raises(ValueError, match=r"weight is on cpu but x is on cuda"):
        shortconv.causal_conv1d(x, torch.randn(8, 4))
    with pytest.raises(ValueError, match=r"cu_seqlens is on cpu"):
        shortconv.causal_conv1d(x, torch.randn(8, 4, device="cuda"),
                                cu_seqlens=torch.tensor([0, 4], dtype=torch.int32))


def test_no_memory_leak_and_deterministic():
    p = make_problem(B=2, T=200, D=128, W=4, seed=83)
    q = to_cuda(p, torch.bfloat16, requires_grad=True)
    args = [q["x"], q["weight"], q["bias"], None, q["initial_state"]]

    def step():
        y, ht = shortconv.causal_conv1d(*args, True, "silu")
        return torch.autograd.grad([y, ht], [q["x"], q["weight"], q["bias"], q["initial_state"]],
                                   [torch.ones_like(y), torch.ones_like(ht)])

    def same_as(first):
        return all(torch.equal(a, b) for a, b in zip(first, step()))

    first = step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    for _ in range(5):
        assert same_as(first), "results must be bitwise identical run to run"
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base  # workspace and temporaries all returned


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_a_non_current_device():
    p = make_problem(B=2, T=40, D=32, W=3, seed=84)
    q0 = to_cuda(p, torch.float32)
    y0, _ = shortconv.causal_conv1d(q0["x"], q0["weight"], q0["bias"], activation="silu")
    x1, w1, b1 = (t.to("cuda:1") for t in (q0["x"], q0["weight"], q0["bias"]))
    with torch.cuda.device(0):
        y1, _ = shortconv.causal_conv1d(x1, w1, b1, activation="silu")
    assert y1.device == torch.device("cuda:1")
    assert torch.equal(y0.cpu(), y1.cpu())


# ---- CUDA graphs ---------------------------------------------------------------------
def _warmup(fn, n=3):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(n):
            fn()
    torch.cuda.current_stream().wait_stream(s)


@pytest.mark.parametrize("packed", [False, True])
def test_cuda_graph_forward_backward_replay(packed):
    W = 4
    lengths = [7, 0, 30, 3]
    p = make_problem(B=2, T=40, D=96, W=W, lengths=lengths if packed else None, seed=85)
    q = to_cuda(p, torch.float32, requires_grad=True)
    leaves = [q["x"], q["weight"], q["bias"], q["initial_state"]]
    cu = q["cu_seqlens"]
    N = len(lengths) if packed else 2
    dy = torch.randn(q["x"].shape, device="cuda")
    dht = torch.randn(N, 96, W, device="cuda")

    def fn():
        y, ht = shortconv.causal_conv1d(q["x"], q["weight"], q["bias"],
                                        initial_state=q["initial_state"], output_final_state=True,
                                        activation="silu", cu_seqlens=cu)
        return (y, ht) + torch.autograd.grad([y, ht], leaves, [dy, dht])

    _warmup(fn)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = fn()
    for trial in range(2):
        with torch.no_grad():
            for t in leaves + [dy, dht]:
                t.copy_(torch.randn_like(t))
        g.replay()
        torch.cuda.synchronize()
        eager = fn()
        for a, b in zip(static_out, eager):
            assert torch.equal(a, b), "replay must equal eager (trial %d)" % trial


def test_seq_idx_graph_replay_and_clamped_ids():
    """seq_idx on the device: captured in a CUDA graph (no host synchronisation) with states
    by id, replay equals eager and the CPU within tolerance; an id past initial_state's rows
    reads a zero state and writes no row (docs/semantics.md section 3)."""
    B, T, D, W, P = 2, 41, 72, 4, 9
    gen = torch.Generator().manual_seed(90)
    ids = torch.tensor([[-1] * 3 + [0] * 20 + [1] + [-2] * 2 + [2] * 15,
                        [3] * 2 + [4] * 30 + [-1] + [5] * 8], dtype=torch.int32)
    cpu = dict(x=torch.randn(B, T, D, generator=gen), w=torch.randn(D, W, generator=gen),
               b=torch.randn(D, generator=gen), h0=torch.randn(P, D, W, generator=gen))
    q = {k: v.cuda().requires_grad_() for k, v in cpu.items()}
    sid = ids.cuda()
    dy = torch.randn(B, T, D, device="cuda")
    dht = torch.randn(P, D, W, device="cuda")
    leaves = [q["x"], q["w"], q["b"], q["h0"]]

    def fn():
        y, ht = shortconv.causal_conv1d(q["x"], q["w"], q["b"], initial_state=q["h0"],
                                        output_final_state=True, activation="silu",
                                        seq_idx=sid)
        return (y, ht) + torch.autograd.grad([y, ht], leaves, [dy, dht])

    _warmup(fn)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = fn()
    g.replay()
    torch.cuda.synchronize()
    eager = fn()
    for a, b in zip(static_out, eager):
        assert torch.equal(a, b)
    c = {k: v.clone().requires_grad_() for k, v in cpu.items()}
    yc, htc = shortconv.causal_conv1d(c["x"], c["w"], c["b"], initial_state=c["h0"],
                                      output_final_state=True, activation="silu", seq_idx=ids)
    ref = (yc, htc) + torch.autograd.grad([yc, htc], [c["x"], c["w"], c["b"], c["h0"]],
                                          [dy.cpu(), dht.cpu()])
    for a, r, what in zip(eager, ref, ["y", "final_state", "dx", "dweight", "dbias", "dh0"]):
        assert_close(a, r, torch.float32, what=what)
    # ids 7 and 8 are rows of a 9-row pool; with a 6-row initial_state they are past its
    # rows on the device: zero initial state, and no final-state row (final_state has 6)
    far = torch.tensor([[7] * 10 + [8] * 31, [-1] * 41], dtype=torch.int32)
    h6 = q["h0"].detach()[:6]
    y_far, ht_far = shortconv.causal_conv1d(q["x"].detach(), q["w"].detach(), q["b"].detach(),
                                            initial_state=h6, output_final_state=True,
                                            activation="silu", seq_idx=far.cuda())
    zero = torch.zeros(2, D, W, device="cuda")
    y_zero, _ = shortconv.causal_conv1d(q["x"].detach(), q["w"].detach(), q["b"].detach(),
                                        initial_state=zero, activation="silu",
                                        seq_idx=torch.tensor([[0] * 10 + [1] * 31, [-1] * 41],
                                                             dtype=torch.int32).cuda())
    assert torch.equal(y_far, y_zero)
    assert torch.equal(ht_far, torch.zeros_like(ht_far))  # (zero-filled rows, none written)


def test_cuda_graph_decode_replay():
    D, W, P = 64, 4, 6
    g0 = torch.Generator().manual_seed(86)
    pool = torch.randn(P, D, W - 1, generator=g0).cuda()
    pool_eager = pool.clone()
    w = torch.randn(D, W, generator=g0).cuda()
    b = torch.randn(D, generator=g0).cuda()
    idx = torch.tensor([4, -1, 0, 2], device="cuda")
    xt = torch.randn(4, D, device="cuda")

    def step(cache):
        return shortconv.causal_conv1d_update(xt, cache, weight=w, bias=b, activation="silu",
                                              cache_indices=idx)[0]

    scratch = pool.clone()
    _warmup(lambda: step(scratch))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y_static = step(pool)
    # capture does not run the kernels; each replay is one decode step
    for _ in range(4):
        xt.copy_(torch.randn_like(xt))
        g.replay()
        y_eager = step(pool_eager)
        torch.cuda.synchronize()
        assert torch.equal(y_static, y_eager)
        assert torch.equal(pool, pool_eager)


@pytest.mark.parametrize("overlap", ["launch", "reads"])
@pytest.mark.parametrize("api", ["core", "vllm"])
def test_overlapped_decode_chain_in_a_graph(overlap, api):
    """Steps launched to overlap the kernel before them, where that kernel wrote their x (each
    step's x is the previous step's y) and consecutive steps update two pools in turn (the
    contract of 'reads'): eager and replayed from a CUDA graph, bitwise the chain without
    overlap.  bf16, W = 4, raw taps: the plain step's kernels (batch 1 and 64, both row
    layouts through the vLLM drop-in's channel-contiguous pool)."""
    D, W, P, steps = 1024, 4, 80, 24
    g0 = torch.Generator().manual_seed(5)
    w = (0.3 * torch.randn(D, W, generator=g0)).bfloat16().cuda()
    bias = (0.1 * torch.randn(D, generator=g0)).bfloat16().cuda()
    for N in (1, 64):
        pools0 = [torch.randn(P, D, W - 1, generator=g0).bfloat16().cuda() for _ in range(2)]
        if api == "vllm":  # vLLM's pools: the feature dim contiguous
            pools0 = [p.transpose(1, 2).contiguous().transpose(1, 2) for p in pools0]
        idx = [torch.randperm(P, generator=g0)[:N].cuda() for _ in range(2)]
        x0 = torch.randn(N, D, generator=g0).bfloat16().cuda()

        def chain(xs, pools, ov):
            for i in range(steps):
                if api == "core":
                    y, _ = shortconv.causal_conv1d_update(xs[i], pools[i % 2], weight=w,
                                                          bias=bias, activation="silu",
                                                          cache_indices=idx[i % 2], overlap=ov)
                else:
                    y = shortconv.vllm.causal_conv1d_update(xs[i], pools[i % 2], w, bias, True,
                                                            idx[i % 2].int(), overlap=ov)
                xs[i + 1].copy_(y)  # (a copy kernel: y's writer is the step right before)
            return xs, pools

        def fresh():
            xs = [x0.clone()] + [torch.zeros_like(x0) for _ in range(steps)]
            return xs, [p.clone() for p in pools0]

        want_x, want_p = chain(*fresh(), None)
        got_x, got_p = chain(*fresh(), overlap)
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(got_x, want_x)), "eager, batch %d" % N
        assert all(torch.equal(a, b) for a, b in zip(got_p, want_p)), "eager, batch %d" % N
        xs, pools = fresh()
        _warmup(lambda: chain([x.clone() for x in xs], [p.clone() for p in pools], overlap))
        xs, pools = fresh()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            chain(xs, pools, overlap)
        for _ in range(2):
            fx, fp = fresh()
            for a, f in zip(xs + pools, fx + fp):
                a.copy_(f)
            graph.replay()
            torch.cuda.synchronize()
            assert all(torch.equal(a, b) for a, b in zip(xs, want_x)), "graph, batch %d" % N
            assert all(torch.equal(a, b) for a, b in zip(pools, want_p)), "graph, batch %d" % N


# ---- torch.compile -------------------------------------------------------------------
@pytest.mark.skipif(not shortconv.HAS_CUSTOM_OPS, reason="custom ops need torch >= 2.4")
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compile_inductor_matches_eager(mode):
    torch._dynamo.reset()
    p = make_problem(B=2, T=64, D=128, W=4, residual=True, seed=87)
    q = to_cuda(p, torch.bfloat16, requires_grad=True)
    leaves = [q[k] for k in NAMES]

    def f(x, w, b, r, h0):
        y, ht = shortconv.causal_conv1d(torch.tanh(x), w, b, r, h0, True, "silu")
        return (y.float() ** 2).sum() + ht.float().sum()

    cf = torch.compile(f, fullgraph=True, mode=mode)
    for _ in range(3):  # reduce-overhead records the CUDA graph on a later call
        lc = cf(*leaves)
        gc = torch.autograd.grad(lc, leaves)
    le = f(*leaves)
    ge = torch.autograd.grad(le, leaves)
    assert_close(lc, le, torch.bfloat16, what="loss")
    for k, a, b in zip(NAMES, gc, ge):
        assert_close(a, b, torch.bfloat16, what="d" + k)


@pytest.mark.skipif(not shortconv.HAS_CUSTOM_OPS, reason="custom ops need torch >= 2.4")
def test_compile_decode_with_pool():
    torch._dynamo.reset()
    D, W = 32, 4
    w = torch.randn(D, W, device="cuda")
    pool_c = torch.randn(5, D, W, device="cuda")
    pool_e = pool_c.clone()
    idx = torch.tensor([3, 0, -1], device="cuda", dtype=torch.int32)

    def step(x, pool):
        y, _ = shortconv.causal_conv1d_update(x, pool, weight=w, activation="silu",
                                              cache_indices=idx)
        return y * 2

    cstep = torch.compile(step, fullgraph=True)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(3, D, device="cuda")
            assert torch.equal(cstep(x, pool_c), step(x, pool_e))
            assert torch.equal(pool_c, pool_e)


def test_module_packed_on_cuda():
    torch.manual_seed(88)
    m = shortconv.ShortConvolution(48, 4, bias=True, activation="silu").cuda()
    x = torch.randn(1, 20, 48, device="cuda", requires_grad=True)
    cu = lengths_to_cu([5, 15], device="cuda")
    y, ht = m(x, cu_seqlens=cu, output_final_state=True)
    yr, htr = causal_conv1d_ref(x.detach().double().cpu(), m.weight[:, 0].detach().double().cpu(),
                                m.bias.detach().double().cpu(), activation="silu",
                                cu_seqlens=cu.cpu(), output_final_state=True)
    assert_close(y, yr, torch.float32)
    assert torch.equal(ht.double().cpu(), htr)
    y.sum().backward()
    assert m.weight.grad is not None and x.grad is not None
