// C ABI structs built from the C++ argument structs, for tests that drive the same problem through
// both interfaces.
#pragma once

#include <cstring>

#include "flashattn/flashattn.h"
#include "flashattn/flashattn.hpp"

namespace fa_test {

inline flashattn_tensor c_view(const flashattn::TensorView& v) {
  flashattn_tensor t;
  std::memset(&t, 0, sizeof(t));
  t.data = v.data;
  t.dtype = int32_t(v.dtype);
  t.device = int32_t(v.device);
  t.device_index = v.device_index;
  t.rank = v.rank;
  for (int i = 0; i < FLASHATTN_MAX_RANK; ++i) {  // all of them: the rank may be out of range
    t.shape[i] = v.shape[i];
    t.stride[i] = v.stride[i];
  }
  return t;
}

inline flashattn_options c_options(const flashattn::AttnOptions& o) {
  flashattn_options c = flashattn_default_options();
  c.softmax_scale = o.softmax_scale;
  c.causal = o.causal ? 1 : 0;
  c.window_left = o.window_left;
  c.window_right = o.window_right;
  c.softcap = o.softcap;
  c.num_threads = o.num_threads;
  c.stream = o.stream;
  return c;
}

inline flashattn_forward_args c_forward_args(const flashattn::ForwardArgs& a) {
  flashattn_forward_args c;
  std::memset(&c, 0, sizeof(c));
  c.struct_size = sizeof(c);
  c.q = c_view(a.q);
  c.k = c_view(a.k);
  c.v = c_view(a.v);
  c.out = c_view(a.out);
  c.lse = c_view(a.lse);
  c.cu_seqlens_q = c_view(a.cu_seqlens_q);
  c.cu_seqlens_k = c_view(a.cu_seqlens_k);
  c.options = c_options(a.options);
  return c;
}

inline flashattn_backward_args c_backward_args(const flashattn::BackwardArgs& a) {
  flashattn_backward_args c;
  std::memset(&c, 0, sizeof(c));
  c.struct_size = sizeof(c);
  c.dout = c_view(a.dout);
  c.q = c_view(a.q);
  c.k = c_view(a.k);
  c.v = c_view(a.v);
  c.out = c_view(a.out);
  c.lse = c_view(a.lse);
  c.dq = c_view(a.dq);
  c.dk = c_view(a.dk);
  c.dv = c_view(a.dv);
  c.cu_seqlens_q = c_view(a.cu_seqlens_q);
  c.cu_seqlens_k = c_view(a.cu_seqlens_k);
  c.options = c_options(a.options);
  c.deterministic = a.deterministic ? 1 : 0;
  return c;
}

inline flashattn_decode_args c_decode_args(const flashattn::DecodeArgs& a) {
  flashattn_decode_args c;
  std::memset(&c, 0, sizeof(c));
  c.struct_size = sizeof(c);
  c.q = c_view(a.q);
  c.k_cache = c_view(a.k_cache);
  c.v_cache = c_view(a.v_cache);
  c.block_table = c_view(a.block_table);
  c.cache_seqlens = c_view(a.cache_seqlens);
  c.k_new = c_view(a.k_new);
  c.v_new = c_view(a.v_new);
  c.out = c_view(a.out);
  c.lse = c_view(a.lse);
  c.num_splits = a.num_splits;
  c.options = c_options(a.options);
  return c;
}

inline flashattn_merge_args c_merge_args(const flashattn::MergeArgs& a) {
  flashattn_merge_args c;
  std::memset(&c, 0, sizeof(c));
  c.struct_size = sizeof(c);
  c.o_parts = c_view(a.o_parts);
  c.lse_parts = c_view(a.lse_parts);
  c.out = c_view(a.out);
  c.lse = c_view(a.lse);
  c.options = c_options(a.options);
  return c;
}

}  // namespace fa_test
