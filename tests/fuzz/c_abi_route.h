// The fuzzer's calls through the C ABI (include/flashattn/flashattn.h), for a quarter of the cases:
// the same arguments converted field by field (tests/common/c_abi_util.h), and a failing status
// turned back into the C++ API's exception with flashattn_last_error()'s message, so that the same
// checks judge both entry points (the C ABI adds its own: unknown dtype and device codes).
#pragma once

#include "c_abi_util.h"
#include "flashattn/flashattn.h"
#include "flashattn/flashattn.hpp"

namespace fa_fuzz::c_abi {

inline void check(int status) {
  if (status != FLASHATTN_OK) throw flashattn::Error(flashattn::Status(status), flashattn_last_error());
}

inline void forward(const flashattn::ForwardArgs& a) {
  const flashattn_forward_args c = fa_test::c_forward_args(a);
  check(flashattn_forward(&c));
}

inline void backward(const flashattn::BackwardArgs& a) {
  const flashattn_backward_args c = fa_test::c_backward_args(a);
  check(flashattn_backward(&c));
}

inline void decode(const flashattn::DecodeArgs& a) {
  const flashattn_decode_args c = fa_test::c_decode_args(a);
  check(flashattn_decode(&c));
}

inline void merge_states(const flashattn::MergeArgs& a) {
  const flashattn_merge_args c = fa_test::c_merge_args(a);
  check(flashattn_merge_states(&c));
}

}  // namespace fa_fuzz::c_abi
