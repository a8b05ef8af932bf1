"""Import-time switches and library discovery (each in a fresh interpreter)."""
import os
import subprocess
import sys

import pytest
import torch

import shortconv
from helpers import run_python

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(shortconv.__file__)))

SCRIPT = r"""
import torch, shortconv
torch.set_num_threads(1)
print("custom_ops", shortconv.HAS_CUSTOM_OPS)
x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
h0 = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
f = lambda x, w, h0: shortconv.causal_conv1d(x, w, initial_state=h0, output_final_state=True,
                                             activation="silu")
assert torch.autograd.gradcheck(f, [x, w, h0])
print("ok")
"""


run = run_python


def test_forced_fallback_path():
    r = run(SCRIPT, SHORTCONV_DISABLE_CUSTOM_OP="1")
    assert r.returncode == 0, r.stderr
    assert "custom_ops False" in r.stdout and "ok" in r.stdout


@pytest.mark.skipif(not shortconv.HAS_CUSTOM_OPS, reason="custom ops need torch >= 2.4")
def test_eager_calls_through_custom_ops():
    r = run(SCRIPT + "\nassert shortconv._ops.EAGER_CUSTOM_OP\n", SHORTCONV_EAGER_CUSTOM_OP="1")
    assert r.returncode == 0, r.stderr
    assert "custom_ops True" in r.stdout and "ok" in r.stdout


def test_missing_library_is_a_clear_import_error(monkeypatch):
    from shortconv import _lib

    monkeypatch.setenv("SHORTCONV_LIBRARY", "/nonexistent/libshortconv.so")
    with pytest.raises(ImportError, match=r"libshortconv.so not found .*SHORTCONV_LIBRARY"):
        _lib._load()
    monkeypatch.delenv("SHORTCONV_LIBRARY")
    # without the variable: the package directory (wheel), then <repo>/build/lib (source tree)
    pkg = os.path.dirname(os.path.abspath(shortconv.__file__))
    assert _lib._candidates() == [os.path.join(pkg, "libshortconv.so"),
                                  os.path.join(os.path.dirname(os.path.dirname(pkg)), "build",
                                               "lib", "libshortconv.so")]


def test_library_info():
    assert os.path.exists(shortconv.library_path)
    assert shortconv.version() == shortconv.__version__
    assert shortconv.has_backend("cpu") and shortconv.has_backend("ref")
    assert shortconv.has_backend("cuda") in (True, False)
    if torch.cuda.is_available():
        assert shortconv.has_backend("cuda"), "a GPU machine should build the CUDA backend"
