#!/usr/bin/env python3
"""Our GPU kernels beside PyTorch SDPA's backends, in one process on one GPU.

Calls libflashattn through its C ABI (ctypes), so nothing needs building beyond the library.
Shapes follow the anchors (shared/anchors/README.md) and the FlashAttention-3 paper: bf16, 16k
tokens in total (batch = tokens // seqlen), hidden 2048 (heads = 2048 // d). Forward FLOPs are
4*b*h*s*s*d, halved when causal; backward FLOPs are 2.5x that. Times are medians of
triton.testing.do_bench (CUDA events, after warm-up). With --rounds N every timing of a shape is
taken N times in turns (ours, then FlashAttention-2, then cuDNN, round after round) and each
figure is the median of its N: one timing of each varied by a few percent from run to run on the
H200, as much as the gaps the ratios are read for. Each shape's forward output is also checked
against SDPA's. --modes fwd,bwd adds the backward: ours (default and deterministic) beside SDPA's
out.backward(), and the largest difference between our dq, dk, dv and SDPA's (FlashAttention-2).

  python3 bench/sdpa_compare.py --lib build/libflashattn.so
  python3 bench/sdpa_compare.py --lib build/libflashattn.so --d 128 --s 2048,8192 --json out.json
  python3 bench/sdpa_compare.py --lib build/libflashattn.so --modes fwd,bwd --rounds 3
"""
import argparse
import contextlib
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
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sweep_args(p, "512,1024,2048,4096,8192,16384")
    p.add_argument("--modes", default="fwd", help="fwd or fwd,bwd")
    p.add_argument("--rounds", type=int, default=1, help="timings per figure, taken in turns; the median is shown")
    p.add_argument("--json")
    a = p.parse_args()
    lib = load(a.lib)
    bwd = "bwd" in a.modes.split(",")
    rows = []
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  cudnn {torch.backends.cudnn.version()}")
    print(f"{'d':>4} {'causal':>6} {'s':>6} | {'ours':>6} {'fa2':>6} {'cudnn':>6} | {'/fa2':>5} {'/cudnn':>6} | max|ours-sdpa|"
          + (" || bwd ours  det   fa2 cudnn |  /fa2 /cudnn det/ours | max|ours-sdpa|" if bwd else ""))
    for d, causal, s, b, h in shapes(a):
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        out = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        args = ForwardArgs()
        args.struct_size = C.sizeof(ForwardArgs)
        args.q, args.k, args.v, args.out = view(q, BF16), view(k, BF16), view(v, BF16), view(out, BF16)
        args.lse = view(lse, F32)
        args.options.causal = causal
        args.options.window_left = args.options.window_right = -1
        args.options.stream = torch.cuda.current_stream().cuda_stream
        ref_args = C.byref(args)

        def ours():
            rc = lib.flashattn_forward(ref_args)
            if rc != 0:
                raise RuntimeError(lib.flashattn_last_error().decode())

        fwd_flops = flops(b, h, s, d, causal)
        row = {"d": d, "causal": bool(causal), "s": s, "b": b, "h": h}
        # Figure name -> (function, FLOPs, SDPA backend or None); timed in this order, round after
        # round, SDPA's inside its backend's context.
        timed = {"ours": (ours, fwd_flops, None)}
        ours()
        row["kernel"] = lib.flashattn_last_gpu_kernel().decode()
        if bwd:
            g = torch.randn_like(q)
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            bargs = BackwardArgs()
            bargs.struct_size = C.sizeof(BackwardArgs)
            for name, t, code in (("dout", g, BF16), ("q", q, BF16), ("k", k, BF16), ("v", v, BF16),
                                  ("out", out, BF16), ("lse", lse, F32), ("dq", dq, BF16), ("dk", dk, BF16),
                                  ("dv", dv, BF16)):
                setattr(bargs, name, view(t, code))
            bargs.options = args.options
            ref_bargs = C.byref(bargs)

            det_bargs = BackwardArgs.from_buffer_copy(bargs)
            det_bargs.deterministic = 1
            ref_det_bargs = C.byref(det_bargs)

            def ours_bwd(ref=ref_bargs):
                if lib.flashattn_backward(ref) != 0:
                    raise RuntimeError(lib.flashattn_last_error().decode())

            ours_bwd()
            row["bwd_kernel"] = lib.flashattn_last_gpu_kernel().decode()
            timed["ours_bwd"] = (ours_bwd, 2.5 * fwd_flops, None)
            timed["ours_bwd_det"] = (lambda: ours_bwd(ref_det_bargs), 2.5 * fwd_flops, None)
        qt, kt, vt = (x.transpose(1, 2).contiguous().requires_grad_(bwd) for x in (q, k, v))
        for name, backend in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
            except RuntimeError as e:
                row[name + "_error"] = str(e).splitlines()[0][:160]
                continue
            sdpa = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
            timed[name] = (sdpa, fwd_flops, backend)
            if bwd:
                gt = torch.randn_like(ref)
                timed[name + "_bwd"] = (lambda ref=ref, gt=gt: ref.backward(gt, retain_graph=True), 2.5 * fwd_flops,
                                        backend)
        samples = {key: [] for key in timed}
        for _ in range(max(1, a.rounds)):
            for key, (fn, n, backend) in timed.items():
                with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                    samples[key].append(n / median_ms(fn) / 1e9)
        for key, xs in samples.items():
            row[key] = statistics.median(xs)
        # Our output (and gradients, for the same dO) beside SDPA's FlashAttention-2 backend.
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
        if bwd:
            ours_bwd()
            grads = torch.autograd.grad(ref, (qt, kt, vt), g.transpose(1, 2))
            row["bwd_max_abs_diff_vs_sdpa"] = max(
                (ours_g.float() - ref_g.transpose(1, 2).float()).abs().max().item()
                for ours_g, ref_g in zip((dq, dk, dv), grads))
        ours()
        torch.cuda.synchronize()
        row["max_abs_diff_vs_sdpa"] = (out.float() - ref.detach().transpose(1, 2).float()).abs().max().item()
        rows.append(row)
        f = lambda key: f"{row[key]:6.0f}" if key in row else "     -"
        r = lambda num, key: f"{row[num] / row[key]:5.2f}" if key in row and num in row else "    -"
        line = (f"{d:4d} {causal:6d} {s:6d} | {f('ours')} {f('fa2')} {f('cudnn')} | {r('ours', 'fa2')} "
                f"{r('ours', 'cudnn'):>6} | {row['max_abs_diff_vs_sdpa']:.3g} {row['kernel'].split(' hdim')[0]}")
        if bwd:
            line += (f" || {f('ours_bwd')} {f('ours_bwd_det')} {f('fa2_bwd')} {f('cudnn_bwd')} | "
                     f"{r('ours_bwd', 'fa2_bwd')} {r('ours_bwd', 'cudnn_bwd'):>6} {r('ours_bwd_det', 'ours_bwd'):>8} | "
                     f"{row['bwd_max_abs_diff_vs_sdpa']:.3g} {row['bwd_kernel'].split(' hdim')[0]}")
        print(line, flush=True)
        del q, k, v, out, lse, qt, kt, vt
        torch.cuda.empty_cache()
        # Rewritten after every shape, so that a run cut short (a device call's time limit) keeps its rows.
        if a.json:
            with open(a.json, "w") as fh:
                json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, fh,
                          indent=1)


if __name__ == "__main__":
    main()
