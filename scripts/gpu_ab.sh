#!/usr/bin/env bash
# A kernel change measured against this tree in one call on a GPU machine, needing nothing built
# elsewhere: builds this tree (A) and a copy of it with PATCH applied (B), both at once, then B's
# GPU tests (TEST_FILTER) and the two libraries timed in turns by bench/ab_compare.py. Logs go to
# $OUT (the device tool brings them back).
#   scripts/gpu_ab.sh PATCH                 (a `git diff` against this tree; git apply needs no repo)
# Environment: ARCHS (default 90a); HDIMS and DTYPES of the timed builds (default "64;128" and bf16);
# AB_ARGS, passed to bench/ab_compare.py (default
# "--modes fwd --d 64,128 --s 2048,8192"; it times bf16); TEST_FILTER, a gtest filter for B's test
# program, which is built with every head dim and dtype (about 45 s; empty: no tests).
set -uo pipefail
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: scripts/gpu_ab.sh PATCH (a file)"; exit 2; }
patch=$(realpath "$1")
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-gpu-out}
mkdir -p "$OUT"
B=/tmp/flashattn-ab-b
rm -rf "$B" && mkdir -p "$B"
# The sources only: build folders and carried files stay behind.
tar --exclude='./build*' --exclude=./.git -cf - . | tar -xf - -C "$B"
(cd "$B" && git apply "$patch") || { echo "the patch does not apply to this tree"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"

configure() {  # source folder, build folder, then extra cmake options
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_ARCHS="${ARCHS:-90a}" \
    -DFLASHATTN_BUILD_TOOLS=OFF "${@:3}" > "$OUT/configure_$(basename "$2").log" 2>&1
}
subset=(-DFLASHATTN_HDIMS="${HDIMS:-64;128}" -DFLASHATTN_DTYPES="${DTYPES:-bf16}" -DFLASHATTN_BUILD_TESTS=OFF)
status=0
configure . build-ab-a "${subset[@]}" && configure "$B" "$B/build-ab" "${subset[@]}" || { echo "configure failed"; exit 1; }
cmake --build build-ab-a -j8 --target flashattn > "$OUT/build_a.log" 2>&1 &
cmake --build "$B/build-ab" -j8 --target flashattn > "$OUT/build_b.log" 2>&1 &
wait -n && wait -n || { grep -hE "error|FAILED" "$OUT"/build_?.log | head -20; exit 1; }
# What ptxas made of each side: fences it injected before wgmmas (C7519: one a kernel is usual;
# many mean wgmmas wait on each other, as session 46's first half-tile version did) and wgmmas it
# serialized (C7520), then each kernel's spills (the end of its mangled name: the template arguments).
for side in a b; do
  log="$OUT/build_$side.log"
  echo "$side: C7519 $(grep -c C7519 "$log"), C7520 $(grep -c C7520 "$log")"
  grep -h "spill" "$log" | sed -E "s/.*function '([^']*)', (.*)/\1 \2/" | awk '{n = $1; sub(/^[^ ]* /, ""); print "  ...", substr(n, length(n) - 79), $0}' | sort
done

if [ -n "${TEST_FILTER:-}" ]; then
  configure "$B" "$B/build-tests" && cmake --build "$B/build-tests" -j16 --target flashattn_gpu_tests > "$OUT/build_tests.log" 2>&1 ||
    { grep -E "error|FAILED" "$OUT/build_tests.log" | head -20; exit 1; }
  "$B/build-tests/tests/flashattn_gpu_tests" --gtest_filter="$TEST_FILTER" > "$OUT/tests_b.log" 2>&1 || status=1
  grep -E "^\[  (FAILED|PASSED) |Failure|tests ran" "$OUT/tests_b.log" | head -40
fi

PYTHONUNBUFFERED=1 python3 bench/ab_compare.py --lib-a build-ab-a/libflashattn.so --lib-b "$B/build-ab/libflashattn.so" \
  ${AB_ARGS:---modes fwd --d 64,128 --s 2048,8192} 2>&1 | tee "$OUT/ab.txt" || status=1
exit $status
