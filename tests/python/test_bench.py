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
