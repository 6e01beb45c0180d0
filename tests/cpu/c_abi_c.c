/* Compiled as C99 with -pedantic-errors (tests/CMakeLists.txt): proves that flashattn.h is a C
 * header, and runs a forward built entirely from C for c_abi_test.cpp to compare with the C++ API. */
#include <string.h>

#include "flashattn/flashattn.h"

int c_abi_forward_f32(float* q, float* k, float* v, float* out, float* lse, const int64_t shape[6], int causal) {
  /* shape = {batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim} */
  const int64_t q_shape[4] = {shape[0], shape[1], shape[3], shape[5]};
  const int64_t kv_shape[4] = {shape[0], shape[2], shape[4], shape[5]};
  const int64_t lse_shape[3] = {shape[0], shape[3], shape[1]};
  flashattn_forward_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.q = flashattn_contiguous(q, FLASHATTN_F32, FLASHATTN_CPU, 4, q_shape);
  args.k = flashattn_contiguous(k, FLASHATTN_F32, FLASHATTN_CPU, 4, kv_shape);
  args.v = flashattn_contiguous(v, FLASHATTN_F32, FLASHATTN_CPU, 4, kv_shape);
  args.out = flashattn_contiguous(out, FLASHATTN_F32, FLASHATTN_CPU, 4, q_shape);
  args.lse = flashattn_contiguous(lse, FLASHATTN_F32, FLASHATTN_CPU, 3, lse_shape);
  args.options = flashattn_default_options();
  args.options.causal = causal;
  return flashattn_forward(&args);
}

/* The version string and an error message, as a C caller reads them. */
const char* c_abi_version(void) { return flashattn_version(); }

int c_abi_bad_head_dim(float* buf) {
  const int64_t shape[4] = {1, 1, 1, 20};
  flashattn_forward_args args;
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.q = flashattn_contiguous(buf, FLASHATTN_F32, FLASHATTN_CPU, 4, shape);
  args.k = flashattn_contiguous(buf + 20, FLASHATTN_F32, FLASHATTN_CPU, 4, shape);
  args.v = flashattn_contiguous(buf + 40, FLASHATTN_F32, FLASHATTN_CPU, 4, shape);
  args.out = flashattn_contiguous(buf + 60, FLASHATTN_F32, FLASHATTN_CPU, 4, shape);
  args.options = flashattn_default_options();
  return flashattn_forward(&args);
}
