// Host-side helpers shared by the CUDA launchers: error checking that turns CUDA failures into
// flashattn::Error, the device a call runs on, and its attributes.
#pragma once

#include <cuda_runtime.h>

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

}  // namespace flashattn::cuda
