"""Clear errors in Python terms, naming the argument; nothing written on error."""
import pytest
import torch

import shortconv

from helpers import make_problem


def test_error_type_is_a_value_error():
    assert issubclass(shortconv.ShortConvError, ValueError)


def test_wrong_weight_shape_names_weight():
    p = make_problem(B=2, T=4, D=3, W=4, seed=60)
    with pytest.raises(shortconv.ShortConvError, match=r"weight: expected shape \[3, 4\]"):
        shortconv.causal_conv1d(p["x"], p["weight"][:2])  # [2, 4] for D = 3
    with pytest.raises(shortconv.ShortConvError, match=r"weight: expected 2 dims, got 1"):
        shortconv.causal_conv1d(p["x"], p["weight"][0])


def test_wrong_state_shapes():
    p = make_problem(B=2, T=4, D=3, W=4, seed=61)
    with pytest.raises(shortconv.ShortConvError, match=r"initial_state: expected shape \[2, 3, 4\]"):
        shortconv.causal_conv1d(p["x"], p["weight"], initial_state=p["initial_state"][:1])
    with pytest.raises(shortconv.ShortConvError, match=r"S must be >= W-1 = 3"):
        shortconv.causal_conv1d(p["x"], p["weight"], initial_state=p["initial_state"][:, :, :2])
    with pytest.raises(shortconv.ShortConvError, match=r"state_len"):
        shortconv.causal_conv1d(p["x"], p["weight"], initial_state=p["initial_state"],
                                state_len=5)


def test_bad_cu_seqlens():
    p = make_problem(W=3, lengths=[2, 3], seed=62)
    bad = torch.tensor([0, 2, 4], dtype=torch.int32)  # ends at 4, x has 5 tokens
    with pytest.raises(shortconv.ShortConvError, match=r"cu_seqlens\[2\]"):
        shortconv.causal_conv1d(p["x"], p["weight"], cu_seqlens=bad)
    with pytest.raises(TypeError, match=r"cu_seqlens has dtype torch.float32"):
        shortconv.causal_conv1d(p["x"], p["weight"], cu_seqlens=bad.float())


def test_unsupported_dtypes():
    p = make_problem(B=1, T=3, D=2, W=2, seed=63)
    with pytest.raises(TypeError, match=r"x has dtype torch.int32"):
        shortconv.causal_conv1d(p["x"].int(), p["weight"])
    with pytest.raises(TypeError, match=r"weight has dtype torch.uint8"):
        shortconv.causal_conv1d(p["x"], p["weight"].to(torch.uint8))
    with pytest.raises(shortconv.ShortConvError, match=r"bias: expected dtype float64"):
        shortconv.causal_conv1d(p["x"], p["weight"], p["bias"].float())
    with pytest.raises(shortconv.ShortConvError, match=r"residual: expected dtype float64"):
        shortconv.causal_conv1d(p["x"], p["weight"], residual=p["x"].float())


def test_different_devices():
    p = make_problem(B=1, T=3, D=2, W=2, seed=64)
    meta_w = torch.empty(2, 2, dtype=torch.float64, device="meta")
    with pytest.raises(ValueError, match=r"weight is on meta but x is on cpu"):
        shortconv.causal_conv1d(p["x"], meta_w)
    with pytest.raises(ValueError, match=r"initial_state is on meta"):
        shortconv.causal_conv1d(p["x"], p["weight"],
                                initial_state=torch.empty(1, 2, 2, device="meta",
                                                          dtype=torch.float64))


def test_bad_activation_and_missing_weight():
    p = make_problem(B=1, T=3, D=2, W=2, seed=65)
    with pytest.raises(ValueError, match=r"activation: expected None, 'silu' or 'swish', got 'relu'"):
        shortconv.causal_conv1d(p["x"], p["weight"], activation="relu")
    with pytest.raises(ValueError, match=r"weight: required"):
        shortconv.causal_conv1d(p["x"])
    with pytest.raises(TypeError, match=r"unexpected keyword"):
        shortconv.causal_conv1d(p["x"], p["weight"], bogus=1)


def test_update_errors_name_cache_and_write_nothing():
    D, W = 3, 4
    w = torch.randn(D, W, dtype=torch.float64)
    x = torch.randn(2, D, dtype=torch.float64)
    pool = torch.randn(4, D, W, dtype=torch.float64)
    before = pool.clone()
    with pytest.raises(shortconv.ShortConvError, match=r"cache_indices\[1\]: pool row index out of range"):
        shortconv.causal_conv1d_update(x, pool, weight=w, cache_indices=torch.tensor([0, 4]))
    assert torch.equal(pool, before)
    with pytest.raises(shortconv.ShortConvError, match=r"cache: expected shape \[2, 3, 4\]"):
        shortconv.causal_conv1d_update(x, pool, weight=w)
    assert torch.equal(pool, before)


def test_output_overlap_is_rejected_for_in_place_views():
    # cache given as an expanded (stride-0) view: the output would write rows twice
    D, W = 2, 3
    w = torch.randn(D, W, dtype=torch.float64)
    cache = torch.zeros(1, D, W, dtype=torch.float64).expand(2, D, W)
    with pytest.raises(shortconv.ShortConvError, match=r"cache: output strides make elements overlap"):
        shortconv.causal_conv1d_update(torch.randn(2, D, dtype=torch.float64), cache, weight=w)
