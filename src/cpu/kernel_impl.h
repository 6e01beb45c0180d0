// The tile kernels of src/cpu/simd.h, written once over a "vector traits" type V and instantiated
// per SIMD level (kernels_portable.cpp, kernels_avx2.cpp, kernels_avx512.cpp).
//
// V provides: T (float or double), reg (a vector of W values of T), W, the micro-tile shapes
// kScoreKeys x kScoreVecs and kAccDims x kAccVecs, and zero / load / store / set1 / add / sub / mul /
// fma(a, b, c) = a * b + c / max / exponent_base / exp2 / tanh / widen.
//
// Everything here has internal linkage (anonymous namespace) and uses no standard-library
// templates: each instantiating file is compiled with its own ISA flags, and a shared inline
// symbol could otherwise let the linker pick, say, the AVX-512 copy for the portable path.
#pragma once

#include <cstdint>

#include "cpu/simd.h"

namespace flashattn::cpu {
namespace {

inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

// Head dims past the last whole vector (fewer than the widest level's 16 floats).
inline constexpr int64_t kMaxTailDims = 16;

// ---- vector exp2 and tanh (SIMD levels; the portable level calls libm) ------------------------
// These need from V: round (to nearest integer), pow2i (2^n for integral n in [-127, 128]), abs,
// copysign(magnitude, sign), div and less_select(a, b, x, y) = a < b ? x : y.

// 2^x for x <= 0 (a score minus its row max), x = -inf (a masked score) giving exactly 0, and NaN
// giving NaN. x = n + r with n integral and |r| <= 1/2; 2^r = e^(r ln 2) by its Taylor series to
// degree 7, whose truncation error (ln 2 / 2)^8 / 8! < 6e-9 is below half an fp32 ulp. Results
// below 2^-126 flush to 0 (they are negligible next to the row's largest term, which is 1).
template <class V>
typename V::reg exp2_poly(typename V::reg x) {
  using reg = typename V::reg;
  x = V::max(V::set1(-127), x);  // V::max returns its second operand for NaN, so NaN stays NaN
  reg n = V::round(x);
  reg r = V::sub(x, n);
  reg p = V::set1(1.525273380405984e-05);  // (ln 2)^7 / 7!
  p = V::fma(p, r, V::set1(1.5403530393381608e-04));
  p = V::fma(p, r, V::set1(1.3333558146428443e-03));
  p = V::fma(p, r, V::set1(9.618129107628477e-03));
  p = V::fma(p, r, V::set1(5.550410866482158e-02));
  p = V::fma(p, r, V::set1(2.402265069591007e-01));
  p = V::fma(p, r, V::set1(6.931471805599453e-01));
  p = V::fma(p, r, V::set1(1.0));
  return V::mul(p, V::pow2i(n));  // 2^-127 is built as +0, so -inf and very small x give 0
}

// tanh(y). For |y| < 1/2 the odd Taylor series through y^15 (alternating, so its error is below the
// next term, 6e-4 * 2^-17 < 5e-9, about a tenth of an ulp); above, (1 - e) / (1 + e) with
// e = exp(-2|y|) <= e^-1, where the subtraction loses no precision. NaN gives NaN.
template <class V>
typename V::reg tanh_poly(typename V::reg y) {
  using reg = typename V::reg;
  reg a = V::abs(y);
  reg a2 = V::mul(a, a);
  reg s = V::set1(-929569.0 / 638512875.0);
  s = V::fma(s, a2, V::set1(21844.0 / 6081075.0));
  s = V::fma(s, a2, V::set1(-1382.0 / 155925.0));
  s = V::fma(s, a2, V::set1(62.0 / 2835.0));
  s = V::fma(s, a2, V::set1(-17.0 / 315.0));
  s = V::fma(s, a2, V::set1(2.0 / 15.0));
  s = V::fma(s, a2, V::set1(-1.0 / 3.0));
  s = V::fma(s, a2, V::set1(1.0));
  reg small = V::mul(s, a);
  reg one = V::set1(1.0);
  reg e = exp2_poly<V>(V::mul(V::set1(-2.0 * 1.4426950408889634), a));
  reg large = V::div(V::sub(one, e), V::add(one, e));
  return V::copysign(V::less_select(a, V::set1(0.5), small, large), y);
}

// ---- S^T = K Q^T -------------------------------------------------------------------------------
// A micro-tile of MR keys x NV vectors of query rows, accumulated over the head dimension in
// registers. Each step broadcasts one value of each key row and multiplies it by NV vectors of Q^T.
template <class V, int MR, int NV>
void scores_micro(const typename V::T* k, int64_t ldk, const typename V::T* qt, int64_t d, int64_t mpad,
                  typename V::T* st) {
  using reg = typename V::reg;
  reg acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = V::zero();
  // Four steps per loop trip, as the backward's products (the same sums in the same order).
#pragma GCC unroll 4
  for (int64_t x = 0; x < d; ++x) {
    reg q[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) q[v] = V::load(qt + x * mpad + v * V::W);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      reg b = V::set1(k[r * ldk + x]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = V::fma(b, q[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) V::store(st + r * mpad + v * V::W, acc[r][v]);
}

// Picks the micro-tile for the remainder shapes (mr <= MR keys, nv <= NV vectors) at run time.
template <class V, int MR, int NV>
void scores_dispatch(int mr, int nv, const typename V::T* k, int64_t ldk, const typename V::T* qt, int64_t d,
                     int64_t mpad, typename V::T* st) {
  if constexpr (MR > 1) {
    if (mr < MR) return scores_dispatch<V, MR - 1, NV>(mr, nv, k, ldk, qt, d, mpad, st);
  }
  if constexpr (NV > 1) {
    if (nv < NV) return scores_dispatch<V, MR, NV - 1>(mr, nv, k, ldk, qt, d, mpad, st);
  }
  scores_micro<V, MR, NV>(k, ldk, qt, d, mpad, st);
}

template <class V>
void scores(const typename V::T* k, int64_t ldk, int64_t nk, const typename V::T* qt, int64_t d, int64_t rows,
            int64_t mpad, typename V::T* st) {
  constexpr int MR = V::kScoreKeys, NV = V::kScoreVecs, W = V::W;
  // Query panels outside: a panel of Q^T (d x NV*W) stays in L1 while the key rows stream.
  for (int64_t i0 = 0; i0 < rows; i0 += NV * W) {
    int nv = int(min_i64(NV, (rows - i0) / W));
    for (int64_t j = 0; j < nk; j += MR) {
      int mr = int(min_i64(MR, nk - j));
      scores_dispatch<V, MR, NV>(mr, nv, k + j * ldk, ldk, qt + i0, d, mpad, st + j * mpad + i0);
    }
  }
}

// ---- O~^T = f * O~^T + V^T P^T -----------------------------------------------------------------
// A micro-tile of MR head-dimension rows x NV vectors of query rows; the old values are rescaled
// by the row factors f as they are loaded, so the rescale costs no extra pass over o~.
template <class V, int MR, int NV>
void accumulate_micro(const typename V::T* vt, int64_t ldv, int64_t nk, const typename V::T* pt, int64_t mpad,
                      const typename V::T* f, typename V::T* ot) {
  using reg = typename V::reg;
  reg acc[MR][NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    reg fv = V::load(f + v * V::W);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) acc[r][v] = V::mul(V::load(ot + r * mpad + v * V::W), fv);
  }
#pragma GCC unroll 4
  for (int64_t j = 0; j < nk; ++j) {
    reg p[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) p[v] = V::load(pt + j * mpad + v * V::W);
    const typename V::T* vr = vt + j * ldv;
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      reg b = V::set1(vr[r]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = V::fma(b, p[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) V::store(ot + r * mpad + v * V::W, acc[r][v]);
}

template <class V, int MR, int NV>
void accumulate_dispatch(int mr, int nv, const typename V::T* vt, int64_t ldv, int64_t nk, const typename V::T* pt,
                         int64_t mpad, const typename V::T* f, typename V::T* ot) {
  if constexpr (MR > 1) {
    if (mr < MR) return accumulate_dispatch<V, MR - 1, NV>(mr, nv, vt, ldv, nk, pt, mpad, f, ot);
  }
  if constexpr (NV > 1) {
    if (nv < NV) return accumulate_dispatch<V, MR, NV - 1>(mr, nv, vt, ldv, nk, pt, mpad, f, ot);
  }
  accumulate_micro<V, MR, NV>(vt, ldv, nk, pt, mpad, f, ot);
}

template <class V>
void accumulate(const typename V::T* vt, int64_t ldv, int64_t nk, const typename V::T* pt, int64_t rows,
                int64_t mpad, int64_t d, const typename V::T* f, typename V::T* ot) {
  constexpr int MR = V::kAccDims, NV = V::kAccVecs, W = V::W;
  // Query panels outside: the panel of P^T (nk x NV*W) stays in L1 while the head dimension walks.
  for (int64_t i0 = 0; i0 < rows; i0 += NV * W) {
    int nv = int(min_i64(NV, (rows - i0) / W));
    for (int64_t x0 = 0; x0 < d; x0 += MR) {
      int mr = int(min_i64(MR, d - x0));
      accumulate_dispatch<V, MR, NV>(mr, nv, vt + x0, ldv, nk, pt + i0, mpad, f + i0, ot + x0 * mpad + i0);
    }
  }
}

// ---- few query rows, the head dimension in the vector lanes --------------------------------------
// Decoding's tiles have a handful of rows (the query heads of one KV head, times the new tokens):
// in the kernels above they would fill rows / W of each vector. These put the head dimension in the
// lanes instead, with the rows row-major (q, o: [rows][d]) and the key rows read where they lie
// (k[j], v[j]), in the kernels' own type or as f16 / bf16 widened while they load (no pass over the
// tile first). ST and f are the kernels' usual [nk][mpad] and [mpad].

// Where the key rows' values come from: rows of the kernels' own type, or of 16-bit values.
template <class V>
struct OwnRows {
  using E = typename V::T;
  static typename V::reg load(const E* p) { return V::load(p); }
  static void widen(const E* p, int64_t n, typename V::T* dst) {
    for (int64_t i = 0; i < n; ++i) dst[i] = p[i];
  }
};
template <class V, DType kType>
struct HalfRows {
  using E = uint16_t;
  static typename V::reg load(const E* p) { return kType == DType::f16 ? V::load_f16(p) : V::load_bf16(p); }
  static void widen(const E* p, int64_t n, typename V::T* dst) { V::widen(p, kType, dst, n); }
};

// Asks for row r's d values a few rows ahead of their use: the products wait on each key's loads,
// so without it few reads are in flight, and a cache in DRAM streamed at a fraction of the rate a
// copy of the tile first reaches.
template <class E>
void prefetch_row(const E* r, int64_t d) {
  for (int64_t b = 0; b < d * int64_t(sizeof(E)); b += 64) __builtin_prefetch(reinterpret_cast<const char*>(r) + b);
}
constexpr int64_t kPrefetchRows = 8;

// S[i][j] = q_i . k_j for i < rows, j < nk, row-major (rows ld apart): blocks of four rows by
// kKeys keys, whose rows' products over the lanes share each load of q (kKeys key rows, widened as
// they load, against four q rows per step: 16 accumulators on AVX-512's 32 registers, 8 on AVX2's
// 16), then each key's four lane sums together (V::sum4); head dims past the last whole vector add
// lane by lane.
template <class V, class Rows>
void scores_rows_from(const void* const* k, int64_t nk, const typename V::T* q, int64_t d, int64_t rows, int64_t ld,
                      typename V::T* s) {
  using T = typename V::T;
  using reg = typename V::reg;
  using E = typename Rows::E;
  constexpr int kKeys = V::W >= 16 ? 4 : 2;
  const int64_t dv = d / V::W * V::W;
  for (int64_t i0 = 0; i0 < rows; i0 += 4) {
    const int64_t nr = min_i64(4, rows - i0);
    // Rows past the block's own repeat its first, so the loop stays branch-free; their sums are dropped.
    const T* qr[4];
    for (int r = 0; r < 4; ++r) qr[r] = q + (i0 + (r < nr ? r : 0)) * d;
    for (int64_t j0 = 0; j0 < nk; j0 += kKeys) {
      const int64_t nj = min_i64(kKeys, nk - j0);
      const E* kr[kKeys];
      const char* ahead[kKeys];  // the rows kPrefetchRows on (or these again, past the last)
      for (int c = 0; c < kKeys; ++c) {
        kr[c] = static_cast<const E*>(k[j0 + (c < nj ? c : 0)]);
        const int64_t j = j0 + kPrefetchRows + c;
        ahead[c] = reinterpret_cast<const char*>(i0 == 0 && j < nk ? static_cast<const E*>(k[j]) : kr[c]);
      }
      reg acc[kKeys][4];
      for (int c = 0; c < kKeys; ++c)
        for (int r = 0; r < 4; ++r) acc[c][r] = V::zero();
      for (int64_t x = 0; x < dv; x += V::W) {
        // The rows ahead are asked for a line per step, spread over the products: a burst of
        // them at the block's start filled the line buffers and stalled the loads.
        if ((x * int64_t(sizeof(E))) % 64 == 0)
          for (int c = 0; c < kKeys; ++c) __builtin_prefetch(ahead[c] + x * int64_t(sizeof(E)));
        reg kv[kKeys];
        for (int c = 0; c < kKeys; ++c) kv[c] = Rows::load(kr[c] + x);
        for (int r = 0; r < 4; ++r) {
          const reg qv = V::load(qr[r] + x);
          for (int c = 0; c < kKeys; ++c) acc[c][r] = V::fma(kv[c], qv, acc[c][r]);
        }
      }
      // Every key of the block is reduced (a fixed count keeps the accumulators in registers); the
      // repeated ones are dropped.
      alignas(64) T sum[kKeys][4];
      for (int c = 0; c < kKeys; ++c) V::sum4(acc[c][0], acc[c][1], acc[c][2], acc[c][3], sum[c]);
      for (int c = 0; c < nj; ++c) {
        if (dv < d) {
          alignas(64) T kt[kMaxTailDims] = {};
          Rows::widen(kr[c] + dv, d - dv, kt);
          for (int r = 0; r < 4; ++r)
            for (int64_t x = dv; x < d; ++x) sum[c][r] += kt[x - dv] * qr[r][x];
        }
        for (int64_t r = 0; r < nr; ++r) s[(i0 + r) * ld + j0 + c] = sum[c][r];
      }
    }
  }
}

// One online-softmax step of the row-major tile S[i][j] (i < rows, j < nk; entries past nk up to
// the next whole vector hold -inf): the update of softmax() below, row by row with the keys in the
// lanes, so that a few rows use whole vectors. P~ replaces S (0 past nk).
template <class V>
void softmax_rows(typename V::T* s, int64_t nk, int64_t rows, int64_t ld, typename V::T c, typename V::T* m,
                  typename V::T* l, typename V::T* f) {
  using T = typename V::T;
  using reg = typename V::reg;
  const int64_t n = (nk + V::W - 1) / V::W * V::W;
  const reg cv = V::set1(c);
  alignas(64) T lanes[V::W];
  for (int64_t i = 0; i < rows; ++i) {
    T* row = s + i * ld;
    reg mx = V::set1(m[i]);
    // V::max returns its second operand for NaN: a NaN score is passed over here, as in softmax().
    for (int64_t j = 0; j < n; j += V::W) mx = V::max(V::load(row + j), mx);
    V::store(lanes, mx);
    T m_new = lanes[0];
    for (int w = 1; w < V::W; ++w) m_new = lanes[w] > m_new ? lanes[w] : m_new;
    const reg b = V::exponent_base(V::set1(m_new));  // 0 while the row has seen only -inf
    V::store(lanes, V::exp2(V::mul(V::sub(V::set1(m[i]), b), cv)));
    f[i] = lanes[0];
    m[i] = m_new;
    reg sum = V::zero();
    for (int64_t j = 0; j < n; j += V::W) {
      const reg p = V::exp2(V::mul(V::sub(V::load(row + j), b), cv));
      V::store(row + j, p);
      sum = V::add(sum, p);
    }
    V::store(lanes, sum);
    T total = 0;
    for (int w = 0; w < V::W; ++w) total += lanes[w];
    l[i] = l[i] * f[i] + total;
  }
}

// o_i = f_i o_i + sum_j P[i][j] v_j for NR rows from i0 and NV vectors of the head dim from x0
// (P row-major, rows ld apart): NR x NV accumulators, the counts fixed so that they stay in
// registers and the loop has no bounds to test.
template <class V, class Rows, int NR, int NV>
void accumulate_rows_block(const void* const* v, int64_t nk, const typename V::T* p, int64_t ld, int64_t d,
                           const typename V::T* f, typename V::T* o, int64_t i0, int64_t x0, bool prefetch) {
  using reg = typename V::reg;
  using E = typename Rows::E;
  reg acc[NR][NV];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NV; ++c) acc[r][c] = V::mul(V::load(o + (i0 + r) * d + x0 + c * V::W), V::set1(f[i0 + r]));
  for (int64_t j = 0; j < nk; ++j) {
    const E* vj = static_cast<const E*>(v[j]) + x0;
    if (prefetch && j + kPrefetchRows < nk) prefetch_row(static_cast<const E*>(v[j + kPrefetchRows]), d);
    reg pr[NR];
    for (int r = 0; r < NR; ++r) pr[r] = V::set1(p[(i0 + r) * ld + j]);
    for (int c = 0; c < NV; ++c) {
      const reg vv = Rows::load(vj + c * V::W);
      for (int r = 0; r < NR; ++r) acc[r][c] = V::fma(pr[r], vv, acc[r][c]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < NV; ++c) V::store(o + (i0 + r) * d + x0 + c * V::W, acc[r][c]);
}

// Picks accumulate_rows_block's counts at run time (nr <= NR rows, nv <= NV vectors).
template <class V, class Rows, int NR, int NV>
void accumulate_rows_dispatch(int nr, int nv, const void* const* v, int64_t nk, const typename V::T* p, int64_t ld,
                              int64_t d, const typename V::T* f, typename V::T* o, int64_t i0, int64_t x0,
                              bool prefetch) {
  if constexpr (NR > 1) {
    if (nr < NR) return accumulate_rows_dispatch<V, Rows, NR - 1, NV>(nr, nv, v, nk, p, ld, d, f, o, i0, x0, prefetch);
  }
  if constexpr (NV > 1) {
    if (nv < NV) return accumulate_rows_dispatch<V, Rows, NR, NV - 1>(nr, nv, v, nk, p, ld, d, f, o, i0, x0, prefetch);
  }
  accumulate_rows_block<V, Rows, NR, NV>(v, nk, p, ld, d, f, o, i0, x0, prefetch);
}

// o_i = f_i o_i + sum_j P[i][j] v_j for i < rows (P row-major, rows ld apart), over blocks of up
// to four rows and four vectors of the head dimension, then lane by lane past the last whole
// vector. Each block's pass over the keys prefetches the value rows ahead once (the first block).
template <class V, class Rows>
void accumulate_rows_from(const void* const* v, int64_t nk, const typename V::T* p, int64_t rows, int64_t ld,
                          int64_t d, const typename V::T* f, typename V::T* o) {
  using T = typename V::T;
  using E = typename Rows::E;
  constexpr int kVecs = 4;
  const int64_t dv = d / V::W * V::W;
  for (int64_t i0 = 0; i0 < rows; i0 += 4) {
    const int nr = int(min_i64(4, rows - i0));
    for (int64_t x0 = 0; x0 < dv; x0 += kVecs * V::W) {
      const int nv = int(min_i64(kVecs, (dv - x0) / V::W));
      accumulate_rows_dispatch<V, Rows, 4, kVecs>(nr, nv, v, nk, p, ld, d, f, o, i0, x0, i0 == 0 && x0 == 0);
    }
    if (dv < d) {
      for (int r = 0; r < nr; ++r)
        for (int64_t x = dv; x < d; ++x) o[(i0 + r) * d + x] *= f[i0 + r];
      for (int64_t j = 0; j < nk; ++j) {
        alignas(64) T vt[kMaxTailDims] = {};
        Rows::widen(static_cast<const E*>(v[j]) + dv, d - dv, vt);
        for (int r = 0; r < nr; ++r)
          for (int64_t x = dv; x < d; ++x) o[(i0 + r) * d + x] += p[(i0 + r) * ld + j] * vt[x - dv];
      }
    }
  }
}

// The row type picks the loader: f16 and bf16 rows widen as they load; other rows are of type T.
template <class V>
void scores_rows(const void* const* k, DType t, int64_t nk, const typename V::T* q, int64_t d, int64_t rows,
                 int64_t ld, typename V::T* s) {
  if (t == DType::f16) return scores_rows_from<V, HalfRows<V, DType::f16>>(k, nk, q, d, rows, ld, s);
  if (t == DType::bf16) return scores_rows_from<V, HalfRows<V, DType::bf16>>(k, nk, q, d, rows, ld, s);
  scores_rows_from<V, OwnRows<V>>(k, nk, q, d, rows, ld, s);
}
template <class V>
void accumulate_rows(const void* const* v, DType t, int64_t nk, const typename V::T* p, int64_t rows, int64_t ld,
                     int64_t d, const typename V::T* f, typename V::T* o) {
  if (t == DType::f16) return accumulate_rows_from<V, HalfRows<V, DType::f16>>(v, nk, p, rows, ld, d, f, o);
  if (t == DType::bf16) return accumulate_rows_from<V, HalfRows<V, DType::bf16>>(v, nk, p, rows, ld, d, f, o);
  accumulate_rows_from<V, OwnRows<V>>(v, nk, p, rows, ld, d, f, o);
}

// ---- online softmax over a tile ----------------------------------------------------------------
// Column i of ST holds the scores of query row i: the update of core::SoftmaxState, W rows at once.
// The running max m stays in score units; exponents are formed as (s - base) * c, the difference
// first, so a score of 1e4 keeps the precision of its distance to the max. Both passes walk ST
// row by row (sequential memory), keeping the per-row state in the small m, l, f arrays.
template <class V>
void softmax(typename V::T* st, int64_t nk, int64_t rows, int64_t mpad, typename V::T c, typename V::T* m,
             typename V::T* l, typename V::T* f) {
  using T = typename V::T;
  using reg = typename V::reg;
  const reg cv = V::set1(c);
  // Pass 1: the tile's new running max, gathered in f.
  for (int64_t i = 0; i < rows; i += V::W) V::store(f + i, V::load(m + i));
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t i = 0; i < rows; i += V::W) V::store(f + i, V::max(V::load(st + j * mpad + i), V::load(f + i)));
  // Per row: the rescale factor of the old state (rescale_factor(m_old, m_new)).
  alignas(64) T base[kMaxTileRows];
  alignas(64) T sum[kMaxTileRows];
  for (int64_t i = 0; i < rows; i += V::W) {
    reg m_new = V::load(f + i);
    reg b = V::exponent_base(m_new);  // 0 while the row has seen only -inf
    V::store(f + i, V::exp2(V::mul(V::sub(V::load(m + i), b), cv)));
    V::store(base + i, b);
    V::store(m + i, m_new);
    V::store(sum + i, V::zero());
  }
  // Pass 2: P~ in place of the scores. Its row sums gather in the tile's own sum, which joins l once
  // (l = l * factor + sum): adding every p straight to l, which grows with the sequence, lost
  // precision (max error 3.6e-6 instead of 7.6e-7 against fp64 at N = 4096, f32).
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t i = 0; i < rows; i += V::W) {
      reg p = V::exp2(V::mul(V::sub(V::load(st + j * mpad + i), V::load(base + i)), cv));
      V::store(st + j * mpad + i, p);
      V::store(sum + i, V::add(V::load(sum + i), p));
    }
  for (int64_t i = 0; i < rows; i += V::W) V::store(l + i, V::fma(V::load(l + i), V::load(f + i), V::load(sum + i)));
}

// n is a multiple of W (a whole score tile, nk * mpad).
template <class V>
void softcap(typename V::T* x, int64_t n, typename V::T cap, typename V::T mul) {
  typename V::reg c = V::set1(cap), m = V::set1(mul);
  for (int64_t i = 0; i < n; i += V::W) V::store(x + i, V::mul(c, V::tanh(V::mul(m, V::load(x + i)))));
}

// W x W blocks through V::transpose_block where the level has one (8 or 16 loads, shuffles, 8 or 16
// stores), the edges and the portable level element by element.
template <class V>
void transpose(const typename V::T* src, int64_t lds, typename V::T* dst, int64_t ldd, int64_t rows, int64_t cols) {
  int64_t r = 0;
  if constexpr (requires { V::transpose_block(src, lds, dst, ldd); }) {
    for (; r + V::W <= rows; r += V::W) {
      int64_t c = 0;
      for (; c + V::W <= cols; c += V::W) V::transpose_block(src + r * lds + c, lds, dst + c * ldd + r, ldd);
      for (; c < cols; ++c)
        for (int64_t i = r; i < r + V::W; ++i) dst[c * ldd + i] = src[i * lds + c];
    }
  }
  for (; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

template <class V>
TileKernels<typename V::T> make_kernels(KernelLevel level) {
  TileKernels<typename V::T> t;
  t.level = level;
  t.row_align = V::W;
  t.scores = &scores<V>;
  t.softcap = &softcap<V>;
  t.softmax = &softmax<V>;
  t.accumulate = &accumulate<V>;
  t.scores_rows = &scores_rows<V>;
  t.softmax_rows = &softmax_rows<V>;
  t.accumulate_rows = &accumulate_rows<V>;
  t.transpose = &transpose<V>;
  t.widen = &V::widen;
  t.narrow = &V::narrow;
  return t;
}

}  // namespace
}  // namespace flashattn::cpu
