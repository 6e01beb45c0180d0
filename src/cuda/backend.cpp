// The CUDA backend as the API layer sees it (src/api/backends.h): device queries, the copy used
// to validate index arrays, and the operations. Launch-time checks here (device residency,
// alignment) complete validation for what only the GPU path requires, before any kernel runs.
#include <cuda_runtime.h>

#include <string>

#include "api/backends.h"
#include "cuda/common.cuh"
#include "cuda/backward.h"
#include "cuda/forward.h"
#include "cuda/variants.h"

namespace flashattn::cuda {
namespace {

// A pointer the kernel will dereference must be device memory of this device (or managed).
void check_device_pointer(const void* ptr, const char* op, const char* name, int device_index) {
  if (ptr == nullptr) return;
  cudaPointerAttributes attr{};
  cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state this query may leave
    throw Error(Status::invalid_argument, std::string(op) + ": argument '" + name + "': is not a CUDA allocation");
  }
  bool ok = (attr.type == cudaMemoryTypeDevice && attr.device == device_index) || attr.type == cudaMemoryTypeManaged;
  if (!ok)
    throw Error(Status::invalid_argument, std::string(op) + ": argument '" + name + "': is tagged cuda:" +
                                              std::to_string(device_index) + " but is not device memory of that device");
}

// cp.async moves 16-byte chunks: rows must start 16-byte aligned.
void check_rows_aligned(const void* ptr, const core::Strides& s, const char* op, const char* name) {
  bool ok = reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && s.batch % 8 == 0 && s.row % 8 == 0 && s.head % 8 == 0;
  if (!ok)
    throw Error(Status::invalid_argument,
                std::string(op) + ": argument '" + name +
                    "': the GPU path needs 16-byte aligned rows (data pointer aligned to 16 bytes and batch, row and "
                    "head strides multiples of 8 elements)");
}

int compute_capability(int device_index) {
  int major = 0, minor = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index), "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index), "cudaDeviceGetAttribute");
  return major * 10 + minor;
}

// Kernels write element pairs with 4-byte stores.
void check_pairs_aligned(const void* ptr, const core::Strides& s, const char* op, const char* name) {
  if (reinterpret_cast<uintptr_t>(ptr) % 4 != 0 || s.batch % 2 || s.row % 2 || s.head % 2)
    throw Error(Status::invalid_argument, std::string(op) + ": argument '" + name +
                                              "': the GPU path writes element pairs: data pointer aligned to 4 "
                                              "bytes and even strides needed");
}

void check_gpu_dtype(DType t, const char* op) {
  if (t != DType::f16 && t != DType::bf16)
    throw Error(Status::unsupported, std::string(op) + ": the GPU path supports f16 and bf16, got " + dtype_name(t));
}

[[noreturn]] void not_yet(const char* op) {
  throw Error(Status::unsupported, std::string(op) + ": not yet available on the GPU in this version (use CPU tensors)");
}

}  // namespace

bool compiled() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string device_names() {
  std::string s;
  for (int i = 0; i < device_count(); ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    if (!s.empty()) s += "; ";
    s += "cuda:" + std::to_string(i) + " " + prop.name + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
         ", " + std::to_string(prop.multiProcessorCount) + " SMs)";
  }
  return s;
}

std::string kernels() { return variant_list(); }

void copy_to_host(void* dst, const void* src, int64_t bytes, int device_index) {
  DeviceGuard guard(device_index);
  check_device_pointer(src, "validation", "index array", device_index);
  check(cudaMemcpy(dst, src, size_t(bytes), cudaMemcpyDeviceToHost), "cudaMemcpy (index array to host)");
}

void forward(const core::ForwardParams& p, int device_index) {
  DeviceGuard guard(device_index);
  check_gpu_dtype(p.dtype, "forward");
  const std::pair<const void*, const char*> ptrs[] = {{p.q, "q"}, {p.k, "k"}, {p.v, "v"}, {p.out, "out"}, {p.lse, "lse"}};
  for (auto [ptr, name] : ptrs) check_device_pointer(ptr, "forward", name, device_index);
  check_rows_aligned(p.q, p.q_s, "forward", "q");
  check_rows_aligned(p.k, p.k_s, "forward", "k");
  check_rows_aligned(p.v, p.v_s, "forward", "v");
  check_pairs_aligned(p.out, p.o_s, "forward", "out");
  if (p.total_q == 0 || p.batch == 0) return;
  dispatch_forward(p, compute_capability(device_index), static_cast<cudaStream_t>(p.stream));
}

void backward(const core::BackwardParams& p, int device_index) {
  DeviceGuard guard(device_index);
  check_gpu_dtype(p.dtype, "backward");
  const std::pair<const void*, const char*> ptrs[] = {{p.q, "q"},       {p.k, "k"},   {p.v, "v"},   {p.out, "out"},
                                                      {p.dout, "dout"}, {p.lse, "lse"}, {p.dq, "dq"}, {p.dk, "dk"},
                                                      {p.dv, "dv"}};
  for (auto [ptr, name] : ptrs) check_device_pointer(ptr, "backward", name, device_index);
  check_rows_aligned(p.q, p.q_s, "backward", "q");
  check_rows_aligned(p.k, p.k_s, "backward", "k");
  check_rows_aligned(p.v, p.v_s, "backward", "v");
  check_rows_aligned(p.out, p.o_s, "backward", "out");
  check_rows_aligned(p.dout, p.do_s, "backward", "dout");
  check_rows_aligned(p.dq, p.dq_s, "backward", "dq");
  check_pairs_aligned(p.dk, p.dk_s, "backward", "dk");
  check_pairs_aligned(p.dv, p.dv_s, "backward", "dv");
  if (p.batch == 0 || (p.total_q == 0 && p.total_k == 0)) return;
  dispatch_backward(p, compute_capability(device_index), static_cast<cudaStream_t>(p.stream));
}

void decode(const core::DecodeParams&, int) { not_yet("decode"); }
void merge_states(const core::MergeParams&, int) { not_yet("merge_states"); }

}  // namespace flashattn::cuda
