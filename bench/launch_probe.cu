// What the decode step's fixed costs are made of on this GPU, measured without the library:
//   * graph replays (CUDA events, median of 200 after warm-up) of a one-CTA kernel alone, after an
//     8-byte memset node, after a second kernel, and after a kernel with programmatic dependent
//     launch (PDL) so the second kernel may start before the first ends;
//   * how many thread-block clusters of 1..16 CTAs can be resident at once for a kernel of 128
//     threads and a given dynamic shared memory (cudaOccupancyMaxActiveClusters), and on how many
//     SMs a grid of 8 such clusters lands (%smid of every CTA).
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/launch_probe.cu -o launch_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <vector>

#define CK(x)                                                                     \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

__global__ void tiny(int* x) {
  if (threadIdx.x == 0) atomicAdd(x, 1);
}

__global__ void tiny_pdl_primary(int* x) {
  asm volatile("griddepcontrol.launch_dependents;");
  if (threadIdx.x == 0) atomicAdd(x, 1);
}

__global__ void tiny_pdl_secondary(int* x) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x == 0) atomicAdd(x, 1);
}

__global__ void where(int* smid) {
  extern __shared__ int pad[];
  if (threadIdx.x == 0) {
    int s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    smid[blockIdx.x] = s;
    pad[0] = s;
  }
}

template <class F>
float graph_us(cudaStream_t st, F&& body) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  body();
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < 230; ++i) {
    CK(cudaEventRecord(a, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(b, st));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 30) t.push_back(ms * 1e3f);
  }
  std::sort(t.begin(), t.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return t[t.size() / 2];
}

int main() {
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int* x;
  CK(cudaMalloc(&x, 1024));
  std::printf("graph replay, median us: tiny %.2f\n", graph_us(st, [&] { tiny<<<1, 32, 0, st>>>(x); }));
  std::printf("  memset + tiny %.2f\n", graph_us(st, [&] {
                CK(cudaMemsetAsync(x + 8, 0, 8, st));
                tiny<<<1, 32, 0, st>>>(x);
              }));
  std::printf("  tiny + tiny %.2f\n", graph_us(st, [&] {
                tiny<<<1, 32, 0, st>>>(x + 8);
                tiny<<<1, 32, 0, st>>>(x);
              }));
  std::printf("  tiny + tiny (PDL) %.2f\n", graph_us(st, [&] {
                tiny_pdl_primary<<<1, 32, 0, st>>>(x + 8);
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = 1;
                cfg.blockDim = 32;
                cfg.stream = st;
                cudaLaunchAttribute at[1];
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.attrs = at;
                cfg.numAttrs = 1;
                CK(cudaLaunchKernelEx(&cfg, tiny_pdl_secondary, x));
              }));

  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaFuncSetAttribute(where, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  int* smid;
  CK(cudaMalloc(&smid, 4096 * 4));
  // 112 KB: the sm90 decode kernel's budget (two CTAs per SM); 116 KB: one per SM.
  for (int smem_kb : {112, 116}) {
    CK(cudaFuncSetAttribute(where, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_kb * 1024));
    std::printf("smem %d KB, %d SMs: max active clusters of c CTAs (SMs used by 8 clusters)\n", smem_kb, sms);
    for (int c = 1; c <= 16; ++c) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = 8 * c;
      cfg.blockDim = 128;
      cfg.dynamicSmemBytes = size_t(smem_kb) * 1024;
      cfg.stream = st;
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeClusterDimension;
      at[0].val.clusterDim.x = c;
      at[0].val.clusterDim.y = 1;
      at[0].val.clusterDim.z = 1;
      cfg.attrs = at;
      cfg.numAttrs = 1;
      int n = -1;
      cudaError_t e = cudaOccupancyMaxActiveClusters(&n, where, &cfg);
      CK(cudaMemset(smid, 0xff, 4096 * 4));
      CK(cudaLaunchKernelEx(&cfg, where, smid));
      CK(cudaStreamSynchronize(st));
      std::vector<int> h(8 * c);
      CK(cudaMemcpy(h.data(), smid, h.size() * 4, cudaMemcpyDeviceToHost));
      std::set<int> u(h.begin(), h.end());
      std::printf("  c%d: %d%s (%zu CTAs on %zu SMs)\n", c, n, e == cudaSuccess ? "" : cudaGetErrorString(e), h.size(),
                  u.size());
    }
  }
  CK(cudaFree(smid));
  CK(cudaFree(x));
  CK(cudaStreamDestroy(st));
  return 0;
}
