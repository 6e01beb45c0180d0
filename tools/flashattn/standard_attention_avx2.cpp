// The CPU standard attention built for AVX2 (see standard_attention_impl.h; chosen at run time).
#define FATOOL_STD_ISA avx2
#define FATOOL_VECTOR_BYTES 32
#include "standard_attention_impl.h"
