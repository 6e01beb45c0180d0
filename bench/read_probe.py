#!/usr/bin/env python3
"""How fast this GPU can merely read a buffer once, timed as the decode benchmarks time a step.

A decode step must read every byte of K and V at least once, so the time a kernel takes to do
nothing else with them (sum them into one number per program) bounds any decode kernel from below,
and cuDNN's time over it bounds the ratio to cuDNN that any decode kernel can reach on that row.
The reader is a Triton kernel, tried in a few shapes (a program per block, or a fixed grid looping
over blocks; block sizes; warps), each captured in a CUDA graph and timed by triton's do_bench
(an L2 flush before every replay, CUDA events, median), exactly as bench/decode_compare.py times
our graph replays; the fastest shape counts. With --cuda-lib (bench/read_probe.cu built as a shared
library), the shapes of a hand-written CUDA reader are tried too. decode_compare.py calls read_us()
for each row.

  python3 bench/read_probe.py --mb 33.5,134.2,536.9   # alone: every shape's time per size
"""
import argparse
import ctypes as C

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


_cuda_lib = None


def use_cuda_reader(path):
    """Adds the shapes of bench/read_probe.cu, built as the shared library at `path`."""
    global _cuda_lib
    _cuda_lib = C.CDLL(path)
    _cuda_lib.read_probe_launch.argtypes = [C.c_void_p, C.c_int64, C.c_void_p, C.c_int, C.c_int, C.c_int, C.c_void_p]


def _cuda_launch(x, out, blocks, threads, unroll):
    rc = _cuda_lib.read_probe_launch(x.data_ptr(), x.numel() * x.element_size(), out.data_ptr(), blocks, threads,
                                     unroll, C.c_void_p(torch.cuda.current_stream().cuda_stream))
    if rc != 0:
        raise RuntimeError(f"read_probe_launch: CUDA error {rc}")


def _shapes(n, sms):
    """(name, launch) of every reader shape tried; launch(x, out) enqueues one read of x. Small
    buffers favour many small programs (every SM has its loads in flight sooner), large ones larger
    programs; the persistent shapes keep one wave resident."""
    shapes = []
    for block, warps in ((2048, 2), (2048, 4), (4096, 4), (4096, 8), (8192, 4), (8192, 8), (16384, 8), (32768, 8)):
        grid = triton.cdiv(n, block)
        shapes.append((f"blocks {block}/{warps}w", lambda x, o, b=block, w=warps, g=grid:
                       _read_blocks[(g,)](x, o, n, BLOCK=b, num_warps=w)))
    for per_sm, block, warps in ((4, 4096, 4), (8, 4096, 4), (16, 2048, 4), (4, 8192, 8)):
        grid = min(sms * per_sm, triton.cdiv(n, block))
        shapes.append((f"strided {per_sm}/SM {block}/{warps}w", lambda x, o, b=block, w=warps, g=grid:
                       _read_strided[(g,)](x, o, n, BLOCK=b, num_warps=w)))
    if _cuda_lib is not None:
        # Whole waves of CTAs (2048 threads per SM), 4 or 8 vectors in flight per thread.
        for threads, per_sm, unroll in ((256, 8, 4), (256, 8, 8), (512, 4, 4), (512, 4, 8), (1024, 2, 8),
                                        (256, 4, 8)):
            shapes.append((f"cuda {per_sm}x{threads}/SM unroll {unroll}",
                           lambda x, o, t=threads, g=sms * per_sm, u=unroll: _cuda_launch(x, o, g, t, u)))
    return shapes


def read_us(x, every=None):
    """Fastest graph-replay time (us) over the reader shapes to read the bf16 tensor x once, and the
    shape's name; every shape's time goes into the dict `every` when given. Each shape first sums a
    tensor of ones of x's size, which must come to exactly its element count (every element read
    once; fp32 holds these partial counts exactly)."""
    flat = x.reshape(-1)
    n, sms = flat.numel(), torch.cuda.get_device_properties(0).multi_processor_count
    ones = torch.ones_like(flat)
    best = (float("inf"), "")
    for name, launch in _shapes(n, sms):
        out = torch.zeros(max(triton.cdiv(n, 2048), 16 * sms), device=x.device, dtype=torch.float32)
        launch(ones, out)  # also compiles, outside the capture
        if out.double().sum().item() != n:
            raise RuntimeError(f"read probe '{name}' counted {out.double().sum().item()} of {n} elements")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            launch(flat, out)
        us = 1e3 * do_bench(g.replay, warmup=25, rep=200, return_mode="median")
        if every is not None:
            every[name] = us
        best = min(best, (us, name))
    del ones
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", default="33.5,134.2,536.9,1073.7", help="buffer sizes in MB (1e6 bytes)")
    p.add_argument("--cuda-lib", help="bench/read_probe.cu built as a shared library: its shapes too")
    a = p.parse_args()
    if a.cuda_lib:
        use_cuda_reader(a.cuda_lib)
    print(torch.cuda.get_device_name())
    for mb in (float(s) for s in a.mb.split(",") if s):
        x = torch.randn(round(mb * 1e6 / 4096) * 2048, device="cuda", dtype=torch.bfloat16)  # whole 4 KB
        every = {}
        us, name = read_us(x, every)
        print(f"{mb:8.1f} MB  {us:7.1f} us  {x.numel() * 2 / us / 1e3:6.0f} GB/s  ({name}; all shapes: "
              + ", ".join(f"{k} {v:.1f}" for k, v in every.items()) + ")", flush=True)
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
