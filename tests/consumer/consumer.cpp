// Uses only the installed headers: the C ABI's version, and a forward through the C++ API checked
// against attention written out by hand. Exit code 0 on success.
#include <flashattn/flashattn.h>
#include <flashattn/flashattn.hpp>
#include <flashattn/version.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  if (std::strcmp(flashattn_version(), FLASHATTN_VERSION_STRING) != 0) {
    std::fprintf(stderr, "version mismatch: library %s, header %s\n", flashattn_version(), FLASHATTN_VERSION_STRING);
    return 1;
  }
  // One sequence, 3 queries, 5 keys, 2 heads, head_dim 32, causal (bottom-right aligned).
  const int sq = 3, sk = 5, h = 2, d = 32;
  std::vector<float> q(sq * h * d), k(sk * h * d), v(sk * h * d), out(sq * h * d, NAN);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * float(i));
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.23f * float(i));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.11f * float(i) + 1.f);
  flashattn::ForwardArgs a;
  a.q = flashattn::TensorView::contiguous(q.data(), flashattn::DType::f32, {1, sq, h, d});
  a.k = flashattn::TensorView::contiguous(k.data(), flashattn::DType::f32, {1, sk, h, d});
  a.v = flashattn::TensorView::contiguous(v.data(), flashattn::DType::f32, {1, sk, h, d});
  a.out = flashattn::TensorView::contiguous(out.data(), flashattn::DType::f32, {1, sq, h, d});
  a.options.causal = true;
  try {
    flashattn::forward(a);
  } catch (const flashattn::Error& e) {
    std::fprintf(stderr, "forward failed: %s\n", e.what());
    return 1;
  }
  double worst = 0;
  for (int i = 0; i < sq; ++i)
    for (int hh = 0; hh < h; ++hh) {
      const int last = i + sk - sq;  // causal: row i sees keys 0..i + sk - sq
      std::vector<double> p(sk, 0.0);
      double mx = -INFINITY, sum = 0;
      for (int j = 0; j <= last; ++j) {
        double s = 0;
        for (int x = 0; x < d; ++x) s += double(q[(i * h + hh) * d + x]) * k[(j * h + hh) * d + x];
        p[j] = s / std::sqrt(double(d));
        mx = std::max(mx, p[j]);
      }
      for (int j = 0; j <= last; ++j) sum += (p[j] = std::exp(p[j] - mx));
      for (int x = 0; x < d; ++x) {
        double o = 0;
        for (int j = 0; j <= last; ++j) o += p[j] / sum * v[(j * h + hh) * d + x];
        worst = std::max(worst, std::fabs(o - out[(i * h + hh) * d + x]));
        if (std::isnan(out[(i * h + hh) * d + x])) worst = INFINITY;
      }
    }
  std::printf("flashattn %s: forward max error %.3g\n", flashattn_version(), worst);
  return worst < 1e-5 ? 0 : 1;
}
