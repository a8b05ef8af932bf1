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
    with pytest.raises(ValueError, match=r"activation: expected None, 'identity', 'silu' or 'swish', got 'relu'"):
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


# ---- Python types and scalar ranges (before any allocation or library call) ----------
def _valid_call_args():
    p = make_problem(B=2, T=5, D=3, W=4, S=4, residual=True, seed=66)
    return p, dict(x=p["x"], weight=p["weight"], bias=p["bias"], residual=p["residual"],
                   initial_state=p["initial_state"])


@pytest.mark.parametrize("arg", ["x", "weight", "bias", "residual", "initial_state", "cu_seqlens"])
@pytest.mark.parametrize("kind", ["list", "tuple", "numpy"])
def test_non_tensors_name_the_argument(arg, kind):
    np = pytest.importorskip("numpy")
    p, kw = _valid_call_args()
    if arg == "cu_seqlens":
        kw = dict(x=p["x"].reshape(1, 10, 3), weight=p["weight"])
        value = torch.tensor([0, 3, 10])
    else:
        value = kw[arg]
    kw[arg] = {"list": value.tolist, "tuple": lambda: tuple(value.tolist()),
               "numpy": value.numpy}[kind]()
    got = "numpy.ndarray" if kind == "numpy" else kind
    with pytest.raises(TypeError, match=r"causal_conv1d: %s: expected a torch.Tensor .*got %s"
                       % (arg, got)):
        shortconv.causal_conv1d(**kw)


@pytest.mark.parametrize("arg", ["x", "cache", "weight", "bias", "residual", "cache_indices",
                                 "cu_seqlens"])
def test_update_non_tensors_name_the_argument(arg):
    D, W = 3, 4
    cache = torch.randn(2, D, W)
    before = cache.clone()
    kw = dict(x=torch.randn(2, D), cache=cache, weight=torch.randn(D, W), bias=torch.randn(D),
              residual=torch.randn(2, D), cache_indices=torch.tensor([0, 1]),
              cu_seqlens=None)
    kw[arg] = [0, 1] if arg in ("cache_indices", "cu_seqlens") else kw[arg].tolist()
    with pytest.raises(TypeError, match=r"causal_conv1d_update: %s: expected a torch.Tensor" % arg):
        shortconv.causal_conv1d_update(**kw)
    assert torch.equal(cache, before)


@pytest.mark.parametrize("value,error,message", [
    (2**31, shortconv.ShortConvError, r"state_len: state length S = 2147483648 exceeds the C "
                                      r"ABI's int32 \(at most 2147483647\)"),
    (2**64, shortconv.ShortConvError, r"state_len: state length S = \d+ exceeds"),
    (-5, shortconv.ShortConvError, r"state_len: state length S must be >= W-1 = 3, got S = -5"),
    (-1, shortconv.ShortConvError, r"state_len: state length S must be >= W-1 = 3, got S = -1"),
    (2, shortconv.ShortConvError, r"state_len: state length S must be >= W-1 = 3, got S = 2"),
    (3.5, TypeError, r"state_len: expected an int, got float 3.5"),
    (4.0, TypeError, r"state_len: expected an int, got float 4.0"),
    ("4", TypeError, r"state_len: expected an int, got str '4'"),
    (True, TypeError, r"state_len: expected an int, got bool True"),
    (torch.tensor(4), TypeError, r"state_len: expected an int, got torch.Tensor"),
])
@pytest.mark.parametrize("output_final_state", [False, True])
def test_state_len_values(value, error, message, output_final_state):
    p = make_problem(B=2, T=5, D=3, W=4, h0=False, seed=67)
    with pytest.raises(error, match=r"shortconv.causal_conv1d: (invalid argument: )?" + message):
        shortconv.causal_conv1d(p["x"], p["weight"], state_len=value,
                                output_final_state=output_final_state)


def test_state_len_accepts_integer_types():
    np = pytest.importorskip("numpy")
    p = make_problem(B=2, T=5, D=3, W=4, h0=False, seed=68)
    y, ht = shortconv.causal_conv1d(p["x"], p["weight"], state_len=5, output_final_state=True)
    for v in (np.int64(5), np.int32(5)):
        y2, ht2 = shortconv.causal_conv1d(p["x"], p["weight"], state_len=v, output_final_state=True)
        assert torch.equal(y, y2) and torch.equal(ht, ht2) and ht2.shape == (2, 3, 5)


def test_width_beyond_int32():
    x = torch.randn(1, 2, 1)
    w = torch.ones(1, 1).expand(1, 2**31)  # stride 0: no memory behind 2^31 taps
    with pytest.raises(shortconv.ShortConvError,
                       match=r"weight: width W = weight.shape\[-1\] = 2147483648 exceeds the C "
                             r"ABI's int32"):
        shortconv.causal_conv1d(x, w)
    with pytest.raises(shortconv.ShortConvError, match=r"causal_conv1d_update: .*weight: width W"):
        shortconv.causal_conv1d_update(x[:, 0], torch.zeros(1, 1, 3), weight=w)


def test_initial_state_length_beyond_int32():
    x = torch.randn(1, 2, 1)
    h0 = torch.zeros(1, 1, 1).expand(1, 1, 2**31)
    with pytest.raises(shortconv.ShortConvError,
                       match=r"initial_state: state length S = 2147483648 exceeds"):
        shortconv.causal_conv1d(x, torch.randn(1, 2), initial_state=h0)


@pytest.mark.parametrize("value", ["yes", "False", 2, 0.0, torch.tensor(True), [True], None])
def test_output_final_state_must_be_a_bool(value):
    p = make_problem(B=1, T=3, D=2, W=2, seed=69)
    with pytest.raises(TypeError, match=r"output_final_state: expected a bool, got"):
        shortconv.causal_conv1d(p["x"], p["weight"], output_final_state=value)


def test_output_final_state_accepts_0_1_and_numpy_bools():
    np = pytest.importorskip("numpy")
    p = make_problem(B=1, T=3, D=2, W=2, seed=70)
    for v in (1, np.bool_(True)):
        assert shortconv.causal_conv1d(p["x"], p["weight"], output_final_state=v)[1] is not None
    for v in (0, np.bool_(False)):
        assert shortconv.causal_conv1d(p["x"], p["weight"], output_final_state=v)[1] is None


@pytest.mark.parametrize("value", ["relu", 1, True, [], "SILU"])
def test_activation_values(value):
    p = make_problem(B=1, T=3, D=2, W=2, seed=71)
    msg = r"activation: expected None, 'identity', 'silu' or 'swish', got "
    with pytest.raises(ValueError, match=r"shortconv.causal_conv1d: " + msg):
        shortconv.causal_conv1d(p["x"], p["weight"], activation=value)
    with pytest.raises(ValueError, match=r"shortconv.causal_conv1d_update: " + msg):
        shortconv.causal_conv1d_update(p["x"][:, 0], torch.zeros(1, 2, 2), weight=p["weight"],
                                       activation=value)


def test_update_shape_errors_before_reshaping():
    D, W = 4, 3
    w = torch.randn(D, W)
    cache = torch.randn(2, D, W)
    before = cache.clone()
    with pytest.raises(shortconv.ShortConvError, match=r"x: expected \[N, D\].*got a 0-dim"):
        shortconv.causal_conv1d_update(torch.tensor(1.0), cache, weight=w)
    for res in (torch.randn(D), torch.randn(2, 1, 1, D), torch.randn(2, D + 1)):
        with pytest.raises(shortconv.ShortConvError, match=r"residual: expected x's shape \[2, 4"):
            shortconv.causal_conv1d_update(torch.randn(2, D), cache, res, w)
    assert torch.equal(cache, before)


def test_module_argument_errors():
    m = shortconv.ShortConvolution(4, 3)
    x = torch.randn(2, 5, 4)
    with pytest.raises(TypeError, match=r"ShortConvolution: x: expected a torch.Tensor"):
        m(x.tolist())
    bad = shortconv.ShortConvError
    with pytest.raises(bad, match=r"ShortConvolution: .*x: expected \[B, T, D\]"):
        m(torch.randn(4))
    with pytest.raises(TypeError, match=r"ShortConvolution: cu_seqlens: expected a torch.Tensor"):
        m(x.reshape(1, 10, 4), cu_seqlens=[0, 4, 10])
    with pytest.raises(TypeError, match=r"ShortConvolution: cache: expected a torch.Tensor"):
        m(x, cache=[[0.0]])
    with pytest.raises(bad, match=r"ShortConvolution: .*mask: expected shape \[B, T\] = \[2, 5\], "
                                  r"got \[2, 4\]"):
        m(x, mask=torch.ones(2, 4))
    with torch.no_grad(), pytest.raises(TypeError, match=r"output_final_state: expected a bool"):
        m(torch.randn(2, 1, 4), output_final_state="yes")
