#!/usr/bin/env python3
"""How fast this GPU can merely read a buffer once, timed as the decode benchmarks time a step.

A decode step must read every byte of K and V at least once, so the time a kernel takes to do
nothing else with them (sum them into one number per program) bounds any decode kernel from below,
and cuDNN's time over it bounds the ratio to cuDNN that any decode kernel can reach on that row.
The reader is a Triton kernel, tried in a few shapes (a program per block, or a fixed grid looping
over blocks; block sizes; warps), each captured in a CUDA graph and timed by triton's do_bench
(an L2 flush before every replay, CUDA events, median), exactly as bench/decode_compare.py times
our graph replays; the fastest shape counts. decode_compare.py calls read_us() for each row.

  python3 bench/read_probe.py --mb 33.5,134.2,536.9   # alone: fastest read time per size
"""
import argparse

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def _read_blocks(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """One program per BLOCK elements (the hardware schedules the programs)."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + pid, tl.sum(x.to(tl.float32), axis=0))


@triton.jit
def _read_strided(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """A fixed grid; program p reads blocks p, p + grid, ... (a persistent reader)."""
    pid = tl.program_id(0)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(pid.to(tl.int64) * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def _shapes(n, sms):
    """(name, launch) of every reader shape tried; launch(x, out) enqueues one read of x."""
    shapes = []
    for block, warps in ((4096, 4), (8192, 8), (16384, 8)):
        grid = triton.cdiv(n, block)
        shapes.append((f"blocks {block}/{warps}w", lambda x, o, b=block, w=warps, g=grid:
                       _read_blocks[(g,)](x, o, n, BLOCK=b, num_warps=w)))
    for per_sm, block, warps in ((4, 4096, 4), (8, 4096, 4), (4, 8192, 8)):
        grid = min(sms * per_sm, triton.cdiv(n, block))
        shapes.append((f"strided {per_sm}/SM {block}/{warps}w", lambda x, o, b=block, w=warps, g=grid:
                       _read_strided[(g,)](x, o, n, BLOCK=b, num_warps=w)))
    return shapes


def read_us(x):
    """Fastest graph-replay time (us) over the reader shapes to read the bf16 tensor x once, and the
    shape's name. Each shape first sums a tensor of ones of x's size, which must come to exactly its
    element count (every element read once; fp32 holds these partial counts exactly)."""
    flat = x.reshape(-1)
    n, sms = flat.numel(), torch.cuda.get_device_properties(0).multi_processor_count
    ones = torch.ones_like(flat)
    best = (float("inf"), "")
    for name, launch in _shapes(n, sms):
        out = torch.zeros(triton.cdiv(n, 4096), device=x.device, dtype=torch.float32)
        launch(ones, out)  # also compiles, outside the capture
        if out.double().sum().item() != n:
            raise RuntimeError(f"read probe '{name}' counted {out.double().sum().item()} of {n} elements")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            launch(flat, out)
        us = 1e3 * do_bench(g.replay, warmup=25, rep=200, return_mode="median")
        best = min(best, (us, name))
    del ones
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", default="33.5,134.2,536.9,1073.7", help="buffer sizes in MB (1e6 bytes)")
    a = p.parse_args()
    print(torch.cuda.get_device_name())
    for mb in (float(s) for s in a.mb.split(",") if s):
        x = torch.randn(int(mb * 1e6) // 2, device="cuda", dtype=torch.bfloat16)
        us, name = read_us(x)
        print(f"{mb:8.1f} MB  {us:7.1f} us  {x.numel() * 2 / us / 1e3:6.0f} GB/s  ({name})", flush=True)
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
