#include "timing.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>

#include "gpu.h"

namespace fatool {
namespace {

// A "Key:   123 kB" line of a /proc file, in bytes; -1 when absent.
int64_t proc_kb_field(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  return -1;
}

}  // namespace

std::vector<double> time_runs(flashattn::DeviceType device, int warmup, int runs, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  if (device == flashattn::DeviceType::cuda) gpu::synchronize();
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    if (device == flashattn::DeviceType::cuda) {
      t.push_back(gpu::time_seconds(fn));
    } else {
      auto start = std::chrono::steady_clock::now();
      fn();
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  return t;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int64_t peak_rss_growth(const std::function<void()>& fn) {
  bool reset = false;
  {
    std::ofstream clear("/proc/self/clear_refs");
    reset = static_cast<bool>(clear << "5" << std::flush);
  }
  const int64_t base = proc_kb_field("/proc/self/status", "VmRSS");
  fn();
  const int64_t peak = proc_kb_field("/proc/self/status", "VmHWM");
  if (!reset || base < 0 || peak < 0) return -1;
  return std::max<int64_t>(0, peak - base);
}

int64_t gpu_memory_growth(const std::function<void()>& fn) {
  gpu::synchronize();
  const int64_t before = int64_t(gpu::free_bytes());
  fn();
  gpu::synchronize();
  return std::max<int64_t>(0, before - int64_t(gpu::free_bytes()));
}

int64_t host_available_bytes() { return proc_kb_field("/proc/meminfo", "MemAvailable"); }

}  // namespace fatool
