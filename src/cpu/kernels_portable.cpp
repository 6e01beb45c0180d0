// The portable level: the tile kernels over one value at a time, for float (CPUs without AVX2, and
// the FLASHATTN_CPU_KERNEL=portable cap) and for double (every f64 problem). exp2 and tanh come
// from libm, and the softmax rules from src/core/softmax_state.h directly.
#include <cmath>

#include "core/numeric.h"
#include "core/softmax_state.h"
#include "cpu/kernel_impl.h"

namespace flashattn::cpu {
namespace {

template <class Real>
struct Scalar {
  using T = Real;
  using reg = Real;
  static constexpr int W = 1;
  // Register blocks of 4 x 4 values: enough independent multiply-adds to hide the FMA latency.
  static constexpr int kScoreKeys = 4, kScoreVecs = 4;
  static constexpr int kAccDims = 4, kAccVecs = 4;

  static T zero() { return T(0); }
  static T load(const T* p) { return *p; }
  static void store(T* p, T x) { *p = x; }
  static T set1(T x) { return x; }
  static T add(T a, T b) { return a + b; }
  static T sub(T a, T b) { return a - b; }
  static T mul(T a, T b) { return a * b; }
  static T fma(T a, T b, T c) { return a * b + c; }
  static T load_f16(const uint16_t* p) {
    T x;
    widen(p, DType::f16, &x, 1);
    return x;
  }
  static T load_bf16(const uint16_t* p) {
    T x;
    widen(p, DType::bf16, &x, 1);
    return x;
  }
  static void sum4(T a0, T a1, T a2, T a3, T* out) {
    out[0] = a0;
    out[1] = a1;
    out[2] = a2;
    out[3] = a3;
  }
  static T max(T a, T b) { return a > b ? a : b; }
  static T exponent_base(T m) { return core::exponent_base(m); }
  static T exp2(T x) { return core::exp2_(x); }
  static T tanh(T x) { return std::tanh(x); }

  static void narrow(const T* src, T mul, DType t, void* dst, int64_t n) {
    if (t == DType::f16) {
      auto* d = static_cast<core::half_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = core::to_half(float(src[i] * mul));
    } else {
      auto* d = static_cast<core::bfloat16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = core::to_bf16(float(src[i] * mul));
    }
  }
  static void widen(const void* src, DType t, T* dst, int64_t n) {
    if (t == DType::f16) {
      auto* s = static_cast<const core::half_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = T(core::to_float(s[i]));
    } else {
      auto* s = static_cast<const core::bfloat16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = T(core::to_float(s[i]));
    }
  }
};

}  // namespace

const TileKernels<float>& portable_kernels_f32() {
  static const TileKernels<float> k = make_kernels<Scalar<float>>(KernelLevel::portable);
  return k;
}

const TileKernels<double>& portable_kernels_f64() {
  static const TileKernels<double> k = make_kernels<Scalar<double>>(KernelLevel::portable);
  return k;
}

}  // namespace flashattn::cpu
