"""python -m shortconv.bench runs (a tiny shape, in-process) and reports sane numbers."""
import json

from shortconv import bench


def test_bench_smoke(monkeypatch, capsys):
    monkeypatch.setattr(bench, "copy_GBps", lambda device: 10.0)  # skip the 512 MB copy
    rc = bench.main(["--device", "cpu", "--shape", "1x64x32", "--seqs", "2", "--states",
                     "--dtype", "fp32", "--budget", "0.01", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    (r,) = out["results"]
    assert r["shape"] == "packed 1x64x32 +states" and r["x_bytes"] == 64 * 32 * 4
    for key in ("fwd_us", "fwdbwd_us", "torch_fwd_us", "torch_fwdbwd_us"):
        assert r[key] > 0
    assert abs(r["floor_fwd_us"] - 2 * 64 * 32 * 4 / 1e4) < 1e-9  # 2 x-sized tensors at 10 GB/s


def test_bench_decode_smoke():
    """The decode section on the CPU: both pool layouts, 1 and 1+3 tokens, the floor's bytes."""
    import torch
    from shortconv import bench_decode
    rows = bench_decode.run("cpu", 0.01, 10.0, torch.float32,
                            cases=[("vllm", 16, 4, 8), ("rows", 16, 1, 1)], out=None)
    assert [r["bytes"] for r in rows] == [
        2 * 8 * 4 * 16 * 4 + 7 * 16 * 4 * (3 + 6),  # x, y; 7 real rows: 3 read, 6 written
        2 * 1 * 1 * 16 * 4 + 1 * 16 * 4 * (3 + 3)]
    for r in rows:
        assert r["eager_us"] > 0 and r["torch_op_us"] > 0
        assert r["eager_per_torch_op"] == r["eager_us"] / r["torch_op_us"]
