// The tile arithmetic of the CPU backward (see backward_tile.h), written once over generic vectors
// whose width the including file picks for its ISA. Included by exactly one file per ISA;
// everything is in an unnamed namespace so the per-ISA copies never meet at link time (an AVX2
// body must not be picked for a machine without AVX2). For the same reason this file uses no
// inline functions from other project headers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/backward_tile.h"

namespace flashattn::cpu::bwd {
namespace {

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

template <class T, int W>
inline void store(T* p, typename Simd<T, W>::reg v) {
  std::memcpy(p, &v, sizeof(v));
}

template <class T, int W>
inline typename Simd<T, W>::reg splat(T x) {
  return typename Simd<T, W>::reg{} + x;
}

constexpr int64_t kChunk = 16;  // products summed in registers before joining the running total

// C[kMR][NV * W] (+)= op(A)[kMR][K] B[K][NV * W], op(A) = A or, with TransA, A^T (read in place:
// element (r, x) at a[x * lda + r]; a broadcast costs the same from either address, so P^T and dS^T
// need no transposed copy). Each step loads NV vectors of a B row and broadcasts one op(A) value
// per row into kMR x NV vector accumulators.
// kBlocked (the score products S and dP, written fresh): the sum is blocked, kChunk products at a
// time, each chunk then added to C's running total in the tile (in L1, so the registers hold only
// one chunk's sums and the block can be larger). A float dot product of 64 terms then
// carries about half the rounding error of a plain running sum, which matters because a score
// error becomes a relative error of P. Otherwise (the gradient products) one running sum per output,
// added once to C: there C is the double accumulator that takes each tile's sum.
template <bool TransA, bool kBlocked, class T, int W, int NV, int kMR, class C>
inline void gemm_block(const T* a, int64_t lda, const T* b, int64_t ldb, C* c, int64_t ldc, int64_t k,
                       bool accumulate) {
  using reg = typename Simd<T, W>::reg;
  static_assert(!kBlocked || std::is_same_v<C, T>, "blocked sums run in the tile's own type");
  for (int64_t x0 = 0; x0 < k; x0 += kBlocked ? kChunk : k) {
    const int64_t x1 = kBlocked && x0 + kChunk < k ? x0 + kChunk : k;
    reg acc[kMR][NV];
    for (int r = 0; r < kMR; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = reg{};
    // Four steps per loop trip: the same sums in the same order, with a quarter of the loop's own
    // instructions (3-9% more GFLOP/s from these blocks alone, hot in cache).
#pragma GCC unroll 4
    for (int64_t x = x0; x < x1; ++x) {
      reg bx[NV];
      for (int v = 0; v < NV; ++v) bx[v] = load<T, W>(b + x * ldb + v * W);
      for (int r = 0; r < kMR; ++r) {
        const T ar = TransA ? a[x * lda + r] : a[r * lda + x];
        for (int v = 0; v < NV; ++v) acc[r][v] += ar * bx[v];
      }
    }
    const bool add = accumulate || x0 > 0;
    for (int r = 0; r < kMR; ++r)
      for (int v = 0; v < NV; ++v) {
        C* cv = c + r * ldc + v * W;
        if constexpr (std::is_same_v<C, T>) {
          store<T, W>(cv, add ? load<T, W>(cv) + acc[r][v] : acc[r][v]);
        } else {  // widened in registers; memcpy rather than load/store keeps wide vectors out of calls
          typename Simd<C, W>::reg t = __builtin_convertvector(acc[r][v], typename Simd<C, W>::reg), old;
          if (add) {
            std::memcpy(&old, cv, sizeof(old));
            t += old;
          }
          std::memcpy(cv, &t, sizeof(t));
        }
      }
  }
}

// C[m][n] (+)= op(A)[m][k] B[k][n], all dense row-major (A is [k][m] when TransA); m a multiple of
// 2, n of W; blocks of MR rows, then of 4 and 2 for what is left. The score products (written fresh
// into a tile of T) sum in blocks, the gradient products (added into double) plainly (gemm_block).
template <bool TransA, class T, int W, int NV, int MR, class C>
void gemm(const T* a, const T* b, C* c, int64_t m, int64_t n, int64_t k, bool accumulate) {
  const int64_t lda = TransA ? m : k;
  auto block = [&](auto rows, auto nv, const T* ai, int64_t j, C* cij) {
    constexpr int kRows = decltype(rows)::value, kNV = decltype(nv)::value;
    if constexpr (std::is_same_v<C, T>)
      if (!accumulate) return gemm_block<TransA, true, T, W, kNV, kRows>(ai, lda, b + j, n, cij, n, k, false);
    gemm_block<TransA, false, T, W, kNV, kRows>(ai, lda, b + j, n, cij, n, k, accumulate);
  };
  auto row_block = [&](auto rows, int64_t i) {
    const T* ai = TransA ? a + i : a + i * k;
    int64_t j = 0;
    for (; j + NV * W <= n; j += NV * W) block(rows, std::integral_constant<int, NV>{}, ai, j, c + i * n + j);
    for (; j < n; j += W) block(rows, std::integral_constant<int, 1>{}, ai, j, c + i * n + j);
  };
  int64_t i = 0;
  for (; i + MR <= m; i += MR) row_block(std::integral_constant<int, MR>{}, i);
  if constexpr (MR > 4)
    for (; i + 4 <= m; i += 4) row_block(std::integral_constant<int, 4>{}, i);
  for (; i < m; i += 2) row_block(std::integral_constant<int, 2>{}, i);
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

// 2^x lane by lane: the polynomial for float, libm's exp2 for double (f64 problems exist for
// gradient checks, where exactness matters more than speed).
template <class T, int W>
inline typename Simd<T, W>::reg exp2_vec(typename Simd<T, W>::reg x) {
  if constexpr (std::is_same_v<T, float>) {
    return exp2_poly<W>(x);
  } else {
    for (int l = 0; l < W; ++l) x[l] = exp2(x[l]);
    return x;
  }
}

inline float tanh_t(float x) { return tanhf(x); }
inline double tanh_t(double x) { return tanh(x); }

// The score tile is S = Q K^T [bm][bn] (one row per query), or its transpose S^T [bn][bm] (one
// row per key) when Transposed. The per-query values lse, delta, lo and hi then index tile rows,
// or tile columns (as vectors).
template <bool Transposed, class T>
struct Layout {
  int64_t rows, cols;
  template <class G>
  explicit Layout(const TileStep<T, G>& st) : rows(Transposed ? st.bn : st.bm), cols(Transposed ? st.bm : st.bn) {}
};

// P = exp(s - lse), 0 where masked, with s the scaled (and capped) score. Overwrites st.p, which
// holds Q.K on entry. Evaluated as exp2((s - lse) * log2(e)): subtracting before the change of base
// rounds at the size of s - lse, which is small exactly for the entries that carry weight, instead
// of at the size of lse * log2(e); for scores in the tens this keeps P's relative error near that
// of the rounded lse itself.
template <bool Transposed, class T, int W, class G>
void probabilities(const TileStep<T, G>& st) {
  using reg = typename Simd<T, W>::reg;
  const Layout<Transposed, T> t(st);
  T mul = st.score_mul;
  if (st.softcap != T(0)) {  // s = c * tanh(s / c): keep tanh here and 1 - tanh^2 for the gradient
    for (int64_t e = 0; e < t.rows * t.cols; ++e) {
      const T th = tanh_t(st.p[e] * st.score_mul);
      st.deriv[e] = T(1) - th * th;
      st.p[e] = th;
    }
    mul = st.softcap;
  }
  const T log2e = T(1.4426950408889634);
  for (int64_t r = 0; r < t.rows; ++r) {
    T* row = st.p + r * t.cols;
    for (int64_t c = 0; c < t.cols; c += W) {
      const reg lse = Transposed ? load<T, W>(st.lse + c) : splat<T, W>(st.lse[r]);
      store<T, W>(row + c, exp2_vec<T, W>((load<T, W>(row + c) * mul - lse) * log2e));
    }
    if (!st.masked) continue;
    if constexpr (Transposed) {
      const int64_t key = st.n0 + r;
      for (int64_t c = 0; c < t.cols; ++c) row[c] = (key >= st.lo[c] && key < st.hi[c]) ? row[c] : T(0);
    } else {
      const int64_t lo = st.lo[r] - st.n0, hi = st.hi[r] - st.n0;
      for (int64_t c = 0; c < t.cols; ++c) row[c] = (c >= lo && c < hi) ? row[c] : T(0);
    }
  }
}

// dS = P o (dP - D), times the softcap derivative 1 - tanh^2 (the chain rule through c*tanh(s/c)).
// Overwrites st.p with dS; st.dp holds dP in the same layout.
template <bool Transposed, class T, class G>
void score_grad(const TileStep<T, G>& st) {
  const Layout<Transposed, T> t(st);
  for (int64_t r = 0; r < t.rows; ++r) {
    T* row = st.p + r * t.cols;
    const T* dp = st.dp + r * t.cols;
    if constexpr (Transposed) {
      for (int64_t c = 0; c < t.cols; ++c) row[c] *= dp[c] - st.delta[c];
    } else {
      const T delta = st.delta[r];
      for (int64_t c = 0; c < t.cols; ++c) row[c] *= dp[c] - delta;
    }
  }
  if (st.softcap != T(0))
    for (int64_t e = 0; e < t.rows * t.cols; ++e) st.p[e] *= st.deriv[e];
}

// The key tile's view: S = Q K^T, dP = dO V^T in [bm][bn], so that the key-side products
// dV += P^T dO and dK += dS^T Q read P and dS transposed in place.
template <class T, int W, int NV, int MR>
void dkdv_step(const TileStep<T>& st) {
  gemm<false, T, W, NV, MR>(st.q, st.kt, st.p, st.bm, st.bn, st.d, false);  // S = Q K^T
  probabilities<false, T, W>(st);
  gemm<true, T, W, NV, MR>(st.p, st.dout, st.dv, st.bn, st.d, st.bm, true);  // dV += P^T dO
  gemm<false, T, W, NV, MR>(st.dout, st.vt, st.dp, st.bm, st.bn, st.d, false);  // dP = dO V^T
  score_grad<false, T>(st);
  gemm<true, T, W, NV, MR>(st.p, st.q, st.dk, st.bn, st.d, st.bm, true);  // dK += dS^T Q
}

// The query tile's view: S^T = K Q^T, dP^T = V dO^T in [bn][bm], so that the key and value tiles
// it streams are plain row copies and dQ += dS K reads dS^T transposed in place.
template <class T, int W, int NV, int MR>
void dq_step(const TileStep<T>& st) {
  gemm<false, T, W, NV, MR>(st.k, st.qt, st.p, st.bn, st.bm, st.d, false);  // S^T = K Q^T
  probabilities<true, T, W>(st);
  gemm<false, T, W, NV, MR>(st.v, st.dot, st.dp, st.bn, st.bm, st.d, false);  // dP^T = V dO^T
  score_grad<true, T>(st);
  gemm<true, T, W, NV, MR>(st.p, st.k, st.dq, st.bm, st.d, st.bn, true);  // dQ += dS K
}

// Both sides of a pair at once, for a task that owns dQ of every query row of its KV head group:
// the key tile's view (dkdv_step), then dQ += dS K from the same dS, K row-major in st.k. The same
// products in the same order as dq_step's, so the gradients are bitwise those of the two passes.
template <class T, int W, int NV, int MR>
void fused_step(const TileStep<T>& st) {
  dkdv_step<T, W, NV, MR>(st);
  gemm<false, T, W, NV, MR>(st.p, st.k, st.dq, st.bm, st.d, st.bn, true);  // dQ += dS K
}

// W lanes per vector, NV vectors per register-block row and MR rows per block: MR * NV accumulators
// plus NV loads and a broadcast must fit the ISA's registers (6 x 4 zmm on AVX-512 ran 1.04-1.15x
// 4 x 4, bench/results/cpu_backward_intel_2026-12-05.txt).
template <class T, int W, int NV, int MR = 4>
TileOps<T> make_ops() {
  return TileOps<T>{&dkdv_step<T, W, NV, MR>, &dq_step<T, W, NV, MR>, &fused_step<T, W, NV, MR>};
}

}  // namespace
}  // namespace flashattn::cpu::bwd
