// The argument fuzzer (tests/fuzz/arg_fuzz.cpp) on fixed pseudo-random inputs, so that every run of
// the suite covers a few hundred cases of every operation, valid and mutated. The libFuzzer build
// (README "Fuzzing") explores further under the sanitizers.
#include <gtest/gtest.h>

#include <cstdint>

#include "arg_fuzz.h"

namespace {

TEST(Fuzz, RandomArgumentsKeepTheApiPromises) { EXPECT_EQ(fa_fuzz::run_fixed_cases(20261204, 600), ""); }

// Inputs the coverage-guided fuzzer reported, kept once their cause was understood and fixed.
TEST(Fuzz, ReportedInputs) {
  // An f32 backward over one key, scale 1, d = 256, dO broadcast over the batch: every gradient is
  // zero in exact arithmetic, and D = rowsum(dO o O) cancels against dO V^T only to their summation
  // orders' rounding, 1.15e-4 in dK, past the oracle's fixed f32 1e-4 (an oracle fault: the bound
  // now has a term for that rounding).
  const uint8_t f32_one_key[] = {0x69, 0x81, 0x81, 0x36, 0x05, 0xd9, 0xd9, 0xd9, 0x2e, 0xff, 0x3b, 0x01,
                                 0x00, 0xfa, 0x0e, 0xa9, 0x48, 0x7f, 0xef, 0xd9, 0xd9, 0xff, 0xff, 0xff,
                                 0x3b, 0x01, 0x00, 0xfa, 0x0e, 0xa9, 0x48, 0x7f, 0xef, 0xd9, 0xd9, 0xff,
                                 0xff, 0xa4, 0x21, 0x1c, 0x59, 0x58, 0x2a, 0x97};
  EXPECT_EQ(fa_fuzz::run_case(f32_one_key, sizeof(f32_one_key)), "");
  // An f32 decode at softcap 0.25, scale 0.75, d = 256, each query seeing one key: lse = 0.25 *
  // tanh(3 q.k). The float path multiplied q by 3 before the products, one more rounding of every
  // term of q.k, and its lse missed the rule (2.46e-6 against 2.29e-6). It now multiplies q.k
  // inside the softcap pass (attn_engine.h).
  const uint8_t f32_softcap_decode[] = {0x34, 0x0a, 0xba, 0x0a, 0x71, 0x0d, 0x29, 0x71, 0x7a, 0x71, 0x71, 0x71,
                                        0x71, 0x71, 0x71, 0x71, 0x71, 0xe6, 0x2f, 0x05, 0xff, 0xff, 0x00, 0x00,
                                        0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0f, 0x2f, 0x05, 0xff,
                                        0x30, 0x76, 0x37, 0xeb, 0x71, 0x5b, 0x71, 0x71, 0x51};
  EXPECT_EQ(fa_fuzz::run_case(f32_softcap_decode, sizeof(f32_softcap_decode)), "");
}

}  // namespace
