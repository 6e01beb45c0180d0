// Command-line options of the flashattn subcommands.
//
// Options are "--name value" or "--name=value"; flags take no value. Lists are comma-separated and
// each item may be a range: "a:b" (step 1), "a:b:s" (step s) or "a:b:xF" (multiply by F), e.g.
// "--n 512:8192:x2" is 512, 1024, ..., 8192. A bad option throws UsageError with a one-line message
// that names it; main() prints it and exits non-zero.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace fatool {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Args {
 public:
  // `valued` and `flags` list the option names the subcommand accepts, without the leading "--".
  Args(const std::vector<std::string>& argv, const std::vector<std::string>& valued,
       const std::vector<std::string>& flags);

  bool flag(const std::string& name) const { return flags_.count(name) > 0; }
  bool has(const std::string& name) const { return values_.count(name) > 0; }

  std::string str(const std::string& name, const std::string& def) const;
  int64_t integer(const std::string& name, int64_t def, int64_t min, int64_t max) const;
  std::vector<int64_t> integers(const std::string& name, const std::vector<int64_t>& def, int64_t min,
                                int64_t max) const;
  std::vector<bool> booleans(const std::string& name, const std::vector<bool>& def) const;
  // A list whose items must each be one of `allowed`.
  std::vector<std::string> choices(const std::string& name, const std::vector<std::string>& def,
                                   const std::vector<std::string>& allowed) const;

 private:
  [[noreturn]] void fail(const std::string& name, const std::string& msg) const;
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_;
};

}  // namespace fatool
