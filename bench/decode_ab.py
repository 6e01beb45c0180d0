#!/usr/bin/env python3
"""Two builds of libflashattn (A: a baseline, B: a change) timed on the decode rows in one process.

A decode step moves by fractions of a microsecond between changes, less than two separate runs of
decode_compare.py differ, so A and B are timed in turns: each row runs rounds of (A, B), each a
median of triton do_bench over a CUDA-graph replay of the planned step (CUDA events, an L2 flush
before each call, as in decode_compare.py); the table gives each side's median us per step over the
rounds, B/A (time), and cuDNN (SDPA's CUDNN_ATTENTION backend) once for scale. B's output is checked
against A's (the same function: equal within rounding).

  python3 bench/decode_ab.py --lib-a base/libflashattn.so --lib-b build/libflashattn.so --pages 0,16
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from decode_compare import HK, HQ, D, ROWS, Ours, median_ms
from flashattn_abi import load


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib-a", required=True)
    p.add_argument("--lib-b", required=True)
    p.add_argument("--pages", default="0", help="cache layouts: 0 = contiguous, else tokens per page")
    p.add_argument("--rows", default=",".join(f"{b}x{kv}" for b, kv in ROWS), help="BATCHxKV,...")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--splits", type=int, default=0, help="split count forced on both builds (0: each plans its own)")
    a = p.parse_args()
    libs = {"A": load(a.lib_a), "B": load(a.lib_b)}
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  cudnn {torch.backends.cudnn.version()}")
    print(f"A = {a.lib_a}\nB = {a.lib_b}")
    print(f"{'b':>3} {'kv':>7} {'page':>5} {'splits A/B':>10} | {'A us':>7} {'B us':>7} {'cdn us':>7} |"
          f" {'B/A':>5} {'cud/A':>5} {'cud/B':>5} | A rounds / B rounds (us)")
    for row in a.rows.split(","):
        b, kv = (int(x) for x in row.split("x"))
        q = torch.randn(b, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, kv, HK, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        lens = torch.full((b,), kv, device="cuda", dtype=torch.int32)
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            cud = 1e3 * median_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True))
        del qt, kt, vt
        for page in (int(x) for x in a.pages.split(",")):
            ours = {key: Ours(lib, q, k, v, lens, page, a.splits) for key, lib in libs.items()}
            graphs = {key: o.graph() for key, o in ours.items()}
            us = {"A": [], "B": []}
            for _ in range(a.rounds):
                for key in ("A", "B"):
                    us[key].append(1e3 * median_ms(graphs[key].replay))
            outs = []
            for key in ("A", "B"):
                ours[key].out.fill_(float("nan"))
                graphs[key].replay()
                torch.cuda.synchronize()
                outs.append(ours[key].out.float())
            diff = (outs[0] - outs[1]).abs().max().item()
            ma, mb = statistics.median(us["A"]), statistics.median(us["B"])
            rounds = " ".join(f"{x:.1f}" for x in us["A"]) + " / " + " ".join(f"{x:.1f}" for x in us["B"])
            splits = "/".join(str(o.plan.num_splits) for o in ours.values())
            print(f"{b:3d} {kv:7d} {page:5d} {splits:>10} | {ma:7.1f} {mb:7.1f} {cud:7.1f} | {mb / ma:5.3f} {cud / ma:5.2f} "
                  f"{cud / mb:5.2f} | {rounds} | diff {diff:.3g}", flush=True)
            del ours, graphs
            torch.cuda.empty_cache()
        del q, k, v, lens
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
