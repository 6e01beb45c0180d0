// The pieces of the argument fuzzer (tests/fuzz/arg_fuzz.cpp) that turn a fuzzer's bytes into
// choices and tensor views into host buffers the size their views claim.
//
// Every buffer is allocated to exactly the bytes its view spans, so AddressSanitizer (the libFuzzer
// build) reports any read or write past a tensor, and every byte that is not an element is a NaN
// pattern, so an engine that reads a stride's gap computes NaN and fails the accuracy check.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "test_util.h"

namespace fa_fuzz {

using flashattn::DType;
using flashattn::TensorView;
using fa_test::offset_of;

// The fuzzer's bytes read as a sequence of choices; past the end every choice is 0 (the first
// option), so any input, even an empty one, describes one whole case.
class ByteSource {
 public:
  ByteSource(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint32_t byte() { return pos_ < size_ ? data_[pos_++] : 0u; }
  // A value in [0, n).
  int64_t below(int64_t n) {
    if (n <= 1) return 0;
    uint32_t v = byte() | (n > 256 ? byte() << 8 : 0u);
    return int64_t(v % uint64_t(n));
  }
  int64_t in(int64_t lo, int64_t hi) { return lo + below(hi - lo + 1); }
  bool chance(int num, int den) { return below(den) < num; }
  template <class T>
  T pick(std::initializer_list<T> options) {
    return options.begin()[below(int64_t(options.size()))];
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// What a tensor is to the operation: read only, written only, read and written (an appended
// cache), or an i32 index array.
enum class Role { input, output, inout, index };

// One argument of an operation: its view (pointing into `bytes` once materialized), what the
// generator meant its contents to be, and a copy of its bytes from before the call.
struct Tensor {
  const char* name = "";
  Role role = Role::input;
  TensorView* view = nullptr;  // the field of the operation's argument struct
  std::vector<int32_t> ints;   // contents of an index array, in logical order
  std::unique_ptr<unsigned char[]> bytes;
  size_t size = 0;
  std::vector<unsigned char> before;
  std::vector<bool> element;  // which bytes belong to some element (outputs)
};

// Elements per unit of padding: 8 for cases that run on a GPU, whose paths need 16-byte rows.
inline int64_t g_pad_unit = 1;

// Strides for a view with its shape set: row-major in some order of the dimensions (the last one
// innermost, as the API requires), with `pad` elements of gap after every dimension, and for
// inputs possibly one broadcast (zero-stride) dimension.
inline void set_strides(ByteSource& in, TensorView& v, bool may_broadcast) {
  int order[flashattn::kMaxRank];
  for (int i = 0; i < v.rank; ++i) order[i] = i;
  const int kind = int(in.below(may_broadcast ? 4 : 3));
  if (kind == 2)  // another memory order of the outer dimensions
    for (int i = v.rank - 2; i > 0; --i) std::swap(order[i], order[in.below(i + 1)]);
  const int64_t pad = kind == 1 ? in.in(1, 3) * g_pad_unit : 0;
  int64_t s = 1;
  for (int j = v.rank - 1; j >= 0; --j) {
    v.stride[order[j]] = s;
    s = s * std::max<int64_t>(v.shape[order[j]], 1) + pad;
  }
  if (kind == 3 && v.rank > 1) v.stride[in.below(v.rank - 1)] = 0;
}

// A view with contiguous-or-not strides from `in`.
inline TensorView make_view(ByteSource& in, DType dtype, std::initializer_list<int64_t> shape, bool may_broadcast) {
  TensorView v;
  v.dtype = dtype;
  v.rank = int32_t(shape.size());
  int i = 0;
  for (int64_t s : shape) v.shape[i++] = s;
  set_strides(in, v, may_broadcast);
  return v;
}

// A contiguous i32 array (the API requires index arrays to be contiguous).
inline TensorView index_view(std::initializer_list<int64_t> shape) {
  TensorView v;
  v.dtype = DType::i32;
  v.rank = int32_t(shape.size());
  int i = 0;
  for (int64_t s : shape) v.shape[i++] = s;
  int64_t s = 1;
  for (int j = v.rank - 1; j >= 0; --j) {
    v.stride[j] = s;
    s *= std::max<int64_t>(v.shape[j], 1);
  }
  return v;
}

// Bytes a view spans (0 for an empty one), or nothing when that is not a sane host allocation
// (negative sizes or strides, overflow, an unknown dtype, more than `limit`) or has more elements
// than a case can fill (a broadcast dimension of 2^40 spans one row).
inline std::optional<size_t> span_bytes(const TensorView& v, size_t limit) {
  if (v.rank < 1 || v.rank > flashattn::kMaxRank) return std::nullopt;
  int64_t esize = 0;
  switch (v.dtype) {
    case DType::f16: case DType::bf16: esize = 2; break;
    case DType::f32: case DType::i32: esize = 4; break;
    case DType::f64: esize = 8; break;
    default: return std::nullopt;
  }
  __int128 last = 0, count = 1;
  for (int i = 0; i < v.rank; ++i) {
    if (v.shape[i] < 0 || v.stride[i] < 0) return std::nullopt;
    if (v.shape[i] == 0) return size_t(0);
    last += __int128(v.shape[i] - 1) * v.stride[i];
    count *= v.shape[i];
    if (count > __int128(limit)) return std::nullopt;
  }
  __int128 bytes = (last + 1) * esize;
  if (bytes > __int128(limit)) return std::nullopt;
  return size_t(bytes);
}

// Whether two elements of a view share memory (a broadcast or otherwise overlapping layout): with
// the dimensions sorted by stride, each stride must step past the span of the smaller ones.
inline bool self_overlapping(const TensorView& v) {
  int dims[flashattn::kMaxRank];
  int n = 0;
  for (int i = 0; i < v.rank; ++i) {
    if (v.shape[i] == 0) return false;  // empty: no element at all
    if (v.shape[i] > 1) dims[n++] = i;
  }
  std::sort(dims, dims + n, [&](int a, int b) { return v.stride[a] < v.stride[b]; });
  __int128 span = 0;
  for (int j = 0; j < n; ++j) {
    if (v.stride[dims[j]] <= span) return true;
    span += __int128(v.shape[dims[j]] - 1) * v.stride[dims[j]];
  }
  return false;
}

// Allocates t's bytes for its view (exactly the span; new[0] for an empty view, a unique pointer
// AddressSanitizer guards) and fills them: NaN everywhere, then, for inputs, a normal random value
// per element, and for index arrays their intended contents (0 where a changed shape asks for more).
// Outputs stay NaN; `element` marks their elements' bytes.
inline void materialize(Tensor& t, size_t span, std::mt19937& rng, void (*store)(TensorView&, int64_t, double)) {
  t.bytes.reset(new unsigned char[span]);
  t.size = span;
  std::memset(t.bytes.get(), t.view->dtype == DType::i32 ? 0x7f : 0xff, span);
  t.view->data = t.bytes.get();
  const int64_t n = span ? t.view->numel() : 0;
  if (t.role == Role::index) {
    for (int64_t i = 0; i < n; ++i)  // through `store`: a mutation may have changed the dtype
      store(*t.view, offset_of(*t.view, i), size_t(i) < t.ints.size() ? double(t.ints[size_t(i)]) : 0.0);
  } else if (t.role != Role::output) {
    std::normal_distribution<double> normal(0.0, 1.0);
    for (int64_t i = 0; i < n; ++i) store(*t.view, offset_of(*t.view, i), normal(rng));
  }
  if (t.role == Role::output) {
    t.element.assign(span, false);
    const int64_t esize = flashattn::dtype_size(t.view->dtype);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t b = 0; b < esize; ++b) t.element[size_t(offset_of(*t.view, i) * esize + b)] = true;
  }
}

}  // namespace fa_fuzz
