// The CPU standard attention, compiled once per instruction set (standard_attention.cpp: baseline
// x86-64, 16-byte vectors; standard_attention_avx2.cpp: AVX2, 32-byte vectors) so that it is
// compared with the FlashAttention engine, which dispatches to AVX2 too, on the same footing. The
// includer defines FATOOL_STD_ISA (the namespace) and FATOOL_VECTOR_BYTES.
//
// Three parallel passes over full [b, h, s_q, s_k] buffers, like three kernels: S = scale Q K^T,
// P = softmax(mask(S)), O = P V. The two products are blocked the way any decent GEMM is (packed
// panels, register tiles), so the comparison measures the algorithm, not a naive loop.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "core/block_range.h"
#include "core/numeric.h"
#include "cpu/parallel.h"
#include "standard_attention.h"

// The AVX2 build: only the code below is compiled for AVX2 (a target pragma after the includes, not
// a file-wide -mavx2), so the inline and template code of the headers above stays baseline and no
// AVX2 copy of it can be picked by the linker for a CPU without AVX2.
#if FATOOL_VECTOR_BYTES == 32
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

namespace fatool::FATOOL_STD_ISA {
namespace {

using flashattn::DType;
namespace core = flashattn::core;

// Each storage type with the type it accumulates in: f32 for the 16-bit formats (as a plain GPU
// implementation does), and the type itself for f32 and f64.
template <class T>
struct Storage;
template <>
struct Storage<float> {
  using Acc = float;
  static float widen(float x) { return x; }
  static float narrow(float x) { return x; }
};
template <>
struct Storage<double> {
  using Acc = double;
  static double widen(double x) { return x; }
  static double narrow(double x) { return x; }
};
template <>
struct Storage<core::half_t> {
  using Acc = float;
  static float widen(core::half_t x) { return core::to_float(x); }
  static core::half_t narrow(float x) { return core::to_half(x); }
};
template <>
struct Storage<core::bfloat16_t> {
  using Acc = float;
  static float widen(core::bfloat16_t x) { return core::to_float(x); }
  static core::bfloat16_t narrow(float x) { return core::to_bf16(x); }
};

constexpr int kRows = 4;          // rows per register tile
// Columns per register tile: two vectors, so the 4 x 2 vector accumulators fit the registers.
constexpr int kW = 2 * FATOOL_VECTOR_BYTES / 4;
constexpr int64_t kTaskRows = 64;  // query rows per task: each K or V panel loaded serves 64 rows
constexpr int64_t kKeyChunk = 256; // keys per step of O = P V, so the P and V pieces stay in cache

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// acc[r][w] += sum_t a[r * lda + t] * b[t * kW + w] for t < n, with b a packed panel of kW
// columns: the inner product both matrix passes are made of. Written with GCC's vector extension so
// the kRows x kW accumulators live in registers and each panel row loaded serves kRows rows.
template <class A>
void register_tile(const A* a, int64_t lda, const A* b, int64_t n, A (&acc)[kRows][kW]) {
  typedef A V __attribute__((vector_size(FATOOL_VECTOR_BYTES)));
  constexpr int kL = int(FATOOL_VECTOR_BYTES / sizeof(A)), kV = kW / kL;
  V c[kRows][kV] = {};
  for (int r = 0; r < kRows; ++r)
    for (int w = 0; w < kV; ++w)
      for (int l = 0; l < kL; ++l) c[r][w][l] = acc[r][w * kL + l];
  for (int64_t t = 0; t < n; ++t) {
    for (int w = 0; w < kV; ++w) {
      V bw;
      std::memcpy(&bw, b + t * kW + w * kL, sizeof(V));
      for (int r = 0; r < kRows; ++r) c[r][w] += a[r * lda + t] * bw;
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int w = 0; w < kV; ++w)
      for (int l = 0; l < kL; ++l) acc[r][w * kL + l] = c[r][w][l];
}

template <class T>
void run(const StandardArgs& a) {
  using A = typename Storage<T>::Acc;
  auto widen = [](T x) { return Storage<T>::widen(x); };
  auto narrow = [](A x) { return Storage<T>::narrow(x); };
  const int64_t group = a.h / a.h_kv, row_blocks = (a.s_q + kTaskRows - 1) / kTaskRows;
  const int64_t k_panels = round_up(a.s_k, kW) / kW, v_panels = round_up(a.d, kW) / kW;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  T* out = static_cast<T*>(a.out);
  T* S = static_cast<T*>(a.s);
  T* P = static_cast<T*>(a.p);
  auto q_at = [&](int64_t b, int64_t i, int64_t h) { return q + ((b * a.s_q + i) * a.h + h) * a.d; };
  auto kv_at = [&](const T* base, int64_t b, int64_t j, int64_t hk) { return base + ((b * a.s_k + j) * a.h_kv + hk) * a.d; };
  auto mat_at = [&](T* base, int64_t b, int64_t h, int64_t i) { return base + ((b * a.h + h) * a.s_q + i) * a.s_k; };
  // Splits a pass into tasks of kTaskRows query rows of one (batch, head).
  auto for_row_blocks = [&](const std::function<void(int64_t b, int64_t h, int64_t i0, int64_t rows)>& fn) {
    flashattn::cpu::parallel_for(a.b * a.h * row_blocks, a.threads, [&](int64_t task, int) {
      const int64_t bh = task / row_blocks, i0 = (task % row_blocks) * kTaskRows;
      fn(bh / a.h, bh % a.h, i0, std::min(kTaskRows, a.s_q - i0));
    });
  };

  // K and V of each (batch, KV head) in the accumulation type, packed as panels of kW columns:
  // K^T as [k_panels][d][kW] (columns are keys), V as [v_panels][s_k][kW] (columns are dims).
  // Columns past the end are zero.
  const int64_t k_size = k_panels * a.d * kW, v_size = v_panels * a.s_k * kW;
  std::vector<A> kp(size_t(a.b * a.h_kv * k_size), A(0)), vp(size_t(a.b * a.h_kv * v_size), A(0));
  flashattn::cpu::parallel_for(a.b * a.h_kv, a.threads, [&](int64_t task, int) {
    const int64_t b = task / a.h_kv, hk = task % a.h_kv;
    A* kp_h = kp.data() + task * k_size;
    A* vp_h = vp.data() + task * v_size;
    for (int64_t j = 0; j < a.s_k; ++j)
      for (int64_t x = 0; x < a.d; ++x) {
        kp_h[((j / kW) * a.d + x) * kW + j % kW] = widen(kv_at(k, b, j, hk)[x]);
        vp_h[((x / kW) * a.s_k + j) * kW + x % kW] = widen(kv_at(v, b, j, hk)[x]);
      }
  });

  // Pass 1: S = scale * Q K^T.
  for_row_blocks([&](int64_t b, int64_t h, int64_t i0, int64_t rows) {
    std::vector<A> qs(size_t(kTaskRows * a.d), A(0));  // the rows' q, scaled; missing rows stay 0
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t x = 0; x < a.d; ++x) qs[size_t(r * a.d + x)] = widen(q_at(b, i0 + r, h)[x]) * A(a.scale);
    const A* kp_h = kp.data() + (b * a.h_kv + h / group) * k_size;
    for (int64_t pj = 0; pj < k_panels; ++pj)
      for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
        A acc[kRows][kW] = {};
        register_tile(qs.data() + r0 * a.d, a.d, kp_h + pj * a.d * kW, a.d, acc);
        for (int64_t r = r0; r < std::min<int64_t>(r0 + kRows, rows); ++r) {
          T* s_row = mat_at(S, b, h, i0 + r);
          for (int64_t w = 0, j = pj * kW; w < kW && j < a.s_k; ++w, ++j) s_row[j] = narrow(acc[r - r0][w]);
        }
      }
  });

  // Pass 2: P = softmax of the visible scores of each row (0 elsewhere; all 0 for an empty row).
  const core::MaskSpec mask{a.s_q, a.s_k, a.window_left, a.window_right};
  for_row_blocks([&](int64_t b, int64_t h, int64_t i0, int64_t rows) {
    std::vector<A> e(size_t(a.s_k));
    for (int64_t i = i0; i < i0 + rows; ++i) {
      const T* s_row = mat_at(S, b, h, i);
      T* p_row = mat_at(P, b, h, i);
      const int64_t lo = std::min(mask.lo(i), a.s_k), hi = std::max(mask.hi(i), lo);
      A mx = -std::numeric_limits<A>::infinity(), sum = 0;
      for (int64_t j = lo; j < hi; ++j) mx = std::max(mx, widen(s_row[j]));
      for (int64_t j = lo; j < hi; ++j) {
        e[size_t(j)] = std::exp(widen(s_row[j]) - mx);
        sum += e[size_t(j)];
      }
      const A inv = sum > 0 ? A(1) / sum : A(0);
      for (int64_t j = 0; j < a.s_k; ++j) p_row[j] = narrow(j >= lo && j < hi ? e[size_t(j)] * inv : A(0));
    }
  });

  // Pass 3: O = P V, a chunk of keys at a time (the sum over keys still runs in key order).
  for_row_blocks([&](int64_t b, int64_t h, int64_t i0, int64_t rows) {
    const int64_t ld_o = v_panels * kW;
    std::vector<A> o(size_t(kTaskRows * ld_o), A(0)), pw(size_t(kTaskRows * kKeyChunk), A(0));
    const A* vp_h = vp.data() + (b * a.h_kv + h / group) * v_size;
    for (int64_t t0 = 0; t0 < a.s_k; t0 += kKeyChunk) {
      const int64_t n = std::min(kKeyChunk, a.s_k - t0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t t = 0; t < n; ++t) pw[size_t(r * kKeyChunk + t)] = widen(mat_at(P, b, h, i0 + r)[t0 + t]);
      for (int64_t px = 0; px < v_panels; ++px)
        for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
          A acc[kRows][kW];
          for (int r = 0; r < kRows; ++r)
            for (int w = 0; w < kW; ++w) acc[r][w] = o[size_t((r0 + r) * ld_o + px * kW + w)];
          register_tile(pw.data() + r0 * kKeyChunk, kKeyChunk, vp_h + (px * a.s_k + t0) * kW, n, acc);
          for (int r = 0; r < kRows; ++r)
            for (int w = 0; w < kW; ++w) o[size_t((r0 + r) * ld_o + px * kW + w)] = acc[r][w];
        }
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t x = 0; x < a.d; ++x) out[((b * a.s_q + i0 + r) * a.h + h) * a.d + x] = narrow(o[size_t(r * ld_o + x)]);
  });
}

}  // namespace

void standard_attention(const StandardArgs& a) {
  switch (a.dtype) {
    case DType::f32: return run<float>(a);
    case DType::f64: return run<double>(a);
    case DType::f16: return run<core::half_t>(a);
    case DType::bf16: return run<core::bfloat16_t>(a);
    case DType::i32: break;
  }
  throw flashattn::Error(flashattn::Status::invalid_argument, "standard attention: unsupported dtype");
}

}  // namespace fatool::FATOOL_STD_ISA

#if FATOOL_VECTOR_BYTES == 32
#pragma GCC pop_options
#endif
