// The seed's algorithm in one place: the online-softmax state of a query row and the merge of
// partial (o, lse) states. The CPU engine, the GPU kernels' epilogues and the combine kernels all
// call these, so the -inf rules below cannot drift apart between backends.
//
// Conventions
//   * The running max m is kept in the "exp2 domain": scores are multiplied by log2(e) (folded into
//     the softmax scale) so that every exponential is exp2, one instruction on a GPU.
//   * lse values that leave a kernel are natural-log.
//   * -inf rules: a row that has seen no score has m = -inf, l = 0, o~ = 0. Exponentiating a block
//     against m = -inf would compute -inf - (-inf) = NaN, so exponent_base() returns 0 for it (every
//     masked score is -inf, so exp2(-inf - 0) = 0). A row that ends with l = 0 finalizes to out = 0
//     and lse = -inf. In a merge, a part with lse = -inf weighs 0; if all parts are empty the merge
//     gives o = 0 and lse = -inf.
#pragma once

#include <cmath>
#include <limits>

#if defined(__CUDACC__)
#define FA_HD __host__ __device__ __forceinline__
#else
#define FA_HD inline
#endif

namespace flashattn::core {

inline constexpr double kLog2e = 1.4426950408889634;
inline constexpr double kLn2 = 0.6931471805599453;

template <class T>
FA_HD T neg_inf() {
  return -std::numeric_limits<T>::infinity();
}

FA_HD float exp2_(float x) { return exp2f(x); }
FA_HD double exp2_(double x) { return exp2(x); }
FA_HD float log2_(float x) { return log2f(x); }
FA_HD double log2_(double x) { return log2(x); }
FA_HD float exp_(float x) { return expf(x); }
FA_HD double exp_(double x) { return exp(x); }
FA_HD float log_(float x) { return logf(x); }
FA_HD double log_(double x) { return log(x); }

// ---- online softmax (one row) ---------------------------------------------------------------

// The value to subtract before exp2 for a row whose running max is m (exp2 domain).
template <class T>
FA_HD T exponent_base(T m) {
  return m == neg_inf<T>() ? T(0) : m;
}

// Factor that moves sums kept relative to m_old onto m_new (m_new >= m_old). m_old = -inf gives 0:
// the empty start values vanish, as in the seed's base case.
template <class T>
FA_HD T rescale_factor(T m_old, T m_new) {
  return exp2_(m_old - exponent_base(m_new));
}

// Final lse (natural log) of a row with running max m (exp2 domain) and sum l.
template <class T>
FA_HD T finalize_lse(T m, T l) {
  return l == T(0) ? neg_inf<T>() : (m + log2_(l)) * T(kLn2);
}

// Lazy max (FlashAttention-4's conditional rescaling): keep the running max unless a block's max
// exceeds it by more than kLazyRescaleLog2 (exp2 domain). The sums stay exact, just relative to a
// slightly stale max, so each exp2(s - m) is at most 2^8 = 256: safe in fp32 sums and in fp16/bf16
// P. Kernels then skip rescaling o~ on most blocks (the factor is exactly 1).
inline constexpr float kLazyRescaleLog2 = 8.f;
template <class T>
FA_HD T lazy_max(T m_old, T block_max) {
  if (m_old == neg_inf<T>() || block_max > m_old + T(kLazyRescaleLog2)) return block_max > m_old ? block_max : m_old;
  return m_old;
}

// Multiplier that turns o~ into o: 1/l, or 0 for a row that saw nothing (out = 0, never NaN).
template <class T>
FA_HD T finalize_scale(T l) {
  return l == T(0) ? T(0) : T(1) / l;
}

// The backward recomputes P = exp2(s - lse2) with lse2 = lse * log2(e). A row that saw no key has
// lse = -inf and must get P = 0 (zero gradients), so its base is +inf rather than -inf.
template <class T>
FA_HD T backward_exponent_base(T lse) {
  return lse == neg_inf<T>() ? -neg_inf<T>() : lse * T(kLog2e);
}

// A whole online-softmax state for scalar use (CPU engine, tests). Kernels keep m and l in
// registers and call the functions above directly.
template <class T>
struct SoftmaxState {
  T m = neg_inf<T>();  // running max, exp2 domain
  T l = T(0);          // running sum of exp2(s - m)

  // Take a block whose max is block_max; returns the factor to apply to the old o~ and l.
  FA_HD T update_max(T block_max) {
    T m_new = m > block_max ? m : block_max;
    T f = rescale_factor(m, m_new);
    m = m_new;
    l *= f;
    return f;
  }
  FA_HD T base() const { return exponent_base(m); }
  FA_HD T lse() const { return finalize_lse(m, l); }
  FA_HD T out_scale() const { return finalize_scale(l); }
};

// ---- merge of partial states ----------------------------------------------------------------
// Merging k parts (o_i, lse_i): lse = max + log(sum_i exp(lse_i - max)), o = sum_i w_i o_i with
// w_i = exp(lse_i - lse). Computed in two passes (max first) so nothing overflows, and never
// evaluating -inf - (-inf).

template <class T>
struct MergeState {
  T max_lse = neg_inf<T>();
  T sum = T(0);  // sum of exp(lse_i - max_lse), filled by add_weight()

  FA_HD void see(T lse_i) { max_lse = lse_i > max_lse ? lse_i : max_lse; }
  // Unnormalized weight of part i; adds it to the sum. 0 for an empty part or when all are empty.
  FA_HD T add_weight(T lse_i) {
    T w = (max_lse == neg_inf<T>()) ? T(0) : exp_(lse_i - max_lse);
    sum += w;
    return w;
  }
  FA_HD T out_scale() const { return sum == T(0) ? T(0) : T(1) / sum; }
  FA_HD T lse() const { return sum == T(0) ? neg_inf<T>() : max_lse + log_(sum); }
};

}  // namespace flashattn::core
