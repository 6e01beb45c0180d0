// Standard attention on the GPU, the way a framework without FlashAttention runs it: a cuBLAS
// batched GEMM writes S = scale Q K^T to device memory in the input dtype, a softmax kernel reads
// S and writes P, and a second GEMM computes O = P V. GEMMs accumulate in fp32
// (CUBLAS_COMPUTE_32F: tensor cores for f16/bf16, and no TF32 rounding of f32 inputs).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "core/block_range.h"
#include "gpu.h"

namespace fatool::gpu {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
}

__device__ float to_f(float x) { return x; }
__device__ float to_f(__half x) { return __half2float(x); }
__device__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ T from_f(float x);
template <>
__device__ float from_f<float>(float x) { return x; }
template <>
__device__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

constexpr int kThreads = 256;

// Max (is_max) or sum over the block; every thread gets the result.
__device__ float block_reduce(float v, bool is_max, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) v = is_max ? fmaxf(v, scratch[w]) : v + scratch[w];
  __syncthreads();  // scratch is reused by the next reduction
  return v;
}

// One block per row of S (rows of all heads in order): P = softmax over the keys the row sees,
// 0 elsewhere; a row that sees no key is all 0.
template <class T>
__global__ void __launch_bounds__(kThreads) softmax_rows(const T* S, T* P, int64_t s_q, int64_t s_k,
                                                         flashattn::core::MaskSpec mask) {
  __shared__ float scratch[kThreads / 32];
  const int64_t row = blockIdx.x, i = row % s_q;
  const T* s = S + row * s_k;
  T* p = P + row * s_k;
  const int64_t lo = min(mask.lo(i), s_k), hi = max(mask.hi(i), lo);
  float mx = -INFINITY;
  for (int64_t j = lo + threadIdx.x; j < hi; j += kThreads) mx = fmaxf(mx, to_f(s[j]));
  mx = block_reduce(mx, true, scratch);
  float sum = 0.f;
  for (int64_t j = lo + threadIdx.x; j < hi; j += kThreads) sum += expf(to_f(s[j]) - mx);
  sum = block_reduce(sum, false, scratch);
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  for (int64_t j = threadIdx.x; j < s_k; j += kThreads)
    p[j] = from_f<T>(j >= lo && j < hi ? expf(to_f(s[j]) - mx) * inv : 0.f);
}

cublasHandle_t handle() {
  static cublasHandle_t h = [] {
    cublasHandle_t created;
    check(cublasCreate(&created), "cublasCreate");
    return created;
  }();
  return h;
}

template <class T>
void run(const StandardArgs& a, cudaDataType_t type) {
  const int64_t group = a.h / a.h_kv, esize = sizeof(T);
  const auto* q = static_cast<const char*>(a.q);
  const auto* k = static_cast<const char*>(a.k);
  const auto* v = static_cast<const char*>(a.v);
  auto* out = static_cast<char*>(a.out);
  auto* S = static_cast<char*>(a.s);
  auto* P = static_cast<char*>(a.p);
  const float scale = a.scale, one = 1.f, zero = 0.f;
  // Row-major matrices are column-major transposes: S^T (s_k x s_q) = K (as d x s_k)^T * Q^T
  // (d x s_q), then O^T (d x s_q) = V^T (d x s_k) * P^T (s_k x s_q). One call per (batch, KV
  // head) batches its group of query heads, which all read the same K and V (stride 0).
  for (int64_t b = 0; b < a.b; ++b)
    for (int64_t hk = 0; hk < a.h_kv; ++hk) {
      const int64_t h0 = hk * group;
      const char* kp = k + ((b * a.s_k) * a.h_kv + hk) * a.d * esize;
      const char* qp = q + ((b * a.s_q) * a.h + h0) * a.d * esize;
      char* sp = S + (b * a.h + h0) * a.s_q * a.s_k * esize;
      check(cublasGemmStridedBatchedEx(handle(), CUBLAS_OP_T, CUBLAS_OP_N, int(a.s_k), int(a.s_q), int(a.d), &scale, kp,
                                       type, int(a.h_kv * a.d), 0, qp, type, int(a.h * a.d), a.d, &zero, sp, type,
                                       int(a.s_k), a.s_q * a.s_k, int(group), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmStridedBatchedEx (S = Q K^T)");
    }
  const flashattn::core::MaskSpec mask{a.s_q, a.s_k, a.window_left, a.window_right};
  softmax_rows<T><<<unsigned(a.b * a.h * a.s_q), kThreads>>>(static_cast<const T*>(a.s), static_cast<T*>(a.p), a.s_q,
                                                               a.s_k, mask);
  check(cudaGetLastError(), "softmax kernel launch");
  for (int64_t b = 0; b < a.b; ++b)
    for (int64_t hk = 0; hk < a.h_kv; ++hk) {
      const int64_t h0 = hk * group;
      const char* vp = v + ((b * a.s_k) * a.h_kv + hk) * a.d * esize;
      const char* pp = P + (b * a.h + h0) * a.s_q * a.s_k * esize;
      char* op = out + ((b * a.s_q) * a.h + h0) * a.d * esize;
      check(cublasGemmStridedBatchedEx(handle(), CUBLAS_OP_N, CUBLAS_OP_N, int(a.d), int(a.s_q), int(a.s_k), &one, vp,
                                       type, int(a.h_kv * a.d), 0, pp, type, int(a.s_k), a.s_q * a.s_k, &zero, op, type,
                                       int(a.h * a.d), a.d, int(group), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmStridedBatchedEx (O = P V)");
    }
}

}  // namespace

void standard_attention(const StandardArgs& a) {
  switch (a.dtype) {
    case flashattn::DType::f16: return run<__half>(a, CUDA_R_16F);
    case flashattn::DType::bf16: return run<__nv_bfloat16>(a, CUDA_R_16BF);
    case flashattn::DType::f32: return run<float>(a, CUDA_R_32F);
    default: break;
  }
  throw std::runtime_error(std::string("standard attention on the GPU: unsupported dtype ") + flashattn::dtype_name(a.dtype));
}

}  // namespace fatool::gpu
