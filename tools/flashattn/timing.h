// Timing and memory measurement for the command.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "flashattn/flashattn.hpp"

namespace fatool {

// Seconds of each of `runs` calls of fn, after `warmup` untimed calls: steady_clock around the call
// on the CPU (the library returns when done), CUDA events around it on the GPU.
std::vector<double> time_runs(flashattn::DeviceType device, int warmup, int runs, const std::function<void()>& fn);

double median(std::vector<double> v);

// Growth of this process's peak resident memory while fn runs (bytes): writing "5" to
// /proc/self/clear_refs resets the high-water mark VmHWM to the current RSS. -1 where the kernel
// does not offer it.
int64_t peak_rss_growth(const std::function<void()>& fn);

// Device memory fn leaves allocated (bytes): the drop in cudaMemGetInfo's free memory across fn.
int64_t gpu_memory_growth(const std::function<void()>& fn);

// Bytes of memory the host can still hand out (MemAvailable).
int64_t host_available_bytes();

}  // namespace fatool
