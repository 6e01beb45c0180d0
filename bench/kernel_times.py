#!/usr/bin/env python3
"""Where one call's GPU time goes: every kernel (and memset) of our backward or forward beside
cuDNN's (PyTorch SDPA's CUDNN_ATTENTION backend; --against fa2: its FLASH_ATTENTION backend,
FlashAttention-2), for one shape, from the PyTorch profiler (CUPTI's device timestamps of each
kernel as it ran, no replay).

For each side, `--calls` calls run after warm-up under the profiler; the table lists each kernel's
device time per call (mean over the calls) and their sum. SDPA's backward through autograd adds
the gradients into .grad (elementwise add kernels), which the anchors' timing includes; they are
listed. Shapes follow the anchors: bf16, 16k tokens in total, hidden 2048.

  python3 bench/kernel_times.py --lib build/libflashattn.so --d 64 --s 2048 --causal 1 --mode bwd
  FLASHATTN_GPU_BACKWARD=portable python3 bench/kernel_times.py ... --against fa2   # the portable path
  ncu --profile-from-start off ... python3 bench/kernel_times.py ... --calls 0   # counters instead
  python3 bench/kernel_times.py ... --timeline   # also one call's kernels on a time axis (overlaps)
  python3 bench/kernel_times.py ... --deterministic   # our backward's deterministic mode
"""
import argparse
import collections

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from ab_compare import Problem, runner
from anchor_sweep import add_sweep_args, flops, shapes
from flashattn_abi import load


def device_events(prof):
    """The profiler's device-side events (kernels, memsets, copies), in start order."""
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(evs, key=lambda e: e.time_range.start)


def profile_calls(fn, calls):
    """Device time per call of each kernel fn launches (mean over `calls` profiled calls)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    if calls == 0:
        # Under ncu, which takes CUPTI for itself: one call after the warm-up inside the CUDA
        # profiler's range, which `ncu --profile-from-start off` profiles (every kernel of that
        # call, none of the warm-up's).
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        return {}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per_kernel = collections.OrderedDict()
    for e in device_events(prof):
        per_kernel.setdefault(e.name, []).append(e.time_range.end - e.time_range.start)
    return per_kernel


def print_timeline(fn):
    """One call's device events as start .. end in us from the first one's start: the gaps between
    kernels, and kernels that overlap, show here, where the per-kernel times above cannot."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    evs = device_events(prof)
    if not evs:
        return
    t0 = evs[0].time_range.start
    for e in evs:
        print(f"    {e.time_range.start - t0:9.1f} .. {e.time_range.end - t0:9.1f} us  {e.name[:100]}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sweep_args(p, "2048", head_dims="128")
    p.add_argument("--mode", default="bwd", choices=("fwd", "bwd"))
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--against", default="cudnn", choices=("cudnn", "fa2"))
    p.add_argument("--timeline", action="store_true", help="also print one call of ours on a time axis")
    p.add_argument("--deterministic", action="store_true", help="our backward in deterministic mode")
    a = p.parse_args()
    lib = load(a.lib)
    for d, causal, s, b, h in shapes(a):
        prob = Problem(b, s, h, d, causal, deterministic=a.deterministic)
        work = flops(b, h, s, d, causal, a.mode)
        runner(lib, prob, "fwd")()
        ours = runner(lib, prob, a.mode)
        qt, kt, vt = (x.transpose(1, 2).contiguous().requires_grad_(a.mode == "bwd") for x in (prob.q, prob.k, prob.v))
        backend = SDPBackend.CUDNN_ATTENTION if a.against == "cudnn" else SDPBackend.FLASH_ATTENTION
        with sdpa_kernel(backend):
            fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
            if a.mode == "fwd":
                theirs = fn
            else:
                ref, g = fn(), torch.randn_like(qt)
                theirs = lambda: ref.backward(g, retain_graph=True)
            sides = {"ours": profile_calls(ours, a.calls), a.against: profile_calls(theirs, a.calls)}
        print(f"\n{a.mode} d={d} causal={causal} s={s} b={b} h={h}")
        for side, per_kernel in sides.items():
            if not per_kernel:  # --calls 0 (under ncu): nothing profiled here
                continue
            total = sum(sum(v) for v in per_kernel.values()) / a.calls
            print(f"  {side}: kernels {total:8.1f} us per call ({work / total / 1e6:6.0f} TFLOP/s over their sum)")
            for name, times in per_kernel.items():
                print(f"    {sum(times) / a.calls:8.1f} us  x{len(times) / a.calls:4.1f}  {name[:110]}")
        if a.timeline:
            print("  ours, one call on a time axis:")
            print_timeline(ours)
        del prob, qt, kt, vt
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
