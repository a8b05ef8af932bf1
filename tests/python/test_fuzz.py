"""Property-based fuzzing of the Python entry points (hypothesis).

Each example draws a problem (shapes including 0, dtypes, strided views: transposes,
slices, stride-0 expands, lazily negated views; optional arguments present or absent;
dense or packed; value scales from tiny to huge) and, sometimes, exactly one defect
(a wrong Python type, an out-of-range scalar, a bad shape, dtype, layout or index).
Two outcomes are allowed:
- a defect: a TypeError / ValueError whose message names the defective argument, with
  every input (the decode cache included) unchanged;
- no defect: the result of shortconv.reference's plain-torch reference in float64,
  within the dtype's tolerance, and (when drawn) the same gradients as its autograd.

Bounded for CI: a fixed number of examples, derandomized (the same examples every run).
SHORTCONV_FUZZ_EXAMPLES=n runs n examples per test; SHORTCONV_FUZZ_RANDOM=1 draws new
ones each run.
"""
import os

import pytest
import torch

import shortconv
from shortconv.reference import causal_conv1d_ref

from helpers import TOL, rel

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = int(os.environ.get("SHORTCONV_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                derandomize=os.environ.get("SHORTCONV_FUZZ_RANDOM", "0") != "1",
                suppress_health_check=list(HealthCheck), print_blob=True)

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# Magnitudes of the data (x, residual, states; weights and bias stay ~N(0, 1)): with W <= 5
# taps and <= 21 tokens per dweight sum, pre, y and every gradient stay inside the range of
# the narrowest dtype in the problem (float16's 65504 when one is float16).
SCALES = {"one": (1.0, 1.0), "tiny": (1e-30, 1e-2), "huge": (1e30, 30.0)}


def magnitude(scale, *dtypes):
    return SCALES[scale][torch.float16 in dtypes]


# ---- building inputs: a leaf tensor and the view of it the call receives -------------
class Arg:
    """A float input: ``leaf`` (what gradients are taken of) and ``view(leaf)``."""

    def __init__(self, shape, dtype, layout, mag, gen):
        n = len(shape)
        if layout == "transpose" and n >= 2:
            leaf_shape = shape[:-2] + (shape[-1], shape[-2])
            self.view = lambda t: t.transpose(-1, -2)
        elif layout == "slice":
            last = shape[-1]
            leaf_shape = shape[:-1] + (3 * last + 1,)
            self.view = lambda t: t[..., 1 + last:1 + 2 * last]
        elif layout == "expand" and n >= 2:
            leaf_shape = (1,) + shape[1:]
            self.view = lambda t: t.expand(shape)
        elif layout == "neg":
            leaf_shape = shape
            self.view = lambda t: t._neg_view()
        else:
            leaf_shape = shape
            self.view = lambda t: t
        self.leaf = (torch.randn(leaf_shape, generator=gen, dtype=torch.float64) * mag).to(dtype)

    def value(self):
        return self.view(self.leaf)

    def reference(self):
        """The same view of a float64 copy of the leaf (a leaf of its own)."""
        self.ref_leaf = self.leaf.detach().double().requires_grad_(self.leaf.requires_grad)
        return self.view(self.ref_leaf)


def draw_layout(d, allow_expand=True):
    options = ["contig", "contig", "transpose", "slice", "neg"]
    return d(st.sampled_from(options + (["expand"] if allow_expand else [])))


def snapshot(values):
    return {k: v.detach().clone() for k, v in values.items()
            if isinstance(v, torch.Tensor) and v.device.type != "meta"
            and v.layout == torch.strided}


def assert_unchanged(values, before):
    for k, old in before.items():
        assert torch.equal(values[k].detach(), old), "%s was written on error" % k


def check_close(out, ref, dtype, what, xdt):
    """||out - ref|| / ||ref|| within the tolerance of out's dtype, or of the accumulation
    (fp32 unless x is fp64: docs/semantics.md section 4) when that is coarser."""
    assert out.shape == ref.shape, "%s: shape %s vs %s" % (what, tuple(out.shape), tuple(ref.shape))
    assert out.dtype == dtype, "%s: dtype %s, expected %s" % (what, out.dtype, dtype)
    assert torch.isfinite(ref).all(), "%s: the reference itself overflows" % what
    tol = max(TOL[dtype], TOL[torch.float64 if xdt == torch.float64 else torch.float32])
    err = rel(out, ref)
    assert err <= tol, "%s: relative error %.3g > %.1g" % (what, err, tol)


def expect_error(call, exc, name, values):
    before = snapshot(values)
    with pytest.raises(exc) as info:
        call()
    assert name in str(info.value), "the message does not name %s: %s" % (name, info.value)
    assert_unchanged(values, before)


# ---- causal_conv1d ------------------------------------------------------------------
FWD_DEFECTS = [
    "x:list", "weight:numpy", "bias:tuple", "residual:list", "initial_state:numpy",
    "cu_seqlens:list", "state_len:int32", "state_len:negative", "state_len:short",
    "state_len:float", "state_len:str", "state_len:bool", "activation:relu",
    "output_final_state:str", "x:int_dtype", "weight:shape", "bias:dtype", "residual:shape",
    "initial_state:batch", "cu_seqlens:order", "cu_seqlens:end", "cu_seqlens:dtype",
    "weight:sparse", "x:meta", "seq_idx:float", "seq_idx:shape", "seq_idx:past_rows",
]


def seq_idx_defect(kind, kw):
    """Corrupt kw's seq_idx (float, a short shape, an id past the state rows): what
    apply_*_defect returns, or None where the call has nothing to corrupt."""
    sid = kw.get("seq_idx")
    if sid is None or (kind == "past_rows" and kw.get("initial_state") is None):
        return None
    if kind == "float":
        kw["seq_idx"] = sid.float()
        return TypeError, "seq_idx"
    if kind == "shape":
        kw["seq_idx"] = sid[:, :-1] if sid.shape[1] else sid.new_zeros(sid.shape[0], 1)
        return ValueError, "seq_idx"
    if not sid.numel():
        return None
    sid = sid.clone()
    sid.view(-1)[-1] = kw["initial_state"].shape[0]  # one past the rows
    kw["seq_idx"] = sid
    return ValueError, "seq_idx"


_NOT_SHARED = object()


def apply_shared_defect(defect, kw):
    """The defects both entry points take alike -- seq_idx's, and an argument given as a
    list, a tuple or a numpy array: (exception, name), None when not applicable to this call,
    or _NOT_SHARED for the entry point's own."""
    arg, kind = defect.split(":")
    value = kw.get(arg)
    if arg == "seq_idx":
        return seq_idx_defect(kind, kw)
    if defect == "initial_state:batch" and kw.get("seq_idx") is not None:
        return None  # (rows by id: any row count is valid)
    if kind in ("list", "tuple", "numpy"):
        if value is None:
            return None
        plain = value.detach().resolve_neg()
        kw[arg] = {"list": plain.tolist, "tuple": lambda: tuple(plain.tolist()),
                   "numpy": lambda: plain.double().numpy()}[kind]()
        return TypeError, arg
    return _NOT_SHARED


def apply_fwd_defect(defect, kw, W, packed):
    """Corrupt one argument of a valid call: (exception, name the message must contain)."""
    shared = apply_shared_defect(defect, kw)
    if shared is not _NOT_SHARED:
        return shared
    arg, kind = defect.split(":")
    value = kw.get(arg)
    if arg == "state_len":
        if kind == "short" and W < 2:
            return None
        kw["state_len"] = {"int32": 2**31, "negative": -5, "short": W - 2, "float": W + 0.5,
                           "str": str(W), "bool": True}[kind]
        return (ValueError if kind in ("int32", "negative", "short") else TypeError), "state_len"
    if defect == "activation:relu":
        kw["activation"] = "relu"
        return ValueError, "activation"
    if defect == "output_final_state:str":
        kw["output_final_state"] = "yes"
        return TypeError, "output_final_state"
    if defect == "x:int_dtype":
        kw["x"] = kw["x"].detach().resolve_neg().to(torch.int32)
        return TypeError, "x"
    if defect == "x:meta":
        kw["x"] = torch.empty(kw["x"].shape, device="meta")
        return ValueError, "x"
    if defect == "weight:shape":
        w = kw["weight"].detach().resolve_neg()
        kw["weight"] = torch.cat([w, torch.zeros_like(w[:1]) if w.shape[0] else
                                  torch.zeros(1, W, dtype=w.dtype)], 0)  # [D+1, W]
        return ValueError, "weight"
    if defect == "weight:sparse":
        kw["weight"] = kw["weight"].detach().resolve_neg().to_sparse()
        return TypeError, "weight"
    if defect == "bias:dtype" and value is not None:
        other = torch.float64 if value.dtype != torch.float64 else torch.float32
        kw["bias"] = value.detach().resolve_neg().to(other)
        return ValueError, "bias"
    if defect == "residual:shape" and value is not None:
        kw["residual"] = value.detach()[..., :-1] if value.shape[-1] else \
            torch.zeros(value.shape[:-1] + (1,), dtype=value.dtype)
        return ValueError, "residual"
    if defect == "initial_state:batch" and value is not None:
        h = value.detach().resolve_neg()
        kw["initial_state"] = torch.cat([h, h.new_zeros((1,) + h.shape[1:])], 0)  # N+1 rows
        return ValueError, "initial_state"
    if arg == "cu_seqlens" and packed:
        cu = value.clone()
        if kind == "order":
            if cu.numel() < 3:
                return None
            cu[1] = cu[-1] + 1  # past the end: not non-decreasing
        elif kind == "end":
            cu[-1] += 1
        else:
            cu = cu.float()
            kw["cu_seqlens"] = cu
            return TypeError, "cu_seqlens"
        kw["cu_seqlens"] = cu
        return ValueError, "cu_seqlens"
    return None


def ref_forward(x, w, b, r, h0, cu, S, activation, D):
    """The reference, with D = 0 (no channels; F.conv1d refuses groups=0) done by hand."""
    if D == 0:
        N = x.shape[0] if cu is None else cu.shape[0] - 1
        return x.new_zeros(x.shape), x.new_zeros(N, 0, S)
    # contiguous: torch 1.13's conv1d cannot view some strided weights for an empty batch
    c = [t.contiguous() if t is not None else None for t in (x, w, b, r, h0)]
    return causal_conv1d_ref(*c, True, activation, cu, S)


def draw_seq_idx(d, B, T, rows, unique):
    """seq_idx [B, T]: runs of 1..4 tokens, padding runs, ids < rows (each once if unique)."""
    ids, nxt = [], 0
    for _ in range(B):
        row = []
        while len(row) < T:
            pad = d(st.booleans(), label="padding run") or rows == 0 or (unique and nxt >= rows)
            i = -d(st.integers(1, 2)) if pad else nxt if unique else d(st.integers(0, rows - 1))
            nxt += not pad and unique
            row += [i] * d(st.integers(1, 4), label="run length")
        ids.append(row[:T])
    return torch.tensor(ids, dtype=d(st.sampled_from([torch.int32, torch.int64])),
                        ).reshape(B, T)


def ref_seq_idx(x, w, b, r, h0, seq_idx, S, activation, D, rows):
    """The reference of sequence ids: each run alone (row i of the states = id i), padding 0."""
    y = x.new_zeros(x.shape)
    finals = x.new_zeros(rows, D, S) if h0 is None else h0.new_zeros(rows, D, S)
    if D == 0:
        return y, finals
    for bi, row in enumerate(seq_idx.tolist()):
        s = 0
        for t in range(1, len(row) + 1):
            if t < len(row) and row[t] == row[s]:
                continue
            i = row[s]
            if i >= 0:
                yr, hr = causal_conv1d_ref(x[bi:bi + 1, s:t].contiguous(), w.contiguous(),
                                           None if b is None else b.contiguous(),
                                           None if r is None else r[bi:bi + 1, s:t].contiguous(),
                                           None if h0 is None else h0[i:i + 1].contiguous(),
                                           True, activation, None, S)
                y = y.index_put((torch.tensor([bi]), torch.arange(s, t)), yr[0])
                finals = finals.index_put((torch.tensor([i]),), hr.to(finals.dtype))
            s = t
    return y, finals


@FUZZ
@given(st.data())
def test_fuzz_causal_conv1d(data):
    d = data.draw
    gen = torch.Generator().manual_seed(d(st.integers(0, 2**31 - 1), label="seed"))
    xdt = d(st.sampled_from(FLOATS), label="x dtype")
    wdt = d(st.sampled_from([xdt, xdt] + FLOATS), label="weight dtype")
    sdt = d(st.sampled_from([xdt, xdt] + FLOATS), label="state dtype")
    W, D = d(st.integers(1, 5), label="W"), d(st.integers(0, 5), label="D")
    packed = d(st.booleans(), label="packed")
    if packed:
        lengths = d(st.lists(st.integers(0, 6), max_size=4), label="lengths")
        N, total = len(lengths), sum(lengths)
        xshape = (1, total, D) if d(st.booleans(), label="[1, total, D]") else (total, D)
        cu = torch.tensor([sum(lengths[:i]) for i in range(N + 1)],
                          dtype=d(st.sampled_from([torch.int32, torch.int64])))
    else:
        B, T = d(st.integers(0, 3), label="B"), d(st.integers(0, 7), label="T")
        N, xshape, cu = B, (B, T, D), None
    ids = not packed and d(st.booleans(), label="seq_idx")
    if ids:  # states are pools by id: rows of their own
        N = d(st.integers(0, 4), label="id rows")
    S = d(st.sampled_from([W - 1, W, W + 2] if W > 1 else [W, W + 2]), label="S")
    mag = magnitude(d(st.sampled_from(["one", "one", "tiny", "huge"]), label="scale"),
                    xdt, wdt, sdt)
    act = d(st.sampled_from([None, "silu", "swish"]), label="activation")
    want_ht = d(st.booleans(), label="output_final_state")

    args = {"x": Arg(xshape, xdt, draw_layout(d), mag, gen),
            "weight": Arg((D, W), wdt, draw_layout(d, False), 1.0, gen)}
    if d(st.booleans(), label="bias"):
        args["bias"] = Arg((D,), wdt, draw_layout(d, False), 1.0, gen)
    if d(st.booleans(), label="residual"):
        args["residual"] = Arg(xshape, xdt, draw_layout(d), mag, gen)
    if d(st.booleans(), label="initial_state"):
        args["initial_state"] = Arg((N, D, S), sdt, draw_layout(d), mag, gen)
    S_arg = S if "initial_state" not in args or d(st.booleans(), label="state_len given") else None
    grad = d(st.booleans(), label="grad")
    if grad:
        for a in args.values():
            a.leaf.requires_grad_()
    kw = {k: a.value() for k, a in args.items()}
    kw.update(cu_seqlens=cu, state_len=S_arg, activation=act, output_final_state=want_ht)
    sid = None
    if ids:  # one run per id with final states or a state gradient (docs/semantics.md §3)
        unique = want_ht or (grad and "initial_state" in args)
        sid = kw["seq_idx"] = draw_seq_idx(d, B, T, N if "initial_state" in args else 5, unique)
        event("seq_idx")
        if "initial_state" not in args:  # final_state rows: max id + 1
            N = int(sid.max()) + 1 if sid.numel() and int(sid.max()) >= 0 else 0

    defect = d(st.sampled_from([None] * len(FWD_DEFECTS) + FWD_DEFECTS), label="defect")
    expected = apply_fwd_defect(defect, kw, W, packed) if defect else None
    event("defect" if expected is not None else "grad" if grad else "forward")
    if expected is not None:
        expect_error(lambda: shortconv.causal_conv1d(**kw), *expected, values=kw)
        return

    before = snapshot(kw)
    y, ht = shortconv.causal_conv1d(**kw)
    assert_unchanged(kw, before)
    assert (ht is not None) == want_ht
    ref_in = {k: a.reference() for k, a in args.items()}
    if sid is not None:
        yr, htr = ref_seq_idx(ref_in["x"], ref_in["weight"], ref_in.get("bias"),
                              ref_in.get("residual"), ref_in.get("initial_state"), sid, S, act,
                              D, N)
    else:
        yr, htr = ref_forward(ref_in["x"], ref_in["weight"], ref_in.get("bias"),
                              ref_in.get("residual"), ref_in.get("initial_state"), cu, S, act, D)
    check_close(y, yr, xdt, "y", xdt)
    if want_ht:  # a copy of h0 ++ x entries, rounded once to the state dtype
        assert ht.shape == (N, D, S) and ht.dtype == (sdt if "initial_state" in args else xdt)
        assert torch.equal(ht, htr.detach().to(ht.dtype)), "final_state"
    if not grad:
        return
    gy = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(xdt)
    outs, gouts, routs = [y], [gy], [yr]
    if want_ht:
        outs.append(ht)
        gouts.append(torch.randn(ht.shape, generator=gen, dtype=torch.float64).to(ht.dtype))
        routs.append(htr)
    names = list(args)
    grads = torch.autograd.grad(outs, [args[k].leaf for k in names], gouts, allow_unused=True)
    ref_loss = sum((o * g.double()).sum() for o, g in zip(routs, gouts))
    ref_grads = [None] * len(names)
    if ref_loss.requires_grad:  # not when D = 0
        ref_grads = torch.autograd.grad(ref_loss, [args[k].ref_leaf for k in names],
                                        allow_unused=True)
    for k, g, gr in zip(names, grads, ref_grads):
        leaf = args[k].leaf
        g = torch.zeros_like(leaf) if g is None else g
        gr = torch.zeros(leaf.shape, dtype=torch.float64) if gr is None else gr
        check_close(g, gr, leaf.dtype, "d" + k, xdt)


# ---- causal_conv1d_update -------------------------------------------------------------
UPD_DEFECTS = [
    "x:list", "cache:list", "weight:numpy", "cache_indices:list", "cu_seqlens:tuple",
    "cache_indices:range", "cache_indices:twice", "cache_indices:dtype", "cache:expand",
    "cache:neg", "cache:dtype_int", "weight:shape", "activation:gelu", "residual:shape",
]


@FUZZ
@given(st.data())
def test_fuzz_causal_conv1d_update(data):
    d = data.draw
    gen = torch.Generator().manual_seed(d(st.integers(0, 2**31 - 1), label="seed"))
    xdt = d(st.sampled_from(FLOATS), label="x dtype")
    wdt = d(st.sampled_from([xdt, xdt] + FLOATS), label="weight dtype")
    sdt = d(st.sampled_from([xdt, xdt] + FLOATS), label="cache dtype")
    W, D = d(st.integers(1, 5), label="W"), d(st.integers(0, 5), label="D")
    S = d(st.sampled_from([W - 1, W, W + 2] if W > 1 else [W, W + 2]), label="S")
    N = d(st.integers(0, 4), label="N")
    form = d(st.sampled_from(["[N, D]", "[N, T, D]", "packed"]), label="x form")
    if form == "[N, D]":
        xshape, lengths = (N, D), [1] * N
    elif form == "[N, T, D]":
        T = d(st.integers(0, 3), label="T")
        xshape, lengths = (N, T, D), [T] * N
    else:
        lengths = d(st.lists(st.integers(0, 3), min_size=N, max_size=N), label="lengths")
        xshape = (1, sum(lengths), D)
    cu = None
    if form == "packed":
        cu = torch.tensor([sum(lengths[:i]) for i in range(N + 1)], dtype=torch.int64)
    pool = d(st.booleans(), label="pool")
    P = N + d(st.integers(0, 2), label="extra rows") if pool else N
    idx = None
    if pool:
        rows = torch.randperm(P, generator=gen)[:N]
        pad = torch.rand(N, generator=gen) < 0.25
        idx = torch.where(pad, torch.full_like(rows, -1), rows)
        idx = idx.to(d(st.sampled_from([torch.int32, torch.int64])))
    mag = magnitude(d(st.sampled_from(["one", "one", "tiny", "huge"]), label="scale"),
                    xdt, wdt, sdt)
    act = d(st.sampled_from([None, "silu"]), label="activation")

    x = Arg(xshape, xdt, draw_layout(d), mag, gen).value()
    w = Arg((D, W), wdt, draw_layout(d, False), 1.0, gen).value()
    b = Arg((D,), wdt, "contig", 1.0, gen).value() if d(st.booleans(), label="bias") else None
    r = Arg(xshape, xdt, draw_layout(d), mag, gen).value() if d(st.booleans()) else None
    cache = Arg((P, D, S), sdt, d(st.sampled_from(["contig", "transpose", "slice"])), mag,
                gen).value()
    kw = dict(x=x, cache=cache, residual=r, weight=w, bias=b, activation=act,
              cache_indices=idx, cu_seqlens=cu)

    defect = d(st.sampled_from([None] * len(UPD_DEFECTS) + UPD_DEFECTS), label="defect")
    expected = apply_update_defect(defect, kw, P) if defect else None
    event("defect" if expected is not None else "valid")
    if expected is not None:
        expect_error(lambda: shortconv.causal_conv1d_update(**kw), *expected, values=kw)
        return

    start = cache.clone()
    inputs = snapshot({k: v for k, v in kw.items() if k != "cache"})
    y, out = shortconv.causal_conv1d_update(**kw)
    assert out is cache and y.shape == x.shape and y.dtype == xdt
    assert_unchanged({k: v for k, v in kw.items() if k != "cache"}, inputs)
    if D == 0:
        return
    # the reference, one sequence at a time
    xs = x.reshape(-1, D).double()
    rs = r.reshape(-1, D).double() if r is not None else None
    expect_cache = start.clone()
    ys, t0 = [], 0
    for n, L in enumerate(lengths):
        row = int(idx[n]) if idx is not None else n
        h0 = start[row:row + 1].double() if row >= 0 else torch.zeros(1, D, S, dtype=torch.float64)
        xn = xs[t0:t0 + L].unsqueeze(0)
        rn = rs[t0:t0 + L].unsqueeze(0) if rs is not None else None
        yn, htn = ref_forward(xn, w.double(), b.double() if b is not None else None, rn, h0,
                              None, S, act, D)
        ys.append(yn[0])
        if row >= 0:
            expect_cache[row] = htn[0].to(sdt)
        t0 += L
    yr = torch.cat(ys, 0) if ys else xs.new_zeros(0, D)
    check_close(y.reshape(-1, D), yr, xdt, "y", xdt)
    assert torch.equal(cache, expect_cache), "cache"


def apply_update_defect(defect, kw, P):
    shared = apply_shared_defect(defect, kw)
    if shared is not _NOT_SHARED:
        return shared
    arg, kind = defect.split(":")
    idx = kw["cache_indices"]
    if arg == "cache_indices":
        if idx is None or idx.numel() == 0:
            return None
        if kind == "range":
            idx = idx.clone()
            idx[0] = P
        elif kind == "twice":
            if idx.numel() < 2 or kw["cache"].numel() == 0:
                return None
            idx = idx.clone()
            idx[0], idx[1] = 0, 0
        else:
            kw["cache_indices"] = idx.float()
            return TypeError, "cache_indices"
        kw["cache_indices"] = idx
        return ValueError, "cache_indices"
    cache = kw["cache"]
    if defect == "cache:expand":
        if cache.shape[0] < 2 or cache[0].numel() == 0:
            return None
        kw["cache"] = cache[:1].expand(cache.shape)
        return ValueError, "cache"
    if defect == "cache:neg":
        kw["cache"] = cache._neg_view()
        return TypeError, "cache"
    if defect == "cache:dtype_int":
        kw["cache"] = torch.zeros(cache.shape, dtype=torch.int64)
        return TypeError, "cache"
    if defect == "weight:shape":
        w, x = kw["weight"], kw["x"]
        if x.dim() == 3 and x.shape[1] * x.shape[2] == w.shape[0] + 1:
            return None  # x would be read as [N, H, Dh] heads of D+1 channels
        kw["weight"] = torch.zeros((w.shape[0] + 1, w.shape[1]), dtype=w.dtype)
        return ValueError, "weight"
    if defect == "activation:gelu":
        kw["activation"] = "gelu"
        return ValueError, "activation"
    if defect == "residual:shape":
        x = kw["x"]
        kw["residual"] = torch.zeros(x.shape[:-1] + (x.shape[-1] + 1,), dtype=x.dtype)
        return ValueError, "residual"
    return None


# ---- causal_conv1d_update: serving steps (speculative decoding, tree drafts) ------------
SERVING_DEFECTS = [
    "num_accepted:zero", "num_accepted:past_row", "num_accepted:float", "num_accepted:shape",
    "num_accepted:list", "parent_tokens:forward", "parent_tokens:negative",
    "parent_tokens:short", "parent_tokens:rank1", "cache:short_rows",
    "final_block:absent", "first_block:absent", "final_block:past", "block_table:twice",
    "computed_tokens:negative", "block_size:negative",
]


def serving_reference(x, cache, w, b, act, idx, lengths, acc, parents, D, W, S, apc=None):
    """docs/semantics.md section 5 in float64, one sequence at a time: (y [tokens, D], cache).
    apc: (table, initial_block, final_block, first_block, computed, block_size) or None."""
    start, out = cache.double(), cache.clone()
    xs = x.reshape(-1, D).double()
    ys, t0 = [], 0
    for n, L in enumerate(lengths):
        row = int(idx[n]) if idx is not None else n
        if apc is not None:
            table, ib, fb = apc[0], apc[1], apc[2]
            row, wrow = int(table[n, int(ib[n])]), int(table[n, int(fb[n])])
        if acc is not None:  # the window of W-1 entries from acc - 1; s = W-1
            s = W - 1
            a = int(acc[n])
            h = start[row, :, a - 1:a - 1 + s] if row >= 0 else torch.zeros(D, s, dtype=torch.float64)
        else:
            s = S
            h = start[row] if row >= 0 else torch.zeros(D, S, dtype=torch.float64)
        u = torch.cat([h, xs[t0:t0 + L].t()], 1)
        for t in range(L):
            q, pos = [0] * W, s + t
            for k in range(W - 1, -1, -1):
                q[k] = pos
                if pos - s >= 1:
                    pos = s + (int(parents[n, pos - s]) if parents is not None else pos - s - 1)
                else:
                    pos -= 1
            v = (u[:, q] * w.double()).sum(1) + (b.double() if b is not None else 0)
            ys.append(v * torch.sigmoid(v) if act == "silu" else v)
        wrow = wrow if apc is not None else row
        if wrow >= 0:
            if acc is None:
                out[wrow] = u[:, L:L + S].to(out.dtype)
            elif L > 0:
                E = W - 2 + L
                out[wrow, :, :E] = u[:, 1:1 + E].to(out.dtype)
        if apc is not None and apc[5]:  # snapshots at the block boundaries inside the chunk
            first, c, B = int(apc[3][n]), int(apc[4][n]), apc[5]
            for k, p in enumerate(range((c // B + 1) * B, c + L, B)):
                r = int(apc[0][n, first + k])
                if r >= 0:
                    out[r] = u[:, p - c:p - c + S].to(out.dtype)
        t0 += L
    return (torch.stack(ys) if ys else xs.new_zeros(0, D)), out


@FUZZ
@given(st.data())
def test_fuzz_serving_steps(data):
    """causal_conv1d_update(num_accepted=, parent_tokens=): a clean error naming the argument
    with the pool unchanged, or the section-5 reference (rows: copies, exact)."""
    d = data.draw
    gen = torch.Generator().manual_seed(d(st.integers(0, 2**31 - 1), label="seed"))
    xdt = d(st.sampled_from(FLOATS), label="x dtype")
    W, D = d(st.integers(1, 5), label="W"), d(st.integers(1, 5), label="D")
    N = d(st.integers(1, 4), label="N")
    packed = d(st.booleans(), label="packed")
    if packed:
        lengths = d(st.lists(st.integers(0, 4), min_size=N, max_size=N), label="lengths")
        xshape = (1, sum(lengths), D)
    else:
        T = d(st.integers(1, 4), label="T")
        lengths, xshape = [T] * N, (N, T, D)
    spec, tree, table, prefix = d(st.sampled_from([
        (True, False, False, False), (False, True, False, False), (True, True, False, False),
        (True, False, True, False), (False, False, True, False), (False, False, True, True)]),
        label="kind")
    longest = max(lengths)
    S = max(W - 1, W - 2 + longest) + d(st.integers(0, 2), label="extra entries") if spec else \
        d(st.sampled_from([W - 1, W]), label="S")
    P = N + d(st.integers(0, 2), label="extra rows")
    rows = torch.randperm(P, generator=gen)[:N]
    idx = torch.where(torch.rand(N, generator=gen) < 0.25, torch.full_like(rows, -1), rows).int()
    acc = None
    if spec:
        hi = S - (W - 1) + 1
        acc = torch.randint(1, hi + 1, (N,), generator=gen, dtype=torch.int32)
        acc = torch.where(idx < 0, torch.full_like(acc, -9), acc)  # rows nobody reads: any count
    parents = None
    if tree:
        M = longest + d(st.integers(0, 1), label="extra parents")
        shape = d(st.sampled_from(["chain", "star", "random"]), label="tree")
        parents = torch.full((N, M), -1, dtype=torch.int64)
        for t in range(1, M):
            parents[:, t] = (t - 1 if shape == "chain" else 0 if shape == "star"
                             else torch.randint(0, t, (N,), generator=gen))
    apc = None
    if table:  # rows of each sequence's blocks, vLLM's block indices (distinct rows written)
        Bk = d(st.integers(1, 3), label="block size")
        comp = [d(st.integers(0, 2 * Bk), label="computed") for _ in range(N)]
        M = max((c + L) // Bk + 2 for c, L in zip(comp, lengths))
        P = N * M + 1
        tbl = torch.randperm(P, generator=gen)[:N * M].view(N, M)
        tbl = torch.where(torch.rand(N, M, generator=gen) < 0.1, torch.full_like(tbl, -1), tbl)
        c_ = torch.tensor(comp)
        L_ = torch.tensor(lengths)
        first = c_ // Bk
        last = torch.where(L_ > 0, (c_ + L_ - 1) // Bk, first)
        init = torch.clamp((c_ + Bk - 1) // Bk - 1, min=0)
        apc = [tbl, init, last, first, c_, Bk if prefix else 0]
        idx = None
        if acc is not None:  # the counts of sequences whose rows are read
            acc = torch.where(tbl[torch.arange(N), init] < 0, torch.full_like(acc, -9),
                              torch.randint(1, S - (W - 1) + 2, (N,), generator=gen,
                                            dtype=torch.int32))
    cu = None
    if packed:
        cu = torch.tensor([sum(lengths[:i]) for i in range(N + 1)], dtype=torch.int64)
    x = Arg(xshape, xdt, draw_layout(d, False), 1.0, gen).value()
    w = Arg((D, W), xdt, "contig", 1.0, gen).value()
    b = Arg((D,), xdt, "contig", 1.0, gen).value() if d(st.booleans(), label="bias") else None
    cache = Arg((P, D, S), xdt, d(st.sampled_from(["contig", "transpose"])), 1.0, gen).value()
    act = d(st.sampled_from([None, "silu"]), label="activation")
    kw = dict(x=x, cache=cache, weight=w, bias=b, activation=act, cache_indices=idx,
              cu_seqlens=cu, num_accepted=acc, parent_tokens=parents)
    if apc is not None:
        kw.update(block_table=apc[0], initial_block=apc[1], final_block=apc[2])
        if apc[5]:
            kw.update(first_block=apc[3], computed_tokens=apc[4], block_size=apc[5])

    defect = d(st.sampled_from([None] * len(SERVING_DEFECTS) + SERVING_DEFECTS), label="defect")
    expected = apply_serving_defect(defect, kw, lengths, W) if defect else None
    event("defect" if expected is not None else "valid")
    if expected is not None:
        expect_error(lambda: shortconv.causal_conv1d_update(**kw), *expected, values=kw)
        return
    start = cache.clone()
    y, out = shortconv.causal_conv1d_update(**kw)
    assert out is cache and y.shape == x.shape
    yr, expect_cache = serving_reference(x, start, w, b, act, idx, lengths, acc, parents, D, W, S,
                                         apc)
    check_close(y.reshape(-1, D), yr, xdt, "y", xdt)
    assert torch.equal(cache, expect_cache), "cache"


def apply_table_defect(arg, kind, kw, lengths):
    """Block-table and prefix-caching defects (None: not applicable to this draw)."""
    if "block_table" not in kw:
        return None
    if kind == "absent":
        if arg == "first_block" and "first_block" not in kw:
            return None
        del kw[arg]
        return ValueError, arg
    if arg == "final_block":  # past the table
        fb = kw["final_block"].clone()
        fb[0] = kw["block_table"].shape[1]
        kw["final_block"] = fb
        return ValueError, "final_block[0]"
    if arg == "block_table":  # two sequences' final rows the same
        t, fb = kw["block_table"].clone(), kw["final_block"]
        if t.shape[0] < 2 or kw["cache"][0].numel() == 0:
            return None
        t[1, int(fb[1])] = t[0, int(fb[0])] = 0
        kw["block_table"] = t
        return ValueError, "block_table"
    if "first_block" not in kw:
        return None
    if arg == "computed_tokens":
        c = kw["computed_tokens"].clone()
        c[0] = -1
        kw["computed_tokens"] = c
        return ValueError, "computed_tokens[0]"
    kw["block_size"] = -1  # block_size:negative
    return ValueError, "block_size"


def apply_serving_defect(defect, kw, lengths, W):
    arg, kind = defect.split(":")
    if arg in ("final_block", "first_block", "block_table", "computed_tokens", "block_size"):
        return apply_table_defect(arg, kind, kw, lengths)
    acc, parents, idx = kw["num_accepted"], kw["parent_tokens"], kw["cache_indices"]
    if idx is None:
        return None  # (the count and parent defects are drawn on index addressing)
    reader = next((n for n in range(idx.numel()) if int(idx[n]) >= 0), None)
    if arg == "num_accepted":
        if acc is None:
            return None
        if kind == "float":
            kw["num_accepted"] = acc.float()
            return TypeError, "num_accepted"
        if kind == "list":
            kw["num_accepted"] = acc.tolist()
            return TypeError, "num_accepted"
        if kind == "shape":
            kw["num_accepted"] = torch.cat([acc, acc[:1]])
            return ValueError, "num_accepted"
        if reader is None:
            return None  # no count is read
        acc = acc.clone()
        acc[reader] = 0 if kind == "zero" else kw["cache"].shape[2] - (W - 1) + 2
        kw["num_accepted"] = acc
        return ValueError, "num_accepted[%d]" % reader
    if arg == "parent_tokens":
        if parents is None:
            return None
        if kind == "rank1":
            kw["parent_tokens"] = parents.reshape(-1)
            return ValueError, "parent_tokens"
        if kind == "short":
            if max(lengths) == 0:
                return None
            kw["parent_tokens"] = parents[:, :max(lengths) - 1]
            return ValueError, "parent_tokens"
        n = next((k for k, L in enumerate(lengths) if L >= 2), None)
        if n is None:
            return None
        parents = parents.clone()
        parents[n, 1] = 1 if kind == "forward" else -1
        kw["parent_tokens"] = parents
        return ValueError, "parent_tokens[%d, 1]" % n
    if defect == "cache:short_rows":
        if acc is None or max(lengths) == 0:
            return None
        S_short = W - 3 + max(lengths)  # one entry too few for the longest sequence
        if S_short < max(W - 1, 0):
            return None
        kw["cache"] = kw["cache"][:, :, :S_short]
        kw["num_accepted"] = torch.ones_like(acc)
        return ValueError, "num_accepted"
    return None
