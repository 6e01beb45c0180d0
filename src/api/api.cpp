// The C++ API: validate, then dispatch by device. Kernels never see a TensorView.
#include <cstdint>
#include <string>
#include <utility>

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
  if (rank <= 0 || rank > kMaxRank) return 0;  // absent, or a rank the validation rejects
  for (int i = 0; i < rank; ++i)
    if (shape[i] == 0) return 0;  // before any product: the other sizes may be huge
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];  // validated views do not overflow (Checker::addressable)
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
  core::DecodeParams p = api::validate_decode_shapes(a);
  int64_t longest = api::validate_decode_indices(a, p);
  if (a.q.device == DeviceType::cuda)
    cuda::decode(p, longest, a.q.device_index);
  else
    cpu::decode(p);
}

namespace {

// The shape a plan records, from validated params (also what a run is compared against).
DecodePlan plan_shape(const DecodeArgs& a, const core::DecodeParams& p) {
  DecodePlan plan;
  plan.device = a.q.device;
  plan.device_index = a.q.device == DeviceType::cuda ? a.q.device_index : 0;
  plan.dtype = p.dtype;
  plan.batch = p.batch;
  plan.seqlen_new = p.seqlen_new;
  plan.heads_q = p.heads_q;
  plan.heads_kv = p.heads_kv;
  plan.head_dim = p.head_dim;
  plan.paged = p.paged;
  plan.append = p.append;
  plan.num_pages = p.num_pages;
  plan.page_size = p.page_size;
  plan.max_pages_per_seq = p.max_pages_per_seq;
  return plan;
}

void check_plan(const DecodePlan& plan, const DecodePlan& got) {
  auto fail = [](const std::string& what, int64_t want, int64_t have) {
    throw Error(Status::invalid_argument, "decode: argument 'plan': was made for " + what + " " + std::to_string(want) +
                                              ", but the arguments have " + std::to_string(have) +
                                              " (make a new plan with plan_decode)");
  };
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"device type", {int64_t(plan.device), int64_t(got.device)}},
      {"device index", {plan.device_index, got.device_index}},
      {"dtype code", {int64_t(plan.dtype), int64_t(got.dtype)}},
      {"batch", {plan.batch, got.batch}},
      {"seqlen_new", {plan.seqlen_new, got.seqlen_new}},
      {"heads_q", {plan.heads_q, got.heads_q}},
      {"heads_kv", {plan.heads_kv, got.heads_kv}},
      {"head_dim", {plan.head_dim, got.head_dim}},
      {"paged (0/1)", {plan.paged, got.paged}},
      {"append (0/1)", {plan.append, got.append}},
      {"num_pages", {plan.num_pages, got.num_pages}},
      {"page_size", {plan.page_size, got.page_size}},
      {"max_pages_per_seq", {plan.max_pages_per_seq, got.max_pages_per_seq}}};
  for (const auto& [what, v] : fields)
    if (v.first != v.second) fail(what, v.first, v.second);
  const int64_t capacity = plan.paged ? plan.max_pages_per_seq * plan.page_size : plan.page_size;
  if (plan.max_cache_seqlen + (plan.append ? plan.seqlen_new : 0) > capacity)
    throw Error(Status::invalid_argument, "decode: argument 'plan': max_cache_seqlen " +
                                              std::to_string(plan.max_cache_seqlen) + " leaves no room in the cache (" +
                                              std::to_string(capacity) + " tokens) for the appended ones");
  if (plan.num_splits < 0 || plan.num_splits > kMaxSplits || plan.max_cache_seqlen < 0 || plan.workspace_bytes < 0)
    throw Error(Status::invalid_argument, "decode: argument 'plan': is not a plan made by plan_decode");
}

}  // namespace

DecodePlan plan_decode(const DecodeArgs& a, int64_t max_cache_seqlen) {
  core::DecodeParams p = api::validate_decode_shapes(a);
  int64_t longest = api::validate_decode_indices(a, p);
  const int64_t room = api::decode_capacity(p) - (p.append ? p.seqlen_new : 0);
  if (max_cache_seqlen < 0 || (max_cache_seqlen > 0 && (max_cache_seqlen < longest || max_cache_seqlen > room)))
    throw Error(Status::invalid_argument,
                "plan_decode: argument 'max_cache_seqlen': must be 0 (= the longest cache_seqlens entry, " +
                    std::to_string(longest) + ") or in [" + std::to_string(longest) + ", " + std::to_string(room) +
                    "] (the cache capacity less the appended tokens), got " + std::to_string(max_cache_seqlen));
  DecodePlan plan = plan_shape(a, p);
  plan.max_cache_seqlen = max_cache_seqlen > 0 ? max_cache_seqlen : longest;
  plan.num_splits = p.num_splits;
  if (a.q.device == DeviceType::cuda) cuda::plan_decode(p, plan, a.q.device_index);
  return plan;
}

void decode(const DecodeArgs& a, const DecodePlan& plan, void* workspace) {
  core::DecodeParams p = api::validate_decode_shapes(a);
  check_plan(plan, plan_shape(a, p));
  if (a.q.device == DeviceType::cuda) {
    if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
      throw Error(Status::invalid_argument, "decode: argument 'workspace': needs plan.workspace_bytes (" +
                                                std::to_string(plan.workspace_bytes) +
                                                ") bytes of device memory, 256-byte aligned, got " +
                                                (workspace == nullptr ? std::string("NULL") : "a misaligned pointer"));
    cuda::decode(p, plan, workspace, a.q.device_index);
  } else {
    // Host memory: checking the indices costs a pass over them, far less than the attention.
    api::validate_decode_indices(a, p, plan.max_cache_seqlen);
    cpu::decode(p);
  }
}

DecodeStatus decode_status(const DecodePlan& plan, const void* workspace, void* stream) {
  if (plan.device != DeviceType::cuda) return DecodeStatus{};  // CPU runs throw instead
  if (workspace == nullptr)
    throw Error(Status::invalid_argument, "decode_status: argument 'workspace': is NULL");
  return cuda::decode_status(plan, workspace, stream, plan.device_index);
}

void merge_states(const MergeArgs& a) {
  core::MergeParams p = api::validate_merge(a);
  if (a.o_parts.device == DeviceType::cuda)
    cuda::merge_states(p, a.o_parts.device_index);
  else
    cpu::merge_states(p);
}

std::string last_gpu_kernel() { return cuda::last_kernel(); }

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
