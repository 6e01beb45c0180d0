// The fuzzer's calls through the C ABI (include/flashattn/flashattn.h), for a quarter of the cases:
// the same arguments converted field by field, and a failing status turned back into the C++ API's
// exception with flashattn_last_error()'s message, so that the same checks judge both entry points
// (the C ABI adds its own: unknown dtype and device codes, struct sizes).
#pragma once

#include "flashattn/flashattn.h"
#include "flashattn/flashattn.hpp"

namespace fa_fuzz::c_abi {

inline flashattn_tensor tensor(const flashattn::TensorView& v) {
  flashattn_tensor t{};
  t.data = v.data;
  t.dtype = int32_t(v.dtype);
  t.device = int32_t(v.device);
  t.device_index = v.device_index;
  t.rank = v.rank;
  for (int i = 0; i < FLASHATTN_MAX_RANK; ++i) {
    t.shape[i] = v.shape[i];
    t.stride[i] = v.stride[i];
  }
  return t;
}

inline flashattn_options options(const flashattn::AttnOptions& o) {
  flashattn_options r = flashattn_default_options();
  r.softmax_scale = o.softmax_scale;
  r.causal = o.causal;
  r.window_left = o.window_left;
  r.window_right = o.window_right;
  r.softcap = o.softcap;
  r.num_threads = o.num_threads;
  r.stream = o.stream;
  return r;
}

inline void check(int status) {
  if (status != FLASHATTN_OK) throw flashattn::Error(flashattn::Status(status), flashattn_last_error());
}

inline void forward(const flashattn::ForwardArgs& a) {
  flashattn_forward_args c{};
  c.struct_size = sizeof(c);
  c.q = tensor(a.q), c.k = tensor(a.k), c.v = tensor(a.v), c.out = tensor(a.out), c.lse = tensor(a.lse);
  c.cu_seqlens_q = tensor(a.cu_seqlens_q), c.cu_seqlens_k = tensor(a.cu_seqlens_k);
  c.options = options(a.options);
  check(flashattn_forward(&c));
}

inline void backward(const flashattn::BackwardArgs& a) {
  flashattn_backward_args c{};
  c.struct_size = sizeof(c);
  c.dout = tensor(a.dout), c.q = tensor(a.q), c.k = tensor(a.k), c.v = tensor(a.v), c.out = tensor(a.out);
  c.lse = tensor(a.lse), c.dq = tensor(a.dq), c.dk = tensor(a.dk), c.dv = tensor(a.dv);
  c.cu_seqlens_q = tensor(a.cu_seqlens_q), c.cu_seqlens_k = tensor(a.cu_seqlens_k);
  c.options = options(a.options);
  c.deterministic = a.deterministic;
  check(flashattn_backward(&c));
}

inline void decode(const flashattn::DecodeArgs& a) {
  flashattn_decode_args c{};
  c.struct_size = sizeof(c);
  c.q = tensor(a.q), c.k_cache = tensor(a.k_cache), c.v_cache = tensor(a.v_cache);
  c.block_table = tensor(a.block_table), c.cache_seqlens = tensor(a.cache_seqlens);
  c.k_new = tensor(a.k_new), c.v_new = tensor(a.v_new), c.out = tensor(a.out), c.lse = tensor(a.lse);
  c.num_splits = a.num_splits;
  c.options = options(a.options);
  check(flashattn_decode(&c));
}

inline void merge_states(const flashattn::MergeArgs& a) {
  flashattn_merge_args c{};
  c.struct_size = sizeof(c);
  c.o_parts = tensor(a.o_parts), c.lse_parts = tensor(a.lse_parts), c.out = tensor(a.out), c.lse = tensor(a.lse);
  c.options = options(a.options);
  check(flashattn_merge_states(&c));
}

}  // namespace fa_fuzz::c_abi
