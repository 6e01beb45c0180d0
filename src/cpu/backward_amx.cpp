// The backward tile arithmetic of bf16 problems on AMX tiles (the build gives *_amx.cpp files the
// AVX-512, AVX512-BF16 and AMX flags); backward.cpp calls it only when the engine's level is amx,
// the problem is bf16 and the head dim a multiple of 32. The steps are backward_tile_impl.h's
// (its softmax and dS arithmetic on the fp32 score tiles) with the five products as tile products,
// each operand in the form the tiles want: A as bf16 rows [m][k], B as VNNI words [k/2][n] (the
// bf16 pair of rows 2r and 2r + 1 of each column in one 32-bit word). Q, K, V and dO arrive as
// their bf16 rows (exact); the fixed tile of a task is packed once (TileOps::key_tile,
// query_tile), the streamed one per step; P and dS are rounded to bf16 where they enter a product.
// The tiles write the fp32 score tiles and add into the fp32 gradient accumulators in place
// (TileStep<float, float>).
#if defined(__x86_64__)

#include <immintrin.h>

#include "cpu/amx_simd.h"
#include "cpu/backward_tile_impl.h"

namespace flashattn::cpu::bwd {
namespace {

// op(A) [m][k] as bf16 rows: A row-major [m][k], or (TransA) stored [k][m]. The transposed case
// pairs rows 2r, 2r + 1 of the stored matrix into words (a word holds A[i][2r], A[i][2r + 1]) and
// transposes 16 x 16 blocks of words, so each output row gets its values in order.
template <bool TransA>
void pack_a(const float* a, int64_t m, int64_t k, uint16_t* out) {
  if constexpr (!TransA) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t x = 0; x < k; x += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i * k + x),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(a + i * k + x)));
  } else {
    auto* words = reinterpret_cast<uint32_t*>(out);  // [m][k/2]
    const int64_t pairs = k / 2;
    __m512i r[16];
    for (int64_t p0 = 0; p0 < pairs; p0 += 16)
      for (int64_t i0 = 0; i0 < m; i0 += 16) {
        for (int q = 0; q < 16; ++q) {
          const float* even = a + 2 * (p0 + q) * m + i0;
          r[q] = pair_words(_mm512_loadu_ps(even), _mm512_loadu_ps(even + m));
        }
        transpose16(r);
        for (int q = 0; q < 16; ++q) _mm512_storeu_si512(words + (i0 + q) * pairs + p0, r[q]);
      }
  }
}

// C[32][32] block (i, j) of C[m][n] (+)= A B: tiles 0-3 the four 16 x 16 blocks of C, loaded from
// C to accumulate, 4-5 A, 6-7 B.
void block_product(const uint16_t* ab, const uint32_t* bv, int64_t k, int64_t n, int64_t i, int64_t j, float* c,
                   bool accumulate) {
  const int64_t c_stride = n * 4;
  float* c0 = c + i * n + j;
  float* c2 = c0 + 16 * n;
  if (accumulate) {
    _tile_loadd(0, c0, c_stride);
    _tile_loadd(1, c0 + 16, c_stride);
    _tile_loadd(2, c2, c_stride);
    _tile_loadd(3, c2 + 16, c_stride);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t a_stride = k * 2, b_stride = n * 4;
  for (int64_t x = 0; x < k; x += 32) {
    _tile_loadd(4, ab + i * k + x, a_stride);
    _tile_loadd(5, ab + (i + 16) * k + x, a_stride);
    _tile_loadd(6, bv + (x / 2) * n + j, b_stride);
    _tile_loadd(7, bv + (x / 2) * n + j + 16, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c0, c_stride);
  _tile_stored(1, c0 + 16, c_stride);
  _tile_stored(2, c2, c_stride);
  _tile_stored(3, c2 + 16, c_stride);
}

// C[m][n] (+)= A[m][k] B: A bf16 rows (k apart), B VNNI words [k/2][n]; m, n, k multiples of 32.
void product(const uint16_t* a, const uint32_t* b, float* c, int64_t m, int64_t n, int64_t k, bool accumulate) {
  for (int64_t i = 0; i < m; i += 32)
    for (int64_t j = 0; j < n; j += 32) block_product(a, b, k, n, i, j, c, accumulate);
}

// x [m][n] bf16 rows -> VNNI words [m/2][n]: word (r, c) = (x[2r][c], x[2r + 1][c]).
void pair_rows(const uint16_t* x, int64_t m, int64_t n, uint32_t* out) {
  alignas(64) static constexpr uint16_t kLow[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                    8,  40, 9,  41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t kHigh[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                     24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i low = _mm512_load_si512(kLow), high = _mm512_load_si512(kHigh);
  for (int64_t r = 0; r < m / 2; ++r)
    for (int64_t c = 0; c < n; c += 32) {
      const __m512i even = _mm512_loadu_si512(x + 2 * r * n + c), odd = _mm512_loadu_si512(x + (2 * r + 1) * n + c);
      _mm512_storeu_si512(out + r * n + c, _mm512_permutex2var_epi16(even, low, odd));
      _mm512_storeu_si512(out + r * n + c + 16, _mm512_permutex2var_epi16(even, high, odd));
    }
}

// The key tile's B operands, once per key tile (TileOps::key_tile), from its bf16 rows.
void key_tile(const TileStep<float, float>& st) {
  transpose_words(st.k16, st.bn, st.d, st.kt_words, st.bn);
  transpose_words(st.v16, st.bn, st.d, st.vt_words, st.bn);
  pair_rows(st.k16, st.bn, st.d, st.k_words);
}

// The query tile's B operands, once per dQ task (TileOps::query_tile), from its bf16 rows.
void query_tile(const TileStep<float, float>& st) {
  transpose_words(st.q16, st.bm, st.d, st.qt_words, st.bm);
  transpose_words(st.dout16, st.bm, st.d, st.dot_words, st.bm);
}

// backward_tile_impl.h's steps on operands already in the tiles' forms where they can be: Q, dO,
// K and V as bf16 rows (the A of S, dP and their transposes; paired into words where they are a
// B), the fixed tile's VNNI words. The same bf16 values meet in the same roles in all three steps
// (S^T = K Q^T takes each product S = Q K^T does), so the one-pass and the two-pass schedules
// give bitwise the same gradients.

// The key tile's view: dV += P^T dO and dK += dS^T Q.
void amx_dkdv_step(const TileStep<float, float>& st) {
  const int64_t bm = st.bm, bn = st.bn, d = st.d;
  uint16_t* a = st.pack;                                       // [tile][tile]: P^T, dS^T, dS
  auto* words = reinterpret_cast<uint32_t*>(st.pack + bm * bn);  // [bm/2][d]: dO, then Q
  product(st.q16, st.kt_words, st.p, bm, bn, d, false);  // S = Q K^T
  probabilities<false, float, 16>(st);
  pack_a<true>(st.p, bn, bm, a);
  pair_rows(st.dout16, bm, d, words);
  product(a, words, st.dv, bn, d, bm, true);  // dV += P^T dO
  product(st.dout16, st.vt_words, st.dp, bm, bn, d, false);  // dP = dO V^T
  score_grad<false, float>(st);
  pack_a<true>(st.p, bn, bm, a);
  pair_rows(st.q16, bm, d, words);
  product(a, words, st.dk, bn, d, bm, true);  // dK += dS^T Q
}

// Both views from one dS, for a task that owns dQ of every query row of its KV head group.
void amx_fused_step(const TileStep<float, float>& st) {
  amx_dkdv_step(st);
  pack_a<false>(st.p, st.bm, st.bn, st.pack);
  product(st.pack, st.k_words, st.dq, st.bm, st.d, st.bn, true);  // dQ += dS K
}

// The query tile's view: S^T = K Q^T, dP^T = V dO^T, dQ += dS K.
void amx_dq_step(const TileStep<float, float>& st) {
  const int64_t bm = st.bm, bn = st.bn, d = st.d;
  auto* words = reinterpret_cast<uint32_t*>(st.pack + bm * bn);  // [bn/2][d]: K
  product(st.k16, st.qt_words, st.p, bn, bm, d, false);  // S^T = K Q^T
  probabilities<true, float, 16>(st);
  product(st.v16, st.dot_words, st.dp, bn, bm, d, false);  // dP^T = V dO^T
  score_grad<true, float>(st);
  pack_a<true>(st.p, bm, bn, st.pack);
  pair_rows(st.k16, bn, d, words);
  product(st.pack, words, st.dq, bm, d, bn, true);  // dQ += dS K
}

// A step between loading our tile configuration and restoring the thread's.
template <void (*Step)(const TileStep<float, float>&)>
void on_tiles(const TileStep<float, float>& st) {
  const AmxKernels& amx = amx_kernels();
  AmxSavedState saved;
  amx.begin(&saved);
  Step(st);
  amx.end(&saved);
}

}  // namespace

TileOps<float, float> amx_ops_f32() {
  return TileOps<float, float>{&on_tiles<&amx_dkdv_step>, &on_tiles<&amx_dq_step>, &on_tiles<&amx_fused_step>,
                               &key_tile, &query_tile};
}

}  // namespace flashattn::cpu::bwd

#endif  // __x86_64__
