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
  for (int i = 0; i < v.rank; ++i) {
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

}  // namespace fa_test
