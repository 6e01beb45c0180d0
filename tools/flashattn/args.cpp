#include "args.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace fatool {
namespace {

constexpr size_t kMaxListLength = 4096;  // a typo such as "1:1000000" must not hang the tool

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    parts.push_back(s.substr(start, pos - start));
    if (pos == std::string::npos) return parts;
    start = pos + 1;
  }
}

bool parse_int(const std::string& s, int64_t& out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  out = v;
  return true;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

Args::Args(const std::vector<std::string>& argv, const std::vector<std::string>& valued,
           const std::vector<std::string>& flags) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2) throw UsageError("unexpected argument '" + a + "'");
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    if (contains(flags, name)) {
      if (inline_value) fail(name, "is a flag and takes no value");
      flags_.insert(name);
    } else if (contains(valued, name)) {
      if (!inline_value) {
        if (i + 1 >= argv.size()) fail(name, "needs a value");
        value = argv[++i];
      }
      if (value.empty()) fail(name, "needs a non-empty value");
      values_[name] = value;
    } else {
      throw UsageError("unknown option '--" + name + "'");
    }
  }
}

void Args::fail(const std::string& name, const std::string& msg) const {
  throw UsageError("option '--" + name + "' " + msg);
}

std::string Args::str(const std::string& name, const std::string& def) const {
  auto it = values_.find(name);
  return it == values_.end() ? def : it->second;
}

int64_t Args::integer(const std::string& name, int64_t def, int64_t min, int64_t max) const {
  std::vector<int64_t> v = integers(name, {def}, min, max);
  if (v.size() != 1) fail(name, "takes a single value, got '" + str(name, "") + "'");
  return v[0];
}

std::vector<int64_t> Args::integers(const std::string& name, const std::vector<int64_t>& def, int64_t min,
                                    int64_t max) const {
  if (!has(name)) return def;
  const std::string text = str(name, "");
  std::vector<int64_t> out;
  auto check_range = [&](int64_t v) {
    if (v < min || v > max)
      fail(name, "value " + std::to_string(v) + " is outside [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  };
  for (const std::string& item : split(text, ',')) {
    std::vector<std::string> r = split(item, ':');
    int64_t a = 0, b = 0, step = 1;
    bool multiply = false;
    if (r.size() > 3 || !parse_int(r[0], a))
      fail(name, "expected integers, lists (1,2,4) or ranges (a:b, a:b:step, a:b:xFACTOR), got '" + text + "'");
    b = a;
    if (r.size() >= 2 && !parse_int(r[1], b)) fail(name, "has a bad range end in '" + item + "'");
    if (r.size() == 3) {
      std::string s = r[2];
      multiply = !s.empty() && s[0] == 'x';
      if (!parse_int(multiply ? s.substr(1) : s, step) || step < (multiply ? 2 : 1))
        fail(name, "has a bad range step in '" + item + "' (a positive step, or xF with F >= 2)");
    }
    if (b < a) fail(name, "has a range that ends before it starts: '" + item + "'");
    check_range(a);
    check_range(b);
    if (multiply && a <= 0) fail(name, "a multiplicative range must start above 0: '" + item + "'");
    for (int64_t v = a; v <= b; v = multiply ? v * step : v + step) {
      out.push_back(v);
      if (out.size() > kMaxListLength) fail(name, "expands to more than " + std::to_string(kMaxListLength) + " values");
    }
  }
  return out;
}

std::vector<bool> Args::booleans(const std::string& name, const std::vector<bool>& def) const {
  if (!has(name)) return def;
  std::vector<bool> out;
  for (const std::string& item : split(str(name, ""), ',')) {
    if (item == "1" || item == "true" || item == "yes" || item == "on")
      out.push_back(true);
    else if (item == "0" || item == "false" || item == "no" || item == "off")
      out.push_back(false);
    else
      fail(name, "expected 0 or 1 (or a list such as 0,1), got '" + item + "'");
  }
  return out;
}

std::vector<std::string> Args::choices(const std::string& name, const std::vector<std::string>& def,
                                       const std::vector<std::string>& allowed) const {
  if (!has(name)) return def;
  std::vector<std::string> out = split(str(name, ""), ',');
  for (const std::string& item : out) {
    if (!contains(allowed, item)) {
      std::string list;
      for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
      fail(name, "expected one of " + list + ", got '" + item + "'");
    }
  }
  return out;
}

}  // namespace fatool
