// Validation shared by every operation: checks each argument (rank, shape, dtype, device, strides,
// null pointers, aliasing, index arrays) and builds the plain params struct. Throws
// flashattn::Error(Status::invalid_argument) naming the argument before any work is done.
#pragma once

#include "core/params.h"
#include "flashattn/flashattn.hpp"

namespace flashattn::api {

core::ForwardParams validate_forward(const ForwardArgs& a);
core::BackwardParams validate_backward(const BackwardArgs& a);
core::DecodeParams validate_decode(const DecodeArgs& a);
core::MergeParams validate_merge(const MergeArgs& a);

}  // namespace flashattn::api
