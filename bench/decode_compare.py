#!/usr/bin/env python3
"""Our GPU decode beside PyTorch SDPA's cuDNN and FlashAttention-2 backends, in one process.

The anchors' decode rows (shared/anchors/README.md): bf16, 32 query heads sharing 8 KV heads,
d = 128, one new token per sequence, (batch, kv length) = (1, 8192), (1, 32768), (1, 131072),
(8, 32768), (64, 4096); ours on a contiguous cache and on paged caches (pages of 16 and 256 tokens,
scattered in a shuffled order), and optionally ('h' in --pages) on SDPA's own memory layout, each
KV head's keys contiguous, passed to us as a strided cache view; --splits adds rows with the split
count forced, to check the automatic choice. GB/s = bytes of K and V read / median time (triton do_bench, CUDA
events). The device copy bandwidth is measured in the same run (bytes read + written, as in
the anchors), so every figure can be read against it, and so is, per row, the time of a bare read
of as many bytes (bench/read_probe.py, graph replays timed the same way): cuDNN's time over it is
the highest ratio to cuDNN that any decode kernel could reach on that row (column cdn/read).

Ours is timed two ways through the C ABI (ctypes): `run` calls flashattn_decode_run on a plan
(host checks of shapes and pointers on every call, no host sync), `graph` replays that call
captured in a CUDA graph (what an inference engine does; no host work per step). Each row's
output is checked against SDPA's.

  python3 bench/decode_compare.py --lib build/libflashattn.so --json decode.json
"""
import argparse
import ctypes as C
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from flashattn_abi import BF16, I32, DecodeArgs, DecodePlan, load, view
from read_probe import read_us, use_cuda_reader

ROWS = ((1, 8192), (1, 32768), (1, 131072), (8, 32768), (64, 4096))
HQ, HK, D = 32, 8, 128  # query heads, KV heads, head dim of every row


def median_ms(fn):
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def floor_us():
    """The timing floor of this method: one graph replay of a one-element kernel (launch, events)."""
    z = torch.zeros(1, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        z.add_(1)
    return 1e3 * median_ms(g.replay)


def copy_gbps():
    x = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    gbps = 2 * x.numel() * 2 / median_ms(lambda: y.copy_(x)) / 1e6
    del x, y
    torch.cuda.empty_cache()
    return gbps


class Ours:
    """A planned decode step over a cache: contiguous when page == 0, paged with `page` tokens per
    page, or page == "h": contiguous with each KV head's keys together (kt, vt: [b, hk, kv, d])."""

    def __init__(self, lib, q, k, v, lens, page, splits=0, kt=None, vt=None):
        b, kv, hk, d = k.shape
        self.lib, self.keep = lib, []
        a = DecodeArgs()
        a.struct_size = C.sizeof(DecodeArgs)
        a.num_splits = splits
        if page == "h":
            a.k_cache, a.v_cache = view(kt.transpose(1, 2), BF16), view(vt.transpose(1, 2), BF16)
        elif page:  # pages of `page` tokens in a shuffled order: the cache as an allocator leaves it
            per_seq = kv // page
            perm = torch.randperm(b * per_seq, device="cuda")
            kp, vp = (torch.empty(b * per_seq, page, hk, d, device="cuda", dtype=k.dtype) for _ in range(2))
            kp[perm] = k.reshape(b * per_seq, page, hk, d)
            vp[perm] = v.reshape(b * per_seq, page, hk, d)
            table = perm.to(torch.int32).reshape(b, per_seq)
            self.keep += [kp, vp, table]
            a.k_cache, a.v_cache, a.block_table = view(kp, BF16), view(vp, BF16), view(table, I32)
        else:
            a.k_cache, a.v_cache = view(k, BF16), view(v, BF16)
        self.out = torch.empty_like(q)
        self.keep += [q, lens, self.out]
        a.q, a.cache_seqlens, a.out = view(q, BF16), view(lens, I32), view(self.out, BF16)
        a.options.window_left = a.options.window_right = -1
        a.options.stream = torch.cuda.current_stream().cuda_stream
        self.args = a
        self.plan = DecodePlan()
        self.plan.struct_size = C.sizeof(DecodePlan)
        self.check(lib.flashattn_plan_decode(C.byref(a), 0, C.byref(self.plan)))
        self.ws = torch.empty(max(self.plan.workspace_bytes, 256), device="cuda", dtype=torch.uint8)

    def check(self, rc):
        if rc != 0:
            raise RuntimeError(self.lib.flashattn_last_error().decode())

    def run(self):
        self.check(self.lib.flashattn_decode_run(C.byref(self.args), C.byref(self.plan), C.c_void_p(self.ws.data_ptr())))

    def graph(self):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.args.options.stream = torch.cuda.current_stream().cuda_stream
            self.run()
        self.args.options.stream = torch.cuda.current_stream().cuda_stream
        return g

    def status(self):
        faults, first = C.c_uint32(0), C.c_int64(0)
        self.check(self.lib.flashattn_decode_status(C.byref(self.plan), C.c_void_p(self.ws.data_ptr()), None,
                                                    C.byref(faults), C.byref(first)))
        return faults.value


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", default="build/libflashattn.so")
    p.add_argument("--pages", default="0,16,256",
                   help="cache layouts: 0 = contiguous, h = contiguous per KV head (SDPA's layout), else tokens per page")
    p.add_argument("--splits", default="", help="split counts to force in extra rows (default: the automatic choice only)")
    p.add_argument("--rows", default=",".join(f"{b}x{kv}" for b, kv in ROWS), help="BATCHxKV,... (default: the anchors)")
    p.add_argument("--no-sdpa", action="store_true", help="ours only (e.g. under a profiler)")
    p.add_argument("--no-read", action="store_true", help="skip the bare-read bound (bench/read_probe.py)")
    p.add_argument("--read-lib", help="bench/read_probe.cu built as a shared library: its readers join the bound")
    p.add_argument("--json")
    a = p.parse_args()
    lib = load(a.lib)
    if a.read_lib:
        use_cuda_reader(a.read_lib)
    pages = [x if x == "h" else int(x) for x in a.pages.split(",") if x]
    forced = [int(x) for x in a.splits.split(",") if x]
    rows = [tuple(int(v) for v in r.split("x")) for r in a.rows.split(",") if r]
    copy = 0.0 if a.no_sdpa else copy_gbps()
    floor = floor_us()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
           "copy_GBps_rw": copy, "floor_us": floor, "hq": HQ, "hk": HK, "d": D, "rows": []}
    print(f"{res['device']}  torch {res['torch']}  cudnn {res['cudnn']}  copy {copy:.0f} GB/s (read+write)"
          f"  floor {floor:.1f} us (graph of one tiny kernel)")
    print(f"{'b':>3} {'kv':>7} {'page':>5} {'splits':>6} | {'run':>6} {'graph':>6} | {'cudnn':>6} {'fa2':>6} |"
          f" {'graph/cudnn':>11} {'graph/copy':>10} | {'us':>6} {'cdn_us':>6} {'read':>6} {'cdn/read':>8} | max|ours-sdpa|" + ("   (* = splits forced)" if forced else ""))
    for b, kv in rows:
        q = torch.randn(b, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, kv, HK, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        lens = torch.full((b,), kv, device="cuda", dtype=torch.int32)
        nbytes = 2 * k.numel() * 2
        # SDPA takes [b, heads, tokens, d]; the same values, laid out its way.
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        sdpa = {}
        ref = None
        for name, backend in () if a.no_sdpa else (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    fn = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
                    ref = fn() if ref is None else ref
                    sdpa[name] = nbytes / median_ms(fn) / 1e6
            except RuntimeError as e:
                sdpa[name + "_error"] = str(e).splitlines()[0][:160]
        if "h" not in pages:
            del kt, vt
            kt = vt = None
        torch.cuda.empty_cache()
        if not a.no_read:
            both = torch.empty(2 * k.numel(), device="cuda", dtype=k.dtype).normal_()  # as many bytes as K and V
            t_us, sdpa["read_shape"] = read_us(both)
            sdpa["read_GBps"] = nbytes / t_us / 1e3
            del both
            torch.cuda.empty_cache()
        for page, splits in [(page, 0) for page in pages] + [(pages[0], s) for s in forced]:
            try:
                ours = Ours(lib, q, k, v, lens, page, splits, kt, vt)
            except RuntimeError as e:
                print(f"{b:3d} {kv:7d} {page!s:>5} {splits:6d} | {str(e).splitlines()[0][:120]}", flush=True)
                continue
            row = {"b": b, "kv": kv, "page": page, "splits": ours.plan.num_splits, "forced_splits": splits > 0, **sdpa}
            row["run_GBps"] = nbytes / median_ms(ours.run) / 1e6
            try:
                g = ours.graph()
                row["graph_GBps"] = nbytes / median_ms(g.replay) / 1e6
            except RuntimeError as e:
                row["graph_error"] = str(e).splitlines()[0][:160]
            ours.out.fill_(float("nan"))
            ours.run()
            torch.cuda.synchronize()
            row["faults"] = ours.status()
            if ref is not None:
                row["max_abs_diff_vs_sdpa"] = (ours.out.float() - ref.transpose(1, 2).float()).abs().max().item()
            res["rows"].append(row)
            f = lambda key: f"{row[key]:6.0f}" if key in row else "     -"
            r = lambda num, den: (f"{num / den:.2f}" if num and den else "-")
            us = lambda key: f"{nbytes / row[key] / 1e3:6.1f}" if row.get(key) else "     -"
            print(f"{b:3d} {kv:7d} {page!s:>5} {row['splits']:5d}{'*' if splits else ' '} | {f('run_GBps')} {f('graph_GBps')} | {f('cudnn')}"
                  f" {f('fa2')} | {r(row.get('graph_GBps'), row.get('cudnn')):>11} {r(row.get('graph_GBps'), copy):>10}"
                  f" | {us('graph_GBps')} {us('cudnn')} {us('read_GBps')} {r(row.get('read_GBps'), row.get('cudnn')):>8}"
                  f" | {row.get('max_abs_diff_vs_sdpa', float('nan')):.3g}" + (f"  FAULTS {row['faults']}" if row["faults"] else ""),
                  flush=True)
            del ours
            torch.cuda.empty_cache()
        del q, k, v, qt, kt, vt, lens, ref
        torch.cuda.empty_cache()
        # Rewritten after every row, so that a run cut short keeps what it measured.
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
