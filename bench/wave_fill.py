#!/usr/bin/env python3
"""What the partly filled last wave of work tiles costs: our non-causal forward (or backward) beside
cuDNN's on shapes with the same tokens per head, whose (batch, heads) make the work tiles (query
tiles of 128 rows, 192 at d=64 forward; key tiles of 128 in the backward) fill a whole number of
waves of the GPU's SMs or leave the last wave partly empty. Ours and cuDNN in rounds, medians of
triton.testing.do_bench (CUDA events).

  python3 bench/wave_fill.py --lib build/libflashattn.so --modes fwd,bwd
"""
import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ab_compare import Problem, median_ms, runner
from anchor_sweep import flops
from flashattn_abi import load

# (d, s, batch, heads): the anchors' shape first, then ones that fill whole waves of 132 SMs.
SHAPES = [(128, 2048, 8, 16), (128, 2048, 4, 33), (128, 2048, 4, 32), (128, 2048, 3, 44),
          (128, 8192, 2, 16), (128, 8192, 1, 33),
          (64, 2048, 8, 32), (64, 2048, 8, 30),
          (256, 2048, 8, 8), (256, 2048, 1, 66), (256, 8192, 2, 8), (256, 8192, 1, 33)]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", default="build/libflashattn.so")
    p.add_argument("--modes", default="fwd")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    lib = load(a.lib)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{'mode':>4} {'d':>4} {'s':>5} {'b':>3} {'h':>3} {'tiles':>5} {'fill':>5} | {'ours':>5} {'cudnn':>5} "
          f"{'ratio':>5} | rounds (TFLOP/s)")
    for mode in a.modes.split(","):
        for d, s, b, h in SHAPES:
            rows = 192 if d == 64 and mode == "fwd" else 128
            tiles = b * h * math.ceil(s / rows)
            fill = tiles / (math.ceil(tiles / sms) * sms)
            prob = Problem(b, s, h, d, False)
            run = runner(lib, prob, "fwd")
            if mode == "bwd":
                run()  # the backward reads the forward's O and lse
                run = runner(lib, prob, "bwd")
            qt, kt, vt = (x.transpose(1, 2).contiguous().requires_grad_(mode == "bwd")
                          for x in (prob.q, prob.k, prob.v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                ref = F.scaled_dot_product_attention(qt, kt, vt)
                g = torch.randn_like(ref)
                if mode == "fwd":
                    cud = lambda: F.scaled_dot_product_attention(qt, kt, vt)
                else:
                    cud = lambda: ref.backward(g, retain_graph=True)
                work = flops(b, h, s, d, False, mode)
                ours, theirs = [], []
                for _ in range(a.rounds):
                    ours.append(work / median_ms(run) / 1e9)
                    theirs.append(work / median_ms(cud) / 1e9)
            mo, mc = statistics.median(ours), statistics.median(theirs)
            print(f"{mode:>4} {d:4d} {s:5d} {b:3d} {h:3d} {tiles:5d} {fill:5.3f} | {mo:5.0f} {mc:5.0f} {mo / mc:5.2f} | "
                  + " ".join(f"{x:.0f}" for x in ours) + " / " + " ".join(f"{x:.0f}" for x in theirs), flush=True)
            del prob, qt, kt, vt, ref
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
