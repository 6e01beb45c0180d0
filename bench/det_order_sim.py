#!/usr/bin/env python3
"""List-schedule simulation of the deterministic backward's `up` launch order (CPU only).

Causal self-attention with square tiles: key tile n of a head visits query tiles n .. N-1, one step
each. At query tile m the key tiles add their dQ in turns from the highest down (bwd_layout.h), so
key tile n's step at m starts once its previous step ended and key tile n + 1 ended its step at m,
plus a hand-over of `delta` steps. CTAs run one per SM, dispatched in launch order (a CTA starts
when an SM is free and every CTA before it has started). Prints the makespan over the work's even
share across the SMs for the `up` order (heads one after another, key tiles descending) and for
that order with its last `seg` CTAs re-sorted longest first.

The re-sorted segment is computed with its starts taken from the SMs that the CTAs before it free,
highest key tile first, which holds while the segment fits on the GPU at once (seg <= sms).
"""
import argparse
import heapq


def makespan(n_tiles, heads, sms, delta, seg):
    order = [(h, n) for h in range(heads) for n in reversed(range(n_tiles))]
    head, tail = order[: len(order) - seg], sorted(order[len(order) - seg :], key=lambda x: (x[1], x[0]))
    ends = {}  # (h, n) -> end time of its step at query tile n + i

    def run(h, n, start):
        t, steps = start, []
        for m in range(n, n_tiles):
            ready = ends[(h, n + 1)][m - n - 1] + delta if n < m else 0.0
            t = max(t, ready) + 1.0
            steps.append(t)
        ends[(h, n)] = steps
        return t

    free = [0.0] * sms
    heapq.heapify(free)
    last = 0.0
    for h, n in head:
        last = max(heapq.heappop(free), last)
        heapq.heappush(free, run(h, n, last))
    starts = {}
    for h, n in tail:
        last = max(heapq.heappop(free), last)
        starts[(h, n)] = last
    for h, n in sorted(tail, key=lambda x: -x[1]):
        run(h, n, starts[(h, n)])
    share = heads * n_tiles * (n_tiles + 1) / 2 / sms
    return max(v[-1] for v in ends.values()) / share


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sms", type=int, default=132)
    p.add_argument("--delta", type=float, default=0.1, help="turn hand-over, in steps")
    p.add_argument("--shapes", default="256x8,128x16,64x32,32x64", help="key tiles x heads, comma-separated")
    a = p.parse_args()
    for shape in a.shapes.split(","):
        n_tiles, heads = map(int, shape.split("x"))
        cols = [(f"seg {s}", makespan(n_tiles, heads, a.sms, a.delta, s)) for s in (0, a.sms, a.sms // 2)]
        print(f"{n_tiles:4d} key tiles x {heads:2d} heads: " + "  ".join(f"{k} {v:.3f}" for k, v in cols))


if __name__ == "__main__":
    main()
