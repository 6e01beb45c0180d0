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
  // W values of an fp16 / bf16 row as floats (bf16 is the top half of an fp32).
  static reg load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static reg load_bf16(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  // The lane sums of a0..a3 into out[0..3]: two rounds of pairwise adds, then the two halves.
  static void sum4(reg a0, reg a1, reg a2, reg a3, float* out) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
  }
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

  // core::to_bf16 on 8 values: round to nearest even on the bits, NaN quieted.
  static __m128i bf16_bits(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
    // Both 128-bit lanes' four words into the low 64 bits of each, then those two together.
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
  }

  // dst[c][r] = src[r][c] for an 8 x 8 block: pairs of rows interleaved (unpack), then quads
  // (shuffle within 128-bit lanes: register 4g + j holds column 4L + j of rows 4g..4g+3 in lane L),
  // then the two lanes of the two groups paired (permute2f128).
  static void transpose_block(const float* src, int64_t lds, float* dst, int64_t ldd) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
      r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
      r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
      r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
      r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int j = 0; j < 4; ++j) {
      t[j] = _mm256_permute2f128_ps(r[j], r[4 + j], 0x20);
      t[4 + j] = _mm256_permute2f128_ps(r[j], r[4 + j], 0x31);
    }
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + i * ldd, t[i]);
  }

  // n is a multiple of 8 (a head dimension).
  static void narrow(const float* src, float mul, DType t, void* dst, int64_t n) {
    auto* d = static_cast<uint16_t*>(dst);
    const __m256 m = _mm256_set1_ps(mul);
    for (int64_t i = 0; i < n; i += 8) {
      const __m256 x = _mm256_mul_ps(m, _mm256_loadu_ps(src + i));
      const __m128i h = t == DType::f16 ? _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                                        : bf16_bits(x);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
    }
  }

  // n is a multiple of 8 (a head dimension).
  static void widen(const void* src, DType t, float* dst, int64_t n) {
    auto* s = static_cast<const uint16_t*>(src);
    if (t == DType::f16)
      for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(dst + i, load_f16(s + i));
    else
      for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(dst + i, load_bf16(s + i));
  }
};

}  // namespace

const TileKernels<float>& avx2_kernels_f32() {
  static const TileKernels<float> k = make_kernels<Avx2>(KernelLevel::avx2);
  return k;
}

}  // namespace flashattn::cpu

#endif  // __x86_64__
