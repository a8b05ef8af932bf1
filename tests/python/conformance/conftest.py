"""Conformance suites: each drop-in module against its peer's own test parametrisation.

    tests/python/conformance/test_dao.py   shortconv.dao   vs causal-conv1d's tests/test_causal_conv1d.py
    tests/python/conformance/test_fla.py   shortconv (top level, ShortConvolution) vs FLA's tests/modules/test_conv.py
    tests/python/conformance/test_vllm.py  shortconv.vllm  vs vLLM's tests/kernels/mamba/test_causal_conv1d.py

Every test takes the ``device`` fixture: 'cpu', and 'cuda' too where a GPU and the CUDA backend
are present (the GPU script runs the Python suite, so these run on the H200 there).  The
peers' Cartesian products are sampled deterministically to fit the CPU budget of CI
(references.sample); SHORTCONV_CONFORMANCE=full runs them whole (then on CUDA only, when
present).  Tests that need a core argument shortconv does not have yet skip, naming it.
"""
import pytest
import torch

import shortconv

from references import FULL

_CUDA = torch.cuda.is_available() and shortconv.has_backend("cuda")
DEVICES = (["cuda"] if FULL and _CUDA else ["cpu"] + (["cuda"] if _CUDA else []))


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param
