// Run-time choice of a kernel variant.
//   * Forward on Hopper (compute capability 9.0): the sm90a TMA + wgmma path when it was compiled
//     for this exact head dim and dtype, the output rows are 16-byte aligned (its epilogue stores
//     16 bytes per thread) and the driver accepts the tensors' TMA maps; otherwise the portable
//     path. FLASHATTN_GPU_FORWARD=portable forces the portable path (tests run both); auto (or
//     unset) is the default, anything else an error.
//   * Backward on Hopper: likewise the sm90a path for its compiled head dims when dq, dk and dv
//     take 4-byte element pairs; FLASHATTN_GPU_BACKWARD=portable forces the portable path.
//   * Portable path: the dtype must match, the head dim is rounded up to the smallest compiled
//     kernel head dim (its extra columns are zero-filled on load and never written), and the
//     target arch is the device's own family when compiled (sm_90a SASS on Hopper), else the sm80
//     build (its SASS on sm8x, its PTX JIT-compiled elsewhere).
// The kernel that ran last on this thread is kept for `flashattn bench` and tests to report.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/backward.h"
#include "cuda/common.cuh"
#include "cuda/forward.h"
#include "cuda/variants.h"

namespace flashattn::cuda {
namespace {

using elem_f16 = __half;
using elem_bf16 = __nv_bfloat16;

template <class Params>
struct Variant {
  int head_dim;
  DType dtype;
  int arch;
  void (*run)(const Params&, cudaStream_t);
};

template <class Params>
struct HopperVariant {
  int head_dim;
  DType dtype;
  bool (*run)(const Params&, cudaStream_t);
};

// Each table includes kernel_list.inc with only its own entry macro defined (the file lists that
// kind's compiled variants); the trailing entry keeps a table non-empty in any build.
#define FLASHATTN_FWD_PORTABLE(H, DT, A) Variant<core::ForwardParams>{H, DType::DT, A, &run_forward_portable<H, elem_##DT, A>},
constexpr Variant<core::ForwardParams> kForward[] = {
#include "flashattn_internal/kernel_list.inc"
    Variant<core::ForwardParams>{0, DType::f32, 0, nullptr}};
#undef FLASHATTN_FWD_PORTABLE

#define FLASHATTN_BWD_PORTABLE(H, DT, A) Variant<core::BackwardParams>{H, DType::DT, A, &run_backward_portable<H, elem_##DT, A>},
constexpr Variant<core::BackwardParams> kBackward[] = {
#include "flashattn_internal/kernel_list.inc"
    Variant<core::BackwardParams>{0, DType::f32, 0, nullptr}};
#undef FLASHATTN_BWD_PORTABLE

#define FLASHATTN_FWD_HOPPER(H, DT) HopperVariant<core::ForwardParams>{H, DType::DT, &run_forward_hopper<H, elem_##DT, 90>},
constexpr HopperVariant<core::ForwardParams> kHopperForward[] = {
#include "flashattn_internal/kernel_list.inc"
    HopperVariant<core::ForwardParams>{0, DType::f32, nullptr}};
#undef FLASHATTN_FWD_HOPPER

#define FLASHATTN_BWD_HOPPER(H, DT) HopperVariant<core::BackwardParams>{H, DType::DT, &run_backward_hopper<H, elem_##DT, 90>},
constexpr HopperVariant<core::BackwardParams> kHopperBackward[] = {
#include "flashattn_internal/kernel_list.inc"
    HopperVariant<core::BackwardParams>{0, DType::f32, nullptr}};
#undef FLASHATTN_BWD_HOPPER

thread_local std::string last_kernel;

std::string variant_name(const char* kind, const char* path, int head_dim, DType dtype, int arch) {
  return std::string(kind) + " " + path + " hdim" + std::to_string(head_dim) + " " + dtype_name(dtype) + " sm" +
         std::to_string(arch) + (arch == 90 ? "a" : "");
}

// False when the environment variable `name` ("auto" or unset: the default) forces the portable
// path; any other value is an error that names the variable.
bool hopper_allowed(const char* op, const char* name) {
  const char* force = std::getenv(name);
  if (force == nullptr || *force == '\0' || std::strcmp(force, "auto") == 0) return true;
  if (std::strcmp(force, "portable") == 0) return false;
  throw Error(Status::invalid_argument, std::string(op) + ": environment variable " + name +
                                            ": expected 'auto' or 'portable', got '" + force + "'");
}

template <class Params, size_t N>
const HopperVariant<Params>* find_hopper(const HopperVariant<Params> (&table)[N], const Params& p) {
  for (const HopperVariant<Params>& v : table)
    if (v.run != nullptr && v.head_dim == p.head_dim && v.dtype == p.dtype) return &v;
  return nullptr;
}

// The Hopper forward for p, or null when p must take the portable path.
const HopperVariant<core::ForwardParams>* hopper_forward(const core::ForwardParams& p, int cc) {
  if (cc != 90 || !hopper_allowed("forward", "FLASHATTN_GPU_FORWARD")) return nullptr;
  const bool out_rows_16b = reinterpret_cast<uintptr_t>(p.out) % 16 == 0 && p.o_s.batch % 8 == 0 &&
                            p.o_s.row % 8 == 0 && p.o_s.head % 8 == 0;
  return out_rows_16b ? find_hopper(kHopperForward, p) : nullptr;
}

// The Hopper backward for p, or null. It writes dq, dk and dv as 4-byte element pairs.
const HopperVariant<core::BackwardParams>* hopper_backward(const core::BackwardParams& p, int cc) {
  if (cc != 90 || !hopper_allowed("backward", "FLASHATTN_GPU_BACKWARD")) return nullptr;
  auto pairs = [](const void* base, const core::Strides& s) {
    return reinterpret_cast<uintptr_t>(base) % 4 == 0 && s.batch % 2 == 0 && s.row % 2 == 0 && s.head % 2 == 0;
  };
  const bool ok = pairs(p.dq, p.dq_s) && pairs(p.dk, p.dk_s) && pairs(p.dv, p.dv_s);
  return ok ? find_hopper(kHopperBackward, p) : nullptr;
}

// Can a binary built for `arch` run on a device of compute capability `cc`?
bool runs_on(int arch, int cc) {
  if (arch == 90) return cc / 10 == 9;  // sm_90a machine code: Hopper only
  return cc >= 80;                      // sm_80 SASS on sm8x, its PTX on anything newer
}

template <class Params, size_t N>
void pick_and_run(const Variant<Params> (&table)[N], const char* op, const Params& p, int cc, cudaStream_t stream) {
  const Variant<Params>* best = nullptr;
  for (const Variant<Params>& v : table) {
    if (v.run == nullptr || v.dtype != p.dtype || v.head_dim < p.head_dim || !runs_on(v.arch, cc)) continue;
    bool better = best == nullptr || v.head_dim < best->head_dim ||
                  (v.head_dim == best->head_dim && v.arch > best->arch);  // own family first
    if (better) best = &v;
  }
  if (best == nullptr)
    throw Error(Status::unsupported, std::string(op) + ": no GPU kernel for head_dim " + std::to_string(p.head_dim) +
                                         ", dtype " + dtype_name(p.dtype) + " on compute capability " +
                                         std::to_string(cc / 10) + "." + std::to_string(cc % 10) +
                                         " in this build (compiled: " + variant_list() + ")");
  best->run(p, stream);
  last_kernel = variant_name(op[0] == 'f' ? "fwd" : "bwd", "portable", best->head_dim, best->dtype, best->arch);
}

// The target arch of a table entry (the Hopper tables hold sm_90a code only).
template <class Params>
int arch_of(const Variant<Params>& v) {
  return v.arch;
}
template <class Params>
int arch_of(const HopperVariant<Params>&) {
  return 90;
}

// Appends the compiled variants of a table to s, comma-separated (`flashattn info`).
template <class Table>
void describe(const Table& table, const char* kind, const char* path, std::string& s) {
  for (const auto& v : table) {
    if (v.run == nullptr) continue;
    if (!s.empty()) s += ", ";
    s += variant_name(kind, path, v.head_dim, v.dtype, arch_of(v));
  }
}

}  // namespace

void dispatch_forward(const core::ForwardParams& p, int cc, cudaStream_t stream) {
  if (const auto* v = hopper_forward(p, cc); v != nullptr && v->run(p, stream)) {
    last_kernel = variant_name("fwd", "hopper", v->head_dim, v->dtype, 90);
    return;
  }
  pick_and_run(kForward, "forward", p, cc, stream);
}

void dispatch_backward(const core::BackwardParams& p, int cc, cudaStream_t stream) {
  if (const auto* v = hopper_backward(p, cc); v != nullptr && v->run(p, stream)) {
    last_kernel = variant_name("bwd", "hopper", v->head_dim, v->dtype, 90);
    return;
  }
  pick_and_run(kBackward, "backward", p, cc, stream);
}

std::string variant_list() {
  std::string s;
  describe(kHopperForward, "fwd", "hopper", s);
  describe(kHopperBackward, "bwd", "hopper", s);
  describe(kForward, "fwd", "portable", s);
  describe(kBackward, "bwd", "portable", s);
  return s.empty() ? "none" : s;
}

std::string last_kernel_name() { return last_kernel; }

}  // namespace flashattn::cuda
