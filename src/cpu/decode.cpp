// PLACEHOLDER while the CPU engine is written in parallel; replaced by its owner.
#include "api/backends.h"

namespace flashattn::cpu {
void decode(const core::DecodeParams&) { throw Error(Status::unsupported, "decode: not yet implemented on the CPU"); }
}  // namespace flashattn::cpu
