#!/usr/bin/env python3
"""Two builds of libflashattn (A: a baseline, B: a change) timed in one process on one GPU.

Kernel changes move the speed by a few percent, less than two separate runs of sdpa_compare.py
differ, so A and B are timed in turns within one process: each shape runs rounds of (A, B), each
timing a median of triton.testing.do_bench (CUDA events, after warm-up); the table gives each
side's median over the rounds, B/A, and cuDNN (SDPA's CUDNN_ATTENTION backend) once for scale.
Shapes follow the anchors: bf16, 16k tokens in total, hidden 2048. B's output is checked against
A's (they compute the same function, so they agree within rounding).

  python3 bench/ab_compare.py --lib-a base/libflashattn.so --lib-b build/libflashattn.so --d 64 --causal 1
  python3 bench/ab_compare.py ... --modes bwd   # the backward (default mode) instead
  python3 bench/ab_compare.py ... --modes bwd --deterministic   # the backward's deterministic mode
  python3 bench/ab_compare.py ... --softcap 30   # both sides with a logit soft-cap
"""
import argparse
import ctypes as C
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from anchor_sweep import add_sweep_args, flops, shapes
from flashattn_abi import BF16, F32, BackwardArgs, ForwardArgs, load, view


def median_ms(fn):
    return do_bench(fn, warmup=25, rep=150, return_mode="median")


class Problem:
    """One shape's tensors and the argument structs both libraries are called with."""

    def __init__(self, b, s, h, d, causal, deterministic=False, softcap=0.0):
        self.q, self.k, self.v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        self.out = torch.empty_like(self.q)
        self.lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        self.dout = torch.randn_like(self.q)
        self.dq, self.dk, self.dv = (torch.empty_like(x) for x in (self.q, self.k, self.v))
        self.fwd = ForwardArgs()
        self.fwd.struct_size = C.sizeof(ForwardArgs)
        for name in ("q", "k", "v", "out"):
            setattr(self.fwd, name, view(getattr(self, name), BF16))
        self.fwd.lse = view(self.lse, F32)
        self.fwd.options.causal = causal
        self.fwd.options.window_left = self.fwd.options.window_right = -1
        self.fwd.options.softcap = softcap
        self.fwd.options.stream = torch.cuda.current_stream().cuda_stream
        self.bwd = BackwardArgs()
        self.bwd.struct_size = C.sizeof(BackwardArgs)
        for name in ("dout", "q", "k", "v", "out", "dq", "dk", "dv"):
            setattr(self.bwd, name, view(getattr(self, name), BF16))
        self.bwd.lse = view(self.lse, F32)
        self.bwd.options = self.fwd.options
        self.bwd.deterministic = int(deterministic)


def runner(lib, prob, mode):
    if mode == "fwd":
        args, entry = C.byref(prob.fwd), lib.flashattn_forward
    else:
        args, entry = C.byref(prob.bwd), lib.flashattn_backward

    def run():
        if entry(args) != 0:
            raise RuntimeError(lib.flashattn_last_error().decode())

    return run


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib-a", required=True)
    p.add_argument("--lib-b", required=True)
    add_sweep_args(p, "2048,4096,8192,16384", lib=False)
    p.add_argument("--modes", default="fwd", help="fwd, bwd or fwd,bwd")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--deterministic", action="store_true", help="both sides' backward in deterministic mode "
                   "(cuDNN's column stays its default backward)")
    p.add_argument("--softcap", type=float, default=0.0, help="both sides with this logit soft-cap "
                   "(cuDNN's column stays without)")
    p.add_argument("--json")
    a = p.parse_args()
    libs = {"A": load(a.lib_a), "B": load(a.lib_b)}
    rows = []
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  cudnn {torch.backends.cudnn.version()}")
    print(f"A = {a.lib_a}\nB = {a.lib_b}" + ("\nbackward: deterministic mode" if a.deterministic else "")
          + (f"\nsoftcap {a.softcap}" if a.softcap else ""))
    print(f"{'mode':>4} {'d':>4} {'causal':>6} {'s':>6} | {'A':>6} {'B':>6} {'cudnn':>6} | {'B/A':>5} {'A/cud':>5} "
          f"{'B/cud':>5} | A rounds / B rounds (TFLOP/s)")
    for mode in a.modes.split(","):
        for d, causal, s, b, h in shapes(a):
            prob = Problem(b, s, h, d, causal, a.deterministic, a.softcap)
            work = flops(b, h, s, d, causal, mode)
            fwd = {k: runner(lib, prob, "fwd") for k, lib in libs.items()}
            run = fwd if mode == "fwd" else {k: runner(lib, prob, mode) for k, lib in libs.items()}
            tf = {"A": [], "B": []}
            for _ in range(a.rounds):
                for k in ("A", "B"):
                    if mode == "bwd":
                        fwd[k]()  # the backward reads this side's own out and lse
                    tf[k].append(work / median_ms(run[k]) / 1e9)
            # B computes what A computes: compare the outputs of one call each.
            outs = []
            for k in ("A", "B"):
                fwd[k]()
                if mode == "bwd":
                    run[k]()  # after its own forward, as in the timed rounds
                torch.cuda.synchronize()
                outs.append([x.clone() for x in ((prob.out,) if mode == "fwd" else (prob.dq, prob.dk, prob.dv))])
            diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(*outs))
            qt, kt, vt = (x.transpose(1, 2).contiguous().requires_grad_(mode == "bwd")
                          for x in (prob.q, prob.k, prob.v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
                if mode == "fwd":
                    cud = work / median_ms(fn) / 1e9
                else:
                    ref, g = fn(), torch.randn_like(qt)
                    cud = work / median_ms(lambda: ref.backward(g, retain_graph=True)) / 1e9
            ma, mb = statistics.median(tf["A"]), statistics.median(tf["B"])
            row = {"mode": mode, "d": d, "causal": bool(causal), "s": s, "b": b, "h": h, "A": tf["A"],
                   "B": tf["B"], "cudnn": cud, "max_abs_diff_a_b": diff,
                   "kernel_b": libs["B"].flashattn_last_gpu_kernel().decode()}
            rows.append(row)
            rounds = " ".join(f"{x:.0f}" for x in tf["A"]) + " / " + " ".join(f"{x:.0f}" for x in tf["B"])
            print(f"{mode:>4} {d:4d} {causal:6d} {s:6d} | {ma:6.0f} {mb:6.0f} {cud:6.0f} | {mb / ma:5.3f} "
                  f"{ma / cud:5.2f} {mb / cud:5.2f} | {rounds} | diff {diff:.3g}", flush=True)
            del prob, qt, kt, vt
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
