#!/usr/bin/env python3
"""The CPU engine beside PyTorch's own CPU attention (F.scaled_dot_product_attention on CPU tensors,
its fused flash kernel), in one process: forward and forward + backward, then decoding (one new
token per sequence against a KV cache: our flash_attn_with_kvcache beside SDPA with enable_gqa on
the cache, GB/s of K and V read).

Rounds alternate ours and PyTorch's, each timing one call after one untimed call; the table gives
the medians and PyTorch's time over ours (above 1: ours is faster). Ours runs on every core (the
package's default) and PyTorch keeps its own setting (one thread per core) unless --threads sets
its thread count (which made its short calls slower here, even set to the count it had). GFLOP/s counts
4·b·h·s²·d for the forward, half when causal, and 3.5 times that for forward + backward (the
backward's 2.5). fp32 unless --dtype says bf16 or fp16 (on a CPU with AMX both libraries then run
their bf16 tile kernels for bf16; ours runs fp16 on them too, as bf16 halves); layouts as each
library wants them: ours [b, s, h, d], PyTorch's [b, h, s, d]. --shapes "" leaves the forward and
backward table out.

  python3 bench/cpu_torch_compare.py
  python3 bench/cpu_torch_compare.py --dtype bf16 --decode ""
  FLASHATTN_CPU_KERNEL=avx2 python3 bench/cpu_torch_compare.py   # our engine capped at AVX2
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import flashattn


def timed(fn):
    fn()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=0,
                    help="PyTorch's thread count; 0 (the default) leaves PyTorch's own setting alone")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--no-backward", action="store_true", help="time the forward alone")
    ap.add_argument("--our-layout", choices=["bshd", "bhsd"], default="bshd",
                    help="memory order of our inputs: FlashAttention's [b, s, h, d] (default), or PyTorch's "
                         "[b, h, s, d] tensors passed as strided [b, s, h, d] views")
    ap.add_argument("--shapes", default="1,16,2048,128,0;1,16,2048,128,1;1,16,2048,64,1;4,8,1024,64,0",
                    help="b,h,s,d,causal;...")
    ap.add_argument("--decode", default="1,8192;8,4096;1,32768",
                    help="b,kv;... (32 query heads on 8 KV heads, d = 128; empty: none)")
    args = ap.parse_args()
    # Calling torch.set_num_threads, even with the count PyTorch already had, made its short calls up
    # to 1.7x slower on a 2-core VM (one decode step over 16 cached keys: 15 -> 27 us), so by default
    # PyTorch keeps its own setting (one thread per core, as ours).
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads"
          f"{' (set)' if args.threads > 0 else ' (its own setting)'}, flashattn {flashattn.__version__} "
          f"({flashattn.build_info()['cpu_kernel']} kernels), {args.dtype}, medians of {args.rounds} rounds, "
          f"ours on {args.our_layout}")
    dtype = DTYPES[args.dtype]
    if args.shapes:
        print("  b   h     s    d causal | fwd ours  torch  ratio | fwd+bwd ours  torch  ratio | GFLOP/s fwd, fwd+bwd (ours)")
    for shape in filter(None, args.shapes.split(";")):
        b, h, s, d, causal = (int(x) for x in shape.split(","))
        causal = bool(causal)
        q, k, v = (torch.randn(b, s, h, d, dtype=dtype, requires_grad=True) for _ in range(3))
        qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
        if args.our_layout == "bhsd":
            q, k, v = (x.detach().transpose(1, 2).requires_grad_() for x in (qt, kt, vt))
        g = torch.randn(b, s, h, d, dtype=dtype)
        gt = g.transpose(1, 2).contiguous()
        with torch.no_grad():
            ours_out = flashattn.flash_attn_func(q, k, v, causal=causal)
            ref_out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
        diff = (ours_out.float() - ref_out.float()).abs().max().item()
        fwd = {"ours": [], "torch": []}
        both = {"ours": [], "torch": []}
        for _ in range(args.rounds):
            with torch.no_grad():
                fwd["ours"].append(timed(lambda: flashattn.flash_attn_func(q, k, v, causal=causal)))
                fwd["torch"].append(timed(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)))
            if args.no_backward:
                continue
            both["ours"].append(timed(lambda: torch.autograd.grad(
                flashattn.flash_attn_func(q, k, v, causal=causal), (q, k, v), g)))
            both["torch"].append(timed(lambda: torch.autograd.grad(
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), (qt, kt, vt), gt)))
        f_o, f_t = statistics.median(fwd["ours"]), statistics.median(fwd["torch"])
        b_o, b_t = (statistics.median(both[x]) if both[x] else float("nan") for x in ("ours", "torch"))
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        print(f"{b:3d} {h:3d} {s:5d} {d:4d} {int(causal):6d} | {f_o * 1e3:8.1f} {f_t * 1e3:6.1f} {f_t / f_o:6.2f} | "
              f"{b_o * 1e3:12.1f} {b_t * 1e3:6.1f} {b_t / b_o:6.2f} | {flops / f_o / 1e9:.0f}, "
              f"{3.5 * flops / b_o / 1e9:.0f}   max|out diff| {diff:.1e}")
    if args.decode:
        decode(args)


def decode(args):
    dtype = DTYPES[args.dtype]
    print(f"decode: 32 query heads on 8 KV heads, d = 128, one new token, {args.dtype}")
    print("  b     kv | ours ms  torch ms  ratio | GB/s ours  torch   max|out diff|")
    for shape in filter(None, args.decode.split(";")):
        b, kv = (int(x) for x in shape.split(","))
        q = torch.randn(b, 1, 32, 128, dtype=dtype)
        k_cache, v_cache = torch.randn(b, kv, 8, 128, dtype=dtype), torch.randn(b, kv, 8, 128, dtype=dtype)
        lens = torch.full((b,), kv, dtype=torch.int32)
        qt, kt, vt = q.transpose(1, 2), k_cache.transpose(1, 2).contiguous(), v_cache.transpose(1, 2).contiguous()
        ours_fn = lambda: flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens)  # noqa: E731
        ref_fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)  # noqa: E731
        diff = (ours_fn() - ref_fn().transpose(1, 2)).abs().max().item()
        rounds = {"ours": [], "torch": []}
        for _ in range(4 * args.rounds):
            rounds["ours"].append(timed(ours_fn))
            rounds["torch"].append(timed(ref_fn))
        o, t = statistics.median(rounds["ours"]), statistics.median(rounds["torch"])
        gb = 2 * b * kv * 8 * 128 * k_cache.element_size() / 1e9
        print(f"{b:3d} {kv:6d} | {o * 1e3:7.2f} {t * 1e3:9.2f} {t / o:6.2f} | {gb / o:9.1f} {gb / t:6.1f}   {diff:.1e}")


if __name__ == "__main__":
    main()
