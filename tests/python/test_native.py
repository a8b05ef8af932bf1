"""The native module (shortconv/native.py): when it is used, and what it may not change.

Its calls against the Python one-pass paths and the general path (same library bytes,
bitwise results, same errors, nothing written) are test_fast.py's cases, run through both.
Here: the switches that pick it, the guarantee that a module is only loaded by the torch
and the sources it was built from, and calls from several threads at once (it releases
the GIL while the library runs, as ctypes does)."""
import os
import subprocess
import sys
import threading

import pytest
import torch

import shortconv
from helpers import run_python
from shortconv import _fast, native

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(shortconv.__file__)))
needs_module = pytest.mark.skipif(native.module is None, reason=native.status())


run = run_python


STEP = r"""
import torch, shortconv
from shortconv import _fast, native
pool = torch.zeros(4, 3, 3)
y, _ = shortconv.causal_conv1d_update(torch.ones(2, 3), pool, weight=torch.ones(3, 4),
                                      cache_indices=torch.tensor([1, 3]))
assert y.eq(1).all() and pool[1, :, -1].eq(1).all() and pool[0].eq(0).all()
print("native", _fast._native is not None, native.status())
"""


def test_required_module_is_there_when_the_suite_says_so():
    # scripts/test.sh runs the PyPI suites with SHORTCONV_NATIVE=1: then they test it
    if os.environ.get("SHORTCONV_NATIVE") == "1":
        assert native.module is not None and _fast._native is native.module


def test_turned_off():
    r = run(STEP, SHORTCONV_NATIVE="0")
    assert r.returncode == 0, r.stderr
    assert "native False native module not used: turned off (SHORTCONV_NATIVE=0)" in r.stdout


def test_missing_module_is_the_ctypes_path_or_a_clear_error(tmp_path):
    r = run(STEP, SHORTCONV_NATIVE="", SHORTCONV_NATIVE_DIR=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "native False" in r.stdout and "python -m shortconv.build_native" in r.stdout
    r = run(STEP, SHORTCONV_NATIVE="1", SHORTCONV_NATIVE_DIR=str(tmp_path))
    assert r.returncode != 0
    assert "SHORTCONV_NATIVE=1 but the native module is not available" in r.stderr
    assert str(tmp_path) in r.stderr


@needs_module
def test_found_in_its_directory_only(tmp_path):
    # the module is looked for in SHORTCONV_NATIVE_DIR/<torch, python, source hash>/ alone
    r = run(STEP, SHORTCONV_NATIVE="1",
            SHORTCONV_NATIVE_DIR=os.path.dirname(os.path.dirname(native.module.__file__)))
    assert r.returncode == 0, r.stderr
    assert "native True" in r.stdout


def test_directory_names_torch_python_and_sources(tmp_path, monkeypatch):
    d = native.directory()
    tag = os.path.basename(d)
    assert tag.startswith("torch%s-py%d%d-" % (torch.__version__.replace("+", "_"),
                                               *sys.version_info[:2]))
    # changed sources: another directory, so a module built from the old ones is not loaded
    src = tmp_path / "_native.cpp"
    src.write_bytes(open(native._SOURCE, "rb").read() + b"\n// changed\n")
    monkeypatch.setattr(native, "_SOURCE", str(src))
    assert native.directory() != d
    assert os.path.dirname(native.directory()) == os.path.dirname(d)


@needs_module
def test_calls_from_several_threads_are_the_serial_ones():
    g = torch.Generator().manual_seed(3)
    D, W = 64, 4
    w = torch.randn(D, W, generator=g, dtype=torch.float64)
    b = torch.randn(D, generator=g, dtype=torch.float64)
    xs = [torch.randn(2, 300, D, generator=g, dtype=torch.float64) for _ in range(8)]
    pools = [torch.randn(6, D, W - 1, generator=g, dtype=torch.float64) for _ in range(8)]
    rows = torch.tensor([5, 0, 2])

    def work(i):
        x = xs[i].clone().requires_grad_()
        y, _ = shortconv.causal_conv1d(x, w, b, activation="silu")
        (gx,) = torch.autograd.grad(y.square().sum(), [x])
        pool = pools[i].clone()
        yt, _ = shortconv.causal_conv1d_update(xs[i][:, :3, :].reshape(3, 2, D)[:, 0], pool,
                                               weight=w, bias=b, activation="silu",
                                               cache_indices=rows)
        return y.detach(), gx, yt, pool

    serial = [work(i) for i in range(8)]
    out = [None] * 8

    def thread(i):
        for _ in range(5):
            out[i] = work(i)

    ts = [threading.Thread(target=thread, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for a, e in zip(out, serial):
        for u, v in zip(a, e):
            assert torch.equal(u, v)
