#!/usr/bin/env python3
"""Static instruction mix of each kernel's main loop, in one build or two side by side.

For every kernel in an object file or shared library, finds the longest backward branch in its
SASS (the step or K/V loop; a loop whose body holds masked and unmasked variants counts both),
and prints its length, the opcodes it holds (HMMA, LDSM, LOP3, ...) and the local-memory
accesses (LDL/STL: spills) inside it and in the whole kernel. With two inputs (A, B) each
kernel of A is printed beside the kernel of B with the same name, which is how a change to
address arithmetic or register pressure is judged before it costs GPU time. Counts are static
(instructions in the code, not executed), so they say what a change did to the code, not how
fast it runs.

Needs cuobjdump (CUDA toolkit; the triton wheel also ships one, in
triton/backends/nvidia/bin); no GPU.

  python3 bench/sass_loops.py A.o [B.o] [--match bwd] [--top 24]
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
FUNC = re.compile(r"\s*Function : (\S+)")
BRANCH = re.compile(r"\bBRA\s+(?:`\(\.L_x_\d+\)\s*)?(0x[0-9a-f]+)")


def find_cuobjdump():
    tool = shutil.which("cuobjdump")
    if tool:
        return tool
    try:
        import triton  # noqa: F401  (only for its bundled binary)
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        if os.access(tool, os.X_OK):
            return tool
    except ImportError:
        pass
    sys.exit("sass_loops: cuobjdump not found (CUDA toolkit, or pip install triton)")


def kernels(path, cuobjdump):
    """{mangled name: [(address, instruction text)]} of every function in the file."""
    out = subprocess.run([cuobjdump, "-sass", path], check=True, capture_output=True, text=True).stdout
    result, name = {}, None
    for line in out.splitlines():
        m = FUNC.match(line)
        if m:
            name = m.group(1)
            result[name] = []
            continue
        m = INSTR.match(line)
        if m and name:
            result[name].append((int(m.group(1), 16), m.group(2)))
    return result


def opcode(text):
    text = re.sub(r"^@!?U?P\w+\s+", "", text)
    return text.split()[0].split(".")[0]


def main_loop(instrs):
    """(first, last) index of the longest backward branch's body, or None."""
    index = {a: i for i, (a, _) in enumerate(instrs)}
    best = None
    for i, (a, text) in enumerate(instrs):
        m = BRANCH.search(text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target < a and target in index:
            j = index[target]
            if best is None or i - j > best[1] - best[0]:
                best = (j, i)
    return best


def summary(instrs):
    loop = main_loop(instrs)
    spills = sum(opcode(t) in ("LDL", "STL") for _, t in instrs)
    if loop is None:
        return {"len": 0, "mix": collections.Counter(), "local": 0, "spills": spills}
    body = [t for _, t in instrs[loop[0]:loop[1] + 1]]
    mix = collections.Counter(opcode(t) for t in body)
    return {"len": len(body), "mix": mix, "local": mix["LDL"] + mix["STL"], "spills": spills}


def short(name, width=120):
    """The name without its parameter list, head and tail: the template arguments that tell
    variants apart come last."""
    core = name.split("EEEv")[0] if "EEEv" in name else name
    return core if len(core) <= width else core[:40] + "..." + core[-(width - 43):]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b", nargs="?")
    ap.add_argument("--match", default="", help="only kernels whose mangled name contains this")
    ap.add_argument("--top", type=int, default=24, help="opcodes listed per loop")
    ap.add_argument("--by-order", action="store_true",
                    help="pair A's and B's kernels by their order in the files (when a template argument "
                         "was added, the names differ)")
    args = ap.parse_args()
    tool = find_cuobjdump()
    ka = {n: v for n, v in kernels(args.a, tool).items() if args.match in n}
    kb = {n: v for n, v in kernels(args.b, tool).items() if args.match in n} if args.b else {}
    pairs = zip(ka, kb) if args.by_order else ((n, n if n in kb else None) for n in sorted(ka))
    if not args.b:
        pairs = ((n, None) for n in sorted(ka))
    for name, other in pairs:
        sa = summary(ka[name])
        print(short(name))
        if not args.b:
            print(f"  loop {sa['len']} instructions, LDL/STL in it {sa['local']} (kernel {sa['spills']})")
            print("  " + " ".join(f"{k}:{v}" for k, v in sa["mix"].most_common(args.top)))
            continue
        if other is None:
            print("  not in B")
            continue
        sb = summary(kb[other])
        print(f"  loop A {sa['len']}  B {sb['len']}  ({sb['len'] - sa['len']:+d}); LDL/STL in it A {sa['local']}"
              f"  B {sb['local']} (kernel A {sa['spills']}  B {sb['spills']})")
        ops = [k for k, _ in (sa["mix"] + sb["mix"]).most_common(args.top)]
        print("  " + " ".join(f"{k}:{sa['mix'][k]}/{sb['mix'][k]}" for k in ops))

if __name__ == "__main__":
    main()
