// The AMX-BF16 products of the forward (amx.h). Compiled with the AVX-512, AVX512-BF16 and AMX flags
// (see CMakeLists.txt), so it is called only when the CPU and the OS offer all of them.
//
// The tiles are configured as amx_simd.h's blocks of tile products describe.
#if defined(__x86_64__)

#include <immintrin.h>

#include <cstdint>

#include "cpu/amx_simd.h"

namespace flashattn::cpu {
namespace {

struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// A constant in memory: GCC 12 treats ldtilecfg's operand as a one-byte read, so a configuration
// built on the stack before it lost every store but the palette's (and the first tile
// instruction then faulted).
alignas(64) constexpr TileConfig kConfig = {1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

// The thread's tile configuration is saved first and restored at the end: code around us in the
// thread (oneDNN inside PyTorch, say) may have configured the tiles and count on that
// configuration staying loaded. Their tile data is not kept (our products overwrite the registers).
void begin(AmxSavedState* saved) {
  _tile_storeconfig(saved->bytes);
  _tile_loadconfig(&kConfig);
}

void end(const AmxSavedState* saved) {
  if (saved->bytes[0] != 0) _tile_loadconfig(saved->bytes);  // byte 0, the palette: 0 = none loaded
  else _tile_release();
}

// ---- S^T = K Q^T -------------------------------------------------------------------------------
// KB blocks of 16 keys x RB blocks of 16 query rows, summed over the head dim 32 at a time.
template <int KB, int RB, bool Split>
void scores_block(const uint16_t* k, const uint16_t* k_lo, int64_t ldk, const uint32_t* qv, const uint32_t* qv_lo,
                  int64_t d, int64_t mpad, float* st) {
  zero_block<KB, RB>();
  add_products<KB, RB, Split>(k, k_lo, ldk, qv, qv_lo, mpad, d);
  store_block<KB, RB>(st, mpad);
}

template <bool Split>
void scores_blocks(const uint16_t* k, const uint16_t* k_lo, int64_t ldk, int64_t keys, const uint32_t* qv,
                   const uint32_t* qv_lo, int64_t d, int64_t rows, int64_t mpad, float* st) {
  // Key blocks outside: a block's K rows (32 x d, from L2 or beyond: a head's K and V^T take 2 MiB
  // at d = 256) are read for every block of query rows while they are in L1; Q's VNNI words stay
  // in L1 for the whole tile. Min of 8 runs, alternating builds, 7 rounds: d=256 1.045x the rows
  // outside, d=128 1.00x (prefetching the next block's rows as well: d=256 0.95x).
  for (int64_t j = 0; j < keys; j += 32) {
    const bool two_keys = keys - j >= 32;
    const uint16_t* kj = k + j * ldk;
    const uint16_t* kj_lo = Split ? k_lo + j * ldk : nullptr;
    for (int64_t i = 0; i < rows; i += 32) {
      const bool two_rows = rows - i >= 32;
      const uint32_t* qi_lo = Split ? qv_lo + i : nullptr;
      float* s = st + j * mpad + i;
      if (two_keys && two_rows) scores_block<2, 2, Split>(kj, kj_lo, ldk, qv + i, qi_lo, d, mpad, s);
      else if (two_keys) scores_block<2, 1, Split>(kj, kj_lo, ldk, qv + i, qi_lo, d, mpad, s);
      else if (two_rows) scores_block<1, 2, Split>(kj, kj_lo, ldk, qv + i, qi_lo, d, mpad, s);
      else scores_block<1, 1, Split>(kj, kj_lo, ldk, qv + i, qi_lo, d, mpad, s);
    }
  }
}

void scores(const uint16_t* k, const uint16_t* k_lo, int64_t ldk, int64_t nk, const uint32_t* qv,
            const uint32_t* qv_lo, int64_t d, int64_t rows, int64_t mpad, float* st) {
  const int64_t keys = (nk + 15) / 16 * 16;
  if (k_lo) scores_blocks<true>(k, k_lo, ldk, keys, qv, qv_lo, d, rows, mpad, st);
  else scores_blocks<false>(k, nullptr, ldk, keys, qv, nullptr, d, rows, mpad, st);
}

// ---- online softmax, P^T to bf16 pairs -----------------------------------------------------------
// 2^x for the softmax's exponents (x <= 0 up to rounding): x = n + r, |r| <= 1/2, 2^r by a degree-4
// polynomial fitted for relative error (below 2.9e-6 in fp32 evaluation, 700 times under the
// bf16 rounding P gets next; its constant term is 1, so 2^0 is exactly 1 and a row whose max
// stays put keeps f = 1), times 2^n by vscalefps. Below x = -125 the result is 0 (as the float
// kernels flush results under 2^-126), set by the mask rather than computed: a vscalefps whose
// result underflows takes a microcode assist, and every masked score (-inf) took one when x was
// clamped at -200, where 2^n underflowed to 0 (bf16, 8 heads x 256 tokens, d = 64, causal, two
// threads of a Sapphire Rapids VM: 451 us a call, 266 with the mask). NaN stays NaN (the mask
// keeps unordered lanes, and vmaxps returns its second operand for NaN). Coefficients: a
// Lawson-weighted least-squares fit on Chebyshev points (numpy).
__m512 exp2_bf16(__m512 x) {
  const __mmask16 kept = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.f), _CMP_NLT_UQ);
  x = _mm512_max_ps(_mm512_set1_ps(-125.f), x);
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(0.009582853220669357f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.05590642620810371f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.24024098617764703f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.6931241932253028f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_maskz_scalef_ps(kept, p, n);
}

// The update of core::SoftmaxState for the rows of a score tile (rows are the vector lanes, as in
// kernel_impl.h's softmax): new max, rescale factor f, l = f * l + rowsum(P~); P~ goes out not to
// ST but rounded to bf16 into PV [keys/2][mpad] words, pairs of keys 2r and 2r + 1, zero from key
// nk up to a multiple of 32: the B operand of O~^T += V^T P~^T, written in the same pass. With
// pv_lo, P~'s lo halves (split_bf16) go there in the same form.
template <bool Split>
void softmax_rows(const float* st, int64_t nk, int64_t rows, int64_t mpad, float c, float* m, float* l, float* f,
                  uint32_t* pv, uint32_t* pv_lo) {
  const __m512 cv = _mm512_set1_ps(c), neg_inf = _mm512_set1_ps(-__builtin_inff());
  const int64_t pairs = (nk + 31) / 32 * 16;
  // 16 rows at a time, their max and sums in registers through the whole tile (a running value
  // kept in memory would chain every key's update through a store and a load).
  for (int64_t i = 0; i < rows; i += 16) {
    const __m512 m_old = _mm512_loadu_ps(m + i);
    __m512 m_new = m_old;
    for (int64_t j = 0; j < nk; ++j) m_new = _mm512_max_ps(_mm512_loadu_ps(st + j * mpad + i), m_new);
    // core::exponent_base: 0 while the row has seen only -inf.
    const __m512 b = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m_new, neg_inf, _CMP_EQ_OQ), m_new, _mm512_setzero_ps());
    const __m512 factor = exp2_bf16(_mm512_mul_ps(_mm512_sub_ps(m_old, b), cv));
    __m512 sum_even = _mm512_setzero_ps(), sum_odd = _mm512_setzero_ps();
    for (int64_t r = 0; r < pairs; ++r) {
      __m512 even = _mm512_setzero_ps(), odd = _mm512_setzero_ps();
      if (2 * r < nk) even = exp2_bf16(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(st + 2 * r * mpad + i), b), cv));
      if (2 * r + 1 < nk) odd = exp2_bf16(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(st + (2 * r + 1) * mpad + i), b), cv));
      sum_even = _mm512_add_ps(sum_even, even);
      sum_odd = _mm512_add_ps(sum_odd, odd);
      if constexpr (Split) {
        __m512i hi, lo;
        split_pair_words(even, odd, &hi, &lo);
        _mm512_storeu_si512(pv + r * mpad + i, hi);
        _mm512_storeu_si512(pv_lo + r * mpad + i, lo);
      } else {
        _mm512_storeu_si512(pv + r * mpad + i, pair_words(even, odd));
      }
    }
    _mm512_storeu_ps(m + i, m_new);
    _mm512_storeu_ps(f + i, factor);
    _mm512_storeu_ps(l + i, _mm512_fmadd_ps(_mm512_loadu_ps(l + i), factor, _mm512_add_ps(sum_even, sum_odd)));
  }
}

void softmax(const float* st, int64_t nk, int64_t rows, int64_t mpad, float c, float* m, float* l, float* f,
             uint32_t* pv, uint32_t* pv_lo) {
  if (pv_lo) softmax_rows<true>(st, nk, rows, mpad, c, m, l, f, pv, pv_lo);
  else softmax_rows<false>(st, nk, rows, mpad, c, m, l, f, pv, nullptr);
}

// ---- O~^T = f O~^T + V^T P~^T ------------------------------------------------------------------
// OT *= f, row group by row group; a group of 16 rows whose maxima all stayed put (f = 1 exactly:
// exp2 of 0) is left alone, which is most of them once a row has seen a few tiles.
void rescale(const float* f, int64_t rows, int64_t mpad, int64_t d, float* ot) {
  const __m512 one = _mm512_set1_ps(1.f);
  for (int64_t i = 0; i < rows; i += 16) {
    const __m512 fv = _mm512_loadu_ps(f + i);
    if (_mm512_cmp_ps_mask(fv, one, _CMP_NEQ_UQ) == 0) continue;
    for (int64_t x = 0; x < d; ++x) _mm512_storeu_ps(ot + x * mpad + i, _mm512_mul_ps(fv, _mm512_loadu_ps(ot + x * mpad + i)));
  }
}

// 2 blocks of 16 head-dim rows x RB blocks of 16 query rows of O~^T, over keys [0, keys).
template <int RB, bool Split>
void accumulate_block(const uint16_t* vt, const uint16_t* vt_lo, int64_t ldv, int64_t keys, const uint32_t* pv,
                      const uint32_t* pv_lo, int64_t mpad, float* ot) {
  load_block<2, RB>(ot, mpad);
  add_products<2, RB, Split>(vt, vt_lo, ldv, pv, pv_lo, mpad, keys);
  store_block<2, RB>(ot, mpad);
}

template <bool Split>
void accumulate_blocks(const uint16_t* vt, const uint16_t* vt_lo, int64_t ldv, int64_t keys, const uint32_t* pv,
                       const uint32_t* pv_lo, int64_t rows, int64_t mpad, int64_t d, float* ot) {
  for (int64_t x = 0; x < d; x += 32)
    for (int64_t i = 0; i < rows; i += 32) {
      const uint16_t* a_lo = Split ? vt_lo + x * ldv : nullptr;
      const uint32_t* b_lo = Split ? pv_lo + i : nullptr;
      if (rows - i >= 32) accumulate_block<2, Split>(vt + x * ldv, a_lo, ldv, keys, pv + i, b_lo, mpad, ot + x * mpad + i);
      else accumulate_block<1, Split>(vt + x * ldv, a_lo, ldv, keys, pv + i, b_lo, mpad, ot + x * mpad + i);
    }
}

void accumulate(const uint16_t* vt, const uint16_t* vt_lo, int64_t ldv, int64_t nk, const uint32_t* pv,
                const uint32_t* pv_lo, int64_t rows, int64_t mpad, int64_t d, const float* f, float* ot) {
  rescale(f, rows, mpad, d, ot);
  const int64_t keys = (nk + 31) / 32 * 32;
  if (vt_lo) accumulate_blocks<true>(vt, vt_lo, ldv, keys, pv, pv_lo, rows, mpad, d, ot);
  else accumulate_blocks<false>(vt, nullptr, ldv, keys, pv, nullptr, rows, mpad, d, ot);
}

// ---- operands in and results out ---------------------------------------------------------------
void split_f16(const uint16_t* x, int64_t n, uint16_t* hi, uint16_t* lo) {
  for (int64_t c = 0; c < n; c += 16) {
    __m256i h, l;
    split_bf16(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + c))), &h, &l);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + c), h);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + c), l);
  }
}

// The first `cols` (16 or 32) staged query rows -> columns i0..i0 + cols of the VNNI words.
void pack_q(const uint16_t* staged, int64_t d, uint32_t* qv, int64_t mpad, int64_t i0, int64_t cols) {
  transpose_words(staged, cols, d, qv + i0, mpad);
}

// 32 staged rows of V -> 32 columns of V^T: the rows' values paired into 32-bit words (keys 2p and
// 2p + 1 of one head-dim column x, the first in the low half), then 16 x 16 blocks of words
// transposed in registers, so that row x of V^T gets its 32 values in two 64-byte stores.
void pack_vt(const uint16_t* staged, int64_t d, uint16_t* vt, int64_t ldv, int64_t j0) {
  __m512i r[16];
  for (int64_t x0 = 0; x0 < d; x0 += 16) {
    for (int p = 0; p < 16; ++p) {
      const auto* even = reinterpret_cast<const __m256i*>(staged + 2 * p * d + x0);
      const auto* odd = reinterpret_cast<const __m256i*>(staged + (2 * p + 1) * d + x0);
      r[p] = _mm512_or_si512(_mm512_cvtepu16_epi32(_mm256_loadu_si256(even)),
                             _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(odd)), 16));
    }
    transpose16(r);
    for (int q = 0; q < 16; ++q) _mm512_storeu_si512(vt + (x0 + q) * ldv + j0, r[q]);
  }
}

// Rows i < rows (a multiple of 16) of O~^T [d][mpad], times scale[i], as bf16 or fp16 into out[i]
// (null: a padding row, not written): 16 x 16 blocks transposed in registers, so each row goes out
// in 32-byte stores.
void finish(const float* ot, int64_t mpad, int64_t rows, int64_t d, const float* scale, bool f16, void* const* out) {
  __m512i r[16];
  for (int64_t i0 = 0; i0 < rows; i0 += 16)
    for (int64_t x0 = 0; x0 < d; x0 += 16) {
      for (int q = 0; q < 16; ++q) r[q] = _mm512_castps_si512(_mm512_loadu_ps(ot + (x0 + q) * mpad + i0));
      transpose16(r);
      for (int q = 0; q < 16; ++q) {
        if (!out[i0 + q]) continue;
        const __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(r[q]), _mm512_set1_ps(scale[i0 + q]));
        const __m256i h = f16 ? _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                              : (__m256i)_mm512_cvtneps_pbh(v);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<char*>(out[i0 + q]) + 2 * x0), h);
      }
    }
}

}  // namespace

const AmxKernels& amx_kernels() {
  static const AmxKernels k{&begin, &end, &split_f16, &pack_q, &pack_vt, &scores, &softmax, &accumulate, &finish};
  return k;
}

}  // namespace flashattn::cpu

#endif  // __x86_64__
