// Host-side helpers shared by the CUDA launchers: error checking that turns CUDA failures into
// flashattn::Error, the device a call runs on, its attributes, and launches in clusters of two.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "flashattn/flashattn.hpp"

namespace flashattn::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(Status::cuda_error, std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// Launch errors (bad configuration, too much shared memory) surface here, not at the next sync.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

// An attribute of the current device (the one a call's DeviceGuard made current).
inline int current_device_attribute(cudaDeviceAttr attr) {
  int device = 0, value = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&value, attr, device), "cudaDeviceGetAttribute");
  return value;
}

// Makes `device_index` current for the duration of a call and restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device_index) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device_index) check(cudaSetDevice(device_index), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// Launches of `grid` CTAs (even) in thread-block clusters of two, the Hopper kernels' CTA pairs.
struct PairLaunch {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute cluster{};
  PairLaunch(unsigned grid, int threads, int smem_bytes, cudaStream_t stream) {
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 2;
    cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
    config.gridDim = dim3(grid);
    config.blockDim = dim3(unsigned(threads));
    config.dynamicSmemBytes = size_t(smem_bytes);
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
  }
  PairLaunch(const PairLaunch&) = delete;
  PairLaunch& operator=(const PairLaunch&) = delete;
};

// Pairs of CTAs of `kernel` that fit on the current device at once (0: none), cached per device
// (the query is a driver round trip, the answer fixed per kernel and device). The kernel's
// shared-memory attribute must be set first.
template <class Kernel>
int resident_pairs(Kernel kernel, int threads, int smem_bytes) {
  static std::atomic<int> cached[64];  // pairs + 1; 0: not asked yet
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  if (device < 64 && cached[device].load(std::memory_order_relaxed) > 0) return cached[device] - 1;
  const PairLaunch launch(2, threads, smem_bytes, nullptr);
  int pairs = 0;
  if (cudaOccupancyMaxActiveClusters(&pairs, kernel, &launch.config) != cudaSuccess) {
    cudaGetLastError();
    pairs = 0;
  }
  if (device < 64) cached[device].store(pairs + 1, std::memory_order_relaxed);
  return pairs;
}

}  // namespace flashattn::cuda
