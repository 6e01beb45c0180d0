// The two backends as the API layer sees them. Each takes validated params (src/core/params.h)
// and trusts them; the CUDA side is implemented in src/cuda/ when CUDA is compiled in, and by
// src/api/cuda_absent.cpp (every call reports Status::unsupported) when it is not.
#pragma once

#include <string>

#include "core/params.h"

namespace flashattn::cpu {
void forward(const core::ForwardParams& p);
void backward(const core::BackwardParams& p);
void decode(const core::DecodeParams& p);
void merge_states(const core::MergeParams& p);
std::string features();       // CPU features found, e.g. "avx2 fma f16c"
std::string kernel_level();   // the SIMD level dispatched to
int default_threads();
}  // namespace flashattn::cpu

namespace flashattn::cuda {
bool compiled();
int device_count();
std::string device_names();
std::string kernels();  // the forward/backward/decode kernels compiled in, one per line
std::string last_kernel();  // the forward/backward kernel that ran last on the calling thread
// Synchronous copy of user-owned index arrays (cu_seqlens, cache lengths, block tables) to the
// host, so validation can check them before any kernel trusts them.
void copy_to_host(void* dst, const void* src, int64_t bytes, int device_index);
void forward(const core::ForwardParams& p, int device_index);
void backward(const core::BackwardParams& p, int device_index);
// Decode in two phases (flashattn.hpp): plan_decode fills plan.num_splits and
// plan.workspace_bytes for params validated with their indices; decode runs a plan without reading
// anything to the host; decode_status reads the faults a run recorded in the workspace.
void plan_decode(const core::DecodeParams& p, DecodePlan& plan, int device_index);
void decode(const core::DecodeParams& p, const DecodePlan& plan, void* workspace, int device_index);
DecodeStatus decode_status(const DecodePlan& plan, const void* workspace, void* stream, int device_index);
// Plan and run with a stream-ordered temporary workspace (decode(args) after host validation).
void decode(const core::DecodeParams& p, int64_t max_cache_seqlen, int device_index);
void merge_states(const core::MergeParams& p, int device_index);
}  // namespace flashattn::cuda
