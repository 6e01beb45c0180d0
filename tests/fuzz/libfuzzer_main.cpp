// libFuzzer target over the argument fuzzer (see tests/fuzz/arg_fuzz.cpp and README "Fuzzing").
#include <cstdio>
#include <cstdlib>

#include "arg_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string broken = fa_fuzz::run_case(data, size);
  if (!broken.empty()) {
    std::fprintf(stderr, "flashattn fuzz: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
