// The CUDA backend of a build without CUDA: every GPU call reports Status::unsupported.
#include "api/backends.h"

namespace flashattn::cuda {
namespace {
[[noreturn]] void absent(const char* op) {
  throw Error(Status::unsupported, std::string(op) +
                                       ": tensors are on a CUDA device, but this flashattn was built without CUDA "
                                       "(configure with -DFLASHATTN_CUDA=ON and nvcc on PATH)");
}
}  // namespace

bool compiled() { return false; }
int device_count() { return 0; }
std::string device_names() { return ""; }
std::string kernels() { return ""; }
std::string last_kernel() { return ""; }
void copy_to_host(void*, const void*, int64_t, int) { absent("validation"); }
void forward(const core::ForwardParams&, int) { absent("forward"); }
void backward(const core::BackwardParams&, int) { absent("backward"); }
void plan_decode(const core::DecodeParams&, DecodePlan&, int) { absent("plan_decode"); }
void decode(const core::DecodeParams&, const DecodePlan&, void*, int) { absent("decode"); }
DecodeStatus decode_status(const DecodePlan&, const void*, void*, int) { absent("decode_status"); }
void decode(const core::DecodeParams&, int64_t, int) { absent("decode"); }
void merge_states(const core::MergeParams&, int) { absent("merge_states"); }

}  // namespace flashattn::cuda
