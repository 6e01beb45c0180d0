// The argument fuzzer's cases (tests/fuzz/arg_fuzz.cpp) on the GPU: device copies of every buffer,
// each exactly its view's span, so that under compute-sanitizer memcheck any access past a tensor
// is reported; the same promises as on the CPU (exact results, nothing written on rejection or
// outside the outputs' elements, rows outside every varlen sequence untouched).
#include <random>
#include <vector>

#include "arg_fuzz.h"
#include "gpu_util.h"

namespace fa_test {
namespace {

class GpuFuzz : public GpuTest {};

TEST_F(GpuFuzz, RandomArgumentsKeepTheApiPromises) {
  constexpr int kCases = 400;
  std::mt19937 rng(20261205);
  std::vector<uint8_t> bytes(96);
  for (int i = 0; i < kCases; ++i) {
    for (uint8_t& b : bytes) b = uint8_t(rng());
    const std::string broken = fa_fuzz::run_case(bytes.data(), bytes.size(), /*on_gpu=*/true);
    ASSERT_EQ(broken, "") << "case " << i;
  }
}

}  // namespace
}  // namespace fa_test
