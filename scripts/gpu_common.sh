# shellcheck shell=bash
# Sourced by scripts/gpu_check.sh and scripts/gpu_ab.sh: the pieces both need, so that a single-tree
# check and an A/B report the same things in the same way.

# What ptxas said in a build log LOG: spills, and the wgmma fences it injected or the wgmmas it
# serialized. Serialized wgmmas cost the Hopper kernels a quarter of their speed: message C7520,
# or C7511 when ptxas lacks the registers for the wgmma pipeline (the half-diagonal forward of
# session 47 at d=64 ran 0.75x), so every kernel hitting either is named; its own injected fences,
# C7519, are common and cost little.
report_ptxas() {
  grep -E "spill" "$1" | sort | uniq -c | head -20
  echo "C7519 (injected warpgroup fences): $(grep -c C7519 "$1")"
  echo "C7511/C7520 (serialized wgmmas): $(grep -cE 'C7511|C7520' "$1")"
  grep -E 'C7511|C7520' "$1" | sed -E "s/.*function '([^']*)'.*/  \1/" | sort -u
}

# The library and GPU test program that scripts/gpu_carry.sh packed into PACKED, unpacked into
# BUILD as a build folder lays them out (BUILD/libflashattn.so, BUILD/tests/flashattn_gpu_tests).
unpack_carried() {
  mkdir -p "$2/tests" &&
    gunzip -c "$1/libflashattn.so.gz" > "$2/libflashattn.so" &&
    gunzip -c "$1/tests/flashattn_gpu_tests.gz" > "$2/tests/flashattn_gpu_tests" &&
    chmod +x "$2/tests/flashattn_gpu_tests"
}

# The GPU test program TESTS with gtest filter FILTER (all tests when empty), its log in LOG; prints
# the summary and every failure, and returns non-zero if any test failed.
run_gpu_tests() {
  local status=0
  "$1" ${2:+--gtest_filter="$2"} > "$3" 2>&1 || status=1
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error:|exceeds|tests ran" "$3" | head -40
  return $status
}
