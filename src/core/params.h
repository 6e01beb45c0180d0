// The plain parameter structs every backend receives after validation (src/api/validate.cpp).
// Pointers, sizes, int64 strides in elements and flags; no framework types, no TensorView. The
// CPU engine and the CUDA launchers both read these, and nothing below them re-validates.
#pragma once

#include <cstdint>

#include "flashattn/flashattn.hpp"
#include "softmax_state.h"  // FA_HD

namespace flashattn::core {

// Where row i of head h of sequence b lives: base + b*batch + (tok0(b) + i)*row + h*head, where
// tok0(b) = cu_seqlens[b] for varlen batches (batch stride 0) and 0 otherwise.
struct Strides {
  int64_t batch = 0, row = 0, head = 0;
  FA_HD int64_t offset(int64_t b, int64_t token, int64_t h) const {
    return b * batch + token * row + h * head;
  }
};

struct LseStrides {  // lse[b, h, i]; varlen: lse[h, tok0(b) + i] (batch stride 0)
  int64_t batch = 0, head = 0, row = 0;
  FA_HD int64_t offset(int64_t b, int64_t token, int64_t h) const {
    return b * batch + h * head + token * row;
  }
};

// The shape and options of one attention problem (forward or backward).
struct AttnShape {
  int64_t batch = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  int64_t seqlen_q = 0, seqlen_k = 0;  // fixed length; for varlen, the maximum over the batch
  int64_t total_q = 0, total_k = 0;    // rows of the packed tensors (varlen), else batch*seqlen
  const int32_t* cu_seqlens_q = nullptr;  // varlen when set; same device as the tensors
  const int32_t* cu_seqlens_k = nullptr;
  float scale = 1.f;         // softmax scale (already defaulted to 1/sqrt(d))
  float softcap = 0.f;       // 0 = off
  bool causal = false;       // for reporting; the mask itself is window_right = 0
  int64_t window_left = -1;  // -1 = unbounded
  int64_t window_right = -1;
  DType dtype = DType::f32;
  int32_t num_threads = 0;
  void* stream = nullptr;

  FA_HD bool varlen() const { return cu_seqlens_q != nullptr; }
  FA_HD int64_t group() const { return heads_q / heads_kv; }  // query heads per KV head
};

struct ForwardParams : AttnShape {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  void* lse = nullptr;  // optional; double when dtype is f64, else float
  Strides q_s, k_s, v_s, o_s;
  LseStrides lse_s;
};

struct BackwardParams : ForwardParams {
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  Strides do_s, dq_s, dk_s, dv_s;
  bool deterministic = false;
};

struct DecodeParams {
  int64_t batch = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  int64_t seqlen_new = 0;  // query tokens per sequence
  bool append = false;     // k_new/v_new are written into the cache before attention
  bool paged = false;
  int64_t page_size = 0;   // paged: tokens per page; contiguous: the capacity
  int64_t num_pages = 0;   // paged: pages in the cache; contiguous: batch
  int64_t max_pages_per_seq = 0;
  float scale = 1.f, softcap = 0.f;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  int32_t num_splits = 0;  // 0 = choose
  DType dtype = DType::f32;
  int32_t num_threads = 0;
  void* stream = nullptr;

  const void* q = nullptr;
  void* k_cache = nullptr;  // written only when append
  void* v_cache = nullptr;
  const int32_t* block_table = nullptr;
  int64_t block_table_row_stride = 0, block_table_col_stride = 0;
  const int32_t* cache_seqlens = nullptr;
  int64_t cache_seqlens_stride = 0;
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  void* out = nullptr;
  void* lse = nullptr;  // optional; double when dtype is f64, else float

  Strides q_s, o_s, knew_s, vnew_s;
  // Cache strides: page (or sequence, when contiguous), token in page, head.
  int64_t kc_page = 0, kc_row = 0, kc_head = 0;
  int64_t vc_page = 0, vc_row = 0, vc_head = 0;
  LseStrides lse_s;
};

struct MergeParams {
  int64_t parts = 0, tokens = 0, heads = 0, head_dim = 0;
  DType dtype = DType::f32;  // of o_parts and out
  const void* o_parts = nullptr;
  const void* lse_parts = nullptr;  // double when dtype is f64, else float
  void* out = nullptr;
  void* lse = nullptr;  // optional; same type as lse_parts
  int64_t op_part = 0, op_token = 0, op_head = 0;  // o_parts strides
  int64_t lp_part = 0, lp_token = 0, lp_head = 0;  // lse_parts strides
  int64_t o_token = 0, o_head = 0;                 // out strides
  int64_t l_token = 0, l_head = 0;                 // lse strides
  int32_t num_threads = 0;
  void* stream = nullptr;
};

}  // namespace flashattn::core
