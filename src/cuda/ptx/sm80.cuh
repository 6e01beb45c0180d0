// Our typed layer over the sm80 PTX the portable kernels need: cp.async, ldmatrix, mma.sync, fp32
// reductions into global memory, ex2/tanh approximations and 16-bit packing. Every `asm volatile`
// of the portable path lives here (tests/gpu/ptx_test.cu checks each wrapper against plain CUDA).
// Names say who runs them: thread_* is per thread, warp_* must be called by all 32 lanes of a warp
// together.
//
// Fragment layouts (PTX ISA, mma.m16n8k16; lane = 4*g + t):
//   A (16x16, row-major)  reg r = {a[2r], a[2r+1]}: row g + 8*(r & 1), cols 2t + 8*(r >> 1) + {0, 1}
//   B (16x8,  "col")      reg r = {b[2r], b[2r+1]}: rows (k) 2t + 8*r + {0, 1}, col (n) g
//   C (16x8)              c[i]: row g + 8*(i >> 1), col 2t + (i & 1)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashattn::cuda::ptx {

// The 32-bit shared-memory address of a generic pointer into shared memory (what shared-space PTX
// operands take).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The dynamic shared-memory base rounded up to 1024 bytes (where the 128-byte swizzle pattern of
// TMA and wgmma starts), by adding an offset to the shared array itself: a round trip through an
// integer would hide from the compiler that the result points to shared memory, and every access
// through it would become a generic one (LD.E / ST.E with 64-bit addresses instead of LDS / STS).
__device__ __forceinline__ unsigned char* align_shared_1024(unsigned char* base) {
  return base + ((1024u - (smem_addr(base) & 1023u)) & 1023u);
}

// ---- cp.async: global -> shared, 16 bytes, bypassing L1 --------------------------------------

// Copies 16 bytes when `valid`, else writes 16 zero bytes (src-size 0 reads nothing, so `src` may
// point anywhere mapped, e.g. the tensor base).
__device__ __forceinline__ void thread_cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_size));
}

// 4-byte variant (through L1), for per-row scalars such as the backward's lse and D; zero-fills
// when !valid.
__device__ __forceinline__ void thread_cp_async_4(void* smem_dst, const void* gmem_src, bool valid) {
  uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  int src_size = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_size));
}

__device__ __forceinline__ void thread_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most N of this thread's committed groups are still in flight. Other threads'
// copies are visible only after a barrier.
template <int N>
__device__ __forceinline__ void thread_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---- ldmatrix: shared -> registers in mma fragment layout ------------------------------------

// Four 8x8 b16 matrices. Lane L passes the address of row (L & 7) of matrix (L >> 3); register j
// receives matrix j, lane L holding row L/4, elements 2(L%4) and 2(L%4)+1.
__device__ __forceinline__ void warp_ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// The same, each matrix transposed: lane L holds column L/4, rows 2(L%4) and 2(L%4)+1. Used for
// V, stored [key][d], as the B operand of P.V (which needs consecutive keys in a register).
__device__ __forceinline__ void warp_ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// ---- mma.sync m16n8k16, fp32 accumulate ------------------------------------------------------

template <class Element>
struct Mma;

template <>
struct Mma<__nv_bfloat16> {
  __device__ __forceinline__ static void warp_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                       uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Mma<__half> {
  __device__ __forceinline__ static void warp_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                       uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// ---- reductions into global memory ----------------------------------------------------------

// a[0] += x as a relaxed device-scope atomic whose result is not read (a reduction: no reply).
__device__ __forceinline__ void thread_red_add_f32(float* a, float x) {
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(a), "f"(x) : "memory");
}

// a[0] += x and a[1] += y as relaxed device-scope atomics (no order among threads). On sm90+ one
// vector reduction (red.global.add.v2.f32, PTX ISA 8.1), half the L2 operations of two scalar
// ones; elsewhere two atomicAdd. `a` must be 8-byte aligned.
__device__ __forceinline__ void thread_red_add_f32x2(float* a, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(a), "f"(x), "f"(y) : "memory");
#else
  atomicAdd(a, x);
  atomicAdd(a + 1, y);
#endif
}

// gmem[0..3] += v (16-byte aligned, global memory) as relaxed, gpu-scope atomics: one vector
// reduction on sm90+ (red.global.add.v4.f32), four atomicAdd elsewhere. Two reductions of one
// thread to one address apply in program order.
__device__ __forceinline__ void thread_red_add_f32x4(float* gmem, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(gmem), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
#else
  atomicAdd(gmem, v.x);
  atomicAdd(gmem + 1, v.y);
  atomicAdd(gmem + 2, v.z);
  atomicAdd(gmem + 3, v.w);
#endif
}

// ---- turns between CTAs (the deterministic backward's dQ order; decode's published partials) --

// One read of a turn counter, an acquire at gpu scope (issued early, its latency hides under
// other work before thread_wait_turn needs it).
__device__ __forceinline__ int thread_load_turn(const int* turn) {
  int seen;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(turn) : "memory");
  return seen;
}

// Waits until *turn == value, given `seen`, a value read by thread_load_turn: what the previous
// holder wrote before passing the turn is then visible to this thread (and, after a barrier, to
// its warp or CTA).
__device__ __forceinline__ void thread_wait_turn(const int* turn, int value, int seen) {
  while (seen != value) seen = thread_load_turn(turn);
}

// Passes the turn on (*turn += 1): a gpu-scope fence, which through a preceding barrier also covers
// the CTA's reductions, then a relaxed increment (the release pattern; a red.release would fence
// a second time).
__device__ __forceinline__ void thread_pass_turn(int* turn) {
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], 1;\n" ::"l"(turn) : "memory");
}

// ---- special functions -------------------------------------------------------------------------

// 2^x on the special-function unit (ex2.approx: ~2 ulp; exp2(-inf) = 0, which the softmax relies on).
__device__ __forceinline__ float thread_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// tanh on the special-function unit (relative error ~2^-11, below bf16/fp16 resolution).
__device__ __forceinline__ float thread_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- packing -------------------------------------------------------------------------------------

// Two floats as one register of two 16-bit values, `lo` in the low half (the lower column index of
// an mma fragment), round to nearest even.
template <class Element>
__device__ __forceinline__ uint32_t thread_pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t thread_pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <>
__device__ __forceinline__ uint32_t thread_pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The inverse of thread_pack2: the two 16-bit values of `v` as floats (exact), low half in x.
template <class Element>
__device__ __forceinline__ float2 thread_unpack2(uint32_t v);

template <>
__device__ __forceinline__ float2 thread_unpack2<__nv_bfloat16>(uint32_t v) {
  // A bfloat16 is the top half of the float it rounds, so widening is a shift or a mask.
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

template <>
__device__ __forceinline__ float2 thread_unpack2<__half>(uint32_t v) {
  return __half22float2(*reinterpret_cast<const __half2*>(&v));
}

// ---- named barriers (ids 1..15; 0 is __syncthreads): `threads` (a multiple of 32) of the CTA ----

__device__ __forceinline__ void thread_named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void thread_named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- quad reductions and exchanges (the 4 lanes that share a fragment row) -------------------

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// A 4 x 4 transpose of 32-bit words across a quad: afterwards word k of lane t (t = lane % 4) is
// what word t of lane k was. A quad's accumulator row holds 4 bytes of each of four 8-column blocks
// per lane; transposed, each lane holds one whole 16-byte block, one store instead of four. Two
// xor exchanges, each swapping one bit of the word index with the same bit of the lane's. Every
// lane of the warp calls it, passing t = lane % 4.
__device__ __forceinline__ void warp_quad_transpose(uint32_t (&w)[4], int t) {
  const bool t0 = (t & 1) != 0, t1 = (t & 2) != 0;
  const uint32_t x0 = __shfl_xor_sync(0xffffffffu, t0 ? w[0] : w[1], 1);
  const uint32_t x1 = __shfl_xor_sync(0xffffffffu, t0 ? w[2] : w[3], 1);
  const uint32_t d0 = t0 ? x0 : w[0], d1 = t0 ? w[1] : x0, d2 = t0 ? x1 : w[2], d3 = t0 ? w[3] : x1;
  const uint32_t y0 = __shfl_xor_sync(0xffffffffu, t1 ? d0 : d2, 2);
  const uint32_t y1 = __shfl_xor_sync(0xffffffffu, t1 ? d1 : d3, 2);
  w[0] = t1 ? y0 : d0;
  w[1] = t1 ? y1 : d1;
  w[2] = t1 ? d2 : y0;
  w[3] = t1 ? d3 : y1;
}

}  // namespace flashattn::cuda::ptx
