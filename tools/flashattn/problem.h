// One attention problem as the command runs it: its shape, random inputs on the chosen device, the
// argument structs for the library and for standard attention, and the check against the fp64
// reference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "standard_attention.h"

namespace fatool {

using flashattn::DeviceType;
using flashattn::DType;
using flashattn::TensorView;

enum class Op { fwd, bwd, decode };

struct Shape {
  Op op = Op::fwd;
  int64_t b = 1, h = 8, h_kv = 8, s_q = 4096, s_k = 4096, d = 64;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  int64_t page_size = 0;  // decode: tokens per page of a paged cache, 0 = contiguous cache
  DType dtype = DType::f32;
  DeviceType device = DeviceType::cpu;
  int threads = 0;  // CPU: 0 = all cores

  flashattn::AttnOptions options() const;
  float scale() const;  // the softmax scale the library uses by default
  std::string describe() const;
};

const char* op_name(Op op);
const char* device_name(DeviceType d);
DType parse_dtype(const std::string& s);

// Memory owned on the host or on GPU 0.
class Buffer {
 public:
  Buffer() = default;
  Buffer(DeviceType device, int64_t bytes);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  void upload(const std::vector<unsigned char>& host);
  std::vector<unsigned char> download() const;

 private:
  DeviceType device_ = DeviceType::cpu;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// A buffer with a contiguous view of it; rank 0 when the problem does not use the tensor.
struct Tensor {
  Buffer buf;
  TensorView view;
};

// Values drawn from a standard normal distribution (a fixed, fast generator), stored as `dtype`.
std::vector<unsigned char> random_values(DType dtype, int64_t n, uint64_t seed);

// The tensors of one operation. Inputs are random; outputs start as NaN so an element the library
// fails to write shows up in the check.
class Problem {
 public:
  Problem(const Shape& s, uint64_t seed);

  const Shape& shape() const { return shape_; }
  flashattn::ForwardArgs forward_args() const;
  flashattn::BackwardArgs backward_args() const;  // run forward() first: it fills out and lse
  flashattn::DecodeArgs decode_args() const;
  // Standard attention of q, k, v into std_out, with S and P in the caller's buffers.
  StandardArgs standard_args(void* s, void* p) const;
  Tensor& std_out() { return std_out_; }

  // Max |error| against the fp64 reference of the library's results (and of standard attention's
  // out when `with_standard`). A large problem is checked on a subset; `scope` says which.
  struct Check {
    double flash = 0, standard = -1;  // standard < 0: not checked
    std::string scope;
  };
  Check verify(bool with_standard) const;

 private:
  Check verify_forward(bool with_standard) const;
  Check verify_backward() const;
  Check verify_decode() const;

  Shape shape_;
  Tensor q_, k_, v_, out_, lse_, dout_, dq_, dk_, dv_, block_table_, cache_seqlens_, std_out_;
};

// Max |x - ref| (infinite where exactly one is NaN, or where infinities differ).
double max_abs_error(const std::vector<double>& x, const std::vector<double>& ref);

}  // namespace fatool
