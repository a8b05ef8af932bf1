"""shortconv.distributed on gloo: world sizes 1-5, against the single-process op.

One spawn of the largest selected world size runs every check of helpers_distributed.py for
every size, each size on a group of that many ranks inside the world (a module-scoped fixture,
bounded in time as a whole); the tests below read its results, per size.  Select with
``pytest -k distributed`` (``-k world3`` spawns 3 ranks).  On a machine with GPUs,
SHORTCONV_CP_BACKEND=nccl runs the same checks on NCCL, one GPU per rank, for the world sizes
the GPUs allow.
"""
import os

import pytest
import torch
import torch.distributed as dist

import shortconv

try:
    import shortconv.distributed  # noqa: F401
    from helpers_distributed import BACKEND, run_worlds
    _REASON = None
except ImportError as e:  # pragma: no cover
    _REASON = "shortconv.distributed cannot be imported: %s" % e
    BACKEND = "gloo"

WORLDS = [1, 2, 3, 4, 5]  # 5 > W = 4: a window spans more ranks than it has taps
if os.environ.get("SHORTCONV_CP_WORLDS"):  # e.g. "4,8" for the larger world sizes
    WORLDS = [int(w) for w in os.environ["SHORTCONV_CP_WORLDS"].split(",")]
if _REASON is None and not dist.is_available():
    _REASON = "this torch build has no torch.distributed"
elif _REASON is None and BACKEND == "gloo" and not dist.is_gloo_available():
    _REASON = "this torch build has no gloo backend"
elif _REASON is None and BACKEND == "nccl":
    if not (dist.is_nccl_available() and torch.cuda.device_count() >= 1):
        _REASON = "SHORTCONV_CP_BACKEND=nccl needs NCCL and a GPU"
    WORLDS = [w for w in WORLDS if w <= torch.cuda.device_count()]

pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


@pytest.fixture(scope="module")
def spawn(request):
    """{world size: its results}: one run for the world sizes of the selected tests."""
    sizes = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.module is request.module and callspec is not None:
            sizes.add(callspec.params.get("world"))
    return run_worlds(sorted(sizes - {None}) or WORLDS)


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: "world%d" % w)
def world(request, spawn):
    return spawn[request.param]


def _result(world, name):
    st = world.results.get(name)
    if st is None:
        pytest.fail("check %r did not run on world %d (%s)" % (name, world.world, world.crashed))
    failed = [s for s in st if s != "ok"]
    assert not failed, "\n".join(str(s) for s in failed)
    assert world.crashed is None, world.crashed


def test_distributed_matches_single_process(world):
    """Bitwise y, final_state, dx, dresidual and summed dinitial_state; dweight/dbias summed
    within tolerance.  W in {1, 2, 4, 7} x S in {W-1, W, W+2} x dense/packed, fp32/fp64
    (and bf16 x with fp32 states, fp32 x with fp64 states, a channel-major x, no tokens at
    all), shard lengths 0, 1 and shorter than W-1 back to back, zero-length sequences,
    sequences across several ranks, with and without states, residual and bias."""
    _result(world, "cases")


def test_distributed_no_grad(world):
    _result(world, "no_grad")


def test_distributed_context_reuse_and_cp_context(world):
    """A CPContext reused over calls and layers; shortconv.causal_conv1d(cp_context=...)."""
    _result(world, "context")


def test_distributed_gradcheck(world):
    if world.world not in (2, 3):
        pytest.skip("gradcheck runs on 2 and 3 ranks")
    _result(world, "gradcheck")


def test_distributed_chunk_ratio_table(world, capsys):
    if world.world < 2:
        pytest.skip("needs at least 2 ranks")
    _result(world, "ratio_table")
    with capsys.disabled():
        print("\nworld %d: gradient at the W-1 positions before the last shard, distributed / "
              "whole\n%s" % (world.world, world.reports["ratio_table"]))


def test_distributed_bad_input_raises_on_every_rank(world):
    if world.world < 2:
        pytest.skip("needs at least 2 ranks")
    _result(world, "errors")


def test_distributed_compile_fullgraph(world):
    if world.world != 2:
        pytest.skip("compiled once, on 2 ranks")
    if not shortconv.HAS_CUSTOM_OPS:
        pytest.skip("torch.compile support needs torch >= 2.4 (this is torch %s)"
                    % torch.__version__)
    _result(world, "compile")
