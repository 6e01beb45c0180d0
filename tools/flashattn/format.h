// Human-readable figures for the command's reports.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace fatool {

inline std::string fmt(const char* format, double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, x);
  return buf;
}

inline std::string fmt_bytes(double bytes) {
  if (bytes < 0) return "n/a";
  if (bytes >= 1024.0 * 1024 * 1024) return fmt("%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  if (bytes >= 1024.0 * 1024) return fmt("%.1f MiB", bytes / (1024.0 * 1024));
  if (bytes >= 1024.0) return fmt("%.1f KiB", bytes / 1024.0);
  return fmt("%.0f B", bytes);
}

inline std::string fmt_time(double seconds) {
  if (seconds >= 1.0) return fmt("%.3f s", seconds);
  if (seconds >= 1e-3) return fmt("%.2f ms", seconds * 1e3);
  return fmt("%.1f us", seconds * 1e6);
}

}  // namespace fatool
