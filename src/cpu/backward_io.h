// Element and tile movement between the user's strided tensors (any storage dtype) and the dense
// accumulator-precision tiles the CPU backward and merge work on. Acc is float for f16/bf16/f32
// storage and double for f64 (which must never round through float).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/numeric.h"
#include "core/params.h"
#include "cpu/simd.h"

namespace flashattn::cpu {

template <class Acc, class T>
inline Acc load_acc(const T* p) {
  if constexpr (std::is_same_v<T, double>) {
    return Acc(*p);
  } else {
    return Acc(core::load_as_float(p));
  }
}

template <class T, class Acc>
inline T store_as(Acc x) {
  if constexpr (std::is_same_v<T, double>) {
    return T(x);
  } else {
    return core::from_float<T>(float(x));
  }
}

// Rows [tok0, tok0 + rows) of head h of a token-major tensor into dst[tile_rows][d] (row-major);
// rows past `rows` are zero, so a partial tile behaves like a full one whose extra rows are masked.
// 16-bit rows are widened by the float kernels' vector conversion where the head dim allows (the
// backward loads a query tile per step, and element by element that took a third of a bf16
// backward on AMX).
template <class T, class Acc>
void load_tile(Acc* dst, int64_t tile_rows, const void* src, const core::Strides& s, int64_t b, int64_t tok0,
               int64_t rows, int64_t h, int64_t d) {
  const T* base = static_cast<const T*>(src);
  if constexpr (std::is_same_v<Acc, float> && (std::is_same_v<T, core::half_t> || std::is_same_v<T, core::bfloat16_t>)) {
    if (d % 8 == 0) {
      const TileKernels<float>& kern = float_kernels();
      const DType t = std::is_same_v<T, core::half_t> ? DType::f16 : DType::bf16;
      for (int64_t i = 0; i < rows; ++i) kern.widen(base + s.offset(b, tok0 + i, h), t, dst + i * d, d);
      std::fill(dst + rows * d, dst + tile_rows * d, Acc(0));
      return;
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    const T* row = base + s.offset(b, tok0 + i, h);
    if constexpr (std::is_same_v<T, Acc>) {
      // The library's copy, in the widest vectors the machine has (this file is built for baseline
      // x86-64, whose 16-byte loop took a tenth of an f32 backward on AVX-512).
      std::memcpy(dst + i * d, row, size_t(d) * sizeof(Acc));
    } else {
      for (int64_t x = 0; x < d; ++x) dst[i * d + x] = load_acc<Acc>(row + x);
    }
  }
  std::fill(dst + rows * d, dst + tile_rows * d, Acc(0));
}

// The same rows, transposed: dst[d][tile_rows], dst[x][i] = row i, element x (zero for padding).
// Rows of the accumulator's own type are transposed straight from the tensor (they lie s.row
// apart) in the kernels' register blocks (TileKernels::transpose); element by element, with the
// gradients' stores below, that took a fifth of an f32 backward over 64 tokens. Others are
// converted while they are transposed, which costs no extra pass over the tile.
template <class T, class Acc>
void load_tile_transposed(Acc* dst, int64_t tile_rows, const void* src, const core::Strides& s, int64_t b,
                          int64_t tok0, int64_t rows, int64_t h, int64_t d) {
  const T* base = static_cast<const T*>(src);
  if constexpr (std::is_same_v<T, Acc>) {
    const TileKernels<Acc>* kern;
    if constexpr (std::is_same_v<Acc, float>) kern = &float_kernels();
    else kern = &double_kernels();
    if (rows > 0) kern->transpose(base + s.offset(b, tok0, h), s.row, dst, tile_rows, rows, d);
  } else {
    for (int64_t i = 0; i < rows; ++i) {
      const T* row = base + s.offset(b, tok0 + i, h);
      for (int64_t x = 0; x < d; ++x) dst[x * tile_rows + i] = load_acc<Acc>(row + x);
    }
  }
  for (int64_t x = 0; x < d; ++x) std::fill(dst + x * tile_rows + rows, dst + (x + 1) * tile_rows, Acc(0));
}

// The first `rows` rows of an accumulator tile, times `mul`, into head h of a strided tensor; into
// 16-bit rows by the float kernels' vector rounding where the head dim allows (element by element,
// the gradients' stores took 9% of an fp16 backward on AMX).
template <class T, class Acc>
void store_tile(void* dst, const core::Strides& s, int64_t b, int64_t tok0, int64_t rows, int64_t h, int64_t d,
                const Acc* src, Acc mul) {
  T* base = static_cast<T*>(dst);
  if constexpr (std::is_same_v<Acc, float> && (std::is_same_v<T, core::half_t> || std::is_same_v<T, core::bfloat16_t>)) {
    if (d % 8 == 0) {
      const TileKernels<float>& kern = float_kernels();
      const DType t = std::is_same_v<T, core::half_t> ? DType::f16 : DType::bf16;
      for (int64_t i = 0; i < rows; ++i) kern.narrow(src + i * d, mul, t, base + s.offset(b, tok0 + i, h), d);
      return;
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    // restrict: the gradient rows never overlap the accumulators, so the loop may run in vectors.
    T* __restrict row = base + s.offset(b, tok0 + i, h);
    const Acc* __restrict in = src + i * d;
    for (int64_t x = 0; x < d; ++x) row[x] = store_as<T>(in[x] * mul);
  }
}

}  // namespace flashattn::cpu
