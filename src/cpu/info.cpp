// Runtime CPU dispatch: what the CPU offers, and which table of tile kernels the engine uses.
#include <cstdlib>
#include <string>

#include "api/backends.h"
#include "cpu/simd.h"

namespace flashattn::cpu {
namespace {

#if defined(__x86_64__)
struct Feature {
  const char* name;
  bool present;
};

// __builtin_cpu_supports also checks that the OS saves the AVX / AVX-512 register state.
const Feature* cpu_features(int* count) {
  static const Feature list[] = {
      {"sse4.2", bool(__builtin_cpu_supports("sse4.2"))},
      {"avx", bool(__builtin_cpu_supports("avx"))},
      {"avx2", bool(__builtin_cpu_supports("avx2"))},
      {"fma", bool(__builtin_cpu_supports("fma"))},
      {"f16c", bool(__builtin_cpu_supports("f16c"))},
      {"avx512f", bool(__builtin_cpu_supports("avx512f"))},
      {"avx512bw", bool(__builtin_cpu_supports("avx512bw"))},
      {"avx512dq", bool(__builtin_cpu_supports("avx512dq"))},
      {"avx512vl", bool(__builtin_cpu_supports("avx512vl"))},
      {"avx512bf16", bool(__builtin_cpu_supports("avx512bf16"))},
      {"avx512fp16", bool(__builtin_cpu_supports("avx512fp16"))},
      {"amx-tile", bool(__builtin_cpu_supports("amx-tile"))},
      {"amx-bf16", bool(__builtin_cpu_supports("amx-bf16"))},
  };
  *count = int(sizeof(list) / sizeof(list[0]));
  return list;
}

bool has(const char* name) {
  int n = 0;
  const Feature* f = cpu_features(&n);
  for (int i = 0; i < n; ++i)
    if (std::string(f[i].name) == name) return f[i].present;
  return false;
}
#endif

KernelLevel detect() {
#if defined(__x86_64__)
  // Each level's file is compiled with all of its flags, so every one of them must be present.
  if (has("avx512f") && has("avx512bw") && has("avx512dq") && has("avx512vl") && has("fma") && has("f16c"))
    return KernelLevel::avx512;
  if (has("avx2") && has("fma") && has("f16c")) return KernelLevel::avx2;
#endif
  return KernelLevel::portable;
}

}  // namespace

const char* level_name(KernelLevel level) {
  switch (level) {
    case KernelLevel::portable: return "portable";
    case KernelLevel::avx2: return "avx2";
    case KernelLevel::avx512: return "avx512";
  }
  return "portable";
}

KernelLevel detected_level() {
  static const KernelLevel level = detect();
  return level;
}

KernelLevel active_level() {
  KernelLevel level = detected_level();
  const char* cap = std::getenv("FLASHATTN_CPU_KERNEL");
  if (cap == nullptr || *cap == '\0') return level;
  for (KernelLevel l : {KernelLevel::portable, KernelLevel::avx2, KernelLevel::avx512})
    if (std::string(cap) == level_name(l)) return int(l) < int(level) ? l : level;
  throw Error(Status::invalid_argument, std::string("FLASHATTN_CPU_KERNEL='") + cap +
                                            "' is not a kernel level: expected portable, avx2 or avx512");
}

const TileKernels<float>& float_kernels() {
  switch (active_level()) {
#if defined(__x86_64__)
    case KernelLevel::avx512: return avx512_kernels_f32();
    case KernelLevel::avx2: return avx2_kernels_f32();
#endif
    default: return portable_kernels_f32();
  }
}

const TileKernels<double>& double_kernels() { return portable_kernels_f64(); }

std::string features() {
  std::string s;
#if defined(__x86_64__)
  int n = 0;
  const Feature* f = cpu_features(&n);
  for (int i = 0; i < n; ++i)
    if (f[i].present) {
      if (!s.empty()) s += ' ';
      s += f[i].name;
    }
#endif
  return s;
}

std::string kernel_level() { return level_name(active_level()); }

}  // namespace flashattn::cpu
