#pragma once

#include <string>

namespace flashattn::cuda {
// The kernels compiled into this build, comma-separated (for errors and `flashattn info`).
std::string variant_list();
// The forward or backward kernel that ran last on the calling thread, e.g. "fwd hopper hdim128
// bf16 sm90a"; empty before the first GPU call.
std::string last_kernel_name();
}  // namespace flashattn::cuda
