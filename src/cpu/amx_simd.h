// AVX-512 and tile helpers of the AMX files (kernels_amx.cpp, backward_amx.cpp), which alone include
// this header: both are compiled with the AMX and AVX512-BF16 flags, and everything here has
// internal linkage, so no copy of it is shared with code compiled for other levels.
#pragma once

#include <immintrin.h>

#include <cstdint>

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

// ---- blocks of tile products ---------------------------------------------------------------------
// Every product of the AMX files runs on a block of MA x NB (1 or 2 each) 16 x 16 fp32 results in
// tiles 0-3 (tile 2a + b holds the block's rows 16a.., columns 16b..), A operands in tiles 4-5 and
// B operands in 6-7, all configured as 16 rows x 64 bytes. The tile intrinsics name their registers
// by literal numbers (GCC expands them into the instruction text), so the block shapes are spelled
// out with `if constexpr` rather than indexed.

// The block's results at c, rows ldc floats apart: zeroed, loaded or stored.
template <int MA, int NB>
void zero_block() {
  _tile_zero(0);
  if constexpr (NB == 2) _tile_zero(1);
  if constexpr (MA == 2) _tile_zero(2);
  if constexpr (MA == 2 && NB == 2) _tile_zero(3);
}

template <int MA, int NB>
void load_block(const float* c, int64_t ldc) {
  _tile_loadd(0, c, ldc * 4);
  if constexpr (NB == 2) _tile_loadd(1, c + 16, ldc * 4);
  if constexpr (MA == 2) _tile_loadd(2, c + 16 * ldc, ldc * 4);
  if constexpr (MA == 2 && NB == 2) _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
}

template <int MA, int NB>
void store_block(float* c, int64_t ldc) {
  _tile_stored(0, c, ldc * 4);
  if constexpr (NB == 2) _tile_stored(1, c + 16, ldc * 4);
  if constexpr (MA == 2) _tile_stored(2, c + 16 * ldc, ldc * 4);
  if constexpr (MA == 2 && NB == 2) _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
}

// block += A B over k values of the reduction (a multiple of 32), 32 at a time: A as bf16 rows lda
// apart from a (its second 16 rows 16 * lda further), B as VNNI words [k/2] rows ldb apart from b
// (its second 16 columns 16 further). Split (fp16 problems, amx.h): a_lo and b_lo hold the operands'
// lo halves, and each step adds A_hi B_hi and then the two cross products, A_hi B_lo first, or with
// LoFirst A_lo B_hi first (the order follows the operands' roles where a product must match its
// transpose bit for bit: backward_amx.cpp).
template <int MA, int NB, bool Split, bool LoFirst = false>
void add_products(const uint16_t* a, const uint16_t* a_lo, int64_t lda, const uint32_t* b, const uint32_t* b_lo,
                  int64_t ldb, int64_t k) {
  auto load_a = [&](const uint16_t* from, int64_t x) {
    _tile_loadd(4, from + x, lda * 2);
    if constexpr (MA == 2) _tile_loadd(5, from + 16 * lda + x, lda * 2);
  };
  auto load_b = [&](const uint32_t* from, int64_t x) {
    _tile_loadd(6, from + (x / 2) * ldb, ldb * 4);
    if constexpr (NB == 2) _tile_loadd(7, from + (x / 2) * ldb + 16, ldb * 4);
  };
  auto products = [] {
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NB == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MA == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (MA == 2 && NB == 2) _tile_dpbf16ps(3, 5, 7);
  };
  for (int64_t x = 0; x < k; x += 32) {
    load_a(a, x);
    load_b(b, x);
    products();
    if constexpr (Split && !LoFirst) {
      load_b(b_lo, x);
      products();
      load_a(a_lo, x);
      load_b(b, x);
      products();
    } else if constexpr (Split) {
      load_a(a_lo, x);
      products();
      load_a(a, x);
      load_b(b_lo, x);
      products();
    }
  }
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
