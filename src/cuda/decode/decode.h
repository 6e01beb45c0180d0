// The GPU decode: one split-KV attention kernel per (head dim, dtype, target arch), generated like
// the forward (src/cuda/instantiations/decode_*.cu), and the host side that plans and runs it.
//
// One CTA computes one (sequence, KV head, KV split, row tile): its rows are the query heads that
// share the KV head times the new tokens (row r = token * group + head in group), so a K/V byte
// read from HBM serves every one of them. With one split the CTA writes out and lse; with more,
// it writes a fp32 partial (o, lse) to the workspace, and the last of the splits' CTAs to finish
// merges them into out and lse (src/cuda/merge/merge_row.cuh): one launch per step.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/params.h"
#include "cuda/decode/split_plan.h"  // decode_rows_per_cta, choose_decode_splits
#include "flashattn/flashattn.hpp"

namespace flashattn::cuda {

// Everything a decode kernel reads: the validated params plus what the plan fixed.
struct DecodeLaunch {
  core::DecodeParams p;
  int64_t capacity = 0;          // tokens one sequence's cache holds
  int64_t max_cache_seqlen = 0;  // the plan's bound; a longer cache_seqlens entry is a fault
  int32_t splits = 1;
  int32_t row_tiles = 1;         // CTAs per (sequence, KV head, split) along the rows
  int32_t group = 1;             // heads_q / heads_kv
  bool evict_first = false;      // sm90: K/V boxes with an L2 evict_first policy (split_plan.h)
  float* part_o = nullptr;       // splits > 1: [splits, batch, seqlen_new, heads_q, head_dim]
  float* part_lse = nullptr;     //             [splits, batch, heads_kv, row_tiles, rows per CTA]
  uint32_t* arrivals = nullptr;  //             [2][batch, heads_kv, row_tiles]: CTAs done with their
                                 //             loop, then partials published; 0 at the start
  uint32_t* status = nullptr;    // [2]: fault bits; ~(lowest faulty sequence), 0 = none
  // sm90 kernels: the K and V caches as TMA tensors [pages (batch when contiguous), page rows,
  // heads_kv, head_dim], boxes of box_rows rows (16, or the largest power of two dividing the page
  // size, so that a box stays within a page) by 64 columns; filled by run_decode. With box_blocks
  // > 1 (16-row boxes, head_dim a multiple of 64) the maps are 5-D and one box takes all of a
  // row's box_blocks column blocks (sm90::encode_tma_sw128_blocks).
  CUtensorMap k_map, v_map;
  int32_t box_rows = 16;
  int32_t box_blocks = 1;
};

// The workspace: the status words, then (with splits > 1) the arrival counters, the partial lse
// and o, each 256-byte aligned. Status and counters are zeroed together at the start of a run.
inline constexpr int64_t kDecodeStatusBytes = 256;

template <int kHeadDim, class Element, int kArch>
void run_decode(const DecodeLaunch& L, cudaStream_t stream);
// Resident CTAs per SM of the kernel run_decode launches for this many rows per CTA.
template <int kHeadDim, class Element, int kArch>
int decode_ctas_per_sm(int rows_per_cta);

// ---- host side (decode.cpp) ----------------------------------------------------------------------

int64_t decode_workspace_bytes(const core::DecodeParams& p, int32_t splits);
// Fills plan.num_splits and plan.workspace_bytes for the current device (compute capability cc).
void plan_decode_on_device(const core::DecodeParams& p, DecodePlan& plan, int cc, int num_sms);
// Queues the whole step on `stream`: the status (and counter) reset and the attention kernel,
// which appends and, when splitting, combines. Reads nothing to the host.
void run_decode_plan(const core::DecodeParams& p, const DecodePlan& plan, void* workspace, int cc,
                     cudaStream_t stream);
std::string decode_variant_list();

}  // namespace flashattn::cuda
