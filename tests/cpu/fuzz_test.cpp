// The argument fuzzer (tests/fuzz/arg_fuzz.cpp) on fixed pseudo-random inputs, so that every run of
// the suite covers a few hundred cases of every operation, valid and mutated. The libFuzzer build
// (README "Fuzzing") explores further under the sanitizers.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "arg_fuzz.h"

namespace {

TEST(Fuzz, RandomArgumentsKeepTheApiPromises) {
  constexpr int kCases = 600;
  std::mt19937 rng(20261204);
  std::vector<uint8_t> bytes(96);
  for (int i = 0; i < kCases; ++i) {
    for (uint8_t& b : bytes) b = uint8_t(rng());
    const std::string broken = fa_fuzz::run_case(bytes.data(), bytes.size());
    ASSERT_EQ(broken, "") << "case " << i;
  }
}

}  // namespace
