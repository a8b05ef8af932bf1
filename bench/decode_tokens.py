"""Where a speculative decode step's time goes: the plain one-token step against the
speculative kernel at L = 1, 2 and 4 tokens on the same rows.

    SHORTCONV_LIBRARY=build/lib/libshortconv.so PYTHONPATH=python python bench/decode_tokens.py
    ... ncu --cache-control none -k regex:fwd_decode --metrics ... python bench/decode_tokens.py --ncu

vLLM rows, D = 4096, bf16, W = 4, SiLU, bias, pool of 1024 rows (python/shortconv/bench_decode.py's
step, every 8th slot padded); the speculative steps run on rows of (W-1) + 3 entries with
accepted counts capped at L.  Prints GPU µs per step from graphs of 100 steps, in plain launches
and with overlap='reads', at batch 1 and 8.  With --ncu, two eager calls of each instead (the
second is the one to read), for a profiler's instruction counts and stall reasons.
"""
import argparse

import torch

import shortconv
from shortconv import bench_decode as bd


def cases(D=4096, dtype=torch.bfloat16, device="cuda"):
    out = []
    for batch in (1, 8):
        x1, pool1, kw1, _ = bd.make_step("vllm", D, 1, batch, dtype, device)
        x4, pool4, kw4, _ = bd.make_step("vllm", D, 4, batch, dtype, device)
        out.append((f"plain, 1 token, batch {batch}", x1, pool1, kw1))
        for L in (1, 2, 4):
            kw = dict(kw4)
            kw["num_accepted"] = kw4["num_accepted"].clamp(max=L)
            out.append((f"speculative, L = {L}, batch {batch}", x4[:, :L].contiguous(), pool4, kw))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ncu", action="store_true", help="two eager calls of each step, no timing")
    args = ap.parse_args()
    steps = cases()
    if args.ncu:
        for _, x, pool, kw in steps:
            for ov in (None, "reads"):
                for _ in range(2):
                    shortconv.causal_conv1d_update(x, pool, overlap=ov, **kw)
        torch.cuda.synchronize()
        return
    print(f"{'step':32} {'plain us':>9} {'reads us':>9}")
    for name, x, pool, kw in steps:
        t = [bd.graph_us(lambda ov=ov: shortconv.causal_conv1d_update(x, pool, overlap=ov, **kw))
             for ov in (None, "reads")]
        print(f"{name:32} {t[0]:9.2f} {t[1]:9.2f}")


if __name__ == "__main__":
    main()
