// Device copies of a fuzz case's buffers, so that the same cases run on a GPU (tests/gpu/
// fuzz_test.cpp). Compiled against the CUDA runtime in builds with CUDA (FLASHATTN_FUZZ_CUDA);
// elsewhere gpu_present() is false and the rest is never called.
#pragma once

#include <cstddef>

namespace fa_fuzz {

bool gpu_present();
// Exactly `bytes` of device memory (compute-sanitizer memcheck then reports any access past a
// tensor's span); nullptr for 0 bytes.
void* gpu_alloc(size_t bytes);
void gpu_upload(void* dst, const void* src, size_t bytes);
// Waits for the device first, so that it reports the call's kernels' errors.
void gpu_download(void* dst, const void* src, size_t bytes);
// Waits for the device too: the memory may still be in use by the call.
void gpu_free(void* p);

}  // namespace fa_fuzz
