#!/usr/bin/env python3
"""Which softmax exps the Hopper kernels' machine code runs while a wgmma is still in flight.

The forward's main loop issues S_i, then P_{i-1} V_{i-1}, waits for S_i (wgmma.wait_group 1), runs
the softmax of S_i and only then waits for P V (wait_group 0), so that the softmax hides under
P V; the 80-row backward kernel waits for S^T with dP^T in flight the same way. The source order
is not the machine order: ptxas may move the second wait up past the exps (it did in every sm90
kernel on 2026-12-04, bench/results/h200_session28_2026-12-04.txt; since session 42 the d = 96
and 128 forward kernels wait through ptx::warpgroup_wait_after, which keeps it after them). For
each kernel this script counts, in the SASS, the MUFU.EX2 instructions between each
WARPGROUP.DEPBAR.LE gsb0, 0x1 and the next DEPBAR (the exps issued while one commit group may
still run): zero means that softmax waits for the whole previous product. (The d = 64
backward's exps run before the dV wgmma that follows them, whose own wait is again a DEPBAR 0x1.)

Needs cuobjdump and nvdisasm (CUDA toolkit, or the nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm wheels); reads object files or the shared library, no GPU.

  python3 bench/sass_overlap.py build/libflashattn.so
  python3 bench/sass_overlap.py build/src/cuda/CMakeFiles/flashattn_cuda.dir/instantiations/fwd_hopper_hdim128_bf16_sm90.cu.o
"""
import argparse
import re
import shutil
import subprocess
import sys


def sass(path, cuobjdump):
    return subprocess.run([cuobjdump, "-sass", path], check=True, capture_output=True, text=True).stdout


def overlap(text):
    """{kernel name: [exps between a wait for all but one group and the next wait, ...]}."""
    counts, name, between = {}, None, None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            name, between = m.group(1), None
            counts.setdefault(name, [])
            continue
        if name is None:
            continue
        if "WARPGROUP.DEPBAR.LE" in line:
            if between is not None:
                counts[name].append(between)
            between = 0 if "gsb0, 0x1" in line else None
        elif "MUFU.EX2" in line and between is not None:
            between += 1
    return counts


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="object files or libflashattn.so")
    p.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    p.add_argument("--filter", default="forward_kernel|backward_kernel", help="regex on the kernel names")
    a = p.parse_args()
    want = re.compile(a.filter)
    seen = {}
    for path in a.paths:
        for name, spans in overlap(sass(path, a.cuobjdump)).items():
            if want.search(name) and spans:
                seen.setdefault(name, spans)
    if not seen:
        sys.exit("no kernel with a wait_group 1 span found")
    print("exps issued after each wait_group 1 before the next wait (one number per such wait), kernel")
    for name, spans in sorted(seen.items()):
        print(f"{' '.join(f'{n:3d}' for n in spans):16s} {name}")


if __name__ == "__main__":
    main()
