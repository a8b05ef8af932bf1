"""shortconv.check_contents(): index contents of CUDA calls checked as the host backends do.

On the CPU (every machine): the host copies that the mode validates reproduce, for every
index argument, contiguous, strided or broadcast, exactly the status and message of the
CPU backend's own check of the originals; the mode puts back what it replaced; CPU calls
inside it are unchanged.  On a GPU: each hostile call runs unchecked (the kernels clamp),
and inside the mode raises the CPU backend's error with the pool unchanged; valid calls
give the same bytes checked or not, forward and backward, and a graph captured inside the
mode replays.
"""
import contextlib
import ctypes
import os
import subprocess
import sys

import pytest
import torch

import shortconv
from helpers import HAS_CUDA
from shortconv import _check, _fast, _lib
from shortconv import functional as F

D, W = 6, 4
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA and shortconv.has_backend("cuda") else [])


def _i32(v, device):
    return torch.tensor(v, dtype=torch.int32, device=device)


def _case(name, device, gen=None):
    """(function, kwargs, the state tensor it writes or None) of one call, valid or hostile
    in its index contents only (every description is fine)."""
    gen = gen or torch.Generator().manual_seed(7)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(device)

    w, b = rnd(D, W), rnd(D)
    upd = F.causal_conv1d_update
    if name in ("rows", "row out of the pool", "row written twice", "rows strided",
                "row out of the pool, strided", "one row broadcast"):
        pool = rnd(5, D, W - 1)
        rows = {"rows": [0, 4, 2], "row out of the pool": [0, 7, 2],
                "row written twice": [1, 3, 1]}.get(name)
        if name == "rows strided":
            rows = _i32([0, 9, 4, 9, 2, 9], device)[::2]
        elif name == "row out of the pool, strided":
            rows = _i32([0, 9, 5, 9, 2, 9], device)[::2]
        elif name == "one row broadcast":
            rows = _i32([3], device).expand(3)
        else:
            rows = _i32(rows, device)
        return upd, dict(x=rnd(3, D), cache=pool, weight=w, bias=b, activation="silu",
                         cache_indices=rows), pool
    if name in ("accepted", "accepted 0", "accepted past the row", "accepted int64 strided"):
        pool = rnd(5, D, (W - 2) + 2)  # two tokens a step: S = (W-2) + T
        acc = {"accepted": [1, 2, 1], "accepted 0": [1, 0, 1],
               "accepted past the row": [1, 3, 2]}.get(name)
        acc = (torch.tensor([2, 0, 1, 0, 2, 0], device=device)[::2]
               if acc is None else _i32(acc, device))
        return upd, dict(x=rnd(3, 2, D), cache=pool, weight=w, bias=b,
                         cache_indices=_i32([4, 0, 2], device), num_accepted=acc), pool
    if name in ("parents", "parent after its child"):
        pool = rnd(5, D, W - 1)
        par = [[0, 0, 1], [0, 0, 0], [0, 0, 1]]
        if name != "parents":
            par[1][1] = 2  # token 1's parent must be token 0
        return upd, dict(x=rnd(3, 3, D), cache=pool, weight=w, bias=b,
                         cache_indices=_i32([1, 2, 3], device),
                         parent_tokens=_i32(par, device)), pool
    if name in ("ring", "ring offset negative"):
        cache = rnd(3, D, W)
        off = [0, 5, 2] if name == "ring" else [0, -1, 2]
        return upd, dict(x=rnd(3, D), cache=cache, weight=w, bias=b,
                         cache_seqlens=_i32(off, device)), cache
    if name in ("table", "block past the table", "table entry out of the pool",
                "row read by another sequence", "flags and pad slot"):
        pool = rnd(6, D, W - 1)
        table = _i32([[0, 1, 2], [3, 4, 5]], device)
        init, fin = [0, 1], [1, 2]
        kw = {}
        if name == "block past the table":
            init = [0, 3]
        elif name == "table entry out of the pool":
            table = _i32([[0, 1, 2], [3, 9, 5]], device)
        elif name == "row read by another sequence":  # row 1: written for 0, read by 1
            table = _i32([[0, 1, 2], [3, 1, 5]], device)
        elif name == "flags and pad slot":
            kw = dict(has_initial_state=torch.tensor([True, False], device=device))
        return upd, dict(x=rnd(2, D), cache=pool, weight=w, bias=b, block_table=table,
                         initial_block=_i32(init, device), final_block=_i32(fin, device),
                         **kw), pool
    if name in ("packed", "cu_seqlens decreasing"):
        cu = [0, 3, 3, 8] if name == "packed" else [0, 5, 3, 8]
        return F.causal_conv1d, dict(x=rnd(1, 8, D), weight=w, bias=b, activation="silu",
                                     cu_seqlens=_i32(cu, device)), None
    if name in ("seq_idx", "seq_idx id past the rows"):
        ids = [[0, 0, 1, 1, 1, 2]] if name == "seq_idx" else [[0, 0, 1, 1, 5, 5]]
        return F.causal_conv1d, dict(x=rnd(1, 6, D), weight=w, bias=b,
                                     initial_state=rnd(3, D, W - 1),
                                     seq_idx=_i32(ids, device)), None
    raise KeyError(name)


VALID = ["rows", "rows strided", "accepted", "accepted int64 strided", "parents", "ring",
         "table", "flags and pad slot", "packed", "seq_idx"]
HOSTILE = {  # the argument the error names
    "row out of the pool": "cache_indices", "row out of the pool, strided": "cache_indices",
    "row written twice": "cache_indices", "one row broadcast": "cache_indices",
    "accepted 0": "num_accepted", "accepted past the row": "num_accepted",
    "parent after its child": "parent_tokens", "ring offset negative": "cache_seqlens",
    "block past the table": "initial_block", "table entry out of the pool": "block_table",
    "row read by another sequence": "block_table",
    "cu_seqlens decreasing": "cu_seqlens", "seq_idx id past the rows": "seq_idx",
}


@pytest.mark.parametrize("name", VALID + sorted(HOSTILE))
def test_host_copies_reproduce_the_host_check(name, monkeypatch):
    """validate_on_host (the mode's check) on host copies of the index tensors answers, for
    every call the library validates, what the CPU backend answers on the originals (which
    are poisoned while it runs: it must read the copies)."""
    seen, originals = [], []
    read_copy, sc_validate = _check.read_copy, _check._sc_validate

    def read_and_note(ptr, code, shape, strides, device):
        host = read_copy(ptr, code, shape, strides, device)
        if host.dtype != torch.bool:
            nbytes = (1 + sum(st * (n - 1) for n, st in zip(shape, strides))) * host.element_size()
            orig = torch.frombuffer((ctypes.c_char * nbytes).from_address(ptr),
                                    dtype=host.dtype).as_strided(tuple(shape), tuple(strides))
            originals.append((orig, orig.clone()))
        return host

    def validate_poisoned(*args):
        """The originals overwritten with values no check accepts while the library validates
        (put back after): a validation that read them would answer otherwise."""
        for orig, _ in originals:
            orig.fill_(1 << 30)
        try:
            return sc_validate(*args)
        finally:
            for orig, saved in reversed(originals):
                orig.copy_(saved)
            originals.clear()

    def spy(fn, backward, query):
        def f(base, *rest):
            mine = _check.validate_on_host(base, backward, torch.device("cpu"))
            status = fn(base, *rest)
            seen.append((mine, (status, ctypes.string_at(rest[-1]).decode())))
            return status
        return f

    monkeypatch.setattr(_check, "read_copy", read_and_note)
    monkeypatch.setattr(_check, "_sc_validate", validate_poisoned)
    monkeypatch.setattr(_fast, "_native", None)  # (its C++ calls the library directly)
    for attr, bwd, query in (("_sc_forward", 0, False), ("_sc_backward", 1, False),
                             ("_sc_forward_ws", 0, True), ("_sc_backward_ws", 1, True)):
        monkeypatch.setattr(_lib, attr, spy(getattr(_lib, attr), bwd, query))
    fn, kw, _ = _case(name, "cpu")
    ctx = pytest.raises(ValueError, match=HOSTILE[name]) if name in HOSTILE else \
        contextlib.nullcontext()
    with ctx:
        fn(**kw)
    assert seen, "no library call was seen"
    for mine, real in seen:
        assert mine == real
    assert (seen[-1][1][0] != 0) == (name in HOSTILE)


def test_the_mode_replaces_and_puts_back():
    fwd, bwd, native = _lib._sc_forward, _lib._sc_backward, _fast._native
    assert not _check.active()
    with shortconv.check_contents(False):
        assert _lib._sc_forward is fwd and not _check.active()
    with shortconv.check_contents() as c:
        assert isinstance(c, shortconv.check_contents) and _check.active()
        assert _lib._sc_forward.unchecked is fwd and _lib._sc_backward.unchecked is bwd
        assert _fast._native is None
        with shortconv.check_contents():  # nested: still one wrapper
            assert _lib._sc_forward.unchecked is fwd
        assert _check.active()
    assert (_lib._sc_forward, _lib._sc_backward, _fast._native) == (fwd, bwd, native)
    with pytest.raises(RuntimeError):
        with shortconv.check_contents():
            raise RuntimeError("inside")
    assert not _check.active() and _lib._sc_forward is fwd


def test_the_environment_turns_it_on_for_the_process():
    env = dict(os.environ, SHORTCONV_CHECK_CONTENTS="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(shortconv.__file__)),
                                           os.environ.get("PYTHONPATH", "")]))
    env.setdefault("SHORTCONV_LIBRARY", shortconv.library_path)
    r = subprocess.run([sys.executable, "-c", "import shortconv._check as c; print(c.active())"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stdout + r.stderr


def _run(name, device, checked):
    fn, kw, state = _case(name, device)
    with shortconv.check_contents(checked):
        out = fn(**kw)
    return out, state


@pytest.mark.parametrize("device", DEVICES)
def test_valid_calls_are_unchanged_by_the_mode(device):
    for name in VALID:
        (y0, _), s0 = _run(name, device, False)
        (y1, _), s1 = _run(name, device, True)
        assert torch.equal(y0, y1), name
        assert s0 is None or torch.equal(s0, s1), name


@pytest.mark.parametrize("device", DEVICES)
def test_backward_in_the_mode(device):
    """Both directions pass through the checking wrappers: gradients unchanged."""
    grads = []
    for checked in (False, True):
        fn, kw, _ = _case("packed", device)
        x = kw["x"].requires_grad_()
        with shortconv.check_contents(checked):
            y, _ = fn(**kw)
            y.square().sum().backward()
        grads.append(x.grad)
    assert torch.equal(grads[0], grads[1])


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a GPU and the CUDA backend")
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_contents_on_cuda_raise_the_host_error(name):
    # the CPU backend's own message for the same contents
    fn, kw, _ = _case(name, "cpu")
    with pytest.raises(ValueError) as host:
        fn(**kw)
    # unchecked, the kernels clamp: no error (the reason for the mode)
    fn, kw, _ = _case(name, "cuda")
    fn(**kw)
    torch.cuda.synchronize()
    # checked: that message, nothing written
    fn, kw, state = _case(name, "cuda")
    before = None if state is None else state.clone()
    with shortconv.check_contents():
        with pytest.raises(ValueError) as dev:
            fn(**kw)
    assert str(dev.value) == str(host.value)
    assert HOSTILE[name] in str(dev.value)
    if state is not None:
        assert torch.equal(state, before), "the state was written"


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a GPU and the CUDA backend")
def test_a_graph_captured_in_the_mode_replays():
    """A capture cannot read device memory: calls captured inside the mode are not checked,
    and their graph replays as outside it."""
    fn, kw, pool = _case("rows", "cuda")
    ref_pool = pool.clone()
    y_ref, _ = fn(**dict(kw, cache=ref_pool))
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), shortconv.check_contents():
        work = pool.clone()
        fn(**dict(kw, cache=work))  # warm-up, checked
        work.copy_(pool)
        with torch.cuda.graph(g, stream=s):
            y, _ = fn(**dict(kw, cache=work))
    torch.cuda.current_stream().wait_stream(s)
    work.copy_(pool)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, y_ref) and torch.equal(work, ref_pool)
