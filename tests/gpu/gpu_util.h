// GPU test helpers: device copies of host tensors (same strides), poisoning, and the skip rule
// (every GPU test skips with a printed reason where no CUDA device is present).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.h"

namespace fa_test {

#define FA_CUDA_OK(expr)                                                      \
  do {                                                                        \
    cudaError_t e_ = (expr);                                                  \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);    \
  } while (0)

// After a <<<>>> launch: a launch that failed (say, no image of the kernel for this GPU in the
// build) reports only here, and left unread its error would surface at some later, unrelated check.
#define FA_LAUNCH_OK() FA_CUDA_OK(cudaGetLastError())

inline std::string no_gpu_reason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no usable CUDA device (") + cudaGetErrorString(e) + ")";
  if (n == 0) return "no CUDA device present";
  return "";
}

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = no_gpu_reason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

// A device buffer holding a copy of a host tensor's whole storage, so strides carry over.
struct DeviceTensor {
  void* ptr = nullptr;
  size_t bytes = 0;
  TensorView view;

  DeviceTensor() = default;
  explicit DeviceTensor(const HostTensor& h) {
    bytes = h.storage.size();
    view = h.view;
    if (bytes > 0) {
      if (cudaMalloc(&ptr, bytes) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
      cudaMemcpy(ptr, h.storage.data(), bytes, cudaMemcpyHostToDevice);
    }
    view.data = ptr;
    view.device = flashattn::DeviceType::cuda;
    view.device_index = 0;
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() {
    if (ptr) cudaFree(ptr);
  }
  void poison() {
    if (ptr) cudaMemset(ptr, 0xff, bytes);  // all-ones: NaN in every float format
  }
  void copy_to(HostTensor& h) const {
    if (bytes) cudaMemcpy(h.storage.data(), ptr, bytes, cudaMemcpyDeviceToHost);
  }
};

// Sets (or, with nullptr, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value != nullptr)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

// Does this build have a `kind` ("fwd", "bwd" or "decode") kernel of dtype t for head dim d, that
// is, one whose head dim is at least d (the dispatchers round a head dim up to the smallest compiled
// one)? A subset build (FLASHATTN_HDIMS, FLASHATTN_DTYPES) leaves some out; the test matrices skip
// those cases, saying so, rather than fail on kernels that were never built. A full build has them
// all, so nothing is skipped there.
inline bool have_kernel(const char* kind, int64_t d, flashattn::DType t) {
  // Entries read "<kind> [path] hdim<N> <dtype> sm<arch>", comma-separated.
  std::istringstream list(flashattn::build_info().cuda_kernels);
  std::string entry;
  while (std::getline(list, entry, ',')) {
    std::istringstream in(entry);
    const std::vector<std::string> w{std::istream_iterator<std::string>(in), std::istream_iterator<std::string>()};
    if (w.empty() || w[0] != kind) continue;
    for (size_t i = 1; i + 1 < w.size(); ++i)
      if (w[i].rfind("hdim", 0) == 0 && std::stoll(w[i].substr(4)) >= d && w[i + 1] == flashattn::dtype_name(t))
        return true;
  }
  return false;
}

// Prints why a case is skipped when have_kernel says the build lacks its kernel; true then.
inline bool skip_unbuilt(const char* kind, int64_t d, flashattn::DType t) {
  if (have_kernel(kind, d, t)) return false;
  std::printf("  (no %s kernel for head_dim %lld %s in this build: case skipped)\n", kind, (long long)d,
              flashattn::dtype_name(t));
  return true;
}

// Broadcast views, as torch's expand gives (stride 0: every index reads the first one's values).
// The tensors' values were filled before, so the broadcast copy is what the reference sees too.
// broadcast_batch: one [seqlen, heads, d] for the whole batch of a [batch, seqlen, heads, d]
// tensor. broadcast_rows: every token row the same, the rows axis of [batch, seqlen, heads, d] or
// of varlen's [total, heads, d].
inline void broadcast_batch(HostTensor& t) {
  if (t.view.rank != 4) throw std::runtime_error("broadcast_batch: a [batch, seqlen, heads, d] tensor expected");
  t.view.stride[0] = 0;
}
inline void broadcast_rows(HostTensor& t) { t.view.stride[t.view.rank - 3] = 0; }

// Whether the current device has compute capability 9.0, where dispatch considers the Hopper paths.
inline bool hopper_device() {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major == 9 && minor == 0;
}

// Runs fn(portable) twice: on the path dispatch picks (portable = false), then with the portable
// path forced through the environment variable `var` (FLASHATTN_GPU_FORWARD / _BACKWARD).
template <class F>
void on_both_paths(const char* var, F&& fn) {
  for (bool portable : {false, true}) {
    SCOPED_TRACE(portable ? "portable path forced" : "default path");
    ScopedEnv force(var, portable ? "portable" : nullptr);
    fn(portable);
  }
}

// A problem's shape as the shape-sweeping tests list them (head dim, batch, query and KV heads,
// seqlen_q and seqlen_k, softcap), put into a test file's own Case (forward or backward).
struct GqaShape {
  int64_t d, batch, hq, hkv, sq, sk;
  float softcap;
};

template <class Case>
Case shaped_case(const GqaShape& sh) {
  Case c;
  c.batch = sh.batch;
  c.heads_q = sh.hq;
  c.heads_kv = sh.hkv;
  c.seqlen_q = sh.sq;
  c.seqlen_k = sh.sk;
  c.head_dim = sh.d;
  c.softcap = sh.softcap;
  return c;
}

// Whether dispatch must pick the Hopper path of `kind` ("fwd" or "bwd") for this head dim and
// dtype: on a compute capability 9.0 device, when this build compiled that variant (the test
// layouts keep the outputs' rows 16-byte aligned).
inline bool expect_hopper(const char* kind, int64_t head_dim, flashattn::DType dtype) {
  const std::string want = std::string(kind) + " hopper hdim" + std::to_string(head_dim) + " " +
                           flashattn::dtype_name(dtype) + " sm90a";
  const std::string kernels = flashattn::build_info().cuda_kernels;
  return hopper_device() && (kernels + ",").find(want + ",") != std::string::npos;
}

}  // namespace fa_test
