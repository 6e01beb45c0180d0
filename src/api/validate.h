// Validation shared by every operation: checks each argument (rank, shape, dtype, device, strides,
// null pointers, aliasing, index arrays) and builds the plain params struct. Throws
// flashattn::Error(Status::invalid_argument) naming the argument before any work is done.
#pragma once

#include "core/params.h"
#include "flashattn/flashattn.hpp"

namespace flashattn::api {

core::ForwardParams validate_forward(const ForwardArgs& a);
core::BackwardParams validate_backward(const BackwardArgs& a);
core::DecodeParams validate_decode(const DecodeArgs& a);  // validate_decode_shapes + _indices
// decode in two parts: the checks that need no device memory (what a planned run re-checks; the
// index arrays are only checked for shape, dtype and device), then the index arrays, read to the
// host: every length (and, when max_cache_seqlen >= 0, at most that) and the block-table entries
// the lengths use. Returns the largest cache_seqlens entry.
core::DecodeParams validate_decode_shapes(const DecodeArgs& a);
int64_t validate_decode_indices(const DecodeArgs& a, const core::DecodeParams& p, int64_t max_cache_seqlen = -1);
// Tokens a sequence can hold: max_pages_per_seq * page_size (paged) or the contiguous capacity.
int64_t decode_capacity(const core::DecodeParams& p);
core::MergeParams validate_merge(const MergeArgs& a);

}  // namespace flashattn::api
