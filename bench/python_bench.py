#!/usr/bin/env python3
"""flashattn (the Python package) beside PyTorch SDPA's backends and standard attention, in one
process on one GPU: a CSV of TFLOP/s and PNG charts like FlashAttention's README.

Shapes follow the anchors (shared/anchors/README.md) and the FlashAttention-3 paper: bf16, 16k
tokens in total (batch = tokens // seqlen), hidden 2048 (heads = hidden // d), d in {64, 128, 256},
causal and not, seqlen 512 .. 16k. Forward FLOPs are 4*b*h*s*s*d, halved when causal; backward
FLOPs are 2.5x the forward's. Times are medians of triton.testing.do_bench (CUDA events, after
warm-up, L2 flushed between runs), as in the anchors. Each row also records max |ours - SDPA| of
the forward output, so a fast wrong kernel shows.

Methods: ours (flashattn.flash_attn_func), fa2 / cudnn / eff (SDPA's FLASH_ATTENTION,
CUDNN_ATTENTION, EFFICIENT_ATTENTION backends) and math (SDPA's MATH backend: standard attention,
which materializes the score matrix; it runs out of memory at long sequences, recorded as such).

  python3 bench/python_bench.py                                  # full sweep, fwd and bwd, CSV + charts
  python3 bench/python_bench.py --d 128 --s 2048,8192 --modes fwd
  python3 bench/python_bench.py --plot-only bench/results/python_bench/results.csv --label "NVIDIA H200, ..."

--label goes into every chart's title (the GPU, the date, the commit measured); without it a
measuring run writes the GPU's name and the torch version there.
"""
import argparse
import csv
import os
import time

from anchor_sweep import flops, ints

METHODS = ["ours", "fa2", "cudnn", "eff", "math"]
COLORS = {"ours": "#d62728", "fa2": "#1f77b4", "cudnn": "#2ca02c", "eff": "#9467bd", "math": "#7f7f7f"}
LABELS = {"ours": "flashattn (ours)", "fa2": "SDPA FLASH_ATTENTION (FA2)", "cudnn": "SDPA CUDNN_ATTENTION",
          "eff": "SDPA EFFICIENT_ATTENTION", "math": "SDPA MATH (standard attention)"}
FIELDS = ["d", "causal", "seqlen", "batch", "heads", "method", "mode", "ms", "tflops", "max_abs_diff_vs_sdpa",
          "error"]


def measure(d, causal, s, tokens, hidden, modes, methods, warmup=25, rep=200):
    """Rows (dicts of FIELDS) for one shape: every method, forward and (optionally) backward."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    import flashattn

    b, h = max(1, tokens // s), hidden // d
    backends = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "eff": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    # Each side gets its native layout: ours [b, s, h, d], SDPA [b, h, s, d]; the same values.
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    q_s, k_s, v_s = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    for x in (q, k, v, q_s, k_s, v_s):
        x.requires_grad_(True)
    calls = {"ours": lambda: flashattn.flash_attn_func(q, k, v, causal=causal)}
    for name, backend in backends.items():
        def sdpa(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q_s, k_s, v_s, is_causal=causal).transpose(1, 2)
        calls[name] = sdpa

    rows, outputs = [], {}
    base = {"d": d, "causal": int(causal), "seqlen": s, "batch": b, "heads": h}
    for name in methods:
        for mode in modes:
            row = dict(base, method=name, mode=mode)
            try:
                if mode == "fwd":
                    with torch.no_grad():
                        outputs[name] = calls[name]()
                        ms = do_bench(calls[name], warmup=warmup, rep=rep, return_mode="median")
                else:
                    out = calls[name]()
                    g = torch.randn_like(out)
                    ms = do_bench(lambda out=out, g=g: out.backward(g, retain_graph=True), warmup=warmup, rep=rep,
                                  return_mode="median", grad_to_none=[q, k, v, q_s, k_s, v_s])
                    del out, g
                row.update(ms=ms, tflops=flops(b, h, s, d, causal, mode) / ms / 1e9)
            except (RuntimeError, NotImplementedError) as e:  # an unsupported shape, or out of memory
                row["error"] = str(e).splitlines()[0][:200]
            torch.cuda.empty_cache()
            rows.append(row)
    sdpa_ref = next((outputs[n] for n in ("fa2", "cudnn", "eff", "math") if n in outputs), None)
    if "ours" in outputs and sdpa_ref is not None:
        diff = (outputs["ours"].float() - sdpa_ref.float()).abs().max().item()
        for row in rows:
            if row["method"] == "ours" and row["mode"] == "fwd":
                row["max_abs_diff_vs_sdpa"] = diff
    return rows


def plot(rows, out_dir, label=""):
    """One PNG per (mode, causal): a panel per head dim, grouped bars of TFLOP/s per seqlen; `label`
    (the GPU, date, commit) is the title's second line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    ok = [r for r in rows if r.get("tflops") not in (None, "")]
    for mode in ("fwd", "bwd"):
        for causal in (0, 1):
            sel = [r for r in ok if r["mode"] == mode and int(r["causal"]) == causal]
            if not sel:
                continue
            dims = sorted({int(r["d"]) for r in sel})
            fig, axes = plt.subplots(1, len(dims), figsize=(6 * len(dims), 4.5), squeeze=False)
            for ax, d in zip(axes[0], dims):
                here = [r for r in sel if int(r["d"]) == d]
                seqlens = sorted({int(r["seqlen"]) for r in here})
                methods = [m for m in METHODS if any(r["method"] == m for r in here)]
                width = 0.8 / len(methods)
                for i, m in enumerate(methods):
                    vals = {int(r["seqlen"]): float(r["tflops"]) for r in here if r["method"] == m}
                    xs = [j + (i - (len(methods) - 1) / 2) * width for j, s in enumerate(seqlens) if s in vals]
                    ys = [vals[s] for s in seqlens if s in vals]
                    bars = ax.bar(xs, ys, width, label=LABELS[m], color=COLORS[m])
                    ax.bar_label(bars, fmt="%.0f", fontsize=6, rotation=90, padding=2)
                    failed = {int(r["seqlen"]) for r in rows if r.get("error") and r["method"] == m
                              and r["mode"] == mode and int(r["causal"]) == causal and int(r["d"]) == d}
                    for j, s in enumerate(seqlens):  # a point that did not run (out of memory, unsupported)
                        if s in failed:
                            ax.text(j + (i - (len(methods) - 1) / 2) * width, 2, "n/a", rotation=90, fontsize=6,
                                    ha="center", va="bottom", color=COLORS[m])
                ax.set_xticks(range(len(seqlens)), [f"{s // 1024}k" if s >= 1024 else str(s) for s in seqlens])
                ax.set_xlabel("sequence length")
                ax.set_ylabel("TFLOP/s")
                ax.set_title(f"head dim {d}")
                ax.set_ylim(0, max(float(r["tflops"]) for r in here) * 1.2)
            # One legend for the figure, under the panels, so it hides no bar.
            handles = {}
            for ax in axes[0]:
                for h, lab in zip(*ax.get_legend_handles_labels()):
                    handles.setdefault(lab, h)
            fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), fontsize=9,
                       frameon=False)
            what = "forward" if mode == "fwd" else "backward"
            fig.suptitle(f"Attention {what}, {'causal' if causal else 'not causal'}, bf16, "
                         f"{int(sel[0]['batch']) * int(sel[0]['seqlen'])} tokens, hidden "
                         f"{int(sel[0]['heads']) * int(sel[0]['d'])}" + (f"\n{label}" if label else ""))
            fig.tight_layout(rect=(0, 0.06, 1, 1))
            path = os.path.join(out_dir, f"{mode}_{'causal' if causal else 'noncausal'}.png")
            fig.savefig(path, dpi=120)
            plt.close(fig)
            written.append(path)
    return written


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d", default="64,128,256")
    p.add_argument("--s", default="512,1024,2048,4096,8192,16384")
    p.add_argument("--causal", default="0,1")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--modes", default="fwd,bwd")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--warmup", type=float, default=25, help="do_bench warm-up, ms")
    p.add_argument("--rep", type=float, default=200, help="do_bench measuring time per point, ms")
    p.add_argument("--label", help="second line of every chart title (default: GPU name and torch version)")
    p.add_argument("--out-dir", default="bench/results/python_bench")
    p.add_argument("--plot-only", metavar="CSV", help="draw the charts of an earlier run's CSV; needs no GPU")
    a = p.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    if a.plot_only:
        with open(a.plot_only, newline="") as f:
            rows = list(csv.DictReader(f))
    else:
        import torch

        import flashattn

        modes, methods = a.modes.split(","), a.methods.split(",")
        unknown = set(methods) - set(METHODS)
        if unknown:
            p.error(f"unknown methods {sorted(unknown)}; choose from {METHODS}")
        print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  cudnn {torch.backends.cudnn.version()}  "
              f"flashattn {flashattn.__version__}  {flashattn.build_info()['cuda_kernels']}")
        if a.label is None:
            a.label = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
        start = time.time()
        rows = []
        csv_path = os.path.join(a.out_dir, "results.csv")
        with open(csv_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            for d in ints(a.d):
                for causal in ints(a.causal):
                    for s in ints(a.s):
                        shape_rows = measure(d, bool(causal), s, a.tokens, a.hidden, modes, methods, a.warmup,
                                             a.rep)
                        writer.writerows(shape_rows)
                        f.flush()
                        rows += shape_rows
                        for mode in modes:
                            cells = []
                            for r in (r for r in shape_rows if r["mode"] == mode):
                                cells.append(f"{r['method']} {r['tflops']:5.0f}" if "tflops" in r
                                             else f"{r['method']}     -")
                            print(f"d={d:3d} causal={causal} s={s:5d} {mode} | " + "  ".join(cells)
                                  + f"  [{time.time() - start:.0f} s]", flush=True)
                        for r in shape_rows:
                            if r.get("error"):
                                print(f"  {r['method']} {r['mode']}: {r['error']}", flush=True)
        print(f"wrote {csv_path}")
    for path in plot(rows, a.out_dir, a.label or ""):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
