// PLACEHOLDER while the CPU engine is written in parallel; replaced by its owner.
#include "api/backends.h"

namespace flashattn::cpu {
void merge_states(const core::MergeParams&) { throw Error(Status::unsupported, "merge_states: not yet implemented on the CPU"); }
}  // namespace flashattn::cpu
