// Host-side conversions between fp32 and the 16-bit formats, bit-exact round-to-nearest-even, so
// the CPU engine reads fp16/bf16 tensors in place without any compiler extension. GPU code uses
// cuda_fp16.h / cuda_bf16.h instead.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace flashattn::core {

struct half_t {
  uint16_t bits;
};
struct bfloat16_t {
  uint16_t bits;
};

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float to_float(bfloat16_t h) { return bits_to_float(uint32_t(h.bits) << 16); }

inline bfloat16_t to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return {uint16_t(u >> 16)};
}

inline float to_float(half_t h) {
  uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    // subnormal: value = man * 2^-24
    float v = float(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

inline half_t to_half(float f) {
  uint32_t u = float_to_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return {uint16_t(sign | 0x7e00u)};           // NaN
  if (a >= 0x477ff000u) return {uint16_t(sign | 0x7c00u)};          // rounds to inf (>= 65520)
  if (a < 0x38800000u) {                                            // subnormal or zero in fp16
    float v = bits_to_float(a) * 16777216.0f;                       // scale to units of 2^-24
    uint32_t m = uint32_t(v);
    float rem = v - float(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return {uint16_t(sign | m)};
  }
  uint32_t e = (a >> 23) - 112u;
  uint32_t man = a & 0x7fffffu;
  uint32_t h = (e << 10) | (man >> 13);
  uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: fine
  return {uint16_t(sign | h)};
}

template <class T>
inline float load_as_float(const T* p) {
  if constexpr (std::is_same_v<T, half_t> || std::is_same_v<T, bfloat16_t>) {
    return to_float(*p);
  } else {
    return float(*p);
  }
}

template <class T>
inline T from_float(float f) {
  if constexpr (std::is_same_v<T, half_t>) {
    return to_half(f);
  } else if constexpr (std::is_same_v<T, bfloat16_t>) {
    return to_bf16(f);
  } else {
    return T(f);
  }
}

// Rounds a value through a storage type (what a plain same-precision implementation would keep).
template <class T>
inline double round_through(double x) {
  if constexpr (std::is_same_v<T, double>) {
    return x;
  } else {
    T t = from_float<T>(float(x));
    return double(load_as_float(&t));
  }
}

}  // namespace flashattn::core
