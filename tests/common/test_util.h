// Helpers shared by the test suites: host tensors that own their storage, random and poisoned
// fills, strided (non-contiguous) layouts, the accuracy rule, and concurrent repeats of cases.
//
// The accuracy rule (FlashAttention's own): max |kernel - ref64| <= factor * max |plain - ref64|
// + atol, where ref64 is the fp64 reference and plain is a plain same-precision implementation of
// standard attention (reference::Precision::same_as_input). factor is 2 for outputs and 3 for
// gradients.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/numeric.h"
#include "flashattn/flashattn.hpp"
#include "reference/reference.h"

namespace fa_test {

using flashattn::DType;
using flashattn::TensorView;

// Writes x as element `off` (in elements) of a host buffer of dtype t, rounded to nearest; an i32
// takes x saturated to its range (0 for NaN).
inline void store(void* p, DType t, int64_t off, double x) {
  switch (t) {
    case DType::f16: static_cast<flashattn::core::half_t*>(p)[off] = flashattn::core::to_half(float(x)); break;
    case DType::bf16: static_cast<flashattn::core::bfloat16_t*>(p)[off] = flashattn::core::to_bf16(float(x)); break;
    case DType::f32: static_cast<float*>(p)[off] = float(x); break;
    case DType::f64: static_cast<double*>(p)[off] = x; break;
    case DType::i32:
      static_cast<int32_t*>(p)[off] = std::isnan(x) ? 0 : int32_t(std::clamp(x, -2147483648.0, 2147483647.0));
      break;
  }
}

// Offset (elements) of logical index `i` of a view (row-major over the shape).
inline int64_t offset_of(const TensorView& v, int64_t i) {
  int64_t off = 0;
  for (int d = v.rank - 1; d >= 0; --d) {
    off += (i % v.shape[d]) * v.stride[d];
    i /= v.shape[d];
  }
  return off;
}

// A host view's elements in logical order, as doubles.
inline std::vector<double> values(const TensorView& v) {
  std::vector<double> r(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < r.size(); ++i) r[i] = flashattn::reference::load(v.data, v.dtype, offset_of(v, int64_t(i)));
  return r;
}

// A host tensor with its own storage. `pad` adds that many elements to the stride of every
// dimension but the last, so the view is non-contiguous (as slices of larger tensors are).
struct HostTensor {
  std::vector<unsigned char> storage;
  TensorView view;

  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape, int64_t pad = 0) {
    view.dtype = dtype;
    view.rank = int32_t(shape.size());
    int64_t stride = 1;
    for (int i = view.rank - 1; i >= 0; --i) {
      view.shape[i] = shape[size_t(i)];
      view.stride[i] = stride;
      stride *= shape[size_t(i)] + (i == view.rank - 1 ? pad : 0);
    }
    int64_t span = 1;
    for (int i = 0; i < view.rank; ++i) span += (std::max<int64_t>(shape[size_t(i)], 1) - 1) * view.stride[i];
    storage.assign(size_t(span * flashattn::dtype_size(dtype)), 0);
    view.data = storage.data();
  }
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;
  HostTensor(HostTensor&& o) noexcept { *this = std::move(o); }
  HostTensor& operator=(HostTensor&& o) noexcept {
    storage = std::move(o.storage);
    view = o.view;
    view.data = storage.data();
    return *this;
  }

  int64_t numel() const { return view.numel(); }

  int64_t offset_of(int64_t i) const { return fa_test::offset_of(view, i); }

  double get(int64_t i) const { return flashattn::reference::load(view.data, view.dtype, offset_of(i)); }

  void set(int64_t i, double x) { store(view.data, view.dtype, offset_of(i), x); }

  std::vector<double> values() const { return fa_test::values(view); }

  void fill_uniform(std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
    std::uniform_real_distribution<double> u(lo, hi);
    for (int64_t i = 0; i < numel(); ++i) set(i, u(rng));
  }
  void fill_normal(std::mt19937& rng, double stddev = 1.0) {
    std::normal_distribution<double> n(0.0, stddev);
    for (int64_t i = 0; i < numel(); ++i) set(i, n(rng));
  }
  // Every byte of the storage set to a NaN pattern, so an element the kernel fails to write shows.
  void poison() {
    if (view.dtype == DType::i32) {
      std::memset(storage.data(), 0x7f, storage.size());
    } else {
      std::memset(storage.data(), 0xff, storage.size());  // all-ones is a NaN in every float format
    }
  }
};

inline HostTensor int_tensor(const std::vector<int32_t>& values) {
  HostTensor t(DType::i32, {int64_t(values.size())});
  std::memcpy(t.storage.data(), values.data(), values.size() * 4);
  return t;
}

// cu_seqlens of a varlen batch (0, then running sums) from its sequence lengths.
inline std::vector<int32_t> cu_seqlens_of(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu{0};
  for (int32_t l : lengths) cu.push_back(cu.back() + l);
  return cu;
}

// Max |a - b|, where a NaN on either side (but not both) counts as infinite error.
inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    double x = a[i], y = b[i];
    if (std::isnan(x) && std::isnan(y)) continue;
    if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<double>::infinity();
    if (std::isinf(x) || std::isinf(y)) {
      if (x != y) return std::numeric_limits<double>::infinity();
      continue;
    }
    m = std::max(m, std::fabs(x - y));
  }
  return a.size() == b.size() ? m : std::numeric_limits<double>::infinity();
}

inline double default_atol(DType t) {
  switch (t) {
    case DType::f64: return 1e-10;
    case DType::f32: return 2e-6;
    case DType::f16: return 1e-4;
    case DType::bf16: return 1e-3;
    default: return 0;
  }
}

// The accuracy rule. `what` names the tensor in the failure message.
inline ::testing::AssertionResult within_rule(const std::vector<double>& kernel, const std::vector<double>& ref64,
                                              const std::vector<double>& plain, DType dtype, double factor = 2.0,
                                              const std::string& what = "out") {
  double err = max_abs_diff(kernel, ref64);
  double base = max_abs_diff(plain, ref64);
  double bound = factor * base + default_atol(dtype);
  if (err <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": max error " << err << " exceeds " << factor << " x plain error "
                                       << base << " + atol " << default_atol(dtype) << " (dtype "
                                       << flashattn::dtype_name(dtype) << ")";
}

// The bytes of a followed by those of b: two outputs compared as one (out and lse).
inline std::vector<unsigned char> joined(std::vector<unsigned char> a, const std::vector<unsigned char>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// For the CPU engine's scratch kept between calls (src/cpu/scratch_cache.h). run(i, first) runs
// case i and returns its result's bytes; the first run of every case (first = true: the caller
// checks it against the reference there) is made one case after another. Then four threads at once
// run every case three times each, from different starts, so that calls of different shapes follow
// each other and overlap; every run whose bytes differ from its case's first is a failure, named by
// describe(i).
inline void expect_bitwise_repeats(size_t cases,
                                   const std::function<std::vector<unsigned char>(size_t, bool)>& run,
                                   const std::function<std::string(size_t)>& describe) {
  std::vector<std::vector<unsigned char>> first;
  for (size_t i = 0; i < cases; ++i) first.push_back(run(i, true));
  constexpr size_t kThreads = 4, kRounds = 3;
  std::vector<std::vector<size_t>> differing(kThreads);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (size_t n = 0; n < kRounds * cases; ++n) {
        const size_t i = (t + n) % cases;
        if (run(i, false) != first[i]) differing[t].push_back(i);
      }
    });
  for (std::thread& t : threads) t.join();
  for (size_t t = 0; t < kThreads; ++t)
    for (size_t i : differing[t])
      ADD_FAILURE() << "thread " << t << ": " << describe(i) << " differs from its first run";
}

}  // namespace fa_test
