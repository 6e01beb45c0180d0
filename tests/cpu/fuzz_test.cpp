// The argument fuzzer (tests/fuzz/arg_fuzz.cpp) on fixed pseudo-random inputs, so that every run of
// the suite covers a few hundred cases of every operation, valid and mutated. The libFuzzer build
// (README "Fuzzing") explores further under the sanitizers.
#include <gtest/gtest.h>

#include "arg_fuzz.h"

namespace {

TEST(Fuzz, RandomArgumentsKeepTheApiPromises) { EXPECT_EQ(fa_fuzz::run_fixed_cases(20261204, 600), ""); }

}  // namespace
