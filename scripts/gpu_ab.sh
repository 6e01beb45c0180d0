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
# When device time is short, build on the CPU machine instead (nvcc, no GPU): PACK=1 packs A and B
# there with scripts/gpu_carry.sh, one after the other, into build-carry/ab/{a,b} (libraries and
# GPU test programs, stripped and gzipped, about 9 MB for d=128 bf16); then on the GPU machine CARRY=1
# scripts/gpu_ab.sh, with no PATCH and carry=["build-carry"], runs B's tests and the timing only:
#   PACK=1 HDIMS=128 B_SUBSET=1 scripts/gpu_ab.sh PATCH                                  (here)
#   CARRY=1 AB_BENCH=decode TEST_FILTER='GpuDecode.*:Ptx.*' scripts/gpu_ab.sh            (there)
# Environment: ARCHS (default 90a); HDIMS and DTYPES of the timed builds (default "64;128" and bf16;
# B takes every variant when TEST_FILTER asks for its tests, unless B_SUBSET is set); AB_ARGS,
# passed to the timing script (ab_compare.py: default "--modes fwd --d 64,128 --s 2048,8192", it
# times bf16; decode_ab.py: default "--pages 0,16,256 --rounds 3", the anchors' decode rows).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
source scripts/gpu_common.sh
OUT=${OUT:-/tmp/flashattn-gpu-out}
mkdir -p "$OUT/a" "$OUT/b"
B=/tmp/flashattn-ab-b
PACKED=build-carry/ab

if [ -n "${CARRY:-}" ]; then
  sed -n '1s/^/carried A\/B of /p;$p' $PACKED/a/COMMIT
  for side in a b; do unpack_carried $PACKED/$side build-ab/$side || exit 1; done
  lib_a=build-ab/a/libflashattn.so lib_b=build-ab/b/libflashattn.so tests_b=build-ab/b/tests/flashattn_gpu_tests
else
  [ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: scripts/gpu_ab.sh PATCH (a file), or CARRY=1 scripts/gpu_ab.sh"; exit 2; }
  patch=$(realpath "$1")
  rm -rf "$B" && mkdir -p "$B"
  # The sources only: build folders and carried files stay behind.
  tar --exclude='./build*' --exclude=./.git -cf - . | tar -xf - -C "$B"
  (cd "$B" && git apply "$patch") || { echo "the patch does not apply to this tree"; exit 1; }

  export HDIMS=${HDIMS:-64;128} DTYPES=${DTYPES:-bf16}
  # B's tests need every variant: its build drops the subset when TEST_FILTER is set or the tests are
  # packed (unless B_SUBSET says the tests skip what the subset lacks, as the decode tests do).
  b_env=()
  [ -n "${TEST_FILTER:-}${PACK:-}" ] && [ -z "${B_SUBSET:-}" ] && b_env=(-u HDIMS -u DTYPES)
  if [ -n "${PACK:-}" ]; then
    # scripts/gpu_carry.sh on each side, one after the other (the CPU machine has few cores); B's
    # copy is fresh, so leaving its subset out builds every variant (the CMake default).
    for side in a b; do
      src=.; side_env=(); dest=$PWD/$PACKED/$side; [ $side = b ] && src=$B side_env=("${b_env[@]}")
      (cd $src && env "${side_env[@]}" CARRY_DIR="$dest" SRC_BUILD=build-ab-pack scripts/gpu_carry.sh) \
        > "$OUT/$side/pack.log" 2>&1 || { grep -E "error|FAILED" "$OUT/$side/pack.log" | head -30; exit 1; }
      # A's build folder is kept between runs, so its report covers only what changed since the last.
      echo "== $side (ptxas on the objects compiled in this run)"; report_ptxas "$OUT/$side/pack.log"
    done
    echo "B = A + $patch ($(sha256sum < "$patch" | cut -c1-12))" >> $PACKED/a/COMMIT
    du -sh $PACKED
    exit 0
  fi
  OUT="$OUT/a" scripts/gpu_check.sh build > "$OUT/a/build_step.txt" 2>&1 &
  a=$!
  (cd "$B" && env "${b_env[@]}" OUT="$OUT/b" scripts/gpu_check.sh build) > "$OUT/b/build_step.txt" 2>&1 &
  b=$!
  wait $a; built_a=$?
  wait $b; built_b=$?
  for side in a b; do echo "== $side"; cat "$OUT/$side/build_step.txt"; done
  ((built_a == 0 && built_b == 0)) || exit 1
  lib_a=build-gpu/libflashattn.so lib_b="$B/build-gpu/libflashattn.so" tests_b="$B/build-gpu/tests/flashattn_gpu_tests"
fi

status=0
if [ -n "${TEST_FILTER:-}" ]; then
  run_gpu_tests "$tests_b" "$TEST_FILTER" "$OUT/b/gpu_tests.log" || status=1
fi
libs=(--lib-a "$lib_a" --lib-b "$lib_b")
if [ "${AB_BENCH:-fwd}" = decode ]; then
  PYTHONUNBUFFERED=1 python3 bench/decode_ab.py "${libs[@]}" ${AB_ARGS:---pages 0,16,256 --rounds 3} 2>&1 |
    tee "$OUT/ab.txt" || status=1
else
  PYTHONUNBUFFERED=1 python3 bench/ab_compare.py "${libs[@]}" ${AB_ARGS:---modes fwd --d 64,128 --s 2048,8192} 2>&1 |
    tee "$OUT/ab.txt" || status=1
fi
exit $status
