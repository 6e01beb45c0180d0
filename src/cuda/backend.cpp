// The CUDA backend as the API layer sees it (src/api/backends.h): device queries, the copy used
// to validate index arrays, and the operations. Launch-time checks here (device residency,
// alignment) complete validation for what only the GPU path requires, before any kernel runs.
#include <cuda_runtime.h>

#include <string>

#include "api/backends.h"
#include "cuda/common.cuh"
#include "cuda/backward.h"
#include "cuda/decode/decode.h"
#include "cuda/forward.h"
#include "cuda/merge/merge.h"
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

std::string kernels() { return variant_list() + ", " + decode_variant_list(); }

std::string last_kernel() { return last_kernel_name(); }

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
  // No sequence has a query row: nothing to write (rows outside every varlen sequence stay untouched).
  if (p.batch == 0 || p.seqlen_q == 0) return;
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
  if (p.batch == 0) return;
  // No sequence has a query row: dK = dV = 0 over the sequences' key rows, and there is no dQ.
  if (p.seqlen_q == 0) {
    if (p.seqlen_k > 0) zero_key_gradients(p, static_cast<cudaStream_t>(p.stream));
    return;
  }
  dispatch_backward(p, compute_capability(device_index), static_cast<cudaStream_t>(p.stream));
}

void plan_decode(const core::DecodeParams& p, DecodePlan& plan, int device_index) {
  DeviceGuard guard(device_index);
  check_gpu_dtype(p.dtype, "decode");
  int num_sms = 0;
  check(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device_index), "cudaDeviceGetAttribute");
  plan_decode_on_device(p, plan, compute_capability(device_index), num_sms);
}

// Host checks only (no device memory is read): a planned run may be captured in a CUDA graph.
void decode(const core::DecodeParams& p, const DecodePlan& plan, void* workspace, int device_index) {
  DeviceGuard guard(device_index);
  check_gpu_dtype(p.dtype, "decode");
  const std::pair<const void*, const char*> ptrs[] = {
      {p.q, "q"},         {p.k_cache, "k_cache"},         {p.v_cache, "v_cache"}, {p.block_table, "block_table"},
      {p.cache_seqlens, "cache_seqlens"}, {p.k_new, "k_new"}, {p.v_new, "v_new"}, {p.out, "out"},
      {p.lse, "lse"},     {workspace, "workspace"}};
  for (auto [ptr, name] : ptrs) check_device_pointer(ptr, "decode", name, device_index);
  check_rows_aligned(p.q, p.q_s, "decode", "q");
  check_rows_aligned(p.k_cache, core::Strides{p.kc_page, p.kc_row, p.kc_head}, "decode", "k_cache");
  check_rows_aligned(p.v_cache, core::Strides{p.vc_page, p.vc_row, p.vc_head}, "decode", "v_cache");
  if (p.append) {
    check_rows_aligned(p.k_new, p.knew_s, "decode", "k_new");
    check_rows_aligned(p.v_new, p.vnew_s, "decode", "v_new");
  }
  if (reinterpret_cast<uintptr_t>(p.out) % 4 != 0 || p.o_s.batch % 2 || p.o_s.row % 2 || p.o_s.head % 2)
    throw Error(Status::invalid_argument, "decode: argument 'out': the GPU path writes element pairs: data pointer "
                                          "aligned to 4 bytes and even strides needed");
  run_decode_plan(p, plan, workspace, compute_capability(device_index), static_cast<cudaStream_t>(p.stream));
}

DecodeStatus decode_status(const DecodePlan&, const void* workspace, void* stream, int device_index) {
  DeviceGuard guard(device_index);
  check_device_pointer(workspace, "decode_status", "workspace", device_index);
  uint32_t words[2] = {0, 0};
  auto s = static_cast<cudaStream_t>(stream);
  check(cudaMemcpyAsync(words, workspace, sizeof(words), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync(decode status)");
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize(decode status)");
  DecodeStatus st;
  st.faults = words[0];
  st.first_sequence = words[1] == 0 ? -1 : int64_t(~words[1]);
  return st;
}

// decode(args): validated on the host already; a plan for the current lengths and a workspace
// from the stream-ordered allocator, released in stream order (no host synchronization).
void decode(const core::DecodeParams& p, int64_t max_cache_seqlen, int device_index) {
  DecodePlan plan;
  plan.max_cache_seqlen = max_cache_seqlen;
  plan_decode(p, plan, device_index);
  DeviceGuard guard(device_index);
  auto stream = static_cast<cudaStream_t>(p.stream);
  void* ws = nullptr;
  // 256 bytes of slack: the workspace must start 256-byte aligned, as plan users are told.
  check(cudaMallocAsync(&ws, size_t(plan.workspace_bytes) + 256, stream), "cudaMallocAsync(decode workspace)");
  void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws) + 255) / 256 * 256);
  try {
    decode(p, plan, aligned, device_index);
  } catch (...) {
    cudaFreeAsync(ws, stream);
    throw;
  }
  check(cudaFreeAsync(ws, stream), "cudaFreeAsync(decode workspace)");
}

void merge_states(const core::MergeParams& p, int device_index) {
  DeviceGuard guard(device_index);
  const std::pair<const void*, const char*> ptrs[] = {
      {p.o_parts, "o_parts"}, {p.lse_parts, "lse_parts"}, {p.out, "out"}, {p.lse, "lse"}};
  for (auto [ptr, name] : ptrs) check_device_pointer(ptr, "merge_states", name, device_index);
  MergeLaunch m;
  m.parts = p.parts;
  m.outer = p.tokens;
  m.inner = 1;
  m.heads = p.heads;
  m.head_dim = p.head_dim;
  m.in_dtype = p.dtype;
  m.out_dtype = p.dtype;
  m.o_parts = p.o_parts;
  m.op_part = p.op_part;
  m.op_outer = p.op_token;
  m.op_head = p.op_head;
  m.lse_parts = static_cast<const float*>(p.lse_parts);
  m.lp_part = p.lp_part;
  m.lp_outer = p.lp_token;
  m.lp_head = p.lp_head;
  m.out = p.out;
  m.o_outer = p.o_token;
  m.o_head = p.o_head;
  m.lse = static_cast<float*>(p.lse);
  m.l_outer = p.l_token;
  m.l_head = p.l_head;
  launch_merge(m, static_cast<cudaStream_t>(p.stream));
}

}  // namespace flashattn::cuda
