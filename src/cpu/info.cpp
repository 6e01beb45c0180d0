// Runtime CPU dispatch: what the CPU offers, and which table of tile kernels the engine uses.
#include <cstdint>
#include <cstdlib>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "api/backends.h"
#include "cpu/amx.h"
#include "cpu/simd.h"

namespace flashattn::cpu {
namespace {

#if defined(__x86_64__)
struct Feature {
  const char* name;
  bool present;
};

// From cpuid and xgetbv rather than __builtin_cpu_supports, whose feature names differ between
// compilers (clang 14 knows neither f16c nor amx-*). A vector extension counts only where the OS
// also saves its registers (XCR0: SSE and AVX state for AVX, the three AVX-512 states for AVX-512,
// the tile states for AMX).
struct Features {
  Feature list[13];
};

Features read_features() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  __cpuid(0, a, b, c, d);
  const unsigned max_leaf = a;
  unsigned c1 = 0, b7 = 0, d7 = 0, a7_1 = 0;
  __cpuid(1, a, b, c1, d);
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b7, c, d7);
    __cpuid_count(7, 1, a7_1, b, c, d);
  }
  uint64_t xcr0 = 0;
  if (c1 & (1u << 27)) {  // OSXSAVE: xgetbv is available
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (uint64_t(hi) << 32) | lo;
  }
  const bool avx_os = (xcr0 & 0x6) == 0x6, avx512_os = avx_os && (xcr0 & 0xe0) == 0xe0;
  const bool amx_os = (xcr0 & 0x60000) == 0x60000;
  auto bit = [](unsigned r, int i) { return ((r >> i) & 1u) != 0; };
  return {{
      {"sse4.2", bit(c1, 20)},
      {"avx", bit(c1, 28) && avx_os},
      {"avx2", bit(b7, 5) && avx_os},
      {"fma", bit(c1, 12) && avx_os},
      {"f16c", bit(c1, 29) && avx_os},
      {"avx512f", bit(b7, 16) && avx512_os},
      {"avx512bw", bit(b7, 30) && avx512_os},
      {"avx512dq", bit(b7, 17) && avx512_os},
      {"avx512vl", bit(b7, 31) && avx512_os},
      {"avx512bf16", bit(a7_1, 5) && avx512_os},
      {"avx512fp16", bit(d7, 23) && avx512_os},
      {"amx-tile", bit(d7, 24) && amx_os},
      {"amx-bf16", bit(d7, 22) && amx_os},
  }};
}

const Feature* cpu_features(int* count) {
  static const Features f = read_features();
  *count = int(sizeof(f.list) / sizeof(f.list[0]));
  return f.list;
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
  if (has("avx512f") && has("avx512bw") && has("avx512dq") && has("avx512vl") && has("fma") && has("f16c")) {
    if (has("avx512bf16") && has("amx-tile") && has("amx-bf16") && request_amx_permission()) return KernelLevel::amx;
    return KernelLevel::avx512;
  }
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
    case KernelLevel::amx: return "amx";
  }
  return "portable";
}

bool request_amx_permission() {
#if defined(__x86_64__) && defined(__linux__)
  // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA (Linux 5.16 on): without it the first tile
  // instruction faults. Granted to the whole process; 0 on success.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

KernelLevel detected_level() {
  static const KernelLevel level = detect();
  return level;
}

KernelLevel active_level() {
  KernelLevel level = detected_level();
  const char* cap = std::getenv("FLASHATTN_CPU_KERNEL");
  if (cap == nullptr || *cap == '\0') return level;
  for (KernelLevel l : {KernelLevel::portable, KernelLevel::avx2, KernelLevel::avx512, KernelLevel::amx})
    if (std::string(cap) == level_name(l)) return int(l) < int(level) ? l : level;
  throw Error(Status::invalid_argument, std::string("FLASHATTN_CPU_KERNEL='") + cap +
                                            "' is not a kernel level: expected portable, avx2, avx512 or amx");
}

const TileKernels<float>& float_kernels() {
  switch (active_level()) {
#if defined(__x86_64__)
    case KernelLevel::amx:
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
