#!/usr/bin/env bash
# One call on a GPU machine: build, GPU tests against the fp64 reference, compute-sanitizer on a
# reduced set, and the side-by-side benchmark. Logs go to $OUT (the device tool brings them back).
#   scripts/gpu_check.sh [build|test|sanitize|bench|bars|sweep]...   (default: the first four, in order)
# bars: the open issues' bar points, measured and judged (bench/bars.py).
# Environment (exported, so this script sees it): ARCHS (default 90a), HDIMS, DTYPES,
# TEST_FILTER (gtest filter of the test step), BENCH_ARGS (passed to bench/sdpa_compare.py),
# DECODE_ARGS (passed to bench/decode_compare.py, which the bench step runs next; "skip" leaves it out),
# SAN_FILTER (gtest filter for the sanitizer pass), SAN_TOOLS (default "memcheck racecheck";
# synccheck checks barrier use), SWEEPS (the tile sweeps of the sweep step, default
# "tile_sweep hopper_tile_sweep bwd_tile_sweep") and SWEEP_HDIMS (default "64 128 256"). The sweep
# step needs a configured build (the build step) for the generated headers. With CARRY=1 the
# test, sanitize and bench steps run the programs that scripts/gpu_carry.sh built elsewhere and the
# device tool carried in build-carry/, unpacked into build-carried/ (build-carry/ itself must stay
# packed, within carry's 64 MiB); leave out the build and sweep steps.
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
OUT=${OUT:-/tmp/flashattn-gpu-out}
mkdir -p "$OUT"
BUILD=build-gpu
if [ -n "${CARRY:-}" ]; then
  BUILD=build-carried
  sed -n '1s/^/carried build of /p' build-carry/COMMIT
  unpack_carried build-carry $BUILD || exit 1
fi
# decode_compare.py's bare-read bound also tries the hand-written CUDA reader (bench/read_probe.cu),
# built here for this GPU once per run: READ_ARGS holds the option, or nothing (Triton readers only)
# if it does not build.
read_lib_args() {
  [ -n "${READ_TRIED:-}" ] && return
  READ_TRIED=1 READ_ARGS=()
  if nvcc -O3 -shared -Xcompiler -fPIC -arch=native bench/read_probe.cu -o "$BUILD/read_probe.so"; then
    READ_ARGS=(--read-lib "$BUILD/read_probe.so")
  fi
}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build test sanitize bench)
status=0
for step in "${steps[@]}"; do
  case "$step" in
    build)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
      cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA=ON -DFLASHATTN_ARCHS="${ARCHS:-90a}" \
        ${HDIMS:+-DFLASHATTN_HDIMS="$HDIMS"} ${DTYPES:+-DFLASHATTN_DTYPES="$DTYPES"} -DFLASHATTN_BUILD_TOOLS=OFF > "$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
      cmake --build $BUILD -j16 --target flashattn flashattn_gpu_tests > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
      report_ptxas "$OUT/build.log"
      ;;
    test)
      run_gpu_tests ./$BUILD/tests/flashattn_gpu_tests "${TEST_FILTER:-}" "$OUT/gpu_tests.log" || status=1
      ;;
    sanitize)
      for tool in ${SAN_TOOLS:-memcheck racecheck}; do
        compute-sanitizer --tool $tool --error-exitcode 9 ./$BUILD/tests/flashattn_gpu_tests \
          --gtest_filter="${SAN_FILTER:-Ptx.*:GpuForward.StridesOddHeadDimsAndNoLse:GpuForward.VarlenWithEmptySequences}" \
          > "$OUT/sanitize_$tool.log" 2>&1 || status=1
        echo "$tool: $(grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitize_$tool.log" | tail -3 | tr '\n' ' ')"
      done
      ;;
    bench)
      PYTHONUNBUFFERED=1 python3 bench/sdpa_compare.py --lib $BUILD/libflashattn.so --json "$OUT/bench.json" ${BENCH_ARGS:-} \
        2>&1 | tee "$OUT/bench.log" || status=1
      if [ "${DECODE_ARGS:-}" != "skip" ]; then
        read_lib_args
        PYTHONUNBUFFERED=1 python3 bench/decode_compare.py --lib $BUILD/libflashattn.so --json "$OUT/decode.json" \
          "${READ_ARGS[@]}" ${DECODE_ARGS:-} 2>&1 | tee "$OUT/decode.log" || status=1
      fi
      ;;
    bars)
      # Every open issue's bar points in one pass (about 6 minutes on an H200): the default paths
      # and the portable ones forced, forward and backward, 3 rounds each, then decoding;
      # bench/bars.py reads the three JSON files and says which points clear their bars.
      lib=$BUILD/libflashattn.so
      PYTHONUNBUFFERED=1 python3 bench/sdpa_compare.py --lib $lib --modes fwd,bwd --rounds 3 --json "$OUT/hopper.json" \
        > "$OUT/hopper.log" 2>&1 || status=1
      FLASHATTN_GPU_FORWARD=portable FLASHATTN_GPU_BACKWARD=portable PYTHONUNBUFFERED=1 python3 bench/sdpa_compare.py \
        --lib $lib --modes fwd,bwd --s 2048,4096,8192,16384 --rounds 3 --json "$OUT/portable.json" \
        > "$OUT/portable.log" 2>&1 || status=1
      read_lib_args
      PYTHONUNBUFFERED=1 python3 bench/decode_compare.py --lib $lib --json "$OUT/decode.json" "${READ_ARGS[@]}" \
        > "$OUT/decode.log" 2>&1 || status=1
      python3 bench/bars.py --hopper "$OUT/hopper.json" --portable "$OUT/portable.json" --decode "$OUT/decode.json" |
        tee "$OUT/bars.txt" | grep -E "^device|^WARNING|^#[0-9]+:|BELOW|NOT MEASURED"
      ;;
    sweep)
      # Every (sweep, head dim) binary compiles in parallel; they then run one after another.
      bins=()
      for sw in ${SWEEPS:-tile_sweep hopper_tile_sweep bwd_tile_sweep}; do
        for d in ${SWEEP_HDIMS:-64 128 256}; do
          extra=""
          [ "$sw" = hopper_tile_sweep ] && extra=src/cuda/sm90/tma.cpp
          nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I include -I src \
            -I $BUILD/include -DSWEEP_HDIM=$d bench/$sw.cu $extra -o $BUILD/${sw}_$d > "$BUILD/${sw}_$d.log" 2>&1 &
          bins+=("${sw}_$d")
        done
      done
      wait
      : > "$OUT/sweep.txt"
      for b in "${bins[@]}"; do
        if [ -x "$BUILD/$b" ]; then
          "./$BUILD/$b" >> "$OUT/sweep.txt" 2>&1 || status=1
        else
          { echo "$b did not compile:"; head -5 "$BUILD/$b.log"; } >> "$OUT/sweep.txt"
          status=1
        fi
      done
      cat "$OUT/sweep.txt"
      ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
exit $status
