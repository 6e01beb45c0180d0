// The GPU side of a build without CUDA: no devices, and every GPU operation says why it cannot run.
#include <stdexcept>

#include "gpu.h"

namespace fatool::gpu {
namespace {
[[noreturn]] void absent() {
  throw std::runtime_error("this flashattn was built without CUDA (configure with nvcc on PATH or -DFLASHATTN_CUDA=ON)");
}
}  // namespace

bool compiled() { return false; }
int device_count() { return 0; }
void* alloc(size_t) { absent(); }
void release(void*) {}
void upload(void*, const void*, size_t) { absent(); }
void download(void*, const void*, size_t) { absent(); }
void synchronize() {}
size_t free_bytes() { return 0; }
double time_seconds(const std::function<void()>&) { absent(); }
int flash_block_m(int, bool) { absent(); }
void standard_attention(const StandardArgs&) { absent(); }

}  // namespace fatool::gpu
