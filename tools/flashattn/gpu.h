// What the command needs from a GPU: memory, copies, event timing, and standard attention with
// cuBLAS. Implemented by gpu_cuda.cpp (+ standard_attention.cu) when CUDA is compiled in, and by
// gpu_none.cpp otherwise (every call but compiled() and device_count() then throws).
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "standard_attention.h"

namespace fatool::gpu {

bool compiled();
int device_count();  // 0 when not compiled or no GPU is present

void* alloc(size_t bytes);
void release(void* p);
void upload(void* dst, const void* src, size_t bytes);
void download(void* dst, const void* src, size_t bytes);
void synchronize();
size_t free_bytes();  // free device memory (cudaMemGetInfo)

// Seconds fn takes on the GPU, measured with CUDA events around it on the default stream.
double time_seconds(const std::function<void()>& fn);

// Query rows per tile of the portable forward kernel the library uses for this head dim (and
// mask) on device 0 (src/cuda/tile_size.h), for the traffic model.
int flash_block_m(int head_dim, bool causal);

// Standard attention on device tensors: S = scale Q K^T with cuBLAS (S in the input dtype),
// masked softmax into P (same dtype), O = P V with cuBLAS. f16, bf16 and f32.
void standard_attention(const StandardArgs& a);

}  // namespace fatool::gpu
