// AVX-512 helpers of the AMX files (kernels_amx.cpp, backward_amx.cpp), which alone include this
// header: both are compiled with the AMX and AVX512-BF16 flags, and everything here has internal
// linkage, so no copy of it is shared with code compiled for other levels.
#pragma once

#include <immintrin.h>

#include "cpu/amx.h"

namespace flashattn::cpu {
namespace {

// Two rows of 16 floats -> 16 VNNI words, each the bf16 pair (even[c], odd[c]), rounded to nearest
// even.
inline __m512i pair_words(__m512 even, __m512 odd) {
  return _mm512_permutexvar_epi16(_mm512_load_si512(kAmxPairInterleave), (__m512i)_mm512_cvtne2ps_pbh(odd, even));
}

// 16 bf16 values -> fp32 (exact: a bf16 value is the top half of an fp32 one).
inline __m512 widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// x = hi + lo with hi = bf16(x) and lo = bf16(x - hi), both rounded to nearest even: the two bf16
// halves of an fp16 operand (amx.h), whose sum is x exactly for every finite fp16 value (x - hi is
// exact in fp32 and has at most 4 significant bits). An infinite x keeps lo = 0, so hi + lo stays
// infinite instead of turning NaN.
inline void split_bf16(__m512 x, __m256i* hi, __m256i* lo) {
  *hi = (__m256i)_mm512_cvtneps_pbh(x);
  const __m512 h = widen_bf16(*hi);
  const __mmask16 finite = static_cast<__mmask16>(~_mm512_fpclass_ps_mask(h, 0x18));  // 0x18: +-inf
  *lo = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_sub_ps(finite, x, h));
}

// As pair_words, for the hi and lo halves of each value (split_bf16).
inline void split_pair_words(__m512 even, __m512 odd, __m512i* hi, __m512i* lo) {
  __m256i even_hi, even_lo, odd_hi, odd_lo;
  split_bf16(even, &even_hi, &even_lo);
  split_bf16(odd, &odd_hi, &odd_lo);
  const __m512i idx = _mm512_load_si512(kAmxPairInterleave);
  *hi = _mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(even_hi), odd_hi, 1));
  *lo = _mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(even_lo), odd_lo, 1));
}

// r[0..16) <- their transpose (16 x 16 32-bit words), in three rounds: pairs of rows interleaved
// by 32-bit words, then by 64-bit words (r[4k + s] then holds in 128-bit lane L column 4L + s of
// rows 4k..4k+3), then the 128-bit lanes regrouped so that register c gathers column c's four
// lanes.
inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int s = 0; s < 4; ++s) {  // lanes (0, 2 | 1, 3) of rows 0-7 and of rows 8-15
    t[s] = _mm512_shuffle_i32x4(r[s], r[s + 4], 0x88);
    t[s + 4] = _mm512_shuffle_i32x4(r[s], r[s + 4], 0xdd);
    t[s + 8] = _mm512_shuffle_i32x4(r[s + 8], r[s + 12], 0x88);
    t[s + 12] = _mm512_shuffle_i32x4(r[s + 8], r[s + 12], 0xdd);
  }
  for (int s = 0; s < 4; ++s) {  // columns s, 4 + s, 8 + s, 12 + s
    r[s] = _mm512_shuffle_i32x4(t[s], t[s + 8], 0x88);
    r[s + 8] = _mm512_shuffle_i32x4(t[s], t[s + 8], 0xdd);
    r[s + 4] = _mm512_shuffle_i32x4(t[s + 4], t[s + 12], 0x88);
    r[s + 12] = _mm512_shuffle_i32x4(t[s + 4], t[s + 12], 0xdd);
  }
}

// n rows of d bf16 values (n a multiple of 16, d of 32) -> their 32-bit words transposed: out[r *
// out_stride + j] = word r of row j, the bf16 pair (x[j][2r], x[j][2r + 1]). That is x^T in the
// VNNI layout a B operand wants, in 16 x 16 blocks transposed in registers.
inline void transpose_words(const uint16_t* x, int64_t n, int64_t d, uint32_t* out, int64_t out_stride) {
  const auto* words = reinterpret_cast<const uint32_t*>(x);
  const int64_t pairs = d / 2;
  __m512i r[16];
  for (int64_t j0 = 0; j0 < n; j0 += 16)
    for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
      for (int q = 0; q < 16; ++q) r[q] = _mm512_loadu_si512(words + (j0 + q) * pairs + p0);
      transpose16(r);
      for (int q = 0; q < 16; ++q) _mm512_storeu_si512(out + (p0 + q) * out_stride + j0, r[q]);
    }
}

}  // namespace
}  // namespace flashattn::cpu
