#!/usr/bin/env bash
# A kernel change measured against this tree in one call on a GPU machine, needing nothing built
# elsewhere: scripts/gpu_check.sh's build step on this tree (A) and, at the same time, on a copy of
# it with PATCH applied (B), each reporting its spills and the wgmma fences ptxas injected or the
# wgmmas it serialized; then B's GPU tests (TEST_FILTER) and the two libraries timed in turns by
# bench/ab_compare.py, or with AB_BENCH=decode by bench/decode_ab.py. Logs go to $OUT (the device
# tool brings them back), A's and B's builds' in $OUT/a and $OUT/b.
#   scripts/gpu_ab.sh PATCH                 (a `git diff` against this tree; git apply needs no repo,
#                                            and skips any text before the first diff header)
#   AB_BENCH=decode HDIMS=128 B_SUBSET=1 TEST_FILTER='GpuDecode.*:Ptx.*' scripts/gpu_ab.sh PATCH
# Environment: ARCHS (default 90a); HDIMS and DTYPES of the timed builds (default "64;128" and bf16;
# B takes every variant when TEST_FILTER asks for its tests, unless B_SUBSET is set); AB_ARGS,
# passed to the timing script (ab_compare.py: default "--modes fwd --d 64,128 --s 2048,8192", it
# times bf16; decode_ab.py: default "--pages 0,16,256 --rounds 3", the anchors' decode rows).
set -uo pipefail
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: scripts/gpu_ab.sh PATCH (a file)"; exit 2; }
patch=$(realpath "$1")
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-gpu-out}
mkdir -p "$OUT/a" "$OUT/b"
B=/tmp/flashattn-ab-b
rm -rf "$B" && mkdir -p "$B"
# The sources only: build folders and carried files stay behind.
tar --exclude='./build*' --exclude=./.git -cf - . | tar -xf - -C "$B"
(cd "$B" && git apply "$patch") || { echo "the patch does not apply to this tree"; exit 1; }

export HDIMS=${HDIMS:-64;128} DTYPES=${DTYPES:-bf16}
OUT="$OUT/a" scripts/gpu_check.sh build > "$OUT/a/build_step.txt" 2>&1 &
a=$!
# B's tests need every variant: its build drops the subset when TEST_FILTER is set (unless B_SUBSET
# says the tests skip what the subset lacks, as the decode tests do).
b_env=()
[ -n "${TEST_FILTER:-}" ] && [ -z "${B_SUBSET:-}" ] && b_env=(-u HDIMS -u DTYPES)
(cd "$B" && env "${b_env[@]}" OUT="$OUT/b" scripts/gpu_check.sh build) > "$OUT/b/build_step.txt" 2>&1 &
b=$!
wait $a; built_a=$?
wait $b; built_b=$?
for side in a b; do echo "== $side"; cat "$OUT/$side/build_step.txt"; done
((built_a == 0 && built_b == 0)) || exit 1

status=0
if [ -n "${TEST_FILTER:-}" ]; then
  (cd "$B" && OUT="$OUT/b" scripts/gpu_check.sh test) || status=1
fi
libs=(--lib-a build-gpu/libflashattn.so --lib-b "$B/build-gpu/libflashattn.so")
if [ "${AB_BENCH:-fwd}" = decode ]; then
  PYTHONUNBUFFERED=1 python3 bench/decode_ab.py "${libs[@]}" ${AB_ARGS:---pages 0,16,256 --rounds 3} 2>&1 |
    tee "$OUT/ab.txt" || status=1
else
  PYTHONUNBUFFERED=1 python3 bench/ab_compare.py "${libs[@]}" ${AB_ARGS:---modes fwd --d 64,128 --s 2048,8192} 2>&1 |
    tee "$OUT/ab.txt" || status=1
fi
exit $status
