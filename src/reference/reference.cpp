#include "reference/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "api/validate.h"
#include "core/numeric.h"
#include "cpu/parallel.h"

namespace flashattn::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Rounds an intermediate to the precision a plain implementation would store it in.
struct Rounder {
  Precision precision;
  DType dtype;
  double operator()(double x) const {
    if (precision == Precision::f64) return x;
    switch (dtype) {
      case DType::f16: return core::round_through<core::half_t>(x);
      case DType::bf16: return core::round_through<core::bfloat16_t>(x);
      case DType::f32: return double(float(x));
      default: return x;
    }
  }
  // A plain implementation's accumulators (dot products, sums) and softmax statistics: fp32, also
  // for 16-bit inputs (fp64 for f64 inputs), rounded after every addition. Sums in double made
  // the f32 "plain" error only its storage rounding, which no f32 implementation attains once
  // scores grow (a scale several times 1/sqrt(d): found by tests/fuzz).
  double acc(double x) const {
    return precision == Precision::f64 || dtype == DType::f64 ? x : double(float(x));
  }
  double stat(double x) const { return acc(x); }
};

struct Mask {
  int64_t sq, sk, wl, wr;
  bool visible(int64_t i, int64_t j) const {
    int64_t d = i + sk - sq;
    if (wl >= 0 && j < d - wl) return false;
    if (wr >= 0 && j > d + wr) return false;
    return true;
  }
};

struct HeadProblem {
  int64_t sq = 0, sk = 0, d = 0;
  std::vector<double> q, k, v;  // [sq][d], [sk][d], [sk][d]
};

// Scores after scale and softcap (before masks), as a plain implementation would round them.
double score(const HeadProblem& h, int64_t i, int64_t j, double scale, double softcap, const Rounder& rnd,
             double* tanh_out = nullptr) {
  double s = 0;
  for (int64_t x = 0; x < h.d; ++x) s = rnd.acc(s + h.q[size_t(i * h.d + x)] * h.k[size_t(j * h.d + x)]);
  s = rnd(rnd(s) * scale);
  if (softcap > 0) {
    double t = std::tanh(s / softcap);
    if (tanh_out) *tanh_out = t;
    s = rnd(softcap * t);
  }
  return s;
}

// P of one row (0 where masked); returns lse (-inf for an empty row).
double probabilities(const HeadProblem& h, int64_t i, const Mask& m, double scale, double softcap, const Rounder& rnd,
                     std::vector<double>& p, std::vector<double>* tanh_vals = nullptr) {
  p.assign(size_t(h.sk), 0.0);
  if (tanh_vals) tanh_vals->assign(size_t(h.sk), 0.0);
  double mx = -kInf;
  std::vector<double> s(size_t(h.sk), -kInf);
  for (int64_t j = 0; j < h.sk; ++j) {
    if (!m.visible(i, j)) continue;
    s[size_t(j)] = score(h, i, j, scale, softcap, rnd, tanh_vals ? &(*tanh_vals)[size_t(j)] : nullptr);
    mx = std::max(mx, s[size_t(j)]);
    if (std::isnan(s[size_t(j)])) mx = s[size_t(j)];
  }
  if (mx == -kInf) return -kInf;
  double sum = 0;
  for (int64_t j = 0; j < h.sk; ++j)
    if (s[size_t(j)] != -kInf) sum = rnd.acc(sum + rnd.acc(std::exp(s[size_t(j)] - mx)));
  sum = rnd.stat(sum);
  for (int64_t j = 0; j < h.sk; ++j)
    if (s[size_t(j)] != -kInf) p[size_t(j)] = rnd(std::exp(s[size_t(j)] - mx) / sum);
  return rnd.stat(mx + std::log(sum));
}

// Rows [i0, i1) of one head's attention.
void attend(const HeadProblem& h, const Mask& m, double scale, double softcap, const Rounder& rnd, double* out,
            int64_t out_row_stride, double* lse, int64_t lse_stride, int64_t i0, int64_t i1) {
  std::vector<double> p;
  for (int64_t i = i0; i < i1; ++i) {
    double l = probabilities(h, i, m, scale, softcap, rnd, p);
    for (int64_t x = 0; x < h.d; ++x) {
      double o = 0;
      for (int64_t j = 0; j < h.sk; ++j)
        if (p[size_t(j)] != 0) o = rnd.acc(o + p[size_t(j)] * h.v[size_t(j * h.d + x)]);
      out[i * out_row_stride + x] = rnd(o);
    }
    lse[i * lse_stride] = l;
  }
}

// Gathers rows [tok0, tok0 + n) of head h of a token-major tensor into a dense [n][d] matrix.
std::vector<double> gather(const void* data, DType t, const core::Strides& s, int64_t b, int64_t tok0, int64_t n,
                           int64_t h, int64_t d) {
  std::vector<double> m(size_t(n * d));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t x = 0; x < d; ++x) m[size_t(i * d + x)] = load(data, t, s.offset(b, tok0 + i, h) + x);
  return m;
}

struct SeqSpan {
  int64_t q0, sq, k0, sk;
};

SeqSpan span_of(const core::AttnShape& p, int64_t b) {
  if (!p.varlen()) return {0, p.seqlen_q, 0, p.seqlen_k};
  return {p.cu_seqlens_q[b], p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b], p.cu_seqlens_k[b],
          p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b]};
}

}  // namespace

double load(const void* data, DType t, int64_t offset) {
  switch (t) {
    case DType::f16: return core::to_float(static_cast<const core::half_t*>(data)[offset]);
    case DType::bf16: return core::to_float(static_cast<const core::bfloat16_t*>(data)[offset]);
    case DType::f32: return static_cast<const float*>(data)[offset];
    case DType::f64: return static_cast<const double*>(data)[offset];
    case DType::i32: return static_cast<const int32_t*>(data)[offset];
  }
  return 0;
}

Output forward(const ForwardArgs& a, Precision precision) {
  core::ForwardParams p = api::validate_forward(a);
  Rounder rnd{precision, p.dtype};
  Output r;
  const int64_t hq = p.heads_q, d = p.head_dim;
  r.out.assign(size_t(p.total_q * hq * d), 0.0);
  r.lse.assign(size_t(p.total_q * hq), -kInf);
  // One task per (sequence, head, block of kRows query rows): each computes and writes only its own
  // rows of out and lse, as a serial loop would, so the result does not depend on the threads.
  constexpr int64_t kRows = 64;
  int64_t blocks = 1;
  for (int64_t b = 0; b < p.batch; ++b) blocks = std::max(blocks, (span_of(p, b).sq + kRows - 1) / kRows);
  cpu::parallel_for(p.batch * hq * blocks, 0, [&](int64_t task, int) {
    const int64_t b = task / (hq * blocks), h = task / blocks % hq, i0 = task % blocks * kRows;
    SeqSpan sp = span_of(p, b);
    if (i0 >= sp.sq) return;
    Mask m{sp.sq, sp.sk, p.window_left, p.window_right};
    int64_t hk = h / p.group();
    HeadProblem hp{sp.sq, sp.sk, d, gather(p.q, p.dtype, p.q_s, b, sp.q0, sp.sq, h, d),
                   gather(p.k, p.dtype, p.k_s, b, sp.k0, sp.sk, hk, d),
                   gather(p.v, p.dtype, p.v_s, b, sp.k0, sp.sk, hk, d)};
    int64_t row0 = p.varlen() ? sp.q0 : b * p.seqlen_q;
    double* out = r.out.data() + (row0 * hq + h) * d;
    double* lse = p.varlen() ? r.lse.data() + h * p.total_q + sp.q0 : r.lse.data() + (b * hq + h) * p.seqlen_q;
    attend(hp, m, p.scale, p.softcap, rnd, out, hq * d, lse, 1, i0, std::min(sp.sq, i0 + kRows));
  });
  return r;
}

Grads backward(const BackwardArgs& a, Precision precision) {
  core::BackwardParams p = api::validate_backward(a);
  Rounder rnd{precision, p.dtype};
  Grads g;
  const int64_t hq = p.heads_q, hk_n = p.heads_kv, d = p.head_dim;
  g.dq.assign(size_t(p.total_q * hq * d), 0.0);
  g.dk.assign(size_t(p.total_k * hk_n * d), 0.0);
  g.dv.assign(size_t(p.total_k * hk_n * d), 0.0);
  // One task per (sequence, KV head): dk and dv of a KV head gather the query heads that share it,
  // so the task runs those heads in order, as a serial loop would; its dq rows are its own.
  const int64_t group = p.group();
  cpu::parallel_for(p.batch * hk_n, 0, [&](int64_t task, int) {
    const int64_t b = task / hk_n, hk = task % hk_n;
    std::vector<double> P, T, dP;
    SeqSpan sp = span_of(p, b);
    Mask m{sp.sq, sp.sk, p.window_left, p.window_right};
    int64_t qrow0 = p.varlen() ? sp.q0 : b * p.seqlen_q;
    int64_t krow0 = p.varlen() ? sp.k0 : b * p.seqlen_k;
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      HeadProblem hp{sp.sq, sp.sk, d, gather(p.q, p.dtype, p.q_s, b, sp.q0, sp.sq, h, d),
                     gather(p.k, p.dtype, p.k_s, b, sp.k0, sp.sk, hk, d),
                     gather(p.v, p.dtype, p.v_s, b, sp.k0, sp.sk, hk, d)};
      std::vector<double> dO = gather(p.dout, p.dtype, p.do_s, b, sp.q0, sp.sq, h, d);
      for (int64_t i = 0; i < sp.sq; ++i) {
        double l = probabilities(hp, i, m, p.scale, p.softcap, rnd, P, &T);
        if (l == -kInf) continue;  // a row that sees nothing has zero gradients
        dP.assign(size_t(sp.sk), 0.0);
        double D = 0;
        for (int64_t j = 0; j < sp.sk; ++j) {
          if (P[size_t(j)] == 0) continue;
          double s = 0;
          for (int64_t x = 0; x < d; ++x) s = rnd.acc(s + dO[size_t(i * d + x)] * hp.v[size_t(j * d + x)]);
          dP[size_t(j)] = rnd(s);
          D = rnd.acc(D + P[size_t(j)] * dP[size_t(j)]);
        }
        D = rnd.stat(D);
        for (int64_t j = 0; j < sp.sk; ++j) {
          if (P[size_t(j)] == 0) continue;
          double ds = P[size_t(j)] * (dP[size_t(j)] - D);
          if (p.softcap > 0) ds *= 1.0 - T[size_t(j)] * T[size_t(j)];
          ds = rnd(ds * p.scale);
          double* dq = g.dq.data() + ((qrow0 + i) * hq + h) * d;
          double* dk = g.dk.data() + ((krow0 + j) * hk_n + hk) * d;
          double* dv = g.dv.data() + ((krow0 + j) * hk_n + hk) * d;
          for (int64_t x = 0; x < d; ++x) {
            dq[x] = rnd.acc(dq[x] + ds * hp.k[size_t(j * d + x)]);
            dk[x] = rnd.acc(dk[x] + ds * hp.q[size_t(i * d + x)]);
            dv[x] = rnd.acc(dv[x] + P[size_t(j)] * dO[size_t(i * d + x)]);
          }
        }
      }
    }
  });
  if (precision != Precision::f64) {
    for (auto* v : {&g.dq, &g.dk, &g.dv})
      for (double& x : *v) x = rnd(x);
  }
  return g;
}

Output decode(const DecodeArgs& a, Precision precision) {
  core::DecodeParams p = api::validate_decode(a);
  Rounder rnd{precision, p.dtype};
  Output r;
  const int64_t hq = p.heads_q, d = p.head_dim, sn = p.seqlen_new;
  r.out.assign(size_t(p.batch * sn * hq * d), 0.0);
  r.lse.assign(size_t(p.batch * hq * sn), -kInf);
  int64_t group = hq / p.heads_kv;
  if (sn == 0) return r;  // no query rows: nothing to attend (and no row to point at)
  // One task per (sequence, head), each writing only its own rows (as in forward).
  cpu::parallel_for(p.batch * hq, 0, [&](int64_t task, int) {
    const int64_t b = task / hq, h = task % hq;
    int64_t len = p.cache_seqlens[b * p.cache_seqlens_stride];
    int64_t total = len + (p.append ? sn : 0);
    Mask m{sn, total, p.window_left, p.window_right};
    int64_t hk = h / group;
    HeadProblem hp;
    hp.sq = sn;
    hp.sk = total;
    hp.d = d;
    hp.q = gather(p.q, p.dtype, p.q_s, b, 0, sn, h, d);
    hp.k.resize(size_t(total * d));
    hp.v.resize(size_t(total * d));
    for (int64_t t = 0; t < total; ++t) {
      for (int64_t x = 0; x < d; ++x) {
        double kv[2];
        if (t < len) {
          int64_t page = p.paged ? p.block_table[b * p.block_table_row_stride + (t / p.page_size) * p.block_table_col_stride] : b;
          int64_t slot = p.paged ? t % p.page_size : t;
          kv[0] = load(p.k_cache, p.dtype, page * p.kc_page + slot * p.kc_row + hk * p.kc_head + x);
          kv[1] = load(p.v_cache, p.dtype, page * p.vc_page + slot * p.vc_row + hk * p.vc_head + x);
        } else {
          kv[0] = load(p.k_new, p.dtype, p.knew_s.offset(b, t - len, hk) + x);
          kv[1] = load(p.v_new, p.dtype, p.vnew_s.offset(b, t - len, hk) + x);
        }
        hp.k[size_t(t * d + x)] = kv[0];
        hp.v[size_t(t * d + x)] = kv[1];
      }
    }
    attend(hp, m, p.scale, p.softcap, rnd, r.out.data() + ((b * sn) * hq + h) * d, hq * d,
           r.lse.data() + (b * hq + h) * sn, 1, 0, sn);
  });
  return r;
}

}  // namespace flashattn::reference
