#!/usr/bin/env python3
"""Builds of libflashattn (A: a baseline, B: one change or several) timed on the decode rows in one
process.

A decode step moves by fractions of a microsecond between changes, less than two separate runs of
decode_compare.py differ, so A and B are timed in turns: each row runs rounds of (A, B), each a
median of triton do_bench over a CUDA-graph replay of the planned step (CUDA events, an L2 flush
before each call, as in decode_compare.py); the table gives each side's median us per step over the
rounds, B/A (time), and cuDNN (SDPA's CUDNN_ATTENTION backend) once for scale. B's output is checked
against A's (the same function: equal within rounding). --lib-b may be given several times, to time
several changes against A in one pass (one device call); LIB:SPLITS forces that side's split count.

  python3 bench/decode_ab.py --lib-a base/libflashattn.so --lib-b build/libflashattn.so --pages 0,16
  python3 bench/decode_ab.py --lib-a base/libflashattn.so --lib-b room/libflashattn.so:33 --lib-b room/libflashattn.so
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from decode_compare import HK, HQ, D, ROWS, Ours, median_ms
from flashattn_abi import load


def side(spec, default_splits):
    """LIB or LIB:SPLITS -> (path, forced split count)."""
    path, _, tail = spec.rpartition(":")
    return (path, int(tail)) if path and tail.isdigit() else (spec, default_splits)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib-a", required=True, help="LIB or LIB:SPLITS")
    p.add_argument("--lib-b", required=True, action="append", help="LIB or LIB:SPLITS; repeat for several changes")
    p.add_argument("--pages", default="0", help="cache layouts: 0 = contiguous, else tokens per page")
    p.add_argument("--rows", default=",".join(f"{b}x{kv}" for b, kv in ROWS), help="BATCHxKV,...")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--splits", type=int, default=0, help="split count forced on every side without its own (0: planned)")
    a = p.parse_args()
    specs = [side(a.lib_a, a.splits)] + [side(x, a.splits) for x in a.lib_b]
    names = ["A"] + (["B"] if len(a.lib_b) == 1 else [f"B{i + 1}" for i in range(len(a.lib_b))])
    loaded = {}
    for path, _ in specs:
        loaded.setdefault(path, load(path))
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  cudnn {torch.backends.cudnn.version()}")
    for name, (path, splits) in zip(names, specs):
        print(f"{name} = {path}" + (f" (splits forced to {splits})" if splits else ""))
    bs = names[1:]
    print(f"{'b':>3} {'kv':>7} {'page':>5} {'splits ' + '/'.join(names):>12} | {'A us':>7} "
          + " ".join(f"{n + ' us':>7}" for n in bs) + f" {'cdn us':>7} | "
          + " ".join(f"{n + '/A':>6}" for n in bs) + f" {'cud/A':>5} | rounds (us) | max diff to A")
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
            ours = [Ours(loaded[path], q, k, v, lens, page, splits) for path, splits in specs]
            graphs = [o.graph() for o in ours]
            us = [[] for _ in ours]
            for _ in range(a.rounds):
                for i, g in enumerate(graphs):
                    us[i].append(1e3 * median_ms(g.replay))
            outs = []
            for o, g in zip(ours, graphs):
                o.out.fill_(float("nan"))
                g.replay()
                torch.cuda.synchronize()
                outs.append(o.out.float())
            diff = max((x - outs[0]).abs().max().item() for x in outs[1:])
            med = [statistics.median(x) for x in us]
            rounds = " / ".join(" ".join(f"{x:.1f}" for x in side_us) for side_us in us)
            splits = "/".join(str(o.plan.num_splits) for o in ours)
            print(f"{b:3d} {kv:7d} {page:5d} {splits:>12} | {med[0]:7.1f} " + " ".join(f"{m:7.1f}" for m in med[1:])
                  + f" {cud:7.1f} | " + " ".join(f"{m / med[0]:6.3f}" for m in med[1:]) + f" {cud / med[0]:5.2f} | "
                  + f"{rounds} | {diff:.3g}", flush=True)
            del ours, graphs
            torch.cuda.empty_cache()
        del q, k, v, lens
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
