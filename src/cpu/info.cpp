// PLACEHOLDER: replaced by the CPU engine's SIMD dispatch.
#include "api/backends.h"
#include "cpu/parallel.h"

namespace flashattn::cpu {
std::string features() { return ""; }
std::string kernel_level() { return "portable"; }
}  // namespace flashattn::cpu
