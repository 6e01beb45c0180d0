#!/usr/bin/env python3
"""SM clock and board power while our forward and cuDNN's run back to back, in turns.

On the H200 a long attention forward runs at the board's power cap, so the clock is whatever the
power allows and a kernel's speed there is set by its energy per FLOP as much as by its schedule.
This runs each kernel for --seconds of back-to-back calls (rounds in turns, after warm-up) while
nvidia-smi samples the SM clock, power and temperature every 50 ms, and prints each run's TFLOP/s
(CUDA events over the whole run) beside its mean clock and power (samples from 0.5 s in).

  python3 bench/power_probe.py --lib build/libflashattn.so --d 128,64 --s 2048
"""
import argparse
import subprocess
import threading
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ab_compare import Problem, runner
from anchor_sweep import flops
from flashattn_abi import load


def start_sampler(samples, stop):
    def run():
        p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                              "--format=csv,noheader,nounits", "-lms", "50"], stdout=subprocess.PIPE, text=True)
        for line in p.stdout:
            if stop.is_set():
                break
            try:
                samples.append((time.time(), *(float(x) for x in line.split(","))))
            except ValueError:
                pass
        p.terminate()

    threading.Thread(target=run, daemon=True).start()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", default="build/libflashattn.so")
    p.add_argument("--d", default="128,64")
    p.add_argument("--s", type=int, default=2048)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    lib = load(a.lib)
    samples, stop = [], threading.Event()
    start_sampler(samples, stop)
    time.sleep(1.0)
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  cudnn {torch.backends.cudnn.version()}")
    for d in (int(x) for x in a.d.split(",")):
        s, b, h = a.s, 16384 // a.s, 2048 // d
        prob = Problem(b, s, h, d, a.causal)
        ours = runner(lib, prob, "fwd")
        qt, kt, vt = (x.transpose(1, 2) for x in (prob.q, prob.k, prob.v))

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=a.causal)

        flop = flops(b, h, s, d, a.causal)
        for rnd in range(a.rounds):
            for name, fn in (("ours", ours), ("cudnn", cudnn)):
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0, n = time.time(), 0
                e0.record()
                while time.time() - t0 < a.seconds:
                    for _ in range(50):
                        fn()
                    n += 50
                    torch.cuda.synchronize()
                e1.record()
                torch.cuda.synchronize()
                t1 = time.time()
                win = [x for x in samples if t0 + 0.5 <= x[0] <= t1]
                mean = lambda i: sum(x[i] for x in win) / max(len(win), 1)
                print(f"d={d} causal={int(a.causal)} s={s} round {rnd} {name:5s}: {flop / (e0.elapsed_time(e1) / n) / 1e9:6.1f}"
                      f" TFLOP/s over {n} calls | SM clock {mean(1):5.0f} MHz  power {mean(2):4.0f} W"
                      f"  max temp {max((x[3] for x in win), default=0):.0f} C ({len(win)} samples)", flush=True)
    stop.set()


if __name__ == "__main__":
    main()
