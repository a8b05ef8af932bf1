"""The one-pass paths (shortconv/_fast.py) against the general path they stand in for.

For each case the call runs twice: as it is (the one-pass path where it applies) and with
the one-pass functions disabled (every call through _ops' Call).  Both must hand the
library the same sc_conv_args bytes (but for the data pointers of the outputs each run
allocates and the workspace pointer), give bitwise the same results, and raise the same
errors with nothing written; a spy checks that the cases meant for the one-pass path take
it and the others do not.  Every test runs twice: the one-pass path in Python, and in C++
(the native module, shortconv/native.py; skipped where it is not built), whose library
calls are seen through entry points handed to it that record and forward.
"""
import contextlib
import ctypes
import struct
import warnings

import pytest
import torch

import shortconv
from helpers import HAS_CUDA, entry_points_wrapped, make_problem
from shortconv import _fast, _lib, native

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
_OUTPUTS = ("y", "dx", "dweight", "dbias", "dinitial_state")  # allocated afresh by each run
_WORKSPACE = _lib._EXEC_OFF + _lib._Exec.workspace.offset


def _masked(raw, fields=_OUTPUTS):
    b = bytearray(raw)
    for field in fields:
        b[_lib.OFF[field]:_lib.OFF[field] + 8] = bytes(8)
    b[_WORKSPACE:_WORKSPACE + 8] = bytes(8)
    return bytes(b)


def _without_x_pointer(calls):
    """calls with x's data pointer masked too (a resolved copy: new memory each run)."""
    return [(d, _masked(raw, ("x",))) for d, raw in calls]


@pytest.fixture(autouse=True, params=["python", "native"])
def one_pass(request, monkeypatch):
    """Which one-pass path the test runs: _fast's Python, or the native module's C++."""
    if request.param == "native":
        if native.module is None:
            pytest.skip(native.status())
        monkeypatch.setattr(_fast, "_native", native.module)
    else:
        monkeypatch.setattr(_fast, "_native", None)
    return request.param


@contextlib.contextmanager
def raw_calls():
    """The sc_conv_args bytes of every sc_forward / sc_backward call: [(direction, bytes)],
    those of the Python paths and of the native module (helpers.entry_points_wrapped)."""
    calls = []

    def wrap(direction, fn):
        def run(args, err):
            calls.append((direction, _masked(ctypes.string_at(args, _lib.ARGS_SIZE))))
            return fn(args, err)
        return run

    with entry_points_wrapped(wrap):
        yield calls


@contextlib.contextmanager
def general_only(monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(_fast, "update_fast", lambda *a, **k: None)
        m.setattr(_fast, "plain_call", lambda *a: None)
        yield


@contextlib.contextmanager
def spy(monkeypatch):
    """[True / False per one-pass attempt: taken or declined]."""
    taken = []
    with monkeypatch.context() as m:
        for name in ("update_fast", "plain_call"):
            def wrapped(*a, _f=getattr(_fast, name)):
                out = _f(*a)
                taken.append(out is not None)
                return out
            m.setattr(_fast, name, wrapped)
        yield taken


# ---- decode steps --------------------------------------------------------------------
def _decode_case(name, device, dtype=torch.float32):
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    N, D, W, P = 5, 6, 4, 9

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).to(device)

    rows = torch.tensor([3, -1, 0, 8, 5], dtype=torch.int32, device=device)
    kw = dict(weight=rnd(D, W), bias=rnd(D), activation="silu", cache_indices=rows)
    x, cache = rnd(N, D), rnd(P, D, W - 1)
    if name == "vllm rows":  # a channel-contiguous pool
        cache = rnd(P, W - 1, D).transpose(1, 2)
    elif name == "speculative":  # 1 + 3 drafts, accepted counts 1..4
        x, cache = rnd(N, 4, D), rnd(P, W - 2 + 4, D).transpose(1, 2)
        kw["num_accepted"] = torch.tensor([1, 2, 3, 4, 1], dtype=torch.int32, device=device)
    elif name == "x a slice":
        x = rnd(N, 3 * D)[:, D:2 * D]
    elif name == "no indices, no bias, S = W":
        cache = rnd(N, D, W)
        del kw["cache_indices"], kw["bias"]
    elif name == "int64 indices, parameters, no activation":
        kw["cache_indices"] = rows.long()
        kw["weight"] = torch.nn.Parameter(kw["weight"])
        kw["bias"] = torch.nn.Parameter(kw["bias"])
        kw["activation"] = None
    elif name == "T tokens, swish":
        x, kw["activation"] = rnd(N, 3, D), "swish"
    elif name == "fp16":
        x, cache = x.half(), cache.half()
        kw["weight"], kw["bias"] = kw["weight"].half(), kw["bias"].half()
    elif name == "overlap reads":
        kw["overlap"] = "reads"
    elif name == "overlap launch, speculative":
        x, cache = rnd(N, 4, D), rnd(P, W - 2 + 4, D).transpose(1, 2)
        kw["num_accepted"] = torch.tensor([1, 2, 3, 4, 1], dtype=torch.int32, device=device)
        kw["overlap"] = "launch"
    # not for the one-pass path (functional.py's views, serving arguments):
    elif name == "FLA [1, N, D]":
        x, cache = rnd(1, N, D), rnd(N, D, W)
        del kw["cache_indices"]
    elif name == "heads [N, H, Dh]":
        x = rnd(N, 2, D // 2)
    elif name == "has_initial_state":
        kw["has_initial_state"] = torch.tensor([True, False, True, True, False], device=device)
    elif name == "lazily negated x":
        x = torch._neg_view(x)
    return x, cache, kw


ONE_PASS = ["pool rows", "vllm rows", "speculative", "x a slice", "no indices, no bias, S = W",
            "int64 indices, parameters, no activation", "T tokens, swish", "fp16",
            "overlap reads", "overlap launch, speculative"]
GENERAL = ["FLA [1, N, D]", "heads [N, H, Dh]", "has_initial_state", "lazily negated x"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ONE_PASS + GENERAL)
def test_decode_step_matches_the_general_path(name, device, monkeypatch):
    x, cache, kw = _decode_case(name, device)
    c = cache.clone()  # one memory for both runs: the same pointers in both descriptions
    runs = []
    for general in (False, True):
        c.copy_(cache)
        with raw_calls() as calls, spy(monkeypatch) as taken, \
                (general_only(monkeypatch) if general else contextlib.nullcontext()):
            y, out = shortconv.causal_conv1d_update(x, c, **kw)
        assert out is c
        runs.append((y, c.clone(), calls, taken))
    (y1, c1, calls1, taken1), (y2, c2, calls2, _) = runs
    assert taken1 == [True] if name in ONE_PASS else True not in taken1
    assert torch.equal(y1, y2) and y1.stride() == y2.stride() and torch.equal(c1, c2)
    assert not torch.equal(c1, cache)  # the step wrote its rows
    if name == "lazily negated x":
        calls1, calls2 = _without_x_pointer(calls1), _without_x_pointer(calls2)
    assert len(calls1) == len(calls2) == 1 and calls1 == calls2


def test_decode_step_bumps_the_cache_version_and_takes_inference_tensors():
    x, cache, kw = _decode_case("pool rows", "cpu")
    c = cache.clone()
    v = c._version
    y, _ = shortconv.causal_conv1d_update(x, c, **kw)
    assert c._version > v
    with torch.inference_mode():
        xi, ci = x.clone(), cache.clone()
    yi, _ = shortconv.causal_conv1d_update(xi, ci, **kw)  # outside inference mode
    assert torch.equal(yi, y) and torch.equal(ci, c)


def _decode_errors(device):
    """Calls the one-pass path starts and must leave to the general one, which raises."""
    x, cache, kw = _decode_case("pool rows", device)
    bad = []
    for what, change in (
            ("weight on meta", dict(weight=kw["weight"].to("meta"))),
            ("int weight", dict(weight=kw["weight"].int())),
            ("bias of another D", dict(bias=kw["bias"][:3])),
            # (contents: host backends only; the CUDA kernels clamp device indices, semantics §7)
            ("row out of range", dict(cache_indices=torch.tensor([3, -1, 0, 9, 5],
                                                                 dtype=torch.int32, device=device))
             if device == "cpu" else None),
            ("float indices", dict(cache_indices=kw["cache_indices"].float())),
            ("unknown activation", dict(activation="gelu")),
            ("a list for x", dict(x=x.tolist())),
            ("0-dim x", dict(x=x[0, 0])),
            ("lazily negated cache", dict(cache=torch._neg_view(cache))),
            ("nested x", None)):
        args = dict(kw, x=x, cache=cache)
        if change is None and what == "row out of range":
            continue
        if change is None:
            with warnings.catch_warnings():  # (nested tensors' prototype warning, once)
                warnings.simplefilter("ignore")
                args["x"] = torch.nested.nested_tensor([x[0], x[1]])
        else:
            args.update(change)
        bad.append((what, args))
    return bad


@pytest.mark.parametrize("device", DEVICES)
def test_decode_errors_are_the_general_paths(device, monkeypatch):
    for what, args in _decode_errors(device):
        got = []
        for general in (False, True):
            cache = args["cache"]
            before = cache.clone() if not cache.is_neg() else None
            with (general_only(monkeypatch) if general else contextlib.nullcontext()):
                with pytest.raises(Exception) as e:
                    shortconv.causal_conv1d_update(args["x"], cache, **{
                        k: v for k, v in args.items() if k not in ("x", "cache")})
            if before is not None:
                assert torch.equal(cache, before), "%s: the cache was written" % what
            got.append((type(e.value), str(e.value)))
        assert got[0] == got[1], what
        assert "causal_conv1d_update" in got[0][1], (what, got[0])


# ---- the peers' decode steps (vllm / dao causal_conv1d_update) and the module's --------
class _NativeSpy:
    """The native module with its wrapper steps recorded: [(name, taken)]."""

    def __init__(self, mod):
        self._mod, self.taken = mod, []

    def __getattr__(self, name):
        fn = getattr(self._mod, name)
        if name not in ("update_vllm", "update_dao", "update_module"):
            return fn

        def run(*a):
            out = fn(*a)
            self.taken.append((name, out is not None))
            return out
        return run


def _peer_case(name, device):
    """(function, args, kwargs, the pool) of a vllm / dao decode step."""
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    N, D, W, P = 5, 6, 4, 9

    def rnd(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).to(device)

    rows = torch.tensor([3, -1, 0, 8, 5], dtype=torch.int32, device=device)
    w, b = rnd(D, W), rnd(D)
    vpool = rnd(P, W - 1, D).transpose(1, 2)  # vLLM's rows: the feature dim contiguous
    fn, args, kw = shortconv.vllm.causal_conv1d_update, [rnd(N, D), vpool, w, b, True, rows], {}
    if name == "vllm speculative":  # x [N, D, 1 + 3], rows of W-1+3 entries
        args[:2] = rnd(N, D, 4), rnd(P, W - 1 + 3, D).transpose(1, 2)
        kw["num_accepted_tokens"] = torch.tensor([1, 2, 3, 4, 1], dtype=torch.int32,
                                                 device=device)
    elif name == "vllm rows longer than W-1":  # the state is the first W-1 entries
        args[1] = rnd(P, W + 2, D).transpose(1, 2)
    elif name == "vllm no indices, no bias, no activation":
        args[3:6] = None, None, None
    elif name == "vllm overlap reads":  # (shortconv's keyword: exec.overlap)
        kw["overlap"] = "reads"
    elif name == "vllm x [N, D, T] a slice, fp16":  # token-major underneath, as vLLM's
        x = rnd(N, 2, 3 * D, dtype=torch.float16)[:, :, D:2 * D].transpose(1, 2)
        args[:4] = x, vpool.half(), w.half(), b.half()
        args[4] = "silu"
    elif name == "vllm x of another dtype":  # (vLLM casts to the state's dtype)
        args[0] = args[0].double()
    elif name == "vllm query_start_loc":
        args[0] = rnd(N, D)
        kw["query_start_loc"] = torch.arange(N + 1, dtype=torch.int32, device=device)
    elif name.startswith("module"):  # ShortConvolution.forward of one token per sequence
        conv = shortconv.ShortConvolution(D, W, bias="no bias" not in name,
                                          activation="silu").to(device)
        grad = "with grad" in name

        def fn(x, cache):
            with torch.set_grad_enabled(grad):
                y, out = conv(x, cache=cache, output_final_state=True)
            assert out is cache
            return y.detach()
        args = [rnd(N, 1, D), rnd(N, D, W)]
    elif name.startswith("dao"):
        pool = rnd(P, D, W - 1)
        fn, args = shortconv.dao.causal_conv1d_update, [rnd(N, D), pool, w, b, "silu", None, rows]
        if name == "dao x [N, D, T]":
            args[0], args[1] = rnd(N, D, 3), rnd(P, D, W + 1)
        elif name == "dao no indices":
            args[1], args[6] = rnd(N, D, W - 1), None
        elif name == "dao overlap launch":  # (shortconv's keyword: exec.overlap)
            kw["overlap"] = "launch"
        elif name == "dao cache_seqlens":
            args[1], args[6] = rnd(N, D, W - 1), None
            args[5] = torch.tensor([0, 1, 2, 0, 5], dtype=torch.int32, device=device)
    return fn, args, kw


PEER_ONE_PASS = ["vllm pool rows", "vllm speculative", "vllm rows longer than W-1",
                 "vllm no indices, no bias, no activation", "vllm x [N, D, T] a slice, fp16",
                 "vllm overlap reads",
                 "dao pool rows", "dao x [N, D, T]", "dao no indices", "dao overlap launch",
                 "module step",
                 "module step, no bias"]
PEER_GENERAL = ["vllm x of another dtype", "vllm query_start_loc", "dao cache_seqlens",
                "module step with grad"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", PEER_ONE_PASS + PEER_GENERAL)
def test_peer_decode_steps_match_their_python(name, device, monkeypatch, one_pass):
    """The native module's vllm / dao steps against the wrappers' own Python (views, then
    functional.causal_conv1d_update's general path): the same bytes, outputs and rows."""
    fn, args, kw = _peer_case(name, device)
    pool = args[1]
    original = pool.clone()
    runs = []
    fast_taken = []  # (the Python one pass: update_fast's answers, None = not its case)
    update_fast = _fast.update_fast

    def spy_fast(*a, **k):
        y = update_fast(*a, **k)
        fast_taken.append(y is not None)
        return y
    for general in (False, True):
        pool.copy_(original)
        spy_mod = _NativeSpy(native.module) if one_pass == "native" and not general else None
        with raw_calls() as calls, monkeypatch.context() as m:
            m.setattr(_fast, "_native", spy_mod)
            m.setattr(_fast, "update_fast", (lambda *a, **k: None) if general else spy_fast)
            y = fn(*args, **kw)
        runs.append((y, pool.clone(), calls, spy_mod and spy_mod.taken))
    (y1, p1, c1, taken), (y2, p2, c2, _) = runs
    if one_pass == "native":
        assert [t for _, t in taken] == ([True] if name in PEER_ONE_PASS else
                                         [False] * len(taken)), taken
    elif name in PEER_ONE_PASS:  # (and some of PEER_GENERAL after a view or a cast)
        assert any(fast_taken), fast_taken
    assert torch.equal(y1, y2) and y1.stride() == y2.stride() and y1.dtype == y2.dtype
    assert torch.equal(p1, p2) and not torch.equal(p1, original)
    if name == "vllm x of another dtype":  # (the cast is a copy: new memory each run)
        c1, c2 = _without_x_pointer(c1), _without_x_pointer(c2)
    assert len(c1) == len(c2) == 1
    # (with grad, both runs are the differentiable forward, of a copy of the cache into a
    # new state: new memory each run)
    assert c1 == c2 or name == "module step with grad"


@pytest.mark.parametrize("device", DEVICES)
def test_peer_decode_step_errors_match_their_python(device, monkeypatch, one_pass):
    """A library error through the native step reads as through the Python one (the peers'
    argument names, their exception types), with nothing written."""
    cases = []
    for name in ("vllm pool rows", "dao pool rows", "vllm speculative"):
        fn, args, kw = _peer_case(name, device)
        if device != "cpu":  # (contents: checked on host backends; the kernels clamp, §7)
            continue
        if name == "vllm speculative":  # an accepted count beyond the step's tokens
            kw["num_accepted_tokens"] = kw["num_accepted_tokens"] + 4
        else:  # a row out of the pool
            args[-1] = args[-1].clone().fill_(9)
        cases.append((name, fn, args, kw))
    for name, fn, args, kw in cases:
        pool = args[1]
        before = pool.clone()
        got = []
        for general in (False, True):
            with monkeypatch.context() as m:
                if general:
                    m.setattr(_fast, "_native", None)
                    m.setattr(_fast, "update_fast", lambda *a, **k: None)
                with pytest.raises(Exception) as e:
                    fn(*args, **kw)
            assert torch.equal(pool, before), "%s: the pool was written" % name
            got.append((type(e.value), str(e.value)))
        assert got[0] == got[1], name
        assert name.split()[0] in got[0][1], got[0]


# ---- forward and backward without states ---------------------------------------------
def _plain_case(name, device, dtype=torch.float64):
    """(x, weight, bias, keyword arguments, whether x is passed as a lazily negated view)."""
    p = make_problem(B=2, T=7, D=5, W=4, h0=False, dtype=dtype, device=device,
                     seed=sum(map(ord, name)))
    x, w, b = p["x"], p["weight"], p["bias"]
    kw = dict(activation="silu")
    if name == "channel-major":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    elif name == "packed, int64 offsets, no bias":
        q = make_problem(lengths=[3, 0, 6], D=5, W=4, h0=False, bias=False, dtype=dtype,
                         device=device, seed=4)
        x, b, kw["cu_seqlens"] = q["x"], None, q["cu_seqlens"].long()
    elif name == "packed [total, D]":
        q = make_problem(lengths=[4, 5], D=5, W=4, h0=False, dtype=dtype, device=device, seed=5)
        x, kw["cu_seqlens"] = q["x"][0], q["cu_seqlens"]
    elif name == "state_len W-1, parameters, no activation":
        w, b = torch.nn.Parameter(w), torch.nn.Parameter(b)
        kw = dict(activation=None, state_len=3)
    elif name == "state_len W+2, bf16":
        x, w, b = x.bfloat16(), w.bfloat16(), b.bfloat16()
        kw["state_len"] = 6
    elif name == "heads [B, T, H, Dh]":
        x = make_problem(B=2, T=7, D=6, W=4, h0=False, device=device, seed=6)["x"].view(2, 7, 2, 3)
        w, b = w.new_ones(6, 4), b.new_ones(6)
    elif name == "residual":
        kw["residual"] = torch.randn_like(x)
    elif name == "numpy state_len":
        import numpy as np
        kw["state_len"] = np.int64(4)
    return x, w, b, kw, name == "lazily negated x"


PLAIN_ONE_PASS = ["dense", "channel-major", "packed, int64 offsets, no bias", "packed [total, D]",
                  "state_len W-1, parameters, no activation", "state_len W+2, bf16"]
PLAIN_GENERAL = ["heads [B, T, H, Dh]", "residual", "numpy state_len", "lazily negated x"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["x weight bias", "x", "weight"])
@pytest.mark.parametrize("name", PLAIN_ONE_PASS + PLAIN_GENERAL)
def test_forward_backward_match_the_general_path(name, which, device, monkeypatch):
    x, w, b, kw, neg = _plain_case(name, device)
    for t, n in ((x, "x"), (w, "weight"), (b, "bias")):
        if t is not None:
            t.requires_grad_(n in which)
    wanted = [t for t in (x, w, b) if t is not None and t.requires_grad]
    g = torch.full(x.shape, 0.5, dtype=x.dtype, device=x.device)  # (y has x's shape)
    runs = []
    for general in (False, True):  # the same tensors: the same pointers in both descriptions
        with raw_calls() as calls, spy(monkeypatch) as taken, \
                (general_only(monkeypatch) if general else contextlib.nullcontext()):
            y, ht = shortconv.causal_conv1d(torch._neg_view(x) if neg else x, w, b, **kw)
            grads = torch.autograd.grad(y, wanted, g)
            with torch.no_grad():
                y0, _ = shortconv.causal_conv1d(torch._neg_view(x) if neg else x, w, b, **kw)
        assert ht is None
        runs.append((y, grads, calls, taken, y0))
    (y1, g1, c1, t1, y01), (y2, g2, c2, _, y02) = runs
    assert t1 == [True, True] if name in PLAIN_ONE_PASS else True not in t1
    assert torch.equal(y1, y2) and y1.stride() == y2.stride() and torch.equal(y01, y1)
    for a, e in zip(g1, g2):
        assert torch.equal(a, e) and a.stride() == e.stride()
    if neg:
        c1, c2 = _without_x_pointer(c1), _without_x_pointer(c2)
    assert [d for d, _ in c1] == ["fwd", "bwd", "fwd"] and c1 == c2


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_matches_the_general_path(device, monkeypatch):
    x, w, b, kw, _ = _plain_case("dense", device)
    out = []
    leaves = [t.requires_grad_() for t in (x, w, b)]
    for general in (False, True):
        with (general_only(monkeypatch) if general else contextlib.nullcontext()):
            y, _ = shortconv.causal_conv1d(*leaves, **kw)
            gx, gw = torch.autograd.grad(y.square().sum(), leaves[:2], create_graph=True)
            out.append(torch.autograd.grad(gx.sum() + gw.square().sum(), leaves))
    for a, e in zip(*out):
        assert torch.equal(a, e)


def test_backward_after_a_storage_swap_describes_afresh():
    # the backward resumes from the forward's buffer only while the saved tensors hold the
    # memory it described: after ``.data =`` it describes them again (new x pointer)
    x, w, b, kw, _ = _plain_case("dense", "cpu")
    xs, ws, bs = (t.detach().clone().requires_grad_() for t in (x, w, b))
    want = torch.autograd.grad(shortconv.causal_conv1d(xs, ws, bs, **kw)[0].sum(), (xs, ws, bs))
    y, _ = shortconv.causal_conv1d(xs, ws, bs, **kw)
    old = xs.data_ptr()
    xs.data = x.detach().clone()  # same values, new memory
    with raw_calls() as calls:
        got = torch.autograd.grad(y.sum(), (xs, ws, bs))
    (_, raw), = calls
    assert struct.unpack_from("<Q", raw, _lib.OFF["x"])[0] == xs.data_ptr() != old
    for a, e in zip(got, want):
        assert torch.equal(a, e)


@pytest.mark.parametrize("device", DEVICES)
def test_forward_errors_are_the_general_paths(device, monkeypatch):
    x, w, b, kw, _ = _plain_case("dense", device)
    for what, args in (("weight on meta", (x, w.to("meta"), b)),
                       ("int bias", (x, w, b.int())),
                       ("weight of another D", (x, w[:3], b)),
                       ("1-dim x", (x[0, 0], w, b)),
                       ("a list for weight", (x, w.tolist(), b))):
        got = []
        for general in (False, True):
            with (general_only(monkeypatch) if general else contextlib.nullcontext()):
                with pytest.raises(Exception) as e:
                    shortconv.causal_conv1d(*args, **kw)
            got.append((type(e.value), str(e.value)))
        assert got[0] == got[1], what
    with pytest.raises(shortconv.ShortConvError, match="state_len"):
        shortconv.causal_conv1d(x, w, b, state_len=2)
    with pytest.raises(shortconv.ShortConvError, match="int32"):
        shortconv.causal_conv1d(x, w, b, state_len=2**31)
    with pytest.raises(TypeError, match="state_len"):
        shortconv.causal_conv1d(x, w, b, state_len=True)


def test_buffers_are_reused_and_not_shared(one_pass):
    if one_pass == "native":
        pytest.skip("the Python path's buffers")
    # every call takes its own buffer from the free list and gives it back once the library
    # has returned; a call made while another is being filled gets a different one
    x, cache, kw = _decode_case("pool rows", "cpu")
    shortconv.causal_conv1d_update(x, cache, **kw)
    free = list(_lib._FREE)
    assert free and len(free) <= _lib._FREE_MAX
    buf, base = _lib._take()
    try:
        shortconv.causal_conv1d_update(x, cache, **kw)
        assert buf.raw == _lib._TEMPLATE  # not used by the call
        assert all(b is not buf for b, _ in _lib._FREE)
    finally:
        _lib._give_back(buf, base)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_one_pass_calls_on_a_non_current_device():
    # the calls run with x's device current (its stream, its workspace): on cuda:1 while
    # cuda:0 is current, bitwise the results of the same calls on cuda:0
    out = []
    for dev in ("cuda:0", "cuda:1"):
        x, w, b, kw, _ = _plain_case("dense", dev, torch.float32)
        leaves = [t.requires_grad_() for t in (x, w, b)]
        xd, cache, dkw = _decode_case("pool rows", dev)
        with torch.cuda.device(0):
            y, _ = shortconv.causal_conv1d(*leaves, **kw)
            grads = torch.autograd.grad(y.square().sum(), leaves)
            yd, _ = shortconv.causal_conv1d_update(xd, cache, **dkw)
        assert y.device == yd.device == torch.device(dev)
        out.append([t.cpu() for t in (y, yd, cache) + grads])
    for a, e in zip(*out):
        assert torch.equal(a, e)
