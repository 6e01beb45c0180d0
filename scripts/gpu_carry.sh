#!/usr/bin/env bash
# Builds the GPU test program and the library on a machine with nvcc but no GPU, and packs them
# into build-carry/ (ignored by git) for the device tool's `carry`, so that a device call spends
# its minutes running rather than compiling. Stripped and gzipped, a full sm_90a build is about
# 30 MB (carry takes 64 MiB; unpacked, each of the two files is 64 MB). Then, on the GPU machine:
#   CARRY=1 scripts/gpu_check.sh test sanitize bench     (carry=["build-carry"]; it unpacks them)
# Environment: ARCHS (default 90a), HDIMS, DTYPES, as for scripts/gpu_check.sh; SRC_BUILD, the
# build folder (default build-carry-src); CARRY_DIR, where the packed files go (default build-carry;
# scripts/gpu_ab.sh PACK=1 packs its two sides elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${SRC_BUILD:-build-carry-src}
cmake -S . -B "$SRC" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_ARCHS="${ARCHS:-90a}" \
  ${HDIMS:+-DFLASHATTN_HDIMS="$HDIMS"} ${DTYPES:+-DFLASHATTN_DTYPES="$DTYPES"} -DFLASHATTN_BUILD_TOOLS=OFF > /dev/null
cmake --build "$SRC" --target flashattn flashattn_gpu_tests
DEST=${CARRY_DIR:-build-carry}
rm -rf "$DEST"
mkdir -p "$DEST/tests"
# The test program links the library statically; the benchmarks load the shared library.
strip -s -o "$DEST/tests/flashattn_gpu_tests" "$SRC/tests/flashattn_gpu_tests"
strip -s -o "$DEST/libflashattn.so" "$SRC/libflashattn.so"
gzip "$DEST/tests/flashattn_gpu_tests" "$DEST/libflashattn.so"
# A copy of the sources (gpu_ab.sh's patched side) has no git history to name.
{ git rev-parse HEAD && git status --short || echo "not a git checkout: $PWD"; } > "$DEST/COMMIT" 2>/dev/null
du -sh "$DEST"
