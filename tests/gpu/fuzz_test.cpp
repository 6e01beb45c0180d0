// The argument fuzzer's cases (tests/fuzz/arg_fuzz.cpp) on the GPU: device copies of every buffer,
// each exactly its view's span, so that under compute-sanitizer memcheck any access past a tensor
// is reported; the same promises as on the CPU (exact results, nothing written on rejection or
// outside the outputs' elements, rows outside every varlen sequence untouched).
#include <cstdlib>

#include "arg_fuzz.h"
#include "gpu_util.h"

namespace fa_test {
namespace {

class GpuFuzz : public GpuTest {};

// FLASHATTN_GPU_FUZZ_CASES runs more cases than the suite's 400 (a longer search on a lent GPU).
TEST_F(GpuFuzz, RandomArgumentsKeepTheApiPromises) {
  const char* cases = std::getenv("FLASHATTN_GPU_FUZZ_CASES");
  EXPECT_EQ(fa_fuzz::run_fixed_cases(20261205, cases != nullptr ? std::atoi(cases) : 400, /*on_gpu=*/true), "");
}

}  // namespace
}  // namespace fa_test
