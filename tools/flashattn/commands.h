// The subcommands of `flashattn`. Each takes the arguments after its name, prints its report to
// stdout and returns the exit code; a bad option throws UsageError (args.h).
#pragma once

#include <string>
#include <vector>

namespace fatool {

int run_demo(const std::vector<std::string>& argv);
int run_bench(const std::vector<std::string>& argv);
int run_info(const std::vector<std::string>& argv);
// `flashattn bench --cpu-bar`: the CPU forward against OpenBLAS SGEMM (cpu_bar.cpp).
int run_cpu_bar(int runs, const std::string& json_path);

// Whether the command was built with OpenBLAS (for --cpu-bar), and which.
std::string openblas_status();

}  // namespace fatool
