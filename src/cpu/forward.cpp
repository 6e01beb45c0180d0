// PLACEHOLDER while the CPU engine is written in parallel; replaced by its owner.
#include "api/backends.h"

namespace flashattn::cpu {
void forward(const core::ForwardParams&) { throw Error(Status::unsupported, "forward: not yet implemented on the CPU"); }
}  // namespace flashattn::cpu
