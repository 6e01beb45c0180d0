// The CPU standard attention for baseline x86-64 (SSE2), and the run-time choice of the AVX2 build.
#define FATOOL_STD_ISA portable
#define FATOOL_VECTOR_BYTES 16
#include "standard_attention_impl.h"

namespace fatool {

namespace avx2 {
void standard_attention(const StandardArgs& a);  // standard_attention_avx2.cpp
}

void standard_attention_cpu(const StandardArgs& a) {
  if (__builtin_cpu_supports("avx2"))
    avx2::standard_attention(a);
  else
    portable::standard_attention(a);
}

}  // namespace fatool
