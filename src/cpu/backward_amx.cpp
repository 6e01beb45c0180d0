// The backward tile arithmetic of bf16 and fp16 problems on AMX tiles (the build gives *_amx.cpp
// files the AVX-512, AVX512-BF16 and AMX flags); backward.cpp calls it only when the engine's level
// is amx, the problem is bf16 or fp16 and the head dim a multiple of 32. The steps are
// backward_tile_impl.h's (its softmax and dS arithmetic on the fp32 score tiles) with the five
// products as tile products,
// each operand in the form the tiles want: A as bf16 rows [m][k], B as VNNI words [k/2][n] (the
// bf16 pair of rows 2r and 2r + 1 of each column in one 32-bit word). Q, K, V and dO arrive as
// their bf16 rows (exact); the fixed tile of a task is packed once (TileOps::key_tile,
// query_tile), the streamed one per step; P and dS are rounded to bf16 where they enter a product.
// The tiles write the fp32 score tiles and add into the fp32 gradient accumulators in place
// (TileStep<float, float>).
//
// fp16 problems (TileStep::split) take every operand as its exact bf16 hi and lo halves and every
// product as three tile products, as the forward does (amx.h); P and dS are split too, so they
// keep 16 significant bits. Each operand's lo half lies right after its hi half in the same buffer
// (Operands).
#if defined(__x86_64__)

#include <immintrin.h>

#include <algorithm>

#include "cpu/amx_simd.h"
#include "cpu/backward_tile_impl.h"

namespace flashattn::cpu::bwd {
namespace {

// An operand of a product: hi, and for fp16 problems its lo half (null for bf16).
template <class W>
struct Operand {
  W* hi;
  W* lo;
};

// The operand at p whose lo half, when split, starts `half` elements further on.
template <class W>
Operand<W> halves(W* p, int64_t half, bool split) {
  return {p, split ? p + half : nullptr};
}

// op(A) [m][k] as bf16 rows (and with Split their lo halves): A row-major [m][k], or (TransA) stored
// [k][m]. The transposed case pairs rows 2r, 2r + 1 of the stored matrix into words (a word holds
// A[i][2r], A[i][2r + 1]) and transposes 16 x 16 blocks of words, so each output row gets its
// values in order.
template <bool TransA, bool Split>
void pack_a_as(const float* a, int64_t m, int64_t k, Operand<uint16_t> out) {
  if constexpr (!TransA) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t x = 0; x < k; x += 16) {
        const __m512 v = _mm512_loadu_ps(a + i * k + x);
        auto* hi = reinterpret_cast<__m256i*>(out.hi + i * k + x);
        if constexpr (Split) {
          __m256i h, l;
          split_bf16(v, &h, &l);
          _mm256_storeu_si256(hi, h);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.lo + i * k + x), l);
        } else {
          _mm256_storeu_si256(hi, (__m256i)_mm512_cvtneps_pbh(v));
        }
      }
  } else {
    const int64_t pairs = k / 2;
    auto* words = reinterpret_cast<uint32_t*>(out.hi);  // [m][k/2]
    auto* words_lo = reinterpret_cast<uint32_t*>(out.lo);
    __m512i r[16], r_lo[Split ? 16 : 1];
    for (int64_t p0 = 0; p0 < pairs; p0 += 16)
      for (int64_t i0 = 0; i0 < m; i0 += 16) {
        for (int q = 0; q < 16; ++q) {
          const float* even = a + 2 * (p0 + q) * m + i0;
          if constexpr (Split) split_pair_words(_mm512_loadu_ps(even), _mm512_loadu_ps(even + m), &r[q], &r_lo[q]);
          else r[q] = pair_words(_mm512_loadu_ps(even), _mm512_loadu_ps(even + m));
        }
        transpose16(r);
        for (int q = 0; q < 16; ++q) _mm512_storeu_si512(words + (i0 + q) * pairs + p0, r[q]);
        if constexpr (Split) {
          transpose16(r_lo);
          for (int q = 0; q < 16; ++q) _mm512_storeu_si512(words_lo + (i0 + q) * pairs + p0, r_lo[q]);
        }
      }
  }
}

template <bool TransA>
void pack_a(const float* a, int64_t m, int64_t k, Operand<uint16_t> out) {
  if (out.lo) pack_a_as<TransA, true>(a, m, k, out);
  else pack_a_as<TransA, false>(a, m, k, out);
}

// C[32][32] block (i, j) of C[m][n] (+)= A B (amx_simd.h add_products; Split, LoFirst as there: the
// order of the cross products is the operands' roles', so that S^T = K Q^T adds Q_hi K_lo before
// Q_lo K_hi, as S = Q K^T does, and the schedules that compute a product in either orientation give
// bitwise the same values).
template <bool Split, bool LoFirst>
void block_product(Operand<const uint16_t> a, Operand<const uint32_t> b, int64_t k, int64_t n, int64_t i, int64_t j,
                   float* c, bool accumulate) {
  float* block = c + i * n + j;
  if (accumulate) load_block<2, 2>(block, n);
  else zero_block<2, 2>();
  add_products<2, 2, Split, LoFirst>(a.hi + i * k, Split ? a.lo + i * k : nullptr, k, b.hi + j,
                                     Split ? b.lo + j : nullptr, n, k);
  store_block<2, 2>(block, n);
}

// C[m][n] (+)= A[m][k] B: A bf16 rows (k apart), B VNNI words [k/2][n]; m, n, k multiples of 32.
// Split when a has a lo half (b then has one too); lo_first: block_product's LoFirst.
void product(Operand<const uint16_t> a, Operand<const uint32_t> b, float* c, int64_t m, int64_t n, int64_t k,
             bool accumulate, bool lo_first = false) {
  for (int64_t i = 0; i < m; i += 32)
    for (int64_t j = 0; j < n; j += 32) {
      if (!a.lo) block_product<false, false>(a, b, k, n, i, j, c, accumulate);
      else if (lo_first) block_product<true, true>(a, b, k, n, i, j, c, accumulate);
      else block_product<true, false>(a, b, k, n, i, j, c, accumulate);
    }
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

// The buffers of a step's operands, TileStep's 16-bit rows and words with their lo halves where the
// problem is fp16 (backward.cpp's Scratch sizes them so): rows [tile][d] then their lo rows,
// words [tile * d / 2] then their lo words, and the pack scratch as an A operand of tile x tile
// values and the words of a B operand of tile x d values, each followed by its lo half.
struct Operands {
  explicit Operands(const TileStep<float, float>& st)
      : t(std::max(st.bm, st.bn)), d(st.d), split(st.split), pack_a(halves(st.pack, t * t, split)),
        pack_b(halves(reinterpret_cast<uint32_t*>(st.pack + (split ? 2 : 1) * t * t), t * d / 2, split)) {}
  Operand<const uint16_t> rows(const uint16_t* p) const { return halves(p, t * d, split); }
  Operand<const uint32_t> words(const uint32_t* p) const { return halves(p, t * d / 2, split); }
  Operand<const uint16_t> a() const { return {pack_a.hi, pack_a.lo}; }
  Operand<const uint32_t> b() const { return {pack_b.hi, pack_b.lo}; }
  // Rows [m][n] of a 16-bit buffer (and its lo rows) paired into words (pair_rows) at out, or
  // transposed into words [d/2][m] (transpose_words; m rows of d values), and likewise the lo halves.
  void pair(const uint16_t* x, int64_t m, int64_t n, uint32_t* out) const {
    pair_rows(x, m, n, out);
    if (split) pair_rows(x + t * d, m, n, out + t * d / 2);
  }
  void transpose(const uint16_t* x, int64_t m, uint32_t* out) const {
    transpose_words(x, m, d, out, m);
    if (split) transpose_words(x + t * d, m, d, out + t * d / 2, m);
  }
  int64_t t, d;
  bool split;
  Operand<uint16_t> pack_a;
  Operand<uint32_t> pack_b;
};

// The key tile's B operands, once per key tile (TileOps::key_tile), from its bf16 rows.
void key_tile(const TileStep<float, float>& st) {
  const Operands ops(st);
  ops.transpose(st.k16, st.bn, st.kt_words);
  ops.transpose(st.v16, st.bn, st.vt_words);
  ops.pair(st.k16, st.bn, st.d, st.k_words);
}

// The query tile's B operands, once per dQ task (TileOps::query_tile), from its bf16 rows.
void query_tile(const TileStep<float, float>& st) {
  const Operands ops(st);
  ops.transpose(st.q16, st.bm, st.qt_words);
  ops.transpose(st.dout16, st.bm, st.dot_words);
}

// backward_tile_impl.h's steps on operands already in the tiles' forms where they can be: Q, dO,
// K and V as bf16 rows (the A of S, dP and their transposes; paired into words where they are a
// B), the fixed tile's VNNI words. The same bf16 values meet in the same roles in all three steps
// (S^T = K Q^T takes each product S = Q K^T does, in the same order: lo_first), so the one-pass and
// the two-pass schedules give bitwise the same gradients.

// The key tile's view: dV += P^T dO and dK += dS^T Q.
void amx_dkdv_step(const TileStep<float, float>& st) {
  const int64_t bm = st.bm, bn = st.bn, d = st.d;
  const Operands ops(st);
  product(ops.rows(st.q16), ops.words(st.kt_words), st.p, bm, bn, d, false);  // S = Q K^T
  probabilities<false, float, 16>(st);
  pack_a<true>(st.p, bn, bm, ops.pack_a);
  ops.pair(st.dout16, bm, d, ops.pack_b.hi);
  product(ops.a(), ops.b(), st.dv, bn, d, bm, true);  // dV += P^T dO
  product(ops.rows(st.dout16), ops.words(st.vt_words), st.dp, bm, bn, d, false);  // dP = dO V^T
  score_grad<false, float>(st);
  pack_a<true>(st.p, bn, bm, ops.pack_a);
  ops.pair(st.q16, bm, d, ops.pack_b.hi);
  product(ops.a(), ops.b(), st.dk, bn, d, bm, true);  // dK += dS^T Q
}

// Both views from one dS, for a task that owns dQ of every query row of its KV head group.
void amx_fused_step(const TileStep<float, float>& st) {
  amx_dkdv_step(st);
  const Operands ops(st);
  pack_a<false>(st.p, st.bm, st.bn, ops.pack_a);
  product(ops.a(), ops.words(st.k_words), st.dq, st.bm, st.d, st.bn, true);  // dQ += dS K
}

// The query tile's view: S^T = K Q^T, dP^T = V dO^T, dQ += dS K.
void amx_dq_step(const TileStep<float, float>& st) {
  const int64_t bm = st.bm, bn = st.bn, d = st.d;
  const Operands ops(st);
  product(ops.rows(st.k16), ops.words(st.qt_words), st.p, bn, bm, d, false, true);  // S^T = K Q^T
  probabilities<true, float, 16>(st);
  product(ops.rows(st.v16), ops.words(st.dot_words), st.dp, bn, bm, d, false, true);  // dP^T = V dO^T
  score_grad<true, float>(st);
  pack_a<true>(st.p, bm, bn, ops.pack_a);
  ops.pair(st.k16, bn, d, ops.pack_b.hi);
  product(ops.a(), ops.b(), st.dq, bm, d, bn, true);  // dQ += dS K
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
