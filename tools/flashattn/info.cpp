// `flashattn info`: what this build and this machine offer.
#include <cstdio>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "flashattn/flashattn.hpp"

namespace fatool {

int run_info(const std::vector<std::string>& argv) {
  Args args(argv, {}, {"help"});
  if (args.flag("help")) {
    std::puts("usage: flashattn info\n\nPrints the version, the backends compiled in, the CPU features and the SIMD level the\n"
              "CPU engine uses, the GPUs found and the GPU kernels compiled in.");
    return 0;
  }
  const flashattn::BuildInfo info = flashattn::build_info();
  std::printf("flashattn %s\n", info.version.c_str());
  std::printf("backends:     cpu%s\n", info.cuda_compiled ? ", cuda" : " (built without CUDA)");
  std::printf("CPU:          %d threads; features: %s\n", info.cpu_threads,
              info.cpu_features.empty() ? "(none detected)" : info.cpu_features.c_str());
  std::printf("CPU kernels:  %s\n", info.cpu_kernel.c_str());
  if (info.cuda_compiled) {
    std::printf("GPUs found:   %d%s%s\n", info.cuda_devices, info.cuda_devices ? ": " : "",
                info.cuda_device_names.c_str());
    std::printf("GPU kernels:  %s\n", info.cuda_kernels.empty() ? "none" : info.cuda_kernels.c_str());
  } else {
    std::printf("GPUs found:   not looked for (built without CUDA)\n");
  }
  std::printf("OpenBLAS:     %s\n", openblas_status().c_str());
  return 0;
}

}  // namespace fatool
