// The argument fuzzer's one entry point (tests/fuzz/arg_fuzz.cpp), shared by the libFuzzer target
// (tests/fuzz/libfuzzer_main.cpp) and the randomized test in the CPU suite (tests/cpu/fuzz_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fa_fuzz {

// Builds one case from the bytes, runs it on the CPU (or, on_gpu, on device copies of its buffers:
// 16-bit dtypes and 16-byte rows, and "unsupported" is an allowed answer) and checks the API's
// promises; returns what was broken (with the case), or an empty string. Not thread-safe.
std::string run_case(const uint8_t* data, size_t size, bool on_gpu = false);

// At most this many broken cases are reported by run_fixed_cases, so that one run (a device call
// is scarce) shows several distinct faults.
constexpr int kMaxReported = 8;

// `count` cases from 96 pseudo-random bytes each (std::mt19937 seeded with `seed`), going on past
// broken ones up to kMaxReported: "case i: ..." lines, or "" (the fixed inputs of the test suites).
std::string run_fixed_cases(uint32_t seed, int count, bool on_gpu = false);

}  // namespace fa_fuzz
