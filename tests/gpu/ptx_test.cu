// The thread- and warp-level wrappers of src/cuda/ptx/ (all of sm80.cuh, and the sm90.cuh ones a
// plain sm_90 build has: stmatrix, bulk and vector reductions, predicated named barriers, bulk
// turns) against plain CUDA, host products or the fragment layouts they document. Every kernel here
// builds for every target arch; one whose instruction the arch lacks reports that it did nothing
// and its test skips. The sm_90a-only data paths (TMA, mbarrier, wgmma, clusters), which also need
// tensor maps encoded on the host, are in ptx_tma_wgmma_test.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda/ptx/sm80.cuh"
#include "cuda/ptx/sm90.cuh"
#include "ptx_test_util.cuh"

namespace fa_test {
namespace {

namespace ptx = flashattn::cuda::ptx;

// cp.async: valid chunks copy, invalid ones zero-fill and read nothing.
__global__ void cp_async_kernel(const uint4* src, uint4* dst, int n_valid) {
  __shared__ uint4 buf[32];
  buf[threadIdx.x] = make_uint4(7, 7, 7, 7);
  __syncthreads();
  bool valid = int(threadIdx.x) < n_valid;
  ptx::thread_cp_async_16(&buf[threadIdx.x], valid ? src + threadIdx.x : src, valid);
  ptx::thread_cp_async_commit();
  ptx::thread_cp_async_wait<0>();
  __syncthreads();
  dst[threadIdx.x] = buf[threadIdx.x];
}

// ldmatrix (plain and .trans): a 16x16 tile of indices; each lane reports the 8 values it received.
__global__ void ldmatrix_kernel(uint16_t* out, bool trans) {
  __shared__ __align__(16) uint16_t tile[16 * 16];
  for (int i = threadIdx.x; i < 256; i += 32) tile[i] = uint16_t(i);
  __syncwarp();
  int lane = threadIdx.x;
  uint32_t r[4];
  // Matrix j = (row block j & 1, col block j >> 1); lane supplies row (lane & 7) of matrix lane >> 3.
  int mi = lane >> 3, row = 8 * (mi & 1) + (lane & 7), col = 8 * (mi >> 1);
  if (trans)
    ptx::warp_ldmatrix_x4_trans(r, &tile[row * 16 + col]);
  else
    ptx::warp_ldmatrix_x4(r, &tile[row * 16 + col]);
  for (int j = 0; j < 4; ++j) {
    out[lane * 8 + 2 * j] = uint16_t(r[j] & 0xffff);
    out[lane * 8 + 2 * j + 1] = uint16_t(r[j] >> 16);
  }
}

// mma m16n8k16 bf16: A and B given in fragment layout from row-major host matrices.
__global__ void mma_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C) {
  int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  uint32_t a[4];
  for (int r = 0; r < 4; ++r) {
    int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
    a[r] = ptx::thread_pack2<__nv_bfloat16>(__bfloat162float(A[row * 16 + col]), __bfloat162float(A[row * 16 + col + 1]));
  }
  uint32_t b[2];
  for (int r = 0; r < 2; ++r) {
    int k = 2 * t + 8 * r;  // B is K x N row-major
    b[r] = ptx::thread_pack2<__nv_bfloat16>(__bfloat162float(B[k * 8 + g]), __bfloat162float(B[(k + 1) * 8 + g]));
  }
  float c[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  ptx::Mma<__nv_bfloat16>::warp_m16n8k16(c, a, b[0], b[1]);
  for (int i = 0; i < 4; ++i) C[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = c[i];
}

__global__ void special_kernel(const float* x, float* e, float* th, float* qmax, float* qsum) {
  int lane = threadIdx.x;
  e[lane] = ptx::thread_exp2(x[lane]);
  th[lane] = ptx::thread_tanh(x[lane]);
  qmax[lane] = ptx::quad_max(x[lane]);
  qsum[lane] = ptx::quad_sum(x[lane]);
}

// Each lane's four words name their lane and index (4 * lane + k), then the quad transposes them.
__global__ void quad_transpose_kernel(uint32_t* out) {
  const int lane = threadIdx.x;
  uint32_t w[4];
  for (int k = 0; k < 4; ++k) w[k] = uint32_t(4 * lane + k);
  ptx::warp_quad_transpose(w, lane % 4);
  for (int k = 0; k < 4; ++k) out[4 * lane + k] = w[k];
}

// pack2 then unpack2 (bf16 and fp16): each lane packs its pair and reads it back.
__global__ void pack_unpack_kernel(const float* x, float* bf, float* hf) {
  const int lane = threadIdx.x;
  const float lo = x[2 * lane], hi = x[2 * lane + 1];
  const float2 b = ptx::thread_unpack2<__nv_bfloat16>(ptx::thread_pack2<__nv_bfloat16>(lo, hi));
  const float2 h = ptx::thread_unpack2<__half>(ptx::thread_pack2<__half>(lo, hi));
  bf[2 * lane] = b.x;
  bf[2 * lane + 1] = b.y;
  hf[2 * lane] = h.x;
  hf[2 * lane + 1] = h.y;
}

// Reductions: 64 threads add (i, 2i) into one of 4 float pairs each (vector) and 3i into one of 4
// floats after them (scalar); small integers, so the sums are exact in any order.
__global__ void red_add_kernel(float* pairs) {
  const int i = int(threadIdx.x);
  ptx::thread_red_add_f32x2(pairs + 2 * (i % 4), float(i), float(2 * i));
  ptx::thread_red_add_f32(pairs + 8 + i % 4, float(3 * i));
}

// Bulk reduce-add (sm90): each of 4 threads stages a 16-float row in shared memory and adds it to
// global memory with one copy-engine instruction. Elsewhere the kernel reports it did nothing.
__global__ void bulk_reduce_kernel(float* gmem, int* ran) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ __align__(128) float rows[4][16];
  for (int i = 0; i < 16; ++i) rows[threadIdx.x][i] = float(threadIdx.x * 100 + i);
  ptx::thread_fence_proxy_async_smem();
  __syncthreads();
  // Twice: once waiting for the read of shared memory, once for completion.
  ptx::thread_bulk_reduce_add_f32(gmem + threadIdx.x * 16, rows[threadIdx.x], 16 * 4);
  ptx::thread_bulk_commit();
  ptx::thread_bulk_wait_read_all();
  ptx::thread_bulk_reduce_add_f32(gmem + threadIdx.x * 16, rows[threadIdx.x], 16 * 4);
  ptx::thread_bulk_commit();
  ptx::thread_bulk_wait_all();
  if (threadIdx.x == 0) *ran = 1;
#else
  if (threadIdx.x == 0) *ran = 0;
#endif
}

// Vector reductions (sm90): the 64 threads of each of 4 CTAs add (4i, 4i + 1, 4i + 2, 4i + 3) *
// (tid + 1) to float4 i = tid % 8 of one 32-float array, twice; many threads hit each address.
__global__ void red_add_kernel(float* gmem, int* ran) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int i = int(threadIdx.x) % 8;
  const float w = float(threadIdx.x + 1);
  for (int pass = 0; pass < 2; ++pass)
    ptx::thread_red_add_f32x4(gmem + 4 * i, make_float4(4 * i * w, (4 * i + 1) * w, (4 * i + 2) * w, (4 * i + 3) * w));
  if (threadIdx.x == 0 && blockIdx.x == 0) *ran = 1;
#else
  if (threadIdx.x == 0 && blockIdx.x == 0) *ran = 0;
#endif
}

// Turns: 8 single-thread CTAs, all resident at once, take turns in reverse block order; each
// appends its index to a log at the position the turn counter gave it. `bulk`: the Hopper
// variants (sm90), else the plain ones (any arch), the wait started by an early read.
__global__ void turn_kernel(int* turn, int* log, int* ran, bool bulk) {
  const int mine = int(gridDim.x - 1 - blockIdx.x);
  if (!bulk) {
    ptx::thread_wait_turn(turn, mine, ptx::thread_load_turn(turn));
    log[mine] = int(blockIdx.x);
    ptx::thread_pass_turn(turn);
    if (blockIdx.x == 0) *ran = 1;
    return;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  ptx::thread_wait_turn_bulk(turn, mine);
  log[mine] = int(blockIdx.x);
  ptx::thread_pass_turn_bulk(turn);
  if (blockIdx.x == 0) *ran = 1;
#else
  if (blockIdx.x == 0) *ran = 0;
#endif
}

// stmatrix (plain and .trans): lane L holds (row L/4, cols 2(L%4), 2(L%4)+1) of each of four 8x8
// matrices of a 16x16 tile of indices (matrix j = row block j & 1, column block j >> 1), as an mma
// accumulator pair; the stored tile must be the tile itself, or its transpose. Rows are padded to 24
// elements and the two column blocks swapped in odd rows, so neither the row nor the column
// addresses are one stride.
__global__ void stmatrix_kernel(uint16_t* out, int* ran, bool trans) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ __align__(16) uint16_t tile[16 * 24];
  const int lane = int(threadIdx.x), g = lane / 4, t = lane % 4, j = lane >> 3;
  for (int i = lane; i < 16 * 24; i += 32) tile[i] = 0xffff;
  __syncwarp();
  auto at = [](int row, int col) { return row * 24 + (((col >> 3) ^ (row & 1)) << 3) + (col & 7); };
  uint32_t r[4];
  for (int m = 0; m < 4; ++m) {
    const int row = 8 * (m & 1) + g, col = 8 * (m >> 1) + 2 * t;
    r[m] = uint32_t(row * 16 + col) | (uint32_t(row * 16 + col + 1) << 16);
  }
  if (trans)  // stored row (lane & 7) of matrix j is source column 8 (j >> 1) + (lane & 7)
    ptx::warp_stmatrix_x4_trans(r, &tile[at(8 * (j >> 1) + (lane & 7), 8 * (j & 1))]);
  else
    ptx::warp_stmatrix_x4(r, &tile[at(8 * (j & 1) + (lane & 7), 8 * (j >> 1))]);
  __syncwarp();
  for (int i = lane; i < 256; i += 32) out[i] = tile[at(i / 16, i % 16)];
  if (lane == 0) *ran = 1;
#else
  if (threadIdx.x == 0) *ran = 0;
#endif
}

// Named barriers (any arch), two independent pairs of warps: in pair (0, 1), on barrier 1, warp 1
// writes a word and both sync, then warp 0 reads it; in pair (2, 3), on barrier 2, warp 3 writes
// and only arrives, warp 2 syncs and reads. A barrier that let its waiter through early (or a pair
// that waited on the other's) would read 0.
__global__ void named_barrier_pairs_kernel(int* out) {
  __shared__ volatile int words[2];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (threadIdx.x < 2) words[threadIdx.x] = 0;
  __syncthreads();
  if (warp < 2) {
    if (warp == 1 && lane == 0) {
      __nanosleep(20000);  // the waiter reaches the barrier first
      words[0] = 7;
    }
    __syncwarp();  // bar.sync is aligned: whole warps arrive
    ptx::thread_named_sync(1, 64);
    if (warp == 0 && lane == 0) out[0] = words[0];
  } else {
    if (warp == 3) {
      if (lane == 0) {
        __nanosleep(20000);
        words[1] = 9;
      }
      __syncwarp();
      ptx::thread_named_arrive(2, 64);
    } else {
      ptx::thread_named_sync(2, 64);
      if (lane == 0) out[1] = words[1];
    }
  }
}

// Predicated named barriers (sm90): warp 1 writes a word, then arrives where its predicate holds;
// warp 0 waits where its holds and reads the word. Calls with a false predicate do nothing (a
// stray arrive or wait would leave barrier 2 unbalanced or hang).
__global__ void named_barrier_if_kernel(int* out, int* ran) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ volatile int word;
  const int warp = int(threadIdx.x) / 32;
  if (threadIdx.x == 0) word = 0;
  __syncthreads();
  ptx::thread_named_arrive_if(false, 2, 64);
  ptx::thread_named_sync_if(false, 2, 64);
  if (warp == 1 && threadIdx.x == 32) word = 42;
  ptx::thread_named_arrive_if(warp == 1, 1, 64);
  ptx::thread_named_sync_if(warp == 0, 1, 64);
  if (threadIdx.x == 0) {
    *out = word;
    *ran = 1;
  }
#else
  if (threadIdx.x == 0) *ran = 0;
#endif
}

TEST_F(Ptx, CpAsyncCopiesAndZeroFills) {
  std::vector<uint32_t> src(32 * 4);
  for (size_t i = 0; i < src.size(); ++i) src[i] = uint32_t(i * 2654435761u);
  uint4* d_src = reinterpret_cast<uint4*>(to_device(src));
  uint4* d_dst = nullptr;
  FA_CUDA_OK(cudaMalloc(&d_dst, 32 * 16));
  cp_async_kernel<<<1, 32>>>(d_src, d_dst, 19);
  FA_LAUNCH_OK();
  FA_CUDA_OK(cudaDeviceSynchronize());
  auto dst = to_host(reinterpret_cast<uint32_t*>(d_dst), 32 * 4);
  for (int i = 0; i < 32; ++i)
    for (int w = 0; w < 4; ++w) EXPECT_EQ(dst[i * 4 + w], i < 19 ? src[i * 4 + w] : 0u) << "chunk " << i;
  cudaFree(d_src);
  cudaFree(d_dst);
}

TEST_F(Ptx, LdmatrixMatchesDocumentedLayout) {
  uint16_t* d_out = nullptr;
  FA_CUDA_OK(cudaMalloc(&d_out, 32 * 8 * 2));
  for (bool trans : {false, true}) {
    ldmatrix_kernel<<<1, 32>>>(d_out, trans);
    FA_LAUNCH_OK();
    FA_CUDA_OK(cudaDeviceSynchronize());
    auto got = to_host(d_out, 32 * 8);
    for (int lane = 0; lane < 32; ++lane)
      for (int j = 0; j < 4; ++j)
        for (int e = 0; e < 2; ++e) {
          int r0 = 8 * (j & 1), c0 = 8 * (j >> 1);
          // plain: lane holds row lane/4, cols 2(lane%4)+e; trans: column lane/4, rows 2(lane%4)+e.
          int row = trans ? r0 + 2 * (lane % 4) + e : r0 + lane / 4;
          int col = trans ? c0 + lane / 4 : c0 + 2 * (lane % 4) + e;
          EXPECT_EQ(got[lane * 8 + 2 * j + e], row * 16 + col) << "trans " << trans << " lane " << lane << " reg " << j;
        }
  }
  cudaFree(d_out);
}

TEST_F(Ptx, MmaBf16MatchesHostProduct) {
  std::mt19937 rng(5);
  const std::vector<__nv_bfloat16> A = random_bf16(16 * 16, rng), B = random_bf16(16 * 8, rng);
  auto* dA = to_device(A);
  auto* dB = to_device(B);
  float* dC = nullptr;
  FA_CUDA_OK(cudaMalloc(&dC, 16 * 8 * 4));
  mma_kernel<<<1, 32>>>(dA, dB, dC);
  FA_LAUNCH_OK();
  FA_CUDA_OK(cudaDeviceSynchronize());
  auto C = to_host(dC, 16 * 8);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      double ref = 0.5;
      for (int k = 0; k < 16; ++k) ref += double(__bfloat162float(A[i * 16 + k])) * __bfloat162float(B[k * 8 + j]);
      EXPECT_NEAR(C[i * 8 + j], ref, 1e-4) << i << "," << j;
    }
  cudaFree(dA);
  cudaFree(dB);
  cudaFree(dC);
}

TEST_F(Ptx, SpecialFunctionsAndQuadReductions) {
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = -12.f + 0.77f * float(i);
  x[5] = -INFINITY;
  float* dx = to_device(x);
  float* d[4];
  for (auto& p : d) FA_CUDA_OK(cudaMalloc(&p, 32 * 4));
  special_kernel<<<1, 32>>>(dx, d[0], d[1], d[2], d[3]);
  FA_LAUNCH_OK();
  FA_CUDA_OK(cudaDeviceSynchronize());
  auto e = to_host(d[0], 32), th = to_host(d[1], 32), mx = to_host(d[2], 32), sm = to_host(d[3], 32);
  for (int i = 0; i < 32; ++i) {
    EXPECT_NEAR(e[i], std::exp2(double(x[i])), 4e-7 * std::exp2(double(x[i])) + 1e-30) << i;
    if (std::isfinite(x[i])) EXPECT_NEAR(th[i], std::tanh(double(x[i])), 1e-3) << i;
    float qm = -INFINITY, qs = 0.f;
    for (int j = i & ~3; j < (i & ~3) + 4; ++j) {
      qm = std::fmax(qm, x[j]);
      qs += x[j];
    }
    EXPECT_EQ(mx[i], qm) << i;
    EXPECT_FLOAT_EQ(sm[i], qs) << i;
  }
  EXPECT_EQ(e[5], 0.f);  // exp2(-inf) = 0: what masked scores rely on
  cudaFree(dx);
  for (auto p : d) cudaFree(p);
}

// Word k of lane t (t = lane % 4) is word t of the quad's lane k: what lets each lane of an
// accumulator row store one whole 16-byte block (the Hopper forward's O at d = 192, 256).
TEST_F(Ptx, QuadTransposeGivesEachLaneOneColumn) {
  uint32_t* d = nullptr;
  FA_CUDA_OK(cudaMalloc(&d, 128 * 4));
  quad_transpose_kernel<<<1, 32>>>(d);
  FA_LAUNCH_OK();
  FA_CUDA_OK(cudaDeviceSynchronize());
  auto out = to_host(d, 128);
  for (int lane = 0; lane < 32; ++lane)
    for (int k = 0; k < 4; ++k) {
      const int source_lane = (lane & ~3) + k, source_word = lane & 3;
      EXPECT_EQ(out[4 * lane + k], uint32_t(4 * source_lane + source_word)) << "lane " << lane << " word " << k;
    }
  cudaFree(d);
}

// unpack2 inverts pack2: the low half is the first value, and each is the round-to-nearest-even
// 16-bit value of its input, widened exactly (what the Hopper backward's dS = P (dP - D) reads).
TEST_F(Ptx, PackThenUnpackRoundsToNearestEven) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = (i % 2 ? -1.f : 1.f) * std::ldexp(1.f + 0.0123f * float(i), i % 9 - 4);
  x[3] = 0.f;
  x[4] = 1.f + 1.f / 256.f;  // a bf16 tie: rounds to even, 1
  x[5] = -INFINITY;
  float* dx = to_device(x);
  float *dbf, *dhf;
  FA_CUDA_OK(cudaMalloc(&dbf, 64 * 4));
  FA_CUDA_OK(cudaMalloc(&dhf, 64 * 4));
  pack_unpack_kernel<<<1, 32>>>(dx, dbf, dhf);
  FA_LAUNCH_OK();
  FA_CUDA_OK(cudaDeviceSynchronize());
  auto bf = to_host(dbf, 64), hf = to_host(dhf, 64);
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(bf[i], __bfloat162float(__float2bfloat16_rn(x[i]))) << i;
    EXPECT_EQ(hf[i], __half2float(__float2half_rn(x[i]))) << i;
  }
  EXPECT_EQ(bf[4], 1.f);
  EXPECT_EQ(bf[5], -INFINITY);
  cudaFree(dx);
  cudaFree(dbf);
  cudaFree(dhf);
}

TEST_F(Ptx, RedAddF32AndF32x2SumEveryThread) {
  std::vector<float> base = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f, 9.f, 10.f, 11.f, 12.f};
  float* d = to_device(base);
  red_add_kernel<<<1, 64>>>(d);
  FA_LAUNCH_OK();
  FA_CUDA_OK(cudaDeviceSynchronize());
  auto got = to_host(d, 12);
  for (int pair = 0; pair < 4; ++pair) {
    float sum = 0.f;
    for (int i = pair; i < 64; i += 4) sum += float(i);
    EXPECT_EQ(got[2 * pair], base[2 * pair] + sum) << pair;
    EXPECT_EQ(got[2 * pair + 1], base[2 * pair + 1] + 2.f * sum) << pair;
    EXPECT_EQ(got[8 + pair], base[8 + pair] + 3.f * sum) << "scalar " << pair;
  }
  cudaFree(d);
}

// Runs the stmatrix test kernel on one warp; `got` is the 16x16 tile it read back, or empty where
// the device has no stmatrix (before sm90).
void run_stmatrix_kernel(bool trans, std::vector<uint16_t>& got) {
  uint16_t* d_out = nullptr;
  int* ran = nullptr;
  FA_CUDA_OK(cudaMalloc(&d_out, 256 * 2));
  FA_CUDA_OK(cudaMalloc(&ran, 4));
  stmatrix_kernel<<<1, 32>>>(d_out, ran, trans);
  FA_LAUNCH_OK();
  FA_CUDA_OK(cudaDeviceSynchronize());
  got.clear();
  if (to_host(ran, 1)[0]) got = to_host(d_out, 256);
  cudaFree(d_out);
  cudaFree(ran);
}

TEST_F(Ptx, StmatrixStoresAccumulatorPairsAsTheyAreOnHopper) {
  std::vector<uint16_t> got;
  ASSERT_NO_FATAL_FAILURE(run_stmatrix_kernel(false, got));
  if (got.empty()) GTEST_SKIP() << "stmatrix needs sm90";
  for (int i = 0; i < 256; ++i) EXPECT_EQ(got[i], i) << i / 16 << "," << i % 16;
}

TEST_F(Ptx, StmatrixTransStoresTheTransposeOnHopper) {
  std::vector<uint16_t> got;
  ASSERT_NO_FATAL_FAILURE(run_stmatrix_kernel(true, got));
  if (got.empty()) GTEST_SKIP() << "stmatrix needs sm90";
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) EXPECT_EQ(got[r * 16 + c], c * 16 + r) << r << "," << c;
}

TEST_F(Ptx, NamedBarriersSyncPairsOfWarps) {
  int* out = nullptr;
  FA_CUDA_OK(cudaMalloc(&out, 8));
  FA_CUDA_OK(cudaMemset(out, 0, 8));
  named_barrier_pairs_kernel<<<1, 128>>>(out);
  FA_LAUNCH_OK();
  FA_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<int> got = to_host(out, 2);
  EXPECT_EQ(got[0], 7);
  EXPECT_EQ(got[1], 9);
  cudaFree(out);
}

TEST_F(Ptx, PredicatedNamedBarriersOnHopper) {
  int *out = nullptr, *ran = nullptr;
  FA_CUDA_OK(cudaMalloc(&out, 4));
  FA_CUDA_OK(cudaMalloc(&ran, 4));
  FA_CUDA_OK(cudaMemset(out, 0, 4));
  named_barrier_if_kernel<<<1, 64>>>(out, ran);
  FA_LAUNCH_OK();
  FA_CUDA_OK(cudaDeviceSynchronize());
  if (!to_host(ran, 1)[0]) GTEST_SKIP() << "named barrier wrappers need sm90";
  EXPECT_EQ(to_host(out, 1)[0], 42);
  cudaFree(out);
  cudaFree(ran);
}

TEST_F(Ptx, BulkReduceAddsRowsOnHopper) {
  std::vector<float> base(64);
  for (int i = 0; i < 64; ++i) base[i] = 0.25f * float(i);
  float* d = to_device(base);
  int* ran = nullptr;
  FA_CUDA_OK(cudaMalloc(&ran, 4));
  bulk_reduce_kernel<<<1, 4>>>(d, ran);
  FA_LAUNCH_OK();
  FA_CUDA_OK(cudaDeviceSynchronize());
  int did = to_host(ran, 1)[0];
  if (!did) GTEST_SKIP() << "bulk reduce needs sm90";
  auto got = to_host(d, 64);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(got[i], base[i] + 2.f * float((i / 16) * 100 + i % 16)) << i;
  cudaFree(d);
  cudaFree(ran);
}

TEST_F(Ptx, VectorReductionsAddOnHopper) {
  std::vector<float> base(32);
  for (int i = 0; i < 32; ++i) base[i] = 0.5f * float(i) - 3.f;
  float* d = to_device(base);
  int* ran = nullptr;
  FA_CUDA_OK(cudaMalloc(&ran, 4));
  red_add_kernel<<<4, 64>>>(d, ran);
  FA_LAUNCH_OK();
  FA_CUDA_OK(cudaDeviceSynchronize());
  if (!to_host(ran, 1)[0]) GTEST_SKIP() << "vector reductions need sm90";
  auto got = to_host(d, 32);
  // Element 4i + e gets (4i + e) * (sum over threads t with t % 8 == i of t + 1) twice, in every
  // CTA; all values are small integers plus halves, exact in fp32.
  for (int j = 0; j < 32; ++j) {
    const int i = j / 4;
    double weights = 0;
    for (int t = i; t < 64; t += 8) weights += t + 1;
    EXPECT_EQ(got[j], base[j] + 4 * 2 * j * weights) << j;
  }
  cudaFree(d);
  cudaFree(ran);
}

TEST_F(Ptx, TurnsPassInOrder) {
  for (bool bulk : {false, true}) {
    SCOPED_TRACE(bulk ? "bulk (Hopper) turns" : "turns");
    int *turn = nullptr, *log = nullptr, *ran = nullptr;
    FA_CUDA_OK(cudaMalloc(&turn, 4));
    FA_CUDA_OK(cudaMalloc(&log, 8 * 4));
    FA_CUDA_OK(cudaMalloc(&ran, 4));
    FA_CUDA_OK(cudaMemset(turn, 0, 4));
    FA_CUDA_OK(cudaMemset(log, 0xff, 8 * 4));
    turn_kernel<<<8, 1>>>(turn, log, ran, bulk);
    FA_LAUNCH_OK();
    FA_CUDA_OK(cudaDeviceSynchronize());
    if (to_host(ran, 1)[0]) {
      EXPECT_EQ(to_host(turn, 1)[0], 8);
      auto got = to_host(log, 8);
      for (int i = 0; i < 8; ++i) EXPECT_EQ(got[i], 7 - i) << i;
    } else {
      EXPECT_TRUE(bulk) << "the plain turns run on every arch";
    }
    cudaFree(turn);
    cudaFree(log);
    cudaFree(ran);
  }
}

}  // namespace
}  // namespace fa_test
