// Host side of TMA: tensor maps (CUtensorMap) describing a [batch, rows, heads, head_dim] tensor
// with arbitrary strides, encoded through the driver entry point fetched by the runtime (so the
// library does not link libcuda directly).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace flashattn::cuda::sm90 {

// A 4-D view: element (b, row, h, i) at base + b*batch + row*row_stride + h*head + i (strides in
// elements, innermost dimension contiguous).
struct TmaTensor {
  const void* base = nullptr;
  int elem_bytes = 2;
  int64_t head_dim = 0, rows = 0, heads = 0, batch = 0;
  int64_t row_stride = 0, head_stride = 0, batch_stride = 0;
};

// Encodes a map whose box is 64 elements of head_dim (one 128-byte swizzle span) by box_rows rows
// of one head of one batch entry, written to shared memory with the 128-byte swizzle. Elements
// outside the tensor load as zeros. Returns false (map untouched) when the driver rejects the
// tensor (alignment, strides) or has no TMA: the caller then takes another path.
bool encode_tma_sw128(CUtensorMap* map, const TmaTensor& t, int box_rows);

}  // namespace flashattn::cuda::sm90
