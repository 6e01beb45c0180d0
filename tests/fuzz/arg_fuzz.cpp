// The argument fuzzer: one case of forward, backward, decode or merge_states on the CPU, built
// from a fuzzer's bytes. A case is a valid problem (random sizes, layouts, options, varlen
// batches with empty sequences, paged caches with shuffled pages and garbage in the unused block
// table slots) with up to three mutations: a shape, stride, rank, dtype or device changed, an
// index entry or an option made bad, a tensor dropped, a null or aliasing pointer.
//
// What must hold for every case (the API's promises, include/flashattn/flashattn.hpp):
//   * the call returns or throws flashattn::Error, never anything else, and never touches memory
//     outside the tensors (AddressSanitizer in the libFuzzer build: every buffer is exactly the
//     span its view claims);
//   * a rejected call names the argument and leaves every tensor as it was;
//   * an accepted call leaves its inputs alone, writes nothing but elements of its outputs (and
//     an append's slots of the cache), and is exact under the accuracy rule (fp64 reference);
//   * what must always be rejected (negative strides, ranks or dtypes out of range, devices that
//     differ, null data, outputs aliasing inputs) is.
// Views whose span is not a sane allocation (overflowing or huge shapes) only go through the
// validation, which must answer without undefined behaviour (UndefinedBehaviorSanitizer).
// This file builds each operation's cases; fuzz_case.cpp mutates them, runs them and checks.
#include "arg_fuzz.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <sstream>
#include <tuple>

#include "api/validate.h"
#include "c_abi_route.h"
#include "core/numeric.h"
#include "fuzz_case.h"
#include "fuzz_device.h"
#include "fuzz_tensors.h"
#include "reference/reference.h"
#include "test_util.h"

namespace fa_fuzz {
namespace {

namespace ref = flashattn::reference;
using fa_test::values;
using flashattn::AttnOptions;
using flashattn::DeviceType;

DType lse_type(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// The rows [lo, hi) of a packed (varlen) tensor that some sequence covers: cu_seqlens[0] up to
// cu_seqlens[batch]. No operation reads or writes the others (README "Varlen batches").
struct Covered {
  int64_t lo = 0, hi = std::numeric_limits<int64_t>::max();
};

Covered covered(const TensorView& cu) {
  if (!cu.rank) return {};
  const int32_t* x = static_cast<const int32_t*>(cu.data);
  return {x[0], x[cu.shape[0] - 1]};
}

// Checks that an output's elements in rows no sequence covers still hold their poison (NaN), and
// takes them out of the comparison: the reference has zeros there. Element i is in row i / per_row
// of a token-major tensor, or row i % rows of an lse ([heads, total]).
std::string untouched_outside(std::vector<double>& got, std::vector<double>& exact, std::vector<double>& plain,
                              Covered rows, int64_t per_row, int64_t lse_rows, const char* name) {
  for (size_t i = 0; i < got.size(); ++i) {
    const int64_t r = lse_rows ? int64_t(i) % lse_rows : int64_t(i) / per_row;
    if (r >= rows.lo && r < rows.hi) continue;
    if (!std::isnan(got[i]))
      return std::string(name) + ": wrote row " + std::to_string(r) + ", which no sequence covers";
    got[i] = exact[i] = plain[i] = 0;
  }
  return "";
}

std::string rule(const std::vector<double>& got, const std::vector<double>& exact, const std::vector<double>& plain,
                 DType t, double factor, const char* name) {
  ::testing::AssertionResult r = fa_test::within_rule(got, exact, plain, t, factor, name);
  return r ? "" : r.message();
}

// The rule for an f32 lse, plus 4 ulp of the largest |lse|: the plain implementation's exact tanh
// and exp leave it a fraction of an ulp, while the engines' vector exp2 and tanh (about 1e-7
// relative each) move an lse of 14 (softcap 12.5) by 2-3 ulp.
std::string lse_rule(const std::vector<double>& got, const std::vector<double>& exact,
                     const std::vector<double>& plain, DType t) {
  if (t == DType::f64) return rule(got, exact, plain, t, 2.0, "lse");
  double top = 0;
  for (double x : exact)
    if (std::isfinite(x)) top = std::max(top, std::fabs(x));
  const double err = fa_test::max_abs_diff(got, exact), base = fa_test::max_abs_diff(plain, exact);
  const double bound = 2 * base + fa_test::default_atol(t) + 4 * top * 0x1p-23;
  if (err <= bound) return "";
  char msg[160];
  std::snprintf(msg, sizeof msg, "lse: max error %.3g exceeds %.3g (2 x plain error %.3g + atol + 4 ulp of %.3g)",
                err, bound, base, top);
  return msg;
}

// Sizes of an attention problem: dtype, head dim, heads, and sequence lengths.
struct Dims {
  DType dtype;
  int64_t d, hq, hkv;
};

Dims gen_dims(ByteSource& in) {
  Dims s;
  s.dtype = g_on_gpu ? in.pick<DType>({DType::f16, DType::bf16})
                     : in.pick<DType>({DType::f16, DType::bf16, DType::f32, DType::f64});
  s.d = in.pick<int64_t>({32, 40, 64, 72, 128, 256});
  s.hkv = in.in(1, 2);
  s.hq = s.hkv * in.in(1, 3);
  return s;
}

// Sequence lengths of a varlen batch (empty ones among them) or of a padded one.
std::vector<int32_t> gen_cu(ByteSource& in, int64_t batch, int64_t most) {
  std::vector<int32_t> cu{0};
  for (int64_t b = 0; b < batch; ++b) cu.push_back(cu.back() + int32_t(in.chance(1, 4) ? 0 : in.in(1, most)));
  return cu;
}

// q, k, v (and their varlen cu_seqlens) of a forward or backward case, added to c.
struct AttnViews {
  TensorView q, k, v, cu_q, cu_k;
  int64_t total_q = 0, batch = 0, seqlen_q = 0;
  bool varlen = false;
};

void gen_attention(ByteSource& in, Case& c, const Dims& s, AttnViews& a) {
  a.varlen = in.chance(1, 3);
  if (a.varlen) {
    a.batch = in.in(1, 4);
    std::vector<int32_t> cq = gen_cu(in, a.batch, 33), ck = gen_cu(in, a.batch, 40);
    a.total_q = cq.back();
    a.q = make_view(in, s.dtype, {cq.back(), s.hq, s.d}, true);
    a.k = make_view(in, s.dtype, {ck.back(), s.hkv, s.d}, true);
    a.v = make_view(in, s.dtype, {ck.back(), s.hkv, s.d}, true);
    a.cu_q = index_view({a.batch + 1});
    a.cu_k = index_view({a.batch + 1});
    c.add("q", Role::input, a.q);
    c.add("k", Role::input, a.k);
    c.add("v", Role::input, a.v);
    c.add("cu_seqlens_q", Role::index, a.cu_q, cq);
    c.add("cu_seqlens_k", Role::index, a.cu_k, ck);
  } else {
    a.batch = in.in(1, 3);
    a.seqlen_q = in.pick<int64_t>({1, 17, in.in(0, 48)});
    const int64_t sk = in.pick<int64_t>({1, 17, in.in(0, 48)});
    a.total_q = a.batch * a.seqlen_q;
    a.q = make_view(in, s.dtype, {a.batch, a.seqlen_q, s.hq, s.d}, true);
    a.k = make_view(in, s.dtype, {a.batch, sk, s.hkv, s.d}, true);
    a.v = make_view(in, s.dtype, {a.batch, sk, s.hkv, s.d}, true);
    c.add("q", Role::input, a.q);
    c.add("k", Role::input, a.k);
    c.add("v", Role::input, a.v);
  }
}

TensorView lse_view(ByteSource& in, const Dims& s, const AttnViews& a) {
  return a.varlen ? make_view(in, lse_type(s.dtype), {s.hq, a.total_q}, false)
                  : make_view(in, lse_type(s.dtype), {a.batch, s.hq, a.seqlen_q}, false);
}

std::string fuzz_forward(ByteSource& in, std::mt19937& rng) {
  Case c;
  flashattn::ForwardArgs args;
  const Dims s = gen_dims(in);
  AttnViews a;
  gen_attention(in, c, s, a);
  args.out = a.q;
  set_strides(in, args.out, false);
  c.add("out", Role::output, args.out);
  if (in.chance(2, 3)) {
    args.lse = lse_view(in, s, a);
    c.add("lse", Role::output, args.lse);
  }
  gen_options(in, args.options);
  c.options = &args.options;
  for (int m = mutation_count(in); m > 0; --m) mutate_views(in, c);
  args.q = a.q;  // the views live in `a` until now so that the mutations reach them through c
  ref::Output exact, plain;
  Run run;
  auto sync = [&] {
    args.q = a.q, args.k = a.k, args.v = a.v, args.cu_seqlens_q = a.cu_q, args.cu_seqlens_k = a.cu_k;
  };
  run.validate = [&] { sync(); flashattn::api::validate_forward(args); };
  run.reference = [&] {
    sync();
    exact = ref::forward(args, ref::Precision::f64);
    plain = ref::forward(args, ref::Precision::same_as_input);
  };
  const bool via_c = in.chance(1, 4);
  run.call = [&] { sync(), via_c ? c_abi::forward(args) : flashattn::forward(args); };
  run.check = [&] {
    sync();  // args' copies of the views held device pointers during a GPU call
    const Covered rows = covered(args.cu_seqlens_q);
    std::vector<double> out = values(args.out);
    std::string r = untouched_outside(out, exact.out, plain.out, rows, args.out.shape[1] * args.out.shape[2], 0, "out");
    if (r.empty()) r = rule(out, exact.out, plain.out, s.dtype, 2.0, "out");
    if (r.empty() && args.lse.rank) {
      std::vector<double> lse = values(args.lse);
      r = untouched_outside(lse, exact.lse, plain.lse, rows, 0, args.lse.shape[1], "lse");
      if (r.empty()) r = lse_rule(lse, exact.lse, plain.lse, s.dtype);
    }
    return r;
  };
  return conclude(in, c, via_c ? "forward (C ABI)" : "forward", run, rng);
}

// Writes values (logical order) into t through its view, if the view still points at t's bytes.
void write_values(Tensor& t, const std::vector<double>& v) {
  if (t.view->data != t.bytes.get() || !t.size) return;
  for (int64_t i = 0; i < t.view->numel() && size_t(i) < v.size(); ++i)
    store(*t.view, offset_of(*t.view, i), v[size_t(i)]);
}

Tensor* find(Case& c, const char* name) {
  for (Tensor& t : c.tensors)
    if (std::string(t.name) == name) return &t;
  return nullptr;
}

std::string fuzz_backward(ByteSource& in, std::mt19937& rng) {
  Case c;
  flashattn::BackwardArgs args;
  const Dims s = gen_dims(in);
  AttnViews a;
  gen_attention(in, c, s, a);
  // out and lse are the forward's (written in `prepare`), so no broadcast layouts for them.
  args.out = a.q;
  set_strides(in, args.out, false);
  args.lse = lse_view(in, s, a);
  args.dout = a.q;
  set_strides(in, args.dout, true);
  args.dq = a.q;
  set_strides(in, args.dq, false);
  args.dk = a.k;
  set_strides(in, args.dk, false);
  args.dv = a.k;
  set_strides(in, args.dv, false);
  c.add("out", Role::input, args.out);
  c.add("lse", Role::input, args.lse);
  c.add("dout", Role::input, args.dout);
  c.add("dq", Role::output, args.dq);
  c.add("dk", Role::output, args.dk);
  c.add("dv", Role::output, args.dv);
  gen_options(in, args.options);
  // FlashAttention's rule for 16-bit gradients is calibrated at scales up to 1/sqrt(d) (its tests
  // use that default). With a sharper softmax dS = P o (dP - D) cancels, and the backward's D =
  // rowsum(dO o O) carries the rounding of the forward's 16-bit O, which the plain implementation
  // (D = sum P dP) does not: 3-4x the rule at 5/sqrt(d), 1.1x at 2/sqrt(d), in f16.
  if (s.dtype == DType::f16 || s.dtype == DType::bf16)
    args.options.softmax_scale = std::min(args.options.softmax_scale, float(1 / std::sqrt(double(s.d))));
  args.deterministic = in.chance(1, 2);
  c.options = &args.options;
  for (int m = mutation_count(in); m > 0; --m) mutate_views(in, c);
  ref::Grads exact, plain;
  auto sync = [&] {
    args.q = a.q, args.k = a.k, args.v = a.v, args.cu_seqlens_q = a.cu_q, args.cu_seqlens_k = a.cu_k;
  };
  Run run;
  run.validate = [&] { sync(); flashattn::api::validate_backward(args); };
  run.prepare = [&] {
    sync();
    flashattn::ForwardArgs f;
    f.q = args.q, f.k = args.k, f.v = args.v, f.cu_seqlens_q = args.cu_seqlens_q, f.cu_seqlens_k = args.cu_seqlens_k;
    f.out = args.out, f.lse = args.lse, f.options = args.options;  // the reference only reads them
    try {
      ref::Output o = ref::forward(f, ref::Precision::f64);
      write_values(*find(c, "out"), o.out);
      write_values(*find(c, "lse"), o.lse);
    } catch (const flashattn::Error&) {
    }
  };
  run.reference = [&] {
    sync();
    exact = ref::backward(args, ref::Precision::f64);
    plain = ref::backward(args, ref::Precision::same_as_input);
  };
  const bool via_c = in.chance(1, 4);
  run.call = [&] { sync(), via_c ? c_abi::backward(args) : flashattn::backward(args); };
  // The rule for gradients; in f32 also 1e-4, absolute and relative to the largest gradient. A
  // backward starts from the forward's stored lse and out, which the plain implementation does not:
  // half an ulp of |lse| (1.9e-6 at 30, with large scales) is a relative error of that size in every
  // P = exp(S - lse), and D = rowsum(dO o O) cancels against dO V^T to a rounding error that grows
  // with the terms, not the gradient (all-zero gradients with one key, or one broadcast V row)
  // where the plain computation, with an O of its own, may cancel exactly. In 16 bits that D carries
  // O's storage rounding, up to u * sum |dO o O| per row (u = 2^-8 bf16, 2^-11 f16), which reaches
  // dQ and dK times the scale and |K| or |Q|: the plain computation can again cancel exactly (every
  // key the same, a broadcast K), so that term joins the bound too. In f32 the same term with u =
  // 2^-24 sqrt(d): D sums its d products in another order than dO V^T does (a sharp softmax over one
  // key, scale 1, d = 256, exceeded the fixed 1e-4 alone by 13% in dK). The f64 cases (the same
  // engine code) hold the plain rule.
  run.check = [&]() -> std::string {
    // out and lse that overlap themselves (a mutated stride) cannot hold the forward's results: the
    // call must stay within its tensors, but its gradients are not those of the reference.
    if (self_overlapping(args.out) || self_overlapping(args.lse)) return "";
    sync();  // args' copies of the views held device pointers during a GPU call
    const Covered q_rows = covered(args.cu_seqlens_q), k_rows = covered(args.cu_seqlens_k);
    double d_rounding = 0;  // D's rounding (above), as it reaches dQ and dK
    if (s.dtype != DType::f64) {
      const std::vector<double> o = values(args.out), dout = values(args.dout);
      const std::vector<double> q = values(args.q), k = values(args.k);
      double row_max = 0, qk_max = 0;
      for (size_t r = 0; r * size_t(s.d) < o.size(); ++r) {
        double sum = 0;
        for (size_t x = r * size_t(s.d); x < (r + 1) * size_t(s.d); ++x)
          if (std::isfinite(o[x] * dout[x])) sum += std::fabs(o[x] * dout[x]);
        row_max = std::max(row_max, sum);
      }
      for (const auto* t : {&q, &k})
        for (double x : *t) qk_max = std::max(qk_max, std::fabs(x));
      const double scale =
          args.options.softmax_scale > 0 ? args.options.softmax_scale : 1 / std::sqrt(double(s.d));
      const double u = s.dtype == DType::bf16  ? 0x1p-8
                       : s.dtype == DType::f16 ? 0x1p-11
                                               : 0x1p-24 * std::sqrt(double(s.d));
      d_rounding = u * row_max * scale * qk_max;
    }
    for (auto [got, want, base, name, rows] :
         {std::tuple{&args.dq, &exact.dq, &plain.dq, "dq", q_rows}, {&args.dk, &exact.dk, &plain.dk, "dk", k_rows},
          {&args.dv, &exact.dv, &plain.dv, "dv", k_rows}}) {
      std::vector<double> now = values(*got);
      const int64_t per_row = got->shape[1] * got->shape[2];
      if (std::string r = untouched_outside(now, *want, *base, rows, per_row, 0, name); !r.empty()) return r;
      double g_max = 0;
      for (double x : *want) g_max = std::max(g_max, std::fabs(x));
      const double err = fa_test::max_abs_diff(now, *want), plain_err = fa_test::max_abs_diff(*base, *want);
      const double bound = 3 * (plain_err + d_rounding) + fa_test::default_atol(s.dtype) +
                           (s.dtype == DType::f32 ? 1e-4 * (1 + g_max) : 0);
      if (!(err <= bound))
        return std::string(name) + ": max error " + std::to_string(err) + " exceeds " + std::to_string(bound) +
               " (3 x plain error " + std::to_string(plain_err) + " + atol; largest gradient " +
               std::to_string(g_max) + ")";
    }
    return "";
  };
  return conclude(in, c, via_c ? "backward (C ABI)" : "backward", run, rng);
}

// A random order of n page ids, from the bytes.
std::vector<int32_t> shuffled(ByteSource& in, int64_t n) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t(i);
  for (int64_t i = n - 1; i > 0; --i) std::swap(ids[size_t(i)], ids[size_t(in.below(i + 1))]);
  return ids;
}

std::string fuzz_decode(ByteSource& in, std::mt19937& rng) {
  Case c;
  flashattn::DecodeArgs args;
  const Dims s = gen_dims(in);
  const int64_t batch = in.in(1, 3), sn = in.in(1, 4);
  const bool append = in.chance(1, 2), paged = in.chance(2, 3);
  std::vector<int32_t> lens;
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; ++b) {
    lens.push_back(int32_t(in.pick<int64_t>({0, 1, in.in(0, 40)})));
    longest = std::max<int64_t>(longest, lens.back() + (append ? sn : 0));
  }
  std::vector<int32_t> table;
  int64_t pages_per_seq = 0;
  if (paged) {
    const int64_t page = in.pick<int64_t>({1, 2, 3, 16});
    pages_per_seq = (longest + page - 1) / page + in.below(2);
    const int64_t num_pages = batch * pages_per_seq + in.below(3);
    std::vector<int32_t> ids = shuffled(in, num_pages);
    // Slots past what a sequence uses hold garbage: the API reads only the pages the lengths use.
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < pages_per_seq; ++j) {
        const bool used = j * page < lens[size_t(b)] + (append ? sn : 0);
        table.push_back(used ? ids[size_t(b * pages_per_seq + j)]
                             : in.pick<int32_t>({-1, int32_t(num_pages), 1 << 30, ids[0]}));
      }
    args.k_cache = make_view(in, s.dtype, {num_pages, page, s.hkv, s.d}, false);
  } else {
    args.k_cache = make_view(in, s.dtype, {batch, longest + in.below(3), s.hkv, s.d}, false);
  }
  args.v_cache = args.k_cache;
  set_strides(in, args.v_cache, false);
  args.q = make_view(in, s.dtype, {batch, sn, s.hq, s.d}, true);
  args.out = args.q;
  set_strides(in, args.out, false);
  c.add("q", Role::input, args.q);
  c.add("k_cache", append ? Role::inout : Role::input, args.k_cache);
  c.add("v_cache", append ? Role::inout : Role::input, args.v_cache);
  if (append) {
    args.k_new = make_view(in, s.dtype, {batch, sn, s.hkv, s.d}, true);
    args.v_new = make_view(in, s.dtype, {batch, sn, s.hkv, s.d}, true);
    c.add("k_new", Role::input, args.k_new);
    c.add("v_new", Role::input, args.v_new);
  }
  args.cache_seqlens = index_view({batch});
  c.add("cache_seqlens", Role::index, args.cache_seqlens, lens);
  if (paged) {
    args.block_table = index_view({batch, pages_per_seq});
    c.add("block_table", Role::index, args.block_table, table);
  }
  c.add("out", Role::output, args.out);
  if (in.chance(2, 3)) {
    args.lse = make_view(in, lse_type(s.dtype), {batch, s.hq, sn}, false);
    c.add("lse", Role::output, args.lse);
  }
  gen_options(in, args.options);
  args.num_splits = in.pick<int32_t>({0, 1, 2, int32_t(in.in(1, 64))});
  c.options = &args.options;
  c.num_splits = &args.num_splits;
  for (int m = mutation_count(in); m > 0; --m) mutate_views(in, c);
  const bool planned = in.chance(1, 4);

  // The cache row (page * page_size + slot) of token t of sequence b, for a validated problem.
  auto row_of = [&](const flashattn::core::DecodeParams& p, int64_t b, int64_t t) -> int64_t {
    if (!p.paged) return b * p.page_size + t;
    const int32_t id = p.block_table[b * p.block_table_row_stride + (t / p.page_size) * p.block_table_col_stride];
    return id * p.page_size + t % p.page_size;
  };
  auto cache_offset = [](const TensorView& v, int64_t row, int64_t h, int64_t e) {
    return (row / v.shape[1]) * v.stride[0] + (row % v.shape[1]) * v.stride[1] + h * v.stride[2] + e * v.stride[3];
  };
  ref::Output exact, plain;
  Run run;
  run.validate = [&] { flashattn::api::validate_decode(args); };
  // Every cache row no sequence holds is NaN, so a read past a length shows in the results. Only
  // for a valid problem (an invalid one must be rejected, so its cache contents do not matter).
  run.prepare = [&] {
    flashattn::core::DecodeParams p;
    try {
      p = flashattn::api::validate_decode(args);
    } catch (const flashattn::Error&) {
      return;
    }
    for (const char* name : {"k_cache", "v_cache"}) {
      Tensor& t = *find(c, name);
      const TensorView& v = *t.view;
      if (v.data != t.bytes.get() || !t.size || self_overlapping(v)) continue;  // a broadcast row is live
      std::vector<bool> live(size_t(v.shape[0] * v.shape[1]), false);
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t tok = 0; tok < p.cache_seqlens[b * p.cache_seqlens_stride]; ++tok)
          live[size_t(row_of(p, b, tok))] = true;
      for (int64_t r = 0; r < int64_t(live.size()); ++r)
        if (!live[size_t(r)])
          for (int64_t h = 0; h < v.shape[2]; ++h)
            for (int64_t e = 0; e < v.shape[3]; ++e)
              store(*t.view, cache_offset(v, r, h, e), std::numeric_limits<double>::quiet_NaN());
    }
  };
  run.reference = [&] {
    exact = ref::decode(args, ref::Precision::f64);
    plain = ref::decode(args, ref::Precision::same_as_input);
  };
  const bool via_c = !planned && in.chance(1, 3);
  run.call = [&] {
    if (via_c) return c_abi::decode(args);
    if (!planned) return flashattn::decode(args);
    flashattn::DecodePlan plan = flashattn::plan_decode(args);
    // The workspace of a GPU run: device memory of exactly the plan's size (none on the CPU).
    void* ws = g_on_gpu ? gpu_alloc(size_t(plan.workspace_bytes)) : nullptr;
    try {
      flashattn::decode(args, plan, ws);
    } catch (const flashattn::Error&) {
      if (ws) gpu_free(ws);
      throw;
    }
    if (ws) gpu_free(ws);
  };
  // An accepted append wrote k_new / v_new at tokens [len, len + sn) of each sequence, nothing else.
  run.expected_inout = [&](Tensor& t, std::vector<unsigned char>& want) {
    const flashattn::core::DecodeParams p = flashattn::api::validate_decode(args);  // accepted: valid
    if (!p.append) return;  // k_new and v_new were dropped: the cache stays as it was
    const TensorView& cache = *t.view;
    const TensorView& src = std::string(t.name) == "k_cache" ? args.k_new : args.v_new;
    const int64_t esize = flashattn::dtype_size(cache.dtype);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t i = 0; i < p.seqlen_new; ++i) {
        const int64_t r = row_of(p, b, p.cache_seqlens[b * p.cache_seqlens_stride] + i);
        for (int64_t h = 0; h < p.heads_kv; ++h)
          for (int64_t e = 0; e < p.head_dim; ++e) {
            const int64_t from = b * src.stride[0] + i * src.stride[1] + h * src.stride[2] + e * src.stride[3];
            std::memcpy(want.data() + cache_offset(cache, r, h, e) * esize,
                        static_cast<const unsigned char*>(src.data) + from * esize, size_t(esize));
          }
      }
  };
  run.check = [&] {
    std::string r = rule(values(args.out), exact.out, plain.out, s.dtype, 2.0, "out");
    if (r.empty() && args.lse.rank) r = lse_rule(values(args.lse), exact.lse, plain.lse, s.dtype);
    return r;
  };
  return conclude(in, c, planned ? "decode (planned)" : via_c ? "decode (C ABI)" : "decode", run, rng);
}

std::string fuzz_merge(ByteSource& in, std::mt19937& rng) {
  Case c;
  flashattn::MergeArgs args;
  const DType dt = g_on_gpu ? in.pick<DType>({DType::f16, DType::bf16})
                            : in.pick<DType>({DType::f16, DType::bf16, DType::f32, DType::f64});
  const int64_t parts = in.in(1, 4), tokens = in.in(0, 5), heads = in.in(1, 3), d = in.in(1, 80);
  args.o_parts = make_view(in, dt, {parts, tokens, heads, d}, true);
  args.lse_parts = make_view(in, lse_type(dt), {parts, tokens, heads}, true);
  args.out = make_view(in, dt, {tokens, heads, d}, false);
  c.add("o_parts", Role::input, args.o_parts);
  c.add("lse_parts", Role::input, args.lse_parts);
  c.add("out", Role::output, args.out);
  if (in.chance(2, 3)) {
    args.lse = make_view(in, lse_type(dt), {tokens, heads}, false);
    c.add("lse", Role::output, args.lse);
  }
  args.options.num_threads = int32_t(in.below(4));
  c.options = &args.options;
  c.attention_options = false;
  for (int m = mutation_count(in); m > 0; --m) mutate_views(in, c);
  std::vector<double> want_o, want_lse;
  Run run;
  run.validate = [&] { flashattn::api::validate_merge(args); };
  // Parts scaled apart, a quarter of them empty (lse = -inf).
  run.prepare = [&] {
    Tensor& l = *find(c, "lse_parts");
    if (l.view->data != l.bytes.get() || !l.size) return;
    std::vector<double> v = values(*l.view);
    for (double& x : v) x = rng() % 4 == 0 ? -std::numeric_limits<double>::infinity() : 4 * x;
    write_values(l, v);
  };
  // The merge in double: weights exp(lse_p - max), an all-empty row gives 0 and -inf.
  run.reference = [&] {
    const flashattn::core::MergeParams mp = flashattn::api::validate_merge(args);  // the sizes after mutations
    const int64_t parts = mp.parts, rows = mp.tokens * mp.heads, d = mp.head_dim;
    const std::vector<double> o = values(args.o_parts), l = values(args.lse_parts);
    want_o.assign(size_t(rows * d), 0.0);
    want_lse.assign(size_t(rows), -std::numeric_limits<double>::infinity());
    for (int64_t r = 0; r < rows; ++r) {
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t p = 0; p < parts; ++p) m = std::max(m, l[size_t(p * rows + r)]);
      if (m == -std::numeric_limits<double>::infinity()) continue;
      double sum = 0;
      for (int64_t p = 0; p < parts; ++p) {
        const double w = std::exp(l[size_t(p * rows + r)] - m);
        sum += w;
        for (int64_t e = 0; e < d; ++e) want_o[size_t(r * d + e)] += w * o[size_t((p * rows + r) * d + e)];
      }
      for (int64_t e = 0; e < d; ++e) want_o[size_t(r * d + e)] /= sum;
      want_lse[size_t(r)] = m + std::log(sum);
    }
  };
  const bool via_c = in.chance(1, 4);
  run.call = [&] { via_c ? c_abi::merge_states(args) : flashattn::merge_states(args); };
  run.check = [&]() -> std::string {
    // The dtype after mutations: a mutation may turn both out and o_parts into another type.
    const DType odt = args.out.dtype;
    const double tol = odt == DType::f64 ? 1e-12 : odt == DType::f32 ? 1e-5 : odt == DType::f16 ? 1.0 / 1024 : 1.0 / 128;
    const std::vector<double> got = values(args.out);
    for (size_t i = 0; i < got.size(); ++i)
      if (!(std::fabs(got[i] - want_o[i]) <= tol * (1 + std::fabs(want_o[i]))))
        return "out[" + std::to_string(i) + "] = " + std::to_string(got[i]) + ", want " + std::to_string(want_o[i]);
    if (!args.lse.rank) return "";
    const double ltol = args.lse.dtype == DType::f64 ? 1e-12 : 1e-5;
    const std::vector<double> lse = values(args.lse);
    for (size_t i = 0; i < lse.size(); ++i)
      if (!(lse[i] == want_lse[i] || std::fabs(lse[i] - want_lse[i]) <= ltol * (1 + std::fabs(want_lse[i]))))
        return "lse[" + std::to_string(i) + "] = " + std::to_string(lse[i]) + ", want " + std::to_string(want_lse[i]);
    return "";
  };
  return conclude(in, c, via_c ? "merge_states (C ABI)" : "merge_states", run, rng);
}

}  // namespace

std::string run_case(const uint8_t* data, size_t size, bool on_gpu) {
  g_on_gpu = on_gpu;
  g_pad_unit = on_gpu ? 8 : 1;
  ByteSource in(data, size);
  std::mt19937 rng(uint32_t(in.byte() | in.byte() << 8));
  switch (in.below(4)) {
    case 0: return fuzz_forward(in, rng);
    case 1: return fuzz_backward(in, rng);
    case 2: return fuzz_decode(in, rng);
    default: return fuzz_merge(in, rng);
  }
}

std::string run_fixed_cases(uint32_t seed, int count, bool on_gpu) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(96);
  std::string broken;
  int failures = 0;
  for (int i = 0; i < count && failures < kMaxReported; ++i) {
    for (uint8_t& b : bytes) b = uint8_t(rng());
    const std::string why = run_case(bytes.data(), bytes.size(), on_gpu);
    if (!why.empty()) broken += (failures++ ? "\n" : "") + ("case " + std::to_string(i) + ": " + why);
  }
  return broken;
}

}  // namespace fa_fuzz
