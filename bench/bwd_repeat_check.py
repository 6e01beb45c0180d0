#!/usr/bin/env python3
"""Repeated GPU backward runs against SDPA's gradients: a race shows as a run that is far off.

For each shape (bf16, 16k tokens in total, hidden 2048), our forward and backward run `--runs`
times through the C ABI and each run's dq, dk, dv are compared with PyTorch SDPA's
FLASH_ATTENTION backend (FlashAttention-2) for the same dO; the worst run's largest difference is
printed. A correct kernel stays within bf16 rounding in every run (about 1e-2 here); this found the
d=256 kernel reading dO before it landed (wrong dv in some runs, 2026-12-01).

  python3 bench/bwd_repeat_check.py --lib build/libflashattn.so --d 256 --s 4096,8192 --causal 1
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ab_compare import Problem, runner
from anchor_sweep import add_sweep_args, shapes
from flashattn_abi import load


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sweep_args(p, "4096,8192")
    p.add_argument("--runs", type=int, default=8)
    a = p.parse_args()
    lib = load(a.lib)
    for d, causal, s, b, h in shapes(a):
        prob = Problem(b, s, h, d, causal)
        qt, kt, vt = (x.transpose(1, 2).contiguous().requires_grad_(True) for x in (prob.q, prob.k, prob.v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
            ref = [g.transpose(1, 2) for g in torch.autograd.grad(o, (qt, kt, vt), prob.dout.transpose(1, 2))]
        fwd, bwd = runner(lib, prob, "fwd"), runner(lib, prob, "bwd")
        worst = [0.0, 0.0, 0.0]
        for _ in range(a.runs):
            fwd()
            bwd()
            torch.cuda.synchronize()
            for i, (x, y) in enumerate(zip((prob.dq, prob.dk, prob.dv), ref)):
                worst[i] = max(worst[i], (x.float() - y.float()).abs().max().item())
        print(f"d {d} causal {causal} s {s}: worst of {a.runs} runs, max |ours - fa2|: dq {worst[0]:.3g} "
              f"dk {worst[1]:.3g} dv {worst[2]:.3g}", flush=True)
        del prob, qt, kt, vt
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
