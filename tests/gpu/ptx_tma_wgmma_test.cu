// The Hopper data paths of src/cuda/ptx/ (sm90.cuh, wgmma.cuh) as the kernels use them, on one
// warpgroup or a cluster pair: TMA loads and multicast completing on mbarriers, wgmma with operands
// in shared memory or registers, a bulk copy, mbarrier arrivals across the pair. Apart from the
// thread- and warp-level wrappers (ptx_test.cu) because all of this needs an sm_90a build and
// device: the kernels are stubs under any other target, and the tests skip on any other device.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/ptx/sm90.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/swizzle.cuh"
#include "cuda/sm90/tma.h"
#include "ptx_test_util.cuh"

namespace fa_test {
namespace {

namespace ptx = flashattn::cuda::ptx;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Thread 0 initializes the mbarrier the block's loads complete on (one arrival: the thread that
// issues them); the whole block waits for it.
__device__ void block_init_load_barrier(uint64_t* full) {
  if (threadIdx.x == 0) {
    ptx::thread_mbarrier_init(full, 1);
    ptx::thread_fence_mbarrier_init();
  }
  __syncthreads();
}

// Writes a warpgroup's m64nN accumulators (ptx/wgmma.cuh layout) to a row-major [64][N] matrix.
template <int N>
__device__ void warpgroup_store_accumulators(float* dst, const float (&acc)[N / 2]) {
  const int tid = int(threadIdx.x) % 128, w = tid / 32, g = (tid % 32) / 4, t = tid % 4;
  for (int i = 0; i < N / 2; ++i) dst[(16 * w + g + 8 * ((i >> 1) & 1)) * N + 8 * (i >> 2) + 2 * t + (i & 1)] = acc[i];
}
#endif

// The Hopper forward's data path on one warpgroup: TMA loads (128-byte swizzle, two column blocks
// of a 128-wide row; 4-D and 5-D maps) completing on an mbarrier; S = Q K^T with both operands
// K-major in shared memory (wgmma ss, N = 64); P = bf16(S / 8) re-packed from the accumulator as
// register A fragments; O = P V with V MN-major (wgmma rs, N = 128 spanning both column blocks
// through the descriptor's leading offset). Q, K, V: [64][128]; S: [64][64]; O: [64][128]. The
// last wait is ptx::warpgroup_wait_after: slot_out[w] gets half of S[16 w][0], warp w's lane 0's
// first score.
struct TmaMaps {
  CUtensorMap q, k, v;
};
__global__ void __launch_bounds__(128) wgmma_kernel(const __grid_constant__ TmaMaps maps, float* S, float* O, float* slot_out,
                                                    int* ran) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) unsigned char tiles[3][64 * 128 * 2];
  __shared__ __align__(8) uint64_t full;
  const int tid = threadIdx.x, w = tid / 32;
  block_init_load_barrier(&full);
  if (w == 0 && ptx::warp_elect_one()) {
    ptx::thread_mbarrier_arrive_expect_tx(&full, 3 * 64 * 128 * 2);
    // Q by one 4-D box per column block; K and V by one 5-D box each (maps with the column blocks
    // as a dimension, as decode's), V with an L2 policy (decode's evict_first boxes): S and O check
    // the bytes each delivered.
    for (int c = 0; c < 2; ++c) ptx::thread_tma_load_4d(tiles[0] + c * 64 * 128, &maps.q, &full, 64 * c, 0, 0, 0);
    ptx::thread_tma_load_5d(tiles[1], &maps.k, &full, 0, 0, 0, 0, 0);
    ptx::thread_tma_load_5d_hint(tiles[2], &maps.v, &full, 0, 0, 0, 0, 0, ptx::thread_l2_policy_evict_first());
  }
  ptx::thread_mbarrier_wait(&full, 0);
  float s[32];
  ptx::warpgroup_fence();
  for (int ks = 0; ks < 8; ++ks) {
    const int cb = ks / 4, kk = ks % 4;
    uint64_t da = ptx::make_smem_desc_sw128(tiles[0] + cb * 64 * 128 + kk * 32, 16, 1024);
    uint64_t db = ptx::make_smem_desc_sw128(tiles[1] + cb * 64 * 128 + kk * 32, 16, 1024);
    ptx::Wgmma<__nv_bfloat16, 64>::ss<0>(s, da, db, ks > 0);
  }
  ptx::warpgroup_commit();
  ptx::warpgroup_wait<0>();
  ptx::thread_pin(s);
  uint32_t pf[16];
  warpgroup_store_accumulators<64>(S, s);
  for (int j = 0; j < 16; ++j) pf[j] = ptx::thread_pack2<__nv_bfloat16>(s[2 * j] * 0.125f, s[2 * j + 1] * 0.125f);
  float o[64];
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  ptx::warpgroup_fence();
  for (int kt = 0; kt < 4; ++kt) {
    uint64_t db = ptx::make_smem_desc_sw128(tiles[2] + kt * 2048, 64 * 128, 1024);
    ptx::Wgmma<__nv_bfloat16, 128>::rs<1>(o, *reinterpret_cast<const uint32_t(*)[4]>(&pf[4 * kt]), db, 1);
  }
  ptx::warpgroup_commit();
  // The wait for P V after a value each warp computed meanwhile (its lane 0 stores it).
  __shared__ float slots[4];
  ptx::warpgroup_wait_after<0>(s[0] * 0.5f, &slots[w]);
  ptx::thread_pin(o);
  ptx::thread_pin(pf);
  warpgroup_store_accumulators<128>(O, o);
  __syncthreads();
  if (tid < 4) slot_out[tid] = slots[tid];
  if (tid == 0) *ran = 1;
#else
  if (threadIdx.x == 0) *ran = 0;
#endif
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Waits on an mbarrier phase for at most ~50 ms (a wrong CTA mask or arrival target would
// otherwise hang the test); false on timeout.
__device__ bool thread_bounded_wait(uint64_t* bar, uint32_t parity) {
  const long long start = clock64();
  uint32_t done = 0;
  while (!done && clock64() - start < 100000000ll)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(ptx::smem_addr(bar)), "r"(parity)
        : "memory");
  return done != 0;
}
#endif

// The forward's K/V sharing in a cluster of two CTAs: each loads its 32-row half of a 64 x 128 tile
// into both CTAs by TMA multicast (sm90::thread_tma_load_tile_pair; `half` maps boxes of 32 rows),
// and each CTA's copy must equal, byte for byte, a plain TMA load of the whole tile (`whole`).
// Then arrivals across the pair: rank 1 arrives twice on rank 0's barrier (count 2) and rank 0
// once on rank 1's (count 1), so a remote arrival that landed locally leaves rank 0 waiting.
// out: per rank, the pair-loaded tile then the plain one; ok: per rank, every wait completed.
__global__ void __launch_bounds__(128) cluster_pair_kernel(const __grid_constant__ TmaMaps maps, uint4* out, int* ok) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kBytes = 64 * 128 * 2;
  __shared__ __align__(1024) unsigned char tiles[2][kBytes];
  __shared__ __align__(8) uint64_t bars[3];  // pair-loaded full, plain full, arrivals
  const uint32_t rank = ptx::thread_cluster_rank();
  if (threadIdx.x == 0) {
    ptx::thread_mbarrier_init(&bars[0], 1);
    ptx::thread_mbarrier_init(&bars[1], 1);
    ptx::thread_mbarrier_init(&bars[2], rank == 0 ? 2 : 1);
    ptx::thread_fence_mbarrier_init();
  }
  ptx::thread_cluster_sync();
  if (threadIdx.x == 0) {
    ptx::thread_mbarrier_arrive_expect_tx(&bars[0], kBytes);
    flashattn::cuda::sm90::thread_tma_load_tile_pair<64, 2>(tiles[0], &maps.k, &bars[0], 0, 0, 0, int(rank));
    ptx::thread_mbarrier_arrive_expect_tx(&bars[1], kBytes);
    flashattn::cuda::sm90::thread_tma_load_tile<64, 2>(tiles[1], &maps.q, &bars[1], 0, 0, 0);
    for (uint32_t i = 0; i < (rank == 1 ? 2u : 1u); ++i) ptx::thread_mbarrier_arrive_cluster(&bars[2], rank ^ 1u);
  }
  bool waited = true;
  for (int b = 0; b < 3; ++b) waited = thread_bounded_wait(&bars[b], 0) && waited;
  for (int i = threadIdx.x; i < 2 * kBytes / 16; i += blockDim.x)
    out[rank * (2 * kBytes / 16) + i] = reinterpret_cast<const uint4*>(tiles)[i];
  if (!waited) ok[rank] = 0;
  // Neither CTA exits while the other may still write into its shared memory.
  ptx::thread_cluster_sync();
  if (threadIdx.x == 0 && waited) ok[rank] = 1;
#else
  if (threadIdx.x == 0) ok[blockIdx.x] = -1;
#endif
}

// The Hopper backward's dQ product: C = X^T Y with X [64 K][64 M] and Y [64 K][128 N] both
// MN-major in shared memory (wgmma ss with A and B transposed, N = 128 spanning Y's two column
// blocks), plus a plain bulk copy (64 floats) completing on the same mbarrier as the TMA loads.
__global__ void __launch_bounds__(128) wgmma_trans_a_kernel(const __grid_constant__ TmaMaps maps, const float* vec,
                                                            float* C, float* vec_out, int* ran) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) unsigned char x[64 * 64 * 2];
  __shared__ __align__(1024) unsigned char y[64 * 128 * 2];
  __shared__ __align__(16) float v[64];
  __shared__ __align__(8) uint64_t full;
  const int tid = threadIdx.x, w = tid / 32;
  block_init_load_barrier(&full);
  if (w == 0 && ptx::warp_elect_one()) {
    ptx::thread_mbarrier_arrive_expect_tx(&full, (64 * 64 + 64 * 128) * 2 + 64 * 4);
    ptx::thread_tma_load_4d(x, &maps.q, &full, 0, 0, 0, 0);
    for (int c = 0; c < 2; ++c) ptx::thread_tma_load_4d(y + c * 64 * 128, &maps.k, &full, 64 * c, 0, 0, 0);
    ptx::thread_bulk_load(v, vec, 64 * 4, &full);
  }
  ptx::thread_mbarrier_wait(&full, 0);
  float c[64];
  ptx::warpgroup_fence();
  for (int kt = 0; kt < 4; ++kt) {
    uint64_t da = ptx::make_smem_desc_sw128(x + kt * 2048, 64 * 128, 1024);
    uint64_t db = ptx::make_smem_desc_sw128(y + kt * 2048, 64 * 128, 1024);
    ptx::Wgmma<__nv_bfloat16, 128>::ss<1, 1>(c, da, db, kt > 0);
  }
  ptx::warpgroup_commit();
  ptx::warpgroup_wait<0>();
  ptx::thread_pin(c);
  warpgroup_store_accumulators<128>(C, c);
  if (tid < 64) vec_out[tid] = v[tid];
  if (tid == 0) *ran = 1;
#else
  if (threadIdx.x == 0) *ran = 0;
#endif
}

// A 64-row, row-major bf16 matrix of `cols` columns as a TMA map (boxes of box_rows rows, 128-byte
// swizzle); blocks: the 5-D map whose box takes every 64-column block at once.
bool encode_matrix(CUtensorMap* map, const __nv_bfloat16* base, int cols, int box_rows = 64, bool blocks = false) {
  flashattn::cuda::sm90::TmaTensor t;
  t.base = base;
  t.head_dim = cols;
  t.rows = 64;
  t.heads = 1;
  t.batch = 1;
  t.row_stride = cols;
  return blocks ? flashattn::cuda::sm90::encode_tma_sw128_blocks(map, t, box_rows)
                : flashattn::cuda::sm90::encode_tma_sw128(map, t, box_rows);
}

bool sm90_family() {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major == 9;
}

TEST_F(Ptx, TmaAndWgmmaComputeAttentionProductsOnHopper) {
  if (!sm90_family()) GTEST_SKIP() << "TMA + wgmma need an sm_90a device";
  std::mt19937 rng(11);
  std::vector<__nv_bfloat16> h[3];
  __nv_bfloat16* d[3];
  TmaMaps maps;
  CUtensorMap* m[3] = {&maps.q, &maps.k, &maps.v};
  for (int i = 0; i < 3; ++i) {
    h[i] = random_bf16(64 * 128, rng);
    d[i] = to_device(h[i]);
    ASSERT_TRUE(encode_matrix(m[i], d[i], 128, 64, i > 0));
  }
  float *dS = nullptr, *dO = nullptr, *dSlots = nullptr;
  int* ran = nullptr;
  FA_CUDA_OK(cudaMalloc(&dS, 64 * 64 * 4));
  FA_CUDA_OK(cudaMalloc(&dO, 64 * 128 * 4));
  FA_CUDA_OK(cudaMalloc(&dSlots, 4 * 4));
  FA_CUDA_OK(cudaMalloc(&ran, 4));
  FA_CUDA_OK(cudaMemset(ran, 0, 4));
  FA_CUDA_OK(cudaMemset(dSlots, 0xff, 4 * 4));  // NaN
  wgmma_kernel<<<1, 128>>>(maps, dS, dO, dSlots, ran);
  FA_LAUNCH_OK();
  FA_CUDA_OK(cudaDeviceSynchronize());
  if (!to_host(ran, 1)[0]) GTEST_SKIP() << "this build has no sm_90a code";
  auto S = to_host(dS, 64 * 64), O = to_host(dO, 64 * 128), slots = to_host(dSlots, 4);
  for (int w = 0; w < 4; ++w) EXPECT_EQ(slots[w], S[16 * w * 64] * 0.5f) << "warp " << w << "'s slot";
  auto at = [&](int i, int r, int c) { return double(__bfloat162float(h[i][r * 128 + c])); };
  std::vector<double> P(64 * 64);
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 64; ++c) {
      double ref = 0;
      for (int k = 0; k < 128; ++k) ref += at(0, r, k) * at(1, c, k);
      ASSERT_NEAR(S[r * 64 + c], ref, 1e-3 * (1 + std::fabs(ref))) << "S " << r << "," << c;
      P[r * 64 + c] = __bfloat162float(__float2bfloat16(S[r * 64 + c] * 0.125f));
    }
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 128; ++c) {
      double ref = 0;
      for (int k = 0; k < 64; ++k) ref += P[r * 64 + k] * at(2, k, c);
      ASSERT_NEAR(O[r * 128 + c], ref, 1e-3 * (1 + std::fabs(ref))) << "O " << r << "," << c;
    }
  for (auto p : d) cudaFree(p);
  cudaFree(dS);
  cudaFree(dO);
  cudaFree(dSlots);
  cudaFree(ran);
}

TEST_F(Ptx, WgmmaTransposedAAndBulkLoadOnHopper) {
  if (!sm90_family()) GTEST_SKIP() << "TMA + wgmma need an sm_90a device";
  std::mt19937 rng(12);
  const std::vector<__nv_bfloat16> hx = random_bf16(64 * 64, rng), hy = random_bf16(64 * 128, rng);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> hv(64);
  for (auto& e : hv) e = n(rng);
  __nv_bfloat16 *dx = to_device(hx), *dy = to_device(hy);
  float* dv = to_device(hv);
  TmaMaps maps;
  ASSERT_TRUE(encode_matrix(&maps.q, dx, 64));
  ASSERT_TRUE(encode_matrix(&maps.k, dy, 128));
  float *dc = nullptr, *dvo = nullptr;
  int* ran = nullptr;
  FA_CUDA_OK(cudaMalloc(&dc, 64 * 128 * 4));
  FA_CUDA_OK(cudaMalloc(&dvo, 64 * 4));
  FA_CUDA_OK(cudaMalloc(&ran, 4));
  FA_CUDA_OK(cudaMemset(ran, 0, 4));
  wgmma_trans_a_kernel<<<1, 128>>>(maps, dv, dc, dvo, ran);
  FA_LAUNCH_OK();
  FA_CUDA_OK(cudaDeviceSynchronize());
  if (!to_host(ran, 1)[0]) GTEST_SKIP() << "this build has no sm_90a code";
  auto C = to_host(dc, 64 * 128);
  EXPECT_EQ(to_host(dvo, 64), hv);
  for (int m = 0; m < 64; ++m)
    for (int c = 0; c < 128; ++c) {
      double ref = 0;
      for (int k = 0; k < 64; ++k)
        ref += double(__bfloat162float(hx[k * 64 + m])) * double(__bfloat162float(hy[k * 128 + c]));
      ASSERT_NEAR(C[m * 128 + c], ref, 1e-3 * (1 + std::fabs(ref))) << "C " << m << "," << c;
    }
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(dv);
  cudaFree(dc);
  cudaFree(dvo);
  cudaFree(ran);
}

TEST_F(Ptx, ClusterPairSharesTilesAndBarriersOnHopper) {
  if (!sm90_family()) GTEST_SKIP() << "clusters with TMA multicast need an sm_90a device";
  std::mt19937 rng(13);
  const std::vector<__nv_bfloat16> h = random_bf16(64 * 128, rng);
  __nv_bfloat16* d = to_device(h);
  TmaMaps maps;
  ASSERT_TRUE(encode_matrix(&maps.q, d, 128));
  ASSERT_TRUE(encode_matrix(&maps.k, d, 128, 32));
  constexpr int kVecs = 64 * 128 * 2 / 16;
  uint4* out = nullptr;
  int* ok = nullptr;
  FA_CUDA_OK(cudaMalloc(&out, 2 * 2 * kVecs * sizeof(uint4)));
  FA_CUDA_OK(cudaMemset(out, 0xff, 2 * 2 * kVecs * sizeof(uint4)));
  FA_CUDA_OK(cudaMalloc(&ok, 2 * sizeof(int)));
  FA_CUDA_OK(cudaMemset(ok, 0, 2 * sizeof(int)));
  const flashattn::cuda::PairLaunch launch(2, 128, 0, nullptr);
  FA_CUDA_OK(cudaLaunchKernelEx(&launch.config, cluster_pair_kernel, maps, out, ok));
  FA_CUDA_OK(cudaDeviceSynchronize());
  const auto flags = to_host(ok, 2);
  if (flags[0] == -1) GTEST_SKIP() << "this build has no sm_90a code";
  EXPECT_EQ(flags[0], 1) << "rank 0: a wait timed out";
  EXPECT_EQ(flags[1], 1) << "rank 1: a wait timed out";
  const auto got = to_host(reinterpret_cast<const uint32_t*>(out), 2 * 2 * kVecs * 4);
  for (int rank = 0; rank < 2; ++rank)
    for (int i = 0; i < kVecs * 4; ++i)
      ASSERT_EQ(got[(2 * rank) * kVecs * 4 + i], got[(2 * rank + 1) * kVecs * 4 + i])
          << "rank " << rank << " word " << i;
  // The plain load is the reference: make sure it holds the data (the swizzle permutes 16-byte
  // chunks within rows of 128 bytes, so the multiset of words per row is the matrix's).
  std::vector<uint32_t> plain(got.begin() + kVecs * 4, got.begin() + 2 * kVecs * 4);
  std::vector<uint32_t> want(64 * 128 / 2);
  std::memcpy(want.data(), h.data(), want.size() * 4);
  std::sort(plain.begin(), plain.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(plain, want);
  cudaFree(d);
  cudaFree(out);
  cudaFree(ok);
}

}  // namespace
}  // namespace fa_test
