// The AVX-512 level: 16 floats per register. Compiled with -mavx512f -mavx512bw -mavx512dq
// -mavx512vl (see CMakeLists.txt), so it is called only when the CPU reports all four.
#if defined(__x86_64__)

#include <immintrin.h>

#include "cpu/kernel_impl.h"

namespace flashattn::cpu {
namespace {

struct Avx512 {
  using T = float;
  using reg = __m512;
  static constexpr int W = 16;
  // 32 zmm registers: S^T micro-tile 8 keys x 48 rows (24 accumulators + 3 Q^T + 1 broadcast);
  // accumulate micro-tile 8 head-dim rows x 48 rows (24 accumulators + 3 P^T + 1 broadcast).
  static constexpr int kScoreKeys = 8, kScoreVecs = 3;
  static constexpr int kAccDims = 8, kAccVecs = 3;

  static reg zero() { return _mm512_setzero_ps(); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg x) { _mm512_storeu_ps(p, x); }
  static reg set1(float x) { return _mm512_set1_ps(x); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  // W values of an fp16 / bf16 row as floats (bf16 is the top half of an fp32).
  static reg load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static reg load_bf16(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  // The lane sums of a0..a3 into out[0..3]: pairs, then quads per 128-bit block, then the four
  // blocks (13 instructions for all four, where four separate reductions take about 32).
  static void sum4(reg a0, reg a1, reg a2, reg a3, float* out) {
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
    __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))));
    u = _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, 0x4E));
    u = _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, 0xB1));
    _mm_storeu_ps(out, _mm512_castps512_ps128(u));
  }
  static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }  // b when either is NaN
  static reg round(reg x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static reg pow2i(reg n) {
    __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }
  static reg abs(reg x) { return _mm512_abs_ps(x); }
  static reg copysign(reg mag, reg sgn) {
    __m512i s = _mm512_and_si512(_mm512_castps_si512(sgn), _mm512_set1_epi32(int(0x80000000u)));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(mag), s));
  }
  static reg less_select(reg a, reg b, reg x, reg y) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x);
  }
  // core::exponent_base: 0 where the running max is still -inf.
  static reg exponent_base(reg m) {
    __mmask16 empty = _mm512_cmp_ps_mask(m, _mm512_set1_ps(-__builtin_inff()), _CMP_EQ_OQ);
    return _mm512_mask_blend_ps(empty, m, _mm512_setzero_ps());
  }
  static reg exp2(reg x) { return exp2_poly<Avx512>(x); }
  static reg tanh(reg x) { return tanh_poly<Avx512>(x); }

  // core::to_bf16 on 16 values: round to nearest even on the bits, NaN quieted.
  static __m256i bf16_bits(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
  }

#pragma GCC diagnostic push
  // GCC 12 warns that its own _mm512_undefined_ps, the unmasked shuffles' pass-through, is
  // uninitialized where these are inlined (a false positive of that version).
#pragma GCC diagnostic ignored "-Wuninitialized"
  // dst[c][r] = src[r][c] for a 16 x 16 block: pairs of rows interleaved (unpack), then quads
  // (shuffle within 128-bit lanes: register 4g + j holds column 4L + j of rows 4g..4g+3 in lane L),
  // then the four lanes gathered across the groups (shuffle_f32x4).
  static void transpose_block(const float* src, int64_t lds, float* dst, int64_t ldd) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
      r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
      r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
      r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int j = 0; j < 4; ++j) {
      const __m512 a = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
      const __m512 b = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
      const __m512 c = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
      const __m512 d = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
      t[j] = _mm512_shuffle_f32x4(a, c, 0x88);
      t[8 + j] = _mm512_shuffle_f32x4(a, c, 0xDD);
      t[4 + j] = _mm512_shuffle_f32x4(b, d, 0x88);
      t[12 + j] = _mm512_shuffle_f32x4(b, d, 0xDD);
    }
    for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ldd, t[i]);
  }
#pragma GCC diagnostic pop

  // n is a multiple of 8 (a head dimension): 16 at a time, then a last 8 through a 16-wide masked
  // load and store.
  static void narrow(const float* src, float mul, DType t, void* dst, int64_t n) {
    auto* d = static_cast<uint16_t*>(dst);
    const __m512 m = _mm512_set1_ps(mul);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 live = n - i >= 16 ? __mmask16(0xffff) : __mmask16(0xff);
      const __m512 x = _mm512_mul_ps(m, _mm512_maskz_loadu_ps(live, src + i));
      const __m256i h = t == DType::f16 ? _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                                        : bf16_bits(x);
      _mm256_mask_storeu_epi16(d + i, live, h);
    }
  }

  // n is a multiple of 8 (a head dimension): 16 at a time, then a last 8 with the 256-bit forms.
  static void widen(const void* src, DType t, float* dst, int64_t n) {
    auto* s = static_cast<const uint16_t*>(src);
    int64_t i = 0;
    if (t == DType::f16) {
      for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_f16(s + i));
      if (i < n) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
    } else {  // bf16 is the top half of an fp32
      for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_bf16(s + i));
      if (i < n) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
      }
    }
  }
};

}  // namespace

const TileKernels<float>& avx512_kernels_f32() {
  static const TileKernels<float> k = make_kernels<Avx512>(KernelLevel::avx512);
  return k;
}

}  // namespace flashattn::cpu

#endif  // __x86_64__
