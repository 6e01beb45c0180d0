"""The open GPU issues' speed bars, read from the JSON that the side-by-side scripts write.

Runs no GPU work: it reads what one device call measured and prints every bar point with its
ratio and whether it clears the bar, per issue, then a line per issue. The bars (issues 3-6):
  #3 portable forward:  ours / FlashAttention-2 >= 1.0 at every d and mask from 2k tokens on
  #4 Hopper forward:    ours / cuDNN >= 1.0 from 2k to 16k (512 and 1k reported, no bar)
  #5 backward:          Hopper ours / cuDNN >= 1.0 from 2k to 16k; portable ours / FlashAttention-2
                        >= 1.0 from 2k to 16k; deterministic within 15% of the default (its time at
                        most 1.15x the default's: throughput >= 1 / 1.15 = 0.870 of it)
  #6 decode:            b=1 kv=131072 >= 1.0 x cuDNN and >= 0.9 x the copy bandwidth; b=1 kv=8192
                        and 32768 >= 1.5 x cuDNN; b=64 kv=4096 and b=8 kv=32768 >= 1.0 x cuDNN;
                        paged (16 and 256 tokens) within 5% of contiguous
The bars are stated for an H200; the device the JSON names is printed, with a warning elsewhere.

  # on the GPU machine (one call; `CARRY=1 scripts/gpu_check.sh bars` runs these and this script):
  python3 bench/sdpa_compare.py --lib LIB --modes fwd,bwd --rounds 3 --json $OUT/hopper.json
  FLASHATTN_GPU_FORWARD=portable FLASHATTN_GPU_BACKWARD=portable python3 bench/sdpa_compare.py \\
    --lib LIB --modes fwd,bwd --s 2048,4096,8192,16384 --rounds 3 --json $OUT/portable.json
  python3 bench/decode_compare.py --lib LIB --json $OUT/decode.json
  # here:
  python3 bench/bars.py --hopper hopper.json --portable portable.json --decode decode.json
"""
import argparse
import json


class Issue:
    def __init__(self, number, title):
        self.number, self.title, self.points, self.notes = number, title, [], []

    def bar(self, what, value, bar, aim=None):
        """A bar point: value >= bar clears it (None: not measured, which fails it)."""
        self.points.append((what, value, bar, aim))

    def report(self):
        print(f"\n#{self.number} {self.title}")
        for what, value, bar, aim in self.points:
            if value is None:
                print(f"  {what:<52} {'-':>7}  NOT MEASURED (bar {bar:.3g})")
                continue
            mark = "ok" if value >= bar else "BELOW"
            extra = f", aim {aim:g}" if aim else ""
            print(f"  {what:<52} {value:7.3f}  {mark} (bar {bar:.3g}{extra})")
        for note in self.notes:
            print(f"  {note}")
        below = [p for p in self.points if p[1] is None or p[1] < p[2]]
        cleared = self.points and not below
        verdict = "every bar point cleared" if cleared else f"{len(below)} of {len(self.points)} below"
        return f"#{self.number}: {verdict}"


def load(path):
    if not path:
        return None
    with open(path) as fh:
        return json.load(fh)


def ratio(row, num, den):
    return row[num] / row[den] if row.get(num) and row.get(den) else None


def check_path(data, want, issue, what):
    """Notes rows whose kernel is not on the path the bar is for (a fallback, or a forced path unset)."""
    for row in data["rows"]:
        for key in ("kernel", "bwd_kernel"):
            if key in row and want not in row[key]:
                issue.notes.append(f"note: d={row['d']} s={row['s']} {what} ran '{row[key]}', not the {want} path")


def attention_bars(hopper, portable):
    issues = []
    if hopper:
        fwd = Issue(4, "Hopper forward / cuDNN")
        bwd = Issue(5, "backward: Hopper / cuDNN, portable / FlashAttention-2, deterministic / default")
        check_path(hopper, "hopper", fwd, "the forward")
        for row in hopper["rows"]:
            tag = f"d={row['d']:<3} {'causal' if row['causal'] else 'full  '} s={row['s']:<5}"
            if 2048 <= row["s"] <= 16384:
                fwd.bar(f"fwd {tag}", ratio(row, "ours", "cudnn"), 1.0, 1.1)
            else:
                r = ratio(row, "ours", "cudnn")
                fwd.notes.append(f"fwd {tag} (no bar) {r:.3f}" if r else f"fwd {tag} (no bar) -")
            if "ours_bwd" in row and 2048 <= row["s"] <= 16384:
                bwd.bar(f"bwd hopper {tag}", ratio(row, "ours_bwd", "cudnn_bwd"), 1.0, 1.1)
                det = ratio(row, "ours_bwd_det", "ours_bwd")
                bwd.bar(f"det/default {tag}" + (f" (time x{1 / det:.3f})" if det else ""), det, 1 / 1.15)
        issues.append(fwd)
    else:
        bwd = Issue(5, "backward (no Hopper-path JSON given)")
    if portable:
        port = Issue(3, "portable forward / FlashAttention-2")
        check_path(portable, "portable", port, "this run")
        for row in portable["rows"]:
            if row["s"] < 2048:
                continue
            tag = f"d={row['d']:<3} {'causal' if row['causal'] else 'full  '} s={row['s']:<5}"
            port.bar(f"fwd {tag}", ratio(row, "ours", "fa2"), 1.0)
            if "ours_bwd" in row and row["s"] <= 16384:
                bwd.bar(f"bwd portable {tag}", ratio(row, "ours_bwd", "fa2_bwd"), 1.0)
        issues.insert(0, port)
    if hopper or portable:
        issues.append(bwd)
    return issues


def decode_bars(dec):
    issue = Issue(6, "decode: graph replay against cuDNN, the copy bandwidth, paged against contiguous")
    rows = {(r["b"], r["kv"], r["page"]): r for r in dec["rows"] if not r.get("forced_splits")}
    wants = {(1, 131072): 1.0, (1, 8192): 1.5, (1, 32768): 1.5, (64, 4096): 1.0, (8, 32768): 1.0}
    for (b, kv), bar in wants.items():
        row = rows.get((b, kv, 0))
        aim = 2.0 if bar > 1 else None
        issue.bar(f"b={b} kv={kv} ours/cuDNN", ratio(row, "graph_GBps", "cudnn") if row else None, bar, aim)
        if row and row.get("read_GBps") and row.get("cudnn"):
            ceiling = row["read_GBps"] / row["cudnn"]
            issue.notes.append(f"b={b} kv={kv}: a bare read of K and V runs at {row['read_GBps']:.0f} GB/s, cuDNN at "
                               f"{row['cudnn']:.0f}: a decode kernel reading no faster passes {ceiling:.2f}x cuDNN "
                               "at most" + (f", short of the bar ({bar:g}x)" if ceiling < bar else ""))
        if (b, kv) == (1, 131072):
            copy = dec.get("copy_GBps_rw")
            issue.bar(f"b={b} kv={kv} ours/copy bandwidth", row["graph_GBps"] / copy if row and copy else None, 0.9)
        for page in (16, 256):
            paged = rows.get((b, kv, page))
            both = paged and row and paged.get("graph_GBps") and row.get("graph_GBps")
            issue.bar(f"b={b} kv={kv} page {page} / contiguous",
                      paged["graph_GBps"] / row["graph_GBps"] if both else None, 0.95)
    issue.notes.append(f"copy bandwidth {dec.get('copy_GBps_rw', 0):.0f} GB/s (read+write), timing floor "
                       f"{dec.get('floor_us', 0):.1f} us")
    return [issue]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hopper", help="sdpa_compare.py --modes fwd,bwd JSON, the default (Hopper) paths")
    p.add_argument("--portable", help="the same with FLASHATTN_GPU_FORWARD/BACKWARD=portable")
    p.add_argument("--decode", help="decode_compare.py JSON")
    a = p.parse_args()
    hopper, portable, dec = load(a.hopper), load(a.portable), load(a.decode)
    devices = {d["device"] for d in (hopper, portable, dec) if d}
    print("device: " + ", ".join(sorted(devices)))
    if any("H200" not in d for d in devices):
        print("WARNING: the bars are stated for an H200; these figures are from another GPU")
    issues = attention_bars(hopper, portable) + (decode_bars(dec) if dec else [])
    verdicts = [issue.report() for issue in issues]
    print()
    for v in verdicts:
        print(v)


if __name__ == "__main__":
    main()
