// The AVX2 + FMA + F16C level: 8 floats per register. Compiled with -mavx2 -mfma -mf16c (see
// CMakeLists.txt); called only when the CPU reports all three.
#if defined(__x86_64__)

#include <immintrin.h>

#include "cpu/kernel_impl.h"

namespace flashattn::cpu {
namespace {

struct Avx2 {
  using T = float;
  using reg = __m256;
  static constexpr int W = 8;
  // 16 ymm registers: S^T micro-tile 4 keys x 24 rows (12 accumulators + 3 Q^T + 1 broadcast);
  // accumulate micro-tile 4 head-dim rows x 24 rows (12 accumulators + 3 P^T + 1 broadcast).
  // 4 divides the 64-key tile and every head dimension, so full tiles use only these shapes.
  static constexpr int kScoreKeys = 4, kScoreVecs = 3;
  static constexpr int kAccDims = 4, kAccVecs = 3;

  static reg zero() { return _mm256_setzero_ps(); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg x) { _mm256_storeu_ps(p, x); }
  static reg set1(float x) { return _mm256_set1_ps(x); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }  // b when either is NaN
  static reg round(reg x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static reg pow2i(reg n) {
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  static reg abs(reg x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), x); }
  static reg copysign(reg mag, reg sgn) {
    return _mm256_or_ps(mag, _mm256_and_ps(_mm256_set1_ps(-0.f), sgn));
  }
  static reg less_select(reg a, reg b, reg x, reg y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LT_OQ)); }
  // core::exponent_base: 0 where the running max is still -inf.
  static reg exponent_base(reg m) {
    reg empty = _mm256_cmp_ps(m, _mm256_set1_ps(-__builtin_inff()), _CMP_EQ_OQ);
    return _mm256_andnot_ps(empty, m);
  }
  static reg exp2(reg x) { return exp2_poly<Avx2>(x); }
  static reg tanh(reg x) { return tanh_poly<Avx2>(x); }

  // n is a multiple of 8 (a head dimension).
  static void widen(const void* src, DType t, float* dst, int64_t n) {
    auto* s = static_cast<const uint16_t*>(src);
    if (t == DType::f16) {
      for (int64_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
    } else {  // bf16 is the top half of an fp32
      for (int64_t i = 0; i < n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
      }
    }
  }
};

}  // namespace

const TileKernels<float>& avx2_kernels_f32() {
  static const TileKernels<float> k = make_kernels<Avx2>(KernelLevel::avx2);
  return k;
}

}  // namespace flashattn::cpu

#endif  // __x86_64__
