#pragma once

#include <string>

namespace flashattn::cuda {
// The kernels compiled into this build, comma-separated (for errors and `flashattn info`).
std::string variant_list();
}  // namespace flashattn::cuda
