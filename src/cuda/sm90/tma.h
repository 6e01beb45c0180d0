// Host side of TMA: tensor maps (CUtensorMap) describing a [batch, rows, heads, head_dim] tensor
// with arbitrary strides, encoded through the driver entry point fetched by the runtime (so the
// library does not link libcuda directly).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "core/params.h"

namespace flashattn::cuda::sm90 {

// A 4-D view: element (b, row, h, i) at base + b*batch + row*row_stride + h*head + i (strides in
// elements, innermost dimension contiguous).
struct TmaTensor {
  const void* base = nullptr;
  int elem_bytes = 2;
  int64_t head_dim = 0, rows = 0, heads = 0, batch = 0;
  int64_t row_stride = 0, head_stride = 0, batch_stride = 0;
};

// A tensor of p with strides s as a view of head_dim columns: [batch, seqlen, heads, d], or for
// varlen the packed [total, heads, d] as one sequence of all rows (batch 1). keys: a K/V tensor
// (seqlen_k / total_k rows), else a query-side one (Q, O, dO).
inline TmaTensor tma_view(const core::AttnShape& p, const void* base, const core::Strides& s, int64_t heads,
                          int64_t head_dim, bool keys) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  TmaTensor t;
  t.base = base;
  t.head_dim = head_dim;
  t.rows = varlen ? (keys ? p.total_k : p.total_q) : (keys ? p.seqlen_k : p.seqlen_q);
  t.heads = heads;
  t.batch = varlen ? 1 : p.batch;
  t.row_stride = s.row;
  t.head_stride = s.head;
  t.batch_stride = varlen ? 0 : s.batch;
  return t;
}

// Encodes a map whose box is 64 elements of head_dim (one 128-byte swizzle span) by box_rows rows
// of one head of one batch entry, written to shared memory with the 128-byte swizzle. Elements
// outside the tensor load as zeros. Returns false (map untouched) when the driver rejects the
// tensor (alignment, strides) or has no TMA: the caller then takes another path. An L2 miss fills
// 128 bytes: 256-byte fills, a key row's two halves together, cost the decode kernel 7-11% of its
// time from 32k keys up on an H200 (bench/results/h200_session55_2026-12-06.txt, call 2) where they
// had gained 0.3-0.9% on an H100 (session 51); the forward and backward moved 0.97-1.01x with them
// (H100, session 46).
bool encode_tma_sw128(CUtensorMap* map, const TmaTensor& t, int box_rows);

// The same tensor with each row's head_dim columns seen as head_dim / 64 blocks of 64, a dimension
// of their own: a box of box_rows rows by every block lands as the blocks one after another, each
// box_rows x 128 swizzled bytes (the decode kernel's slots). head_dim must be a multiple of 64 (a
// block past head_dim would read other data, not zeros); false when it is not or the driver refuses.
bool encode_tma_sw128_blocks(CUtensorMap* map, const TmaTensor& t, int box_rows);

}  // namespace flashattn::cuda::sm90
