// The tile arithmetic of the CPU backward (see backward_tile.h), written as plain loops that the
// compiler vectorizes for whatever ISA the including file is compiled for. Included by exactly one
// file per ISA; everything is in an unnamed namespace so the per-ISA copies never meet at link time
// (an AVX2 body must not be picked for a machine without AVX2). For the same reason this file uses
// no inline functions from other project headers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/backward_tile.h"

namespace flashattn::cpu::bwd {
namespace {

constexpr int kMR = 4;  // rows of C per register block

// A vector of W lanes of T (GCC/Clang vector extension): the including file's ISA flags decide
// which registers it maps to, so one kernel source serves every level.
template <class T, int W>
struct Simd {
  typedef T reg __attribute__((vector_size(W * sizeof(T))));
};

template <class T, int W>
inline typename Simd<T, W>::reg load(const T* p) {
  typename Simd<T, W>::reg v;
  std::memcpy(&v, p, sizeof(v));  // an unaligned vector load
  return v;
}

constexpr int64_t kChunk = 16;  // products summed in registers before joining the running total

// C[kMR][NV * W] (+)= op(A)[kMR][K] B[K][NV * W], op(A) = A or, with TransA, A^T (read in place:
// element (r, x) at a[x * lda + r]; a broadcast costs the same from either address, so P^T and dS^T
// need no transposed copy). Each step loads NV vectors of a B row and broadcasts one op(A) value
// per row into kMR x NV vector accumulators.
// The sum is blocked: kChunk products at a time, each chunk then added to a second set of
// registers. A float dot product of 64 terms then carries about half the rounding error of a
// plain running sum, which matters because a score error becomes a relative error of P. C may be
// wider than T (the double gradient accumulators); it is read and written once.
template <bool TransA, class T, int W, int NV, class C>
inline void gemm_block(const T* a, int64_t lda, const T* b, int64_t ldb, C* c, int64_t ldc, int64_t k,
                       bool accumulate) {
  using reg = typename Simd<T, W>::reg;
  reg total[kMR][NV] = {};
  for (int64_t x0 = 0; x0 < k; x0 += kChunk) {
    const int64_t x1 = x0 + kChunk < k ? x0 + kChunk : k;
    reg acc[kMR][NV] = {};
    for (int64_t x = x0; x < x1; ++x) {
      reg bx[NV];
      for (int v = 0; v < NV; ++v) bx[v] = load<T, W>(b + x * ldb + v * W);
      for (int r = 0; r < kMR; ++r) {
        const T ar = TransA ? a[x * lda + r] : a[r * lda + x];
        for (int v = 0; v < NV; ++v) acc[r][v] += ar * bx[v];
      }
    }
    for (int r = 0; r < kMR; ++r)
      for (int v = 0; v < NV; ++v) total[r][v] += acc[r][v];
  }
  for (int r = 0; r < kMR; ++r) {
    C* cr = c + r * ldc;
    for (int v = 0; v < NV; ++v)
      for (int l = 0; l < W; ++l) {
        const C t = C(total[r][v][l]);
        cr[v * W + l] = accumulate ? cr[v * W + l] + t : t;
      }
  }
}

// C[m][n] (+)= op(A)[m][k] B[k][n], all dense row-major (A is [k][m] when TransA); m a multiple of
// kMR, n of W.
template <bool TransA, class T, int W, int NV, class C>
void gemm(const T* a, const T* b, C* c, int64_t m, int64_t n, int64_t k, bool accumulate) {
  const int64_t lda = TransA ? m : k;
  for (int64_t i = 0; i < m; i += kMR) {
    const T* ai = TransA ? a + i : a + i * k;
    int64_t j = 0;
    for (; j + NV * W <= n; j += NV * W) gemm_block<TransA, T, W, NV>(ai, lda, b + j, n, c + i * n + j, n, k, accumulate);
    for (; j < n; j += W) gemm_block<TransA, T, W, 1>(ai, lda, b + j, n, c + i * n + j, n, k, accumulate);
  }
}

template <class T, int W>
inline void store(T* p, typename Simd<T, W>::reg v) {
  std::memcpy(p, &v, sizeof(v));
}

template <class T, int W>
inline typename Simd<T, W>::reg splat(T x) {
  return typename Simd<T, W>::reg{} + x;
}

// 2^x for W floats without a library call, so a score row goes through vector instructions:
// 2^x = 2^r * 2^f with r = round(x) and |f| <= 1/2, 2^f by its Taylor series to degree 7
// (truncation below 1e-8 relative, under float rounding). x < -126 gives 0: every exponent here
// is <= 0 up to rounding, such a P would be subnormal, and -inf (masked or empty rows) must give
// exactly 0. NaN stays NaN.
template <int W>
inline typename Simd<float, W>::reg exp2_poly(typename Simd<float, W>::reg x) {
  using reg = typename Simd<float, W>::reg;
  using ireg = typename Simd<int32_t, W>::reg;
  const reg lo = splat<float, W>(-127.f), hi = splat<float, W>(127.f);
  const reg xc = x >= lo ? (x <= hi ? x : hi) : lo;  // NaN goes to -127 here, restored below
  const reg magic = splat<float, W>(12582912.f);      // 1.5 * 2^23: adding it rounds to an integer
  const reg r = (xc + magic) - magic;
  const reg f = xc - r;
  reg poly = splat<float, W>(1.525273380405984e-05f);
  poly = poly * f + 1.5403530393381606e-04f;
  poly = poly * f + 1.3333558146428443e-03f;
  poly = poly * f + 9.618129107628477e-03f;
  poly = poly * f + 5.550410866482158e-02f;
  poly = poly * f + 2.402265069591007e-01f;
  poly = poly * f + 6.931471805599453e-01f;
  poly = poly * f + 1.0f;
  const ireg bits = (__builtin_convertvector(r, ireg) + 127) << 23;  // 2^r as a float's exponent
  reg scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const reg v = x < splat<float, W>(-126.f) ? reg{} : poly * scale;
  return x != x ? x : v;
}

// row[j] = 2^(row[j] * mul - base) for n values (n a multiple of W). The double path (f64
// problems, used for gradient checks) keeps libm's exp2.
template <class T, int W>
void exp2_row(T* row, int64_t n, T mul, T base) {
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t j = 0; j < n; j += W) store<T, W>(row + j, exp2_poly<W>(load<T, W>(row + j) * mul - base));
  } else {
    for (int64_t j = 0; j < n; ++j) row[j] = exp2(row[j] * mul - base);
  }
}

inline float tanh_t(float x) { return tanhf(x); }
inline double tanh_t(double x) { return tanh(x); }

// P = exp2(s2 - base) with s2 the score in the exp2 domain (capped when softcap is on), 0 where
// masked. Overwrites st.p, which holds S = Q K^T on entry.
template <class T, int W>
void probabilities(const TileStep<T>& st) {
  const int64_t bm = st.bm, bn = st.bn;
  const bool softcap = st.cap_mul != T(0);
  for (int64_t i = 0; i < bm; ++i) {
    T* row = st.p + i * bn;
    if (softcap) {
      T* der = st.deriv + i * bn;
      for (int64_t j = 0; j < bn; ++j) {
        const T t = tanh_t(row[j] * st.score_mul);
        der[j] = T(1) - t * t;
        row[j] = t;
      }
    }
    exp2_row<T, W>(row, bn, softcap ? st.cap_mul : st.score_mul, st.base[i]);
    if (st.masked) {
      const int64_t lo = st.lo[i] - st.n0, hi = st.hi[i] - st.n0;
      for (int64_t j = 0; j < bn; ++j) row[j] = (j >= lo && j < hi) ? row[j] : T(0);
    }
  }
}

// dS = P o (dP - D), times the softcap derivative 1 - tanh^2 (the chain rule through c*tanh(s/c)).
// Overwrites st.p with dS; st.dp holds dP.
template <class T>
void score_grad(const TileStep<T>& st) {
  const int64_t bm = st.bm, bn = st.bn;
  for (int64_t i = 0; i < bm; ++i) {
    T* row = st.p + i * bn;
    const T* dp = st.dp + i * bn;
    const T delta = st.delta[i];
    for (int64_t j = 0; j < bn; ++j) row[j] = row[j] * (dp[j] - delta);
    if (st.cap_mul != T(0)) {
      const T* der = st.deriv + i * bn;
      for (int64_t j = 0; j < bn; ++j) row[j] *= der[j];
    }
  }
}

// S = Q K^T, then P in st.p.
template <class T, int W, int NV>
void recompute_p(const TileStep<T>& st) {
  gemm<false, T, W, NV>(st.q, st.kt, st.p, st.bm, st.bn, st.d, false);
  probabilities<T, W>(st);
}

// dP = dO V^T, then dS in st.p (which holds P on entry).
template <class T, int W, int NV>
void p_to_ds(const TileStep<T>& st) {
  gemm<false, T, W, NV>(st.dout, st.vt, st.dp, st.bm, st.bn, st.d, false);
  score_grad(st);
}

template <class T, int W, int NV>
void dkdv_step(const TileStep<T>& st) {
  recompute_p<T, W, NV>(st);
  gemm<true, T, W, NV>(st.p, st.dout, st.dv, st.bn, st.d, st.bm, true);  // dV += P^T dO
  p_to_ds<T, W, NV>(st);
  gemm<true, T, W, NV>(st.p, st.q, st.dk, st.bn, st.d, st.bm, true);  // dK += dS^T Q
}

template <class T, int W, int NV>
void dq_step(const TileStep<T>& st) {
  recompute_p<T, W, NV>(st);
  p_to_ds<T, W, NV>(st);
  gemm<false, T, W, NV>(st.p, st.k, st.dq, st.bm, st.d, st.bn, true);  // dQ += dS K
}

// W lanes per vector and NV vectors per register-block row: kMR * NV accumulators plus NV loads
// and a broadcast must fit the ISA's registers.
template <class T, int W, int NV>
TileOps<T> make_ops() {
  return TileOps<T>{&dkdv_step<T, W, NV>, &dq_step<T, W, NV>};
}

}  // namespace
}  // namespace flashattn::cpu::bwd
