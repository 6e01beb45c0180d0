// The C++ API: validate, then dispatch by device. Kernels never see a TensorView.
#include <string>

#include "api/backends.h"
#include "api/validate.h"
#include "flashattn/flashattn.hpp"
#include "flashattn/version.h"

namespace flashattn {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
  }
  return "unknown";
}

int64_t dtype_size(DType t) {
  switch (t) {
    case DType::f16:
    case DType::bf16: return 2;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f64: return 8;
  }
  return 0;
}

int64_t TensorView::numel() const {
  if (rank <= 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  DeviceType device, int32_t device_index) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.device_index = device_index;
  if (shape.size() > size_t(kMaxRank))
    throw Error(Status::invalid_argument, "TensorView::contiguous: rank " + std::to_string(shape.size()) + " exceeds 4");
  t.rank = int32_t(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t stride = 1;
  for (int j = t.rank - 1; j >= 0; --j) {
    t.stride[j] = stride;
    stride *= t.shape[j];
  }
  return t;
}

void forward(const ForwardArgs& a) {
  core::ForwardParams p = api::validate_forward(a);
  if (a.q.device == DeviceType::cuda)
    cuda::forward(p, a.q.device_index);
  else
    cpu::forward(p);
}

void backward(const BackwardArgs& a) {
  core::BackwardParams p = api::validate_backward(a);
  if (a.q.device == DeviceType::cuda)
    cuda::backward(p, a.q.device_index);
  else
    cpu::backward(p);
}

void decode(const DecodeArgs& a) {
  core::DecodeParams p = api::validate_decode(a);
  if (a.q.device == DeviceType::cuda)
    cuda::decode(p, a.q.device_index);
  else
    cpu::decode(p);
}

void merge_states(const MergeArgs& a) {
  core::MergeParams p = api::validate_merge(a);
  if (a.o_parts.device == DeviceType::cuda)
    cuda::merge_states(p, a.o_parts.device_index);
  else
    cpu::merge_states(p);
}

BuildInfo build_info() {
  BuildInfo info;
  info.version = FLASHATTN_VERSION_STRING;
  info.cuda_compiled = cuda::compiled();
  info.cuda_kernels = cuda::kernels();
  info.cpu_features = cpu::features();
  info.cpu_kernel = cpu::kernel_level();
  info.cpu_threads = cpu::default_threads();
  info.cuda_devices = cuda::device_count();
  info.cuda_device_names = cuda::device_names();
  return info;
}

}  // namespace flashattn
