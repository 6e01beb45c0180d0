#!/usr/bin/env python3
"""List-schedule simulation of the deterministic backward's launch orders (CPU only).

Causal self-attention with square tiles: key tile n of a (KV head, batch) pair visits query tiles
n .. N-1, one step each, and the key tiles visiting a dQ tile add into it in turns (bwd_layout.h):
  * `up`: key tiles launched descending, each walking up from its diagonal; at query tile m the
    turns go from the highest key tile down, so key tile n's step at m waits for key tile n + 1's;
  * `down`: key tiles launched ascending, each walking down from the last query tile; turns in
    key-tile order, so key tile n's step at m waits for key tile n - 1's.
A step takes 1, a turn's hand-over `delta`. CTAs run one per SM, dispatched in launch order (a CTA
starts when an SM is free and every CTA before it has started). Prints the makespan over the work's
even share across the SMs for:
  * up:        every pair `up`, pairs one after another;
  * last down: the same, with the last pair `down` (what the d = 256 kernel runs);
  * seg S:     every pair `up`, the launch's last S CTAs re-sorted longest first (computed with
               their starts taken from the SMs the CTAs before them free, highest key tile first,
               which holds while S <= sms).
"""
import argparse
import heapq


def makespan(n_tiles, pairs, sms, delta, down_pairs=0, seg=0):
    kinds = ["up"] * (pairs - down_pairs) + ["down"] * down_pairs
    order = []
    for h, kind in enumerate(kinds):
        keys = reversed(range(n_tiles)) if kind == "up" else range(n_tiles)
        order += [(h, n, kind) for n in keys]
    head = order[: len(order) - seg]
    tail = sorted(order[len(order) - seg :], key=lambda x: (x[1], x[0]))
    ends = {}  # (h, n) -> {m: end time of its step at query tile m}

    def run(h, n, kind, start):
        t, steps = start, {}
        for m in (range(n, n_tiles) if kind == "up" else range(n_tiles - 1, n - 1, -1)):
            prev = (h, n + 1) if kind == "up" else (h, n - 1)
            waits = n < m if kind == "up" else n > 0
            ready = ends[prev][m] + delta if waits else 0.0
            t = max(t, ready) + 1.0
            steps[m] = t
        ends[(h, n)] = steps
        return t

    free = [0.0] * sms
    heapq.heapify(free)
    last = 0.0
    for h, n, kind in head:
        last = max(heapq.heappop(free), last)
        heapq.heappush(free, run(h, n, kind, last))
    starts = {}
    for h, n, kind in tail:
        last = max(heapq.heappop(free), last)
        starts[(h, n)] = last
    for h, n, kind in sorted(tail, key=lambda x: -x[1]):
        run(h, n, kind, starts[(h, n)])
    share = pairs * n_tiles * (n_tiles + 1) / 2 / sms
    return max(max(v.values()) for v in ends.values()) / share


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sms", type=int, default=132)
    p.add_argument("--delta", type=float, default=0.1, help="turn hand-over, in steps")
    p.add_argument("--shapes", default="256x8,128x16,64x32,32x64", help="key tiles x pairs, comma-separated")
    a = p.parse_args()
    for shape in a.shapes.split(","):
        n_tiles, pairs = map(int, shape.split("x"))
        cols = [("up", makespan(n_tiles, pairs, a.sms, a.delta)),
                ("last down", makespan(n_tiles, pairs, a.sms, a.delta, down_pairs=1)),
                (f"seg {a.sms}", makespan(n_tiles, pairs, a.sms, a.delta, seg=a.sms)),
                (f"seg {a.sms // 2}", makespan(n_tiles, pairs, a.sms, a.delta, seg=a.sms // 2))]
        print(f"{n_tiles:4d} key tiles x {pairs:2d} pairs: " + "  ".join(f"{k} {v:.3f}" for k, v in cols))


if __name__ == "__main__":
    main()
