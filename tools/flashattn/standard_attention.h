// Standard attention, the baseline FlashAttention is compared with: three passes that materialize
// the scores S = scale * Q K^T and the probabilities P = softmax(mask(S)) for every (batch, head)
// as [b, h, s_q, s_k] tensors in the input dtype, then O = P V. Its extra memory is 2 b h s_q s_k
// elements, and S and P each cross memory twice: the traffic the seed's analysis counts.
//
// Masks are the library's (bottom-right causal / sliding window, core::MaskSpec); a row that sees
// no key gets out = 0, as in the library. Tensors are contiguous and token-major like the API's:
// q, out [b, s_q, h, d]; k, v [b, s_k, h_kv, d].
#pragma once

#include <cstdint>

#include "flashattn/flashattn.hpp"

namespace fatool {

struct StandardArgs {
  flashattn::DType dtype = flashattn::DType::f32;
  int64_t b = 0, h = 0, h_kv = 0, s_q = 0, s_k = 0, d = 0;
  float scale = 0.f;  // already resolved (1/sqrt(d) by default)
  int64_t window_left = -1, window_right = -1;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  void* s = nullptr;  // [b, h, s_q, s_k] scores, dtype
  void* p = nullptr;  // [b, h, s_q, s_k] probabilities, dtype
  int threads = 0;    // CPU: 0 = all cores
};

// Bytes of S (and, again, of P).
inline int64_t standard_matrix_bytes(int64_t b, int64_t h, int64_t s_q, int64_t s_k, flashattn::DType t) {
  return b * h * s_q * s_k * flashattn::dtype_size(t);
}

// Multi-threaded CPU implementation (f16, bf16 and f32 accumulate in f32; f64 in f64).
void standard_attention_cpu(const StandardArgs& a);

}  // namespace fatool
