// `flashattn`: the command. Exit codes: 0 success, 1 a failure while running, 2 a bad command line.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "args.h"
#include "commands.h"
#include "flashattn/flashattn.hpp"

namespace {

const char* kUsage = R"(usage: flashattn <command> [options]

commands:
  demo    FlashAttention against standard attention on one problem: error, time, memory, traffic
  bench   time a sweep of shapes (fwd, bwd, decode); --cpu-bar for the CPU performance bar
  info    version, backends, CPU features, GPUs and the kernels compiled in

`flashattn <command> --help` describes each command's options.
)";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  try {
    if (command == "demo") return fatool::run_demo(args);
    if (command == "bench") return fatool::run_bench(args);
    if (command == "info") return fatool::run_info(args);
    std::fprintf(stderr, "flashattn: unknown command '%s' (commands: demo, bench, info; see flashattn --help)\n",
                 command.c_str());
    return 2;
  } catch (const fatool::UsageError& e) {
    std::fprintf(stderr, "flashattn %s: %s (see flashattn %s --help)\n", command.c_str(), e.what(), command.c_str());
    return 2;
  } catch (const flashattn::Error& e) {
    std::fprintf(stderr, "flashattn %s: %s\n", command.c_str(), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashattn %s: error: %s\n", command.c_str(), e.what());
    return 1;
  }
}
