"""python -m shortconv.bench: runs (tiny shapes, in-process) and reports what it says it does."""
import json
import math
import stat
import sys

import pytest
import torch

import shortconv
from shortconv import bench


@pytest.fixture
def no_copy_bandwidth(monkeypatch):
    monkeypatch.setattr(bench, "copy_GBps", lambda device: 10.0)  # skip the 512 MB copy


def test_bench_smoke(no_copy_bandwidth, capsys):
    rc = bench.main(["--device", "cpu", "--shape", "1x64x32", "--seqs", "2", "--states",
                     "--dtype", "fp32", "--budget", "0.01", "--no-cli", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    (r,) = out["results"]
    assert r["shape"] == "packed 1x64x32 +states" and r["x_bytes"] == 64 * 32 * 4
    for key in ("fwd_us", "fwdbwd_us", "torch_fwd_us", "torch_fwdbwd_us", "silu_us"):
        assert r[key] > 0
    assert abs(r["floor_fwd_us"] - 2 * 64 * 32 * 4 / 1e4) < 1e-9  # 2 x-sized tensors at 10 GB/s
    assert "cli" not in r and out["host_overhead"] is None  # a --shape run: the table only


FAKE_CLI = r"""#!%s
import json, sys
with open(%r, "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\n")
a = sys.argv[1:]
shape = a[a.index("--shape") + 1]
print(json.dumps({"backend": "cpu", "copy_GBps": 1.0, "results": [
    {"shape": "dense " + shape, "dtype": a[a.index("--dtype") + 1], "W": 4, "layout": "token-major",
     "fwd_us": 12.5, "fwdbwd_us": 40.0, "fwd_frac": 0.5, "fwdbwd_frac": 0.25, "error": ""}]}))
"""


def test_cli_figures_beside(no_copy_bandwidth, monkeypatch, tmp_path, capsys):
    log = str(tmp_path / "argv")
    cli = tmp_path / "shortconv"
    cli.write_text(FAKE_CLI % (sys.executable, log))
    cli.chmod(cli.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("SHORTCONV_CLI", str(cli))
    assert bench.find_cli() == str(cli)
    rc = bench.main(["--device", "cpu", "--shape", "1x64x32", "--layout", "channel", "--dtype",
                     "fp32", "--width", "3", "--budget", "0.01", "--no-torch", "--threads", "1"])
    assert rc == 0
    with open(log) as f:
        argv = f.read().split()
    # the CLI runs exactly the row's case
    for flag, value in (("--backend", "cpu"), ("--shape", "1x64x32"), ("--dtype", "fp32"),
                        ("--width", "3"), ("--layout", "channel"), ("--threads", "1")):
        assert argv[argv.index(flag) + 1] == value
    assert "--json" in argv and "--seqs" not in argv and "--states" not in argv
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("dense 1x64")]
    assert len(row) == 1 and "12.5  0.50" in row[0] and "40.0  0.25" in row[0]


def test_cli_json_is_matched_by_case(no_copy_bandwidth, tmp_path, capsys):
    saved = tmp_path / "bench.json"
    saved.write_text(json.dumps({"results": [
        {"shape": "dense 1x64x32", "dtype": "fp32", "W": 4, "layout": "channel-major",
         "fwd_us": 7.0, "fwdbwd_us": 9.0, "fwd_frac": 0.1, "fwdbwd_frac": 0.2},
        {"shape": "dense 1x64x32", "dtype": "fp32", "W": 4, "layout": "token-major",
         "fwd_us": 1.0, "fwdbwd_us": 2.0, "fwd_frac": 0.3, "fwdbwd_frac": 0.4}]}))
    rc = bench.main(["--device", "cpu", "--shape", "1x64x32", "--layout", "channel", "--dtype",
                     "fp32", "--budget", "0.01", "--no-torch", "--cli-json", str(saved),
                     "--json"])
    assert rc == 0
    (r,) = json.loads(capsys.readouterr().out)["results"]
    assert r["cli"]["fwd_us"] == 7.0 and r["cli"]["layout"] == "channel-major"


def test_channel_major_rows_get_a_channel_major_dy():
    s = bench.Shape("dense", 2, 8, 4, layout="channel")
    p = bench.make_inputs(s, torch.float32, "cpu", 1, True)
    assert p["x"].stride() == (32, 1, 8) and p["dy"].stride() == p["x"].stride()
    assert [t.name for t in bench.default_shapes("cpu", 4) if t.layout == "channel"]
    assert [t.name for t in bench.default_shapes("cuda", 4) if t.layout == "channel"]


def test_host_overhead_times_the_host_path():
    # validation_only: every call is validated by the library (a bad one still raises) but
    # nothing is computed
    from shortconv import _lib

    x = torch.randn(1, 8, 4)
    w = torch.randn(4, 3)
    runs = _lib._sc_forward, _lib._sc_backward
    with bench.validation_only():
        assert (_lib._sc_forward, _lib._sc_backward) != runs
        with pytest.raises(shortconv.ShortConvError, match=r"cu_seqlens\[1\]"):
            shortconv.causal_conv1d(x, w, cu_seqlens=torch.tensor([0, 9], dtype=torch.int32))
    assert (_lib._sc_forward, _lib._sc_backward) == runs
    h = bench.host_overhead("cpu", 0.02)
    assert set(h) == {"host path"}
    for what in ("fwdbwd", "fwd"):
        m = h["host path"][what]
        assert m["ours_us"] > 0 and m["noop_us"] > 0 and m["rounds"] >= 5
        assert math.isfinite(m["own_us"]) and math.isfinite(m["own_min_us"])


def test_compiled_row(monkeypatch):
    # the row's plumbing with torch.compile stubbed (compiling takes seconds; the compiled
    # path itself is tests/python/test_compile.py's)
    seen = {}

    def fake_compile(fn, **kw):
        seen.update(kw)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile, raising=False)  # (torch 1.13: none)
    s = bench.Shape("small", 1, 32, 16)
    r = bench.bench_compiled(s, "fp32", "cpu", 0.01, mode="max-autotune")
    if not shortconv.HAS_CUSTOM_OPS:
        assert "skipped" in r and not seen
        return
    assert seen == dict(fullgraph=True, dynamic=False, mode="max-autotune", backend="inductor")
    assert r["shape"] == "small compiled" and r["fwd_us"] > 0 and r["fwdbwd_us"] > 0


def test_bench_decode_smoke():
    """The decode section on the CPU: both pool layouts, 1 and 1+3 tokens, the floor's bytes."""
    from shortconv import bench_decode
    rows = bench_decode.run("cpu", 0.01, 10.0, torch.float32,
                            cases=[("vllm", 16, 4, 8), ("rows", 16, 1, 1)], out=None)
    assert [r["bytes"] for r in rows] == [
        2 * 8 * 4 * 16 * 4 + 7 * 16 * 4 * (3 + 6),  # x, y; 7 real rows: 3 read, 6 written
        2 * 1 * 1 * 16 * 4 + 1 * 16 * 4 * (3 + 3)]
    for r in rows:
        assert r["eager_us"] > 0 and r["torch_op_us"] > 0
        assert r["eager_per_torch_op"] == r["eager_us"] / r["torch_op_us"]


def test_bench_decode_host_path(monkeypatch):
    """The host path of one step per entry point against torch.mul, the library validating
    every call but computing nothing: the pools are left as they were."""
    from shortconv import bench_decode
    pools = []
    real = bench_decode.make_step

    def make_step(*a, **k):
        out = real(*a, **k)
        pools.append((out[1], out[1].clone()))
        return out

    monkeypatch.setattr(bench_decode, "make_step", make_step)
    rows = bench_decode.host_path("cpu", 0.01, torch.float32, D=8, batch=4, out=None)
    assert [r["entry"] for r in rows] == [
        "shortconv.causal_conv1d_update", "vllm.causal_conv1d_update",
        "vllm, 1+3 tokens, num_accepted", "dao.causal_conv1d_update"]
    for r in rows:
        m = r["host_path"]
        assert "eager" not in r and m["ours_us"] > 0 and m["torch_mul_us"] > 0
        assert m["ratio"] == m["ours_us"] / m["torch_mul_us"] and m["rounds"] >= 5
    assert len(pools) == 2 and all(torch.equal(p, before) for p, before in pools)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bench_decode_cuda_smoke():
    """The decode section's CUDA figures (graph replays of the step and of the empty kernel,
    the floor) on two tiny steps: what gpu.sh's pydecode stage prints."""
    from shortconv import bench_decode
    rows = bench_decode.run("cuda", 0.01, 1000.0, torch.bfloat16,
                            cases=[("vllm", 64, 4, 8), ("rows", 64, 1, 8)], out=None)
    for r in rows:
        assert r["gpu_us"] > 0 and r["empty_us"] > 0 and r["empty_call_us"] > 0
        assert r["floor_us"] == r["bytes"] / 1e6 and r["frac"] == r["floor_us"] / r["gpu_us"]
        assert r["per_empty"] == r["gpu_us"] / r["empty_us"]
        assert r["graph_copies"] >= 2 and r["reads_gpu_us"] > 0  # (tiny pools: 4 copies)
        assert r["reads_per_empty"] == r["reads_gpu_us"] / r["empty_us"]
    proj = bench_decode.after_projection(torch.bfloat16, D=256, H=64, batches=(1,), out=None)
    assert [(r["rows"], r["batch"]) for r in proj] == [("vllm", 1), ("rows", 1)]
    for r in proj:  # marginal times: differences of two graph timings (may be near zero)
        assert r["projection_us"] > 0 and all(
            math.isfinite(r[k]) for k in ("empty_us", "none_us", "launch_us", "reads_us"))
        assert r["reads_per_empty"] == r["reads_us"] / r["empty_us"]
    host = bench_decode.host_path("cuda", 0.01, torch.bfloat16, D=64, batch=8, out=None)
    for r in host:  # on a GPU the eager calls beside the host path
        assert r["host_path"]["ours_us"] > 0 and r["eager"]["ours_us"] > 0
        assert r["eager"]["ratio"] == r["eager"]["ours_us"] / r["eager"]["torch_mul_us"]


def test_decode_tokens_steps():
    """bench/decode_tokens.py's steps (built on the CPU here): the plain one-token step and the
    speculative kernel's L = 1, 2, 4 on the same rows, each accepted count within the step's
    tokens, and each step a valid call."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[2] / "bench" / "decode_tokens.py"
    if not path.exists():  # (the installed-package run copies tests/python alone)
        pytest.skip("bench/decode_tokens.py is not beside these tests")
    spec = importlib.util.spec_from_file_location("decode_tokens", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    steps = mod.cases(D=32, dtype=torch.float32, device="cpu")
    assert [n for n, *_ in steps] == [
        f"{kind}, batch {b}" for b in (1, 8)
        for kind in ("plain, 1 token", "speculative, L = 1", "speculative, L = 2",
                     "speculative, L = 4")]
    for name, x, pool, kw in steps:
        L = x.shape[1]
        if name.startswith("speculative"):
            assert name.endswith(f"L = {L}, batch {x.shape[0]}")
            assert pool.shape[2] == 3 + 3  # (W-1) + 3 entries, the rows of 1+3 tokens
            assert 1 <= int(kw["num_accepted"].min()) and int(kw["num_accepted"].max()) <= L
        else:
            assert L == 1 and "num_accepted" not in kw
        before = pool.clone()
        y, _ = shortconv.causal_conv1d_update(x, pool, **kw)
        assert y.shape == x.shape and not torch.equal(pool, before)
