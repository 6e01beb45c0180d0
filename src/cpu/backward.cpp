// PLACEHOLDER while the CPU engine is written in parallel; replaced by its owner.
#include "api/backends.h"

namespace flashattn::cpu {
void backward(const core::BackwardParams&) { throw Error(Status::unsupported, "backward: not yet implemented on the CPU"); }
}  // namespace flashattn::cpu
