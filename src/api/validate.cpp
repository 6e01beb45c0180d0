#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "api/backends.h"

namespace flashattn::api {
namespace {

std::string shape_str(const TensorView& t) {
  std::ostringstream s;
  s << "[";
  for (int i = 0; i < std::min(t.rank, kMaxRank); ++i) s << (i ? ", " : "") << t.shape[i];
  s << "]";
  return s.str();
}

// Collects the checks of one operation; every failure names the operation and the argument.
class Checker {
 public:
  explicit Checker(const char* op) : op_(op) {}

  [[noreturn]] void fail(const std::string& arg, const std::string& msg) const {
    throw Error(Status::invalid_argument, std::string(op_) + ": argument '" + arg + "': " + msg);
  }

  void require(const TensorView& t, const char* name) const {
    if (!t.defined()) fail(name, "is required but absent (rank 0)");
  }

  // Rank, shape (-1 = any), non-negative strides, non-null data when non-empty.
  void tensor(const TensorView& t, const char* name, std::initializer_list<int64_t> shape,
              const char* layout) const {
    tensor(t, name, shape.begin(), int(shape.size()), layout);
  }
  void tensor(const TensorView& t, const char* name, const int64_t* shape, int rank, const char* layout) const {
    require(t, name);
    if (t.rank < 1 || t.rank > kMaxRank) fail(name, "rank " + std::to_string(t.rank) + " is out of range");
    if (t.rank != rank)
      fail(name, "expected rank " + std::to_string(rank) + " " + layout + ", got rank " + std::to_string(t.rank) + " " +
                     shape_str(t));
    for (int i = 0; i < rank; ++i) {
      if (t.shape[i] < 0) fail(name, "shape " + shape_str(t) + " has a negative size");
      if (shape[i] >= 0 && t.shape[i] != shape[i])
        fail(name, "expected shape " + expected(shape, rank) + " " + layout + ", got " + shape_str(t));
      if (t.stride[i] < 0) fail(name, "negative strides are not supported, got stride[" + std::to_string(i) + "] = " +
                                          std::to_string(t.stride[i]));
    }
    addressable(t, name);
    if (t.numel() > 0 && t.data == nullptr) fail(name, "data pointer is null for a non-empty tensor " + shape_str(t));
  }

  // The element count and the byte span of a non-empty view must be int64 numbers (every index the
  // engines compute is one), so shapes and strides that overflow are an error, not a wrap-around.
  void addressable(const TensorView& t, const char* name) const {
    for (int i = 0; i < t.rank; ++i)
      if (t.shape[i] == 0) return;  // empty: nothing is addressed
    int64_t count = 1, last = 0;
    bool overflow = false;
    for (int i = 0; i < t.rank; ++i) {
      int64_t reach = 0;
      overflow |= __builtin_mul_overflow(count, t.shape[i], &count);
      overflow |= __builtin_mul_overflow(t.shape[i] - 1, t.stride[i], &reach);
      overflow |= __builtin_add_overflow(last, reach, &last);
    }
    int64_t bytes = 0;
    overflow |= __builtin_add_overflow(last, 1, &last);  // elements spanned
    overflow |= __builtin_mul_overflow(last, std::max<int64_t>(dtype_size(t.dtype), 1), &bytes);
    if (overflow)
      fail(name, "shape " + shape_str(t) + " and its strides address more than 2^63 elements or bytes");
  }

  void last_dim_contiguous(const TensorView& t, const char* name) const {
    if (t.shape[t.rank - 1] > 1 && t.stride[t.rank - 1] != 1)
      fail(name, "the last dimension must be contiguous (stride 1), got stride " + std::to_string(t.stride[t.rank - 1]));
  }

  // Outputs must not write one element twice: with the dimensions sorted by stride, each stride
  // must step past the whole span of the smaller ones (a zero stride never does). This also
  // rejects layouts such as heads overlapping within a row (head stride < head_dim).
  void no_self_overlap(const TensorView& t, const char* name) const {
    if (t.numel() == 0) return;  // nothing is written (a zero-size dimension may carry any stride)
    int dims[kMaxRank];
    int n = 0;
    for (int i = 0; i < t.rank; ++i)
      if (t.shape[i] > 1) dims[n++] = i;
    for (int j = 1; j < n; ++j)  // insertion sort by stride: at most four dimensions
      for (int i = j; i > 0 && t.stride[dims[i]] < t.stride[dims[i - 1]]; --i) std::swap(dims[i], dims[i - 1]);
    int64_t span = 0;  // the largest offset the smaller strides reach
    for (int j = 0; j < n; ++j) {
      int i = dims[j];
      if (t.stride[i] <= span)
        fail(name, "is an output, but its strides make elements overlap: stride[" + std::to_string(i) + "] = " +
                       std::to_string(t.stride[i]) + " does not step past the " + std::to_string(span + 1) +
                       " elements spanned by the smaller strides");
      span += (t.shape[i] - 1) * t.stride[i];
    }
  }

  void dtype(const TensorView& t, const char* name, DType want) const {
    if (t.dtype != want)
      fail(name, std::string("expected dtype ") + dtype_name(want) + ", got " + dtype_name(t.dtype));
  }

  void float_dtype(const TensorView& t, const char* name) const {
    if (t.dtype != DType::f16 && t.dtype != DType::bf16 && t.dtype != DType::f32 && t.dtype != DType::f64)
      fail(name, std::string("expected a floating dtype (f16, bf16, f32, f64), got ") + dtype_name(t.dtype));
    if (t.dtype == DType::f64 && t.device != DeviceType::cpu)
      fail(name, "f64 is supported on the CPU only");
  }

  void same_device(const TensorView& t, const char* name, const TensorView& ref, const char* ref_name) const {
    if (!t.defined()) return;
    if (t.device != ref.device || (t.device == DeviceType::cuda && t.device_index != ref.device_index))
      fail(name, std::string("is on ") + device_str(t) + " but '" + ref_name + "' is on " + device_str(ref));
  }

  // Two tensors alias when their byte spans overlap (a conservative test on the address range).
  void no_alias(const TensorView& out, const char* out_name, const TensorView& in, const char* in_name) const {
    if (!out.defined() || !in.defined() || out.numel() == 0 || in.numel() == 0) return;
    auto span = [](const TensorView& t) {
      int64_t last = 0;
      for (int i = 0; i < t.rank; ++i) last += (t.shape[i] - 1) * t.stride[i];
      auto b = reinterpret_cast<uintptr_t>(t.data);
      return std::pair<uintptr_t, uintptr_t>(b, b + uintptr_t((last + 1) * dtype_size(t.dtype)));
    };
    auto [a0, a1] = span(out);
    auto [b0, b1] = span(in);
    if (a0 < b1 && b0 < a1) fail(out_name, std::string("aliases '") + in_name + "': outputs must not overlap inputs or other outputs");
  }

 private:
  static std::string expected(const int64_t* shape, int rank) {
    std::ostringstream s;
    s << "[";
    for (int i = 0; i < rank; ++i) {
      s << (i ? ", " : "");
      if (shape[i] < 0) s << "*"; else s << shape[i];
    }
    s << "]";
    return s.str();
  }
  static std::string device_str(const TensorView& t) {
    return t.device == DeviceType::cpu ? std::string("cpu") : "cuda:" + std::to_string(t.device_index);
  }
  const char* op_;
};

void check_head_dim(const Checker& c, const char* name, int64_t d) {
  if (d < 32 || d > 256 || d % 8 != 0)
    c.fail(name, "head_dim must be a multiple of 8 in [32, 256], got " + std::to_string(d));
}

// Reads an i32 index array (host or device) into a host vector.
std::vector<int32_t> read_indices(const Checker& c, const TensorView& t, const char* name) {
  c.dtype(t, name, DType::i32);
  int64_t n = t.numel();
  std::vector<int32_t> host(size_t(n > 0 ? n : 0));
  if (n == 0) return host;
  bool contiguous = true;
  int64_t expect = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    if (t.shape[i] > 1 && t.stride[i] != expect) contiguous = false;
    expect *= t.shape[i];
  }
  if (!contiguous) c.fail(name, "index arrays must be contiguous");
  if (t.device == DeviceType::cpu) {
    std::memcpy(host.data(), t.data, size_t(n) * 4);
  } else {
    cuda::copy_to_host(host.data(), t.data, n * 4, t.device_index);
  }
  return host;
}

// Options common to every attention operation; fills the shape's scale, mask and flags.
void apply_options(const Checker& c, const AttnOptions& o, int64_t head_dim, core::AttnShape& s) {
  // Kernels fold the scale into the exponent and take the row max on unscaled scores, which is
  // only right for a positive scale (a non-positive one is not attention anyway).
  if (!std::isfinite(o.softmax_scale) || o.softmax_scale < 0.f)
    c.fail("options.softmax_scale", "must be finite and > 0 (0 = 1/sqrt(head_dim)), got " + std::to_string(o.softmax_scale));
  if (!(o.softcap >= 0.f) || !std::isfinite(o.softcap)) c.fail("options.softcap", "must be finite and >= 0 (0 = off), got " + std::to_string(o.softcap));
  if (o.window_left < -1) c.fail("options.window_left", "must be >= -1 (-1 = unbounded), got " + std::to_string(o.window_left));
  if (o.window_right < -1) c.fail("options.window_right", "must be >= -1 (-1 = unbounded), got " + std::to_string(o.window_right));
  if (o.causal && o.window_right > 0) c.fail("options.window_right", "must be -1 or 0 when causal (causal sees no future keys), got " + std::to_string(o.window_right));
  if (o.num_threads < 0) c.fail("options.num_threads", "must be >= 0 (0 = all cores)");
  s.scale = o.softmax_scale != 0.f ? o.softmax_scale : float(1.0 / std::sqrt(double(head_dim)));
  s.softcap = o.softcap;
  s.causal = o.causal;
  s.window_left = o.window_left;
  s.window_right = o.causal ? 0 : o.window_right;
  s.num_threads = o.num_threads;
  s.stream = o.stream;
}

// The strides the engines compute offsets with: those of a tensor with no elements are 0. Its
// strides address nothing, so the validation let them be anything, and an engine that still forms
// a row's base offset (merge_states with no parts does, for each output row) must not overflow.
int64_t stride_used(const TensorView& t, int i) { return t.numel() == 0 ? 0 : t.stride[i]; }

core::Strides token_strides(const TensorView& t, bool varlen) {
  core::Strides s;
  if (varlen) {
    s.batch = 0;
    s.row = stride_used(t, 0);
    s.head = stride_used(t, 1);
  } else {
    s.batch = stride_used(t, 0);
    s.row = stride_used(t, 1);
    s.head = stride_used(t, 2);
  }
  return s;
}

core::LseStrides lse_strides(const TensorView& t, bool varlen) {
  core::LseStrides s;
  if (!t.defined()) return s;
  if (varlen) {
    s.batch = 0;
    s.head = stride_used(t, 0);
    s.row = stride_used(t, 1);
  } else {
    s.batch = stride_used(t, 0);
    s.head = stride_used(t, 1);
    s.row = stride_used(t, 2);
  }
  return s;
}

DType lse_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

// q/k/v (+ optional lse and cu_seqlens) of a forward or backward problem.
core::AttnShape check_attention_inputs(const Checker& c, const TensorView& q, const TensorView& k,
                                       const TensorView& v, const TensorView& cu_q, const TensorView& cu_k,
                                       const AttnOptions& opts) {
  c.require(q, "q");
  core::AttnShape s;
  bool varlen = cu_q.defined() || cu_k.defined();
  if (varlen && !(cu_q.defined() && cu_k.defined()))
    c.fail(cu_q.defined() ? "cu_seqlens_k" : "cu_seqlens_q", "varlen batches need both cu_seqlens_q and cu_seqlens_k");
  if (varlen) {
    c.tensor(q, "q", {-1, -1, -1}, "[total_q, heads_q, head_dim] (varlen)");
    c.tensor(k, "k", {-1, -1, q.shape[2]}, "[total_k, heads_kv, head_dim] (varlen)");
    c.tensor(v, "v", {k.shape[0], k.shape[1], q.shape[2]}, "[total_k, heads_kv, head_dim] (varlen)");
  } else {
    c.tensor(q, "q", {-1, -1, -1, -1}, "[batch, seqlen_q, heads_q, head_dim]");
    c.tensor(k, "k", {q.shape[0], -1, -1, q.shape[3]}, "[batch, seqlen_k, heads_kv, head_dim]");
    c.tensor(v, "v", {q.shape[0], k.shape[1], k.shape[2], q.shape[3]}, "[batch, seqlen_k, heads_kv, head_dim]");
  }
  c.float_dtype(q, "q");
  c.dtype(k, "k", q.dtype);
  c.dtype(v, "v", q.dtype);
  c.same_device(k, "k", q, "q");
  c.same_device(v, "v", q, "q");
  for (auto [t, n] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) c.last_dim_contiguous(*t, n);
  int r = q.rank;
  s.head_dim = q.shape[r - 1];
  s.heads_q = q.shape[r - 2];
  s.heads_kv = k.shape[r - 2];
  check_head_dim(c, "q", s.head_dim);
  if (s.heads_q < 1) c.fail("q", "needs at least one head");
  if (s.heads_kv < 1 || s.heads_q % s.heads_kv != 0)
    c.fail("k", "heads_q (" + std::to_string(s.heads_q) + ") must be a positive multiple of heads_kv (" +
                    std::to_string(s.heads_kv) + ")");
  s.dtype = q.dtype;
  apply_options(c, opts, s.head_dim, s);
  if (varlen) {
    c.tensor(cu_q, "cu_seqlens_q", {-1}, "[batch + 1]");
    c.tensor(cu_k, "cu_seqlens_k", {cu_q.shape[0]}, "[batch + 1]");
    c.same_device(cu_q, "cu_seqlens_q", q, "q");
    c.same_device(cu_k, "cu_seqlens_k", q, "q");
    if (cu_q.shape[0] < 2) c.fail("cu_seqlens_q", "needs batch + 1 >= 2 entries");
    s.batch = cu_q.shape[0] - 1;
    s.total_q = q.shape[0];
    s.total_k = k.shape[0];
    int64_t max_len[2] = {0, 0};
    const TensorView* cus[2] = {&cu_q, &cu_k};
    const char* names[2] = {"cu_seqlens_q", "cu_seqlens_k"};
    int64_t totals[2] = {s.total_q, s.total_k};
    for (int w = 0; w < 2; ++w) {
      std::vector<int32_t> cu = read_indices(c, *cus[w], names[w]);
      if (cu[0] < 0) c.fail(names[w], "entry 0 must be >= 0, got " + std::to_string(cu[0]));
      for (int64_t b = 0; b < s.batch; ++b) {
        if (cu[b + 1] < cu[b])
          c.fail(names[w], "must be non-decreasing, but entry " + std::to_string(b + 1) + " (" +
                               std::to_string(cu[b + 1]) + ") < entry " + std::to_string(b) + " (" + std::to_string(cu[b]) + ")");
        max_len[w] = std::max<int64_t>(max_len[w], cu[b + 1] - cu[b]);
      }
      if (cu[s.batch] > totals[w])
        c.fail(names[w], "last entry " + std::to_string(cu[s.batch]) + " is past the end of the packed tensor (" +
                             std::to_string(totals[w]) + " rows)");
    }
    s.seqlen_q = max_len[0];
    s.seqlen_k = max_len[1];
    s.cu_seqlens_q = static_cast<const int32_t*>(cu_q.data);
    s.cu_seqlens_k = static_cast<const int32_t*>(cu_k.data);
  } else {
    s.batch = q.shape[0];
    s.seqlen_q = q.shape[1];
    s.seqlen_k = k.shape[1];
    s.total_q = s.batch * s.seqlen_q;
    s.total_k = s.batch * s.seqlen_k;
  }
  return s;
}

void check_lse(const Checker& c, const TensorView& lse, const char* name, const core::AttnShape& s,
               const TensorView& q) {
  if (s.varlen())
    c.tensor(lse, name, {s.heads_q, s.total_q}, "[heads_q, total_q] (varlen)");
  else
    c.tensor(lse, name, {s.batch, s.heads_q, s.seqlen_q}, "[batch, heads_q, seqlen_q]");
  c.dtype(lse, name, lse_dtype(s.dtype));
  c.same_device(lse, name, q, "q");
}

void check_like(const Checker& c, const TensorView& t, const char* name, const TensorView& ref, const char* ref_name) {
  const std::string layout = std::string("(the shape of '") + ref_name + "')";
  c.tensor(t, name, ref.shape, ref.rank, layout.c_str());
  c.dtype(t, name, ref.dtype);
  c.same_device(t, name, ref, ref_name);
  c.last_dim_contiguous(t, name);
}

}  // namespace

core::ForwardParams validate_forward(const ForwardArgs& a) {
  Checker c("forward");
  core::ForwardParams p;
  static_cast<core::AttnShape&>(p) = check_attention_inputs(c, a.q, a.k, a.v, a.cu_seqlens_q, a.cu_seqlens_k, a.options);
  check_like(c, a.out, "out", a.q, "q");
  c.no_self_overlap(a.out, "out");
  if (a.lse.defined()) {
    check_lse(c, a.lse, "lse", p, a.q);
    c.no_self_overlap(a.lse, "lse");
  }
  for (auto [o, on] : {std::pair{&a.out, "out"}, {&a.lse, "lse"}})
    for (auto [i, in] : {std::pair{&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"}, {&a.cu_seqlens_q, "cu_seqlens_q"},
                         {&a.cu_seqlens_k, "cu_seqlens_k"}})
      c.no_alias(*o, on, *i, in);
  c.no_alias(a.lse, "lse", a.out, "out");
  bool varlen = p.varlen();
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.out = a.out.data;
  p.lse = a.lse.defined() ? a.lse.data : nullptr;
  p.q_s = token_strides(a.q, varlen);
  p.k_s = token_strides(a.k, varlen);
  p.v_s = token_strides(a.v, varlen);
  p.o_s = token_strides(a.out, varlen);
  p.lse_s = lse_strides(a.lse, varlen);
  return p;
}

core::BackwardParams validate_backward(const BackwardArgs& a) {
  Checker c("backward");
  core::BackwardParams p;
  static_cast<core::AttnShape&>(p) = check_attention_inputs(c, a.q, a.k, a.v, a.cu_seqlens_q, a.cu_seqlens_k, a.options);
  check_like(c, a.out, "out", a.q, "q");
  check_like(c, a.dout, "dout", a.q, "q");
  c.require(a.lse, "lse");
  check_lse(c, a.lse, "lse", p, a.q);
  check_like(c, a.dq, "dq", a.q, "q");
  check_like(c, a.dk, "dk", a.k, "k");
  check_like(c, a.dv, "dv", a.v, "v");
  std::initializer_list<std::pair<const TensorView*, const char*>> outs = {{&a.dq, "dq"}, {&a.dk, "dk"}, {&a.dv, "dv"}};
  std::initializer_list<std::pair<const TensorView*, const char*>> ins = {
      {&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"}, {&a.out, "out"}, {&a.dout, "dout"}, {&a.lse, "lse"},
      {&a.cu_seqlens_q, "cu_seqlens_q"}, {&a.cu_seqlens_k, "cu_seqlens_k"}};
  for (auto [o, on] : outs) {
    c.no_self_overlap(*o, on);
    for (auto [i, in] : ins) c.no_alias(*o, on, *i, in);
  }
  c.no_alias(a.dq, "dq", a.dk, "dk");
  c.no_alias(a.dq, "dq", a.dv, "dv");
  c.no_alias(a.dk, "dk", a.dv, "dv");
  bool varlen = p.varlen();
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.out = a.out.data;
  p.lse = a.lse.data;
  p.dout = a.dout.data;
  p.dq = a.dq.data;
  p.dk = a.dk.data;
  p.dv = a.dv.data;
  p.q_s = token_strides(a.q, varlen);
  p.k_s = token_strides(a.k, varlen);
  p.v_s = token_strides(a.v, varlen);
  p.o_s = token_strides(a.out, varlen);
  p.do_s = token_strides(a.dout, varlen);
  p.dq_s = token_strides(a.dq, varlen);
  p.dk_s = token_strides(a.dk, varlen);
  p.dv_s = token_strides(a.dv, varlen);
  p.lse_s = lse_strides(a.lse, varlen);
  p.deterministic = a.deterministic;
  return p;
}

core::DecodeParams validate_decode_shapes(const DecodeArgs& a) {
  Checker c("decode");
  core::DecodeParams p;
  c.tensor(a.q, "q", {-1, -1, -1, -1}, "[batch, seqlen_new, heads_q, head_dim]");
  c.float_dtype(a.q, "q");
  c.last_dim_contiguous(a.q, "q");
  p.batch = a.q.shape[0];
  p.seqlen_new = a.q.shape[1];
  p.heads_q = a.q.shape[2];
  p.head_dim = a.q.shape[3];
  check_head_dim(c, "q", p.head_dim);
  p.paged = a.block_table.defined();
  const char* cache_layout = p.paged ? "[num_pages, page_size, heads_kv, head_dim] (paged)"
                                     : "[batch, capacity, heads_kv, head_dim] (contiguous)";
  c.tensor(a.k_cache, "k_cache", {p.paged ? -1 : p.batch, -1, -1, p.head_dim}, cache_layout);
  c.tensor(a.v_cache, "v_cache", {a.k_cache.shape[0], a.k_cache.shape[1], a.k_cache.shape[2], p.head_dim}, cache_layout);
  for (auto [t, n] : {std::pair{&a.k_cache, "k_cache"}, {&a.v_cache, "v_cache"}}) {
    c.dtype(*t, n, a.q.dtype);
    c.same_device(*t, n, a.q, "q");
    c.last_dim_contiguous(*t, n);
  }
  p.heads_kv = a.k_cache.shape[2];
  if (p.heads_kv < 1 || p.heads_q % p.heads_kv != 0)
    c.fail("k_cache", "heads_q (" + std::to_string(p.heads_q) + ") must be a positive multiple of heads_kv (" +
                          std::to_string(p.heads_kv) + ")");
  core::AttnShape s;
  apply_options(c, a.options, p.head_dim, s);
  p.scale = s.scale;
  p.softcap = s.softcap;
  p.causal = s.causal;
  p.window_left = s.window_left;
  p.window_right = s.window_right;
  p.num_threads = s.num_threads;
  p.stream = s.stream;
  p.dtype = a.q.dtype;
  if (a.num_splits < 0 || a.num_splits > kMaxSplits)
    c.fail("num_splits", "must be in [0, " + std::to_string(kMaxSplits) + "] (0 = choose), got " + std::to_string(a.num_splits));
  p.num_splits = a.num_splits;

  p.append = a.k_new.defined() || a.v_new.defined();
  if (p.append) {
    if (!a.k_new.defined() || !a.v_new.defined())
      c.fail(a.k_new.defined() ? "v_new" : "k_new", "appending needs both k_new and v_new");
    for (auto [t, n] : {std::pair{&a.k_new, "k_new"}, {&a.v_new, "v_new"}}) {
      c.tensor(*t, n, {p.batch, p.seqlen_new, p.heads_kv, p.head_dim}, "[batch, seqlen_new, heads_kv, head_dim]");
      c.dtype(*t, n, a.q.dtype);
      c.same_device(*t, n, a.q, "q");
      c.last_dim_contiguous(*t, n);
    }
  }
  c.tensor(a.cache_seqlens, "cache_seqlens", {p.batch}, "[batch]");
  c.same_device(a.cache_seqlens, "cache_seqlens", a.q, "q");
  c.dtype(a.cache_seqlens, "cache_seqlens", DType::i32);
  if (p.paged) {
    c.tensor(a.block_table, "block_table", {p.batch, -1}, "[batch, max_pages_per_seq]");
    c.same_device(a.block_table, "block_table", a.q, "q");
    c.dtype(a.block_table, "block_table", DType::i32);
    p.num_pages = a.k_cache.shape[0];
    p.page_size = a.k_cache.shape[1];
    if (p.page_size < 1 || p.page_size > 1024)
      c.fail("k_cache", "page_size (dimension 1) must be in [1, 1024], got " + std::to_string(p.page_size));
    p.max_pages_per_seq = a.block_table.shape[1];
  } else {
    p.num_pages = p.batch;
    p.page_size = a.k_cache.shape[1];
    p.max_pages_per_seq = 1;
  }
  check_like(c, a.out, "out", a.q, "q");
  c.no_self_overlap(a.out, "out");
  if (a.lse.defined()) {
    c.tensor(a.lse, "lse", {p.batch, p.heads_q, p.seqlen_new}, "[batch, heads_q, seqlen_new]");
    c.dtype(a.lse, "lse", lse_dtype(p.dtype));
    c.same_device(a.lse, "lse", a.q, "q");
    c.no_self_overlap(a.lse, "lse");
  }
  std::initializer_list<std::pair<const TensorView*, const char*>> ins = {
      {&a.q, "q"}, {&a.k_cache, "k_cache"}, {&a.v_cache, "v_cache"}, {&a.k_new, "k_new"}, {&a.v_new, "v_new"},
      {&a.block_table, "block_table"}, {&a.cache_seqlens, "cache_seqlens"}};
  for (auto [i, in] : ins) {
    c.no_alias(a.out, "out", *i, in);
    c.no_alias(a.lse, "lse", *i, in);
  }
  c.no_alias(a.lse, "lse", a.out, "out");
  if (p.append) {
    for (auto [o, on] : {std::pair{&a.k_cache, "k_cache"}, {&a.v_cache, "v_cache"}}) {
      c.no_self_overlap(*o, on);
      for (auto [i, in] : {std::pair{&a.q, "q"}, {&a.k_new, "k_new"}, {&a.v_new, "v_new"},
                           {&a.block_table, "block_table"}, {&a.cache_seqlens, "cache_seqlens"}})
        c.no_alias(*o, on, *i, in);
    }
    c.no_alias(a.k_cache, "k_cache", a.v_cache, "v_cache");
  }

  p.q = a.q.data;
  p.k_cache = a.k_cache.data;
  p.v_cache = a.v_cache.data;
  p.block_table = p.paged ? static_cast<const int32_t*>(a.block_table.data) : nullptr;
  p.block_table_row_stride = p.paged ? stride_used(a.block_table, 0) : 0;
  p.block_table_col_stride = p.paged ? stride_used(a.block_table, 1) : 0;
  p.cache_seqlens = static_cast<const int32_t*>(a.cache_seqlens.data);
  p.cache_seqlens_stride = stride_used(a.cache_seqlens, 0);
  p.k_new = p.append ? a.k_new.data : nullptr;
  p.v_new = p.append ? a.v_new.data : nullptr;
  p.out = a.out.data;
  p.lse = a.lse.defined() ? a.lse.data : nullptr;
  p.q_s = token_strides(a.q, false);
  p.o_s = token_strides(a.out, false);
  if (p.append) {
    p.knew_s = token_strides(a.k_new, false);
    p.vnew_s = token_strides(a.v_new, false);
  }
  p.kc_page = stride_used(a.k_cache, 0);
  p.kc_row = stride_used(a.k_cache, 1);
  p.kc_head = stride_used(a.k_cache, 2);
  p.vc_page = stride_used(a.v_cache, 0);
  p.vc_row = stride_used(a.v_cache, 1);
  p.vc_head = stride_used(a.v_cache, 2);
  p.lse_s = lse_strides(a.lse, false);
  return p;
}

int64_t decode_capacity(const core::DecodeParams& p) { return p.paged ? p.max_pages_per_seq * p.page_size : p.page_size; }

namespace {

// With a paged cache, sequences may share pages (a common prefix), but a slot a sequence appends to
// must hold no other token, of another sequence or of its own through a page its table lists
// twice: the step appends before it attends, so that token would be overwritten. Checked per page
// the appends touch (at most batch * seqlen_new slots), against every page the sequences use.
void check_append_targets(const Checker& c, const core::DecodeParams& p, const std::vector<int32_t>& lens,
                          const std::vector<int32_t>& table) {
  struct Target {
    int64_t b, token;
  };
  std::unordered_map<int32_t, std::vector<Target>> written;  // page id -> the appends into it
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t t = lens[size_t(b)]; t < lens[size_t(b)] + p.seqlen_new; ++t)
      written[table[size_t(b * p.max_pages_per_seq + t / p.page_size)]].push_back({b, t});
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t end = lens[size_t(b)] + p.seqlen_new;  // tokens this sequence holds after its append
    for (int64_t j = 0; j * p.page_size < end; ++j) {
      auto hit = written.find(table[size_t(b * p.max_pages_per_seq + j)]);
      if (hit == written.end()) continue;
      for (const Target& w : hit->second) {
        const int64_t mine = j * p.page_size + w.token % p.page_size;  // b's token in that slot
        if ((w.b != b || mine != w.token) && mine < end)
          c.fail("block_table", "page " + std::to_string(hit->first) + " slot " + std::to_string(w.token % p.page_size) +
                                    " is where sequence " + std::to_string(w.b) + " appends its token " +
                                    std::to_string(w.token) + ", but it also holds token " + std::to_string(mine) +
                                    " of sequence " + std::to_string(b) + ": an appended slot must hold one token only");
      }
    }
  }
}

}  // namespace

int64_t validate_decode_indices(const DecodeArgs& a, const core::DecodeParams& p, int64_t max_cache_seqlen) {
  Checker c("decode");
  std::vector<int32_t> lens = read_indices(c, a.cache_seqlens, "cache_seqlens");
  std::vector<int32_t> table;
  if (p.paged) table = read_indices(c, a.block_table, "block_table");
  const int64_t capacity = decode_capacity(p);
  const int64_t extra = p.append ? p.seqlen_new : 0;
  int64_t longest = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    int64_t len = lens[size_t(b)];
    if (len < 0) c.fail("cache_seqlens", "entry " + std::to_string(b) + " is negative (" + std::to_string(len) + ")");
    if (len + extra > capacity)
      c.fail("cache_seqlens", "entry " + std::to_string(b) + " (" + std::to_string(len) + (p.append ? " + seqlen_new " + std::to_string(extra) : std::string()) +
                                  ") exceeds the cache capacity of " + std::to_string(capacity) + " tokens");
    if (max_cache_seqlen >= 0 && len > max_cache_seqlen)
      c.fail("cache_seqlens", "entry " + std::to_string(b) + " (" + std::to_string(len) +
                                  ") exceeds the plan's max_cache_seqlen " + std::to_string(max_cache_seqlen));
    if (p.paged) {
      int64_t pages = (len + extra + p.page_size - 1) / p.page_size;
      for (int64_t j = 0; j < pages; ++j) {
        int32_t id = table[size_t(b * p.max_pages_per_seq + j)];
        if (id < 0 || id >= p.num_pages)
          c.fail("block_table", "entry [" + std::to_string(b) + ", " + std::to_string(j) + "] = " + std::to_string(id) +
                                    " is not a page id in [0, " + std::to_string(p.num_pages) + ")");
      }
    }
    longest = std::max(longest, len);
  }
  if (p.paged && p.append) check_append_targets(c, p, lens, table);
  return longest;
}

core::DecodeParams validate_decode(const DecodeArgs& a) {
  core::DecodeParams p = validate_decode_shapes(a);
  validate_decode_indices(a, p);
  return p;
}

core::MergeParams validate_merge(const MergeArgs& a) {
  Checker c("merge_states");
  core::MergeParams p;
  c.tensor(a.o_parts, "o_parts", {-1, -1, -1, -1}, "[num_parts, tokens, heads, head_dim]");
  c.float_dtype(a.o_parts, "o_parts");
  c.last_dim_contiguous(a.o_parts, "o_parts");
  p.parts = a.o_parts.shape[0];
  p.tokens = a.o_parts.shape[1];
  p.heads = a.o_parts.shape[2];
  p.head_dim = a.o_parts.shape[3];
  p.dtype = a.o_parts.dtype;
  c.tensor(a.lse_parts, "lse_parts", {p.parts, p.tokens, p.heads}, "[num_parts, tokens, heads]");
  c.dtype(a.lse_parts, "lse_parts", lse_dtype(p.dtype));
  c.same_device(a.lse_parts, "lse_parts", a.o_parts, "o_parts");
  c.tensor(a.out, "out", {p.tokens, p.heads, p.head_dim}, "[tokens, heads, head_dim]");
  c.dtype(a.out, "out", p.dtype);
  c.same_device(a.out, "out", a.o_parts, "o_parts");
  c.last_dim_contiguous(a.out, "out");
  c.no_self_overlap(a.out, "out");
  if (a.lse.defined()) {
    c.tensor(a.lse, "lse", {p.tokens, p.heads}, "[tokens, heads]");
    c.dtype(a.lse, "lse", lse_dtype(p.dtype));
    c.same_device(a.lse, "lse", a.o_parts, "o_parts");
    c.no_self_overlap(a.lse, "lse");
  }
  if (a.options.num_threads < 0) c.fail("options.num_threads", "must be >= 0 (0 = all cores)");
  for (auto [o, on] : {std::pair{&a.out, "out"}, {&a.lse, "lse"}})
    for (auto [i, in] : {std::pair{&a.o_parts, "o_parts"}, {&a.lse_parts, "lse_parts"}}) c.no_alias(*o, on, *i, in);
  c.no_alias(a.lse, "lse", a.out, "out");
  p.o_parts = a.o_parts.data;
  p.lse_parts = a.lse_parts.data;
  p.out = a.out.data;
  p.lse = a.lse.defined() ? a.lse.data : nullptr;
  p.op_part = stride_used(a.o_parts, 0);
  p.op_token = stride_used(a.o_parts, 1);
  p.op_head = stride_used(a.o_parts, 2);
  p.lp_part = stride_used(a.lse_parts, 0);
  p.lp_token = stride_used(a.lse_parts, 1);
  p.lp_head = stride_used(a.lse_parts, 2);
  p.o_token = stride_used(a.out, 0);
  p.o_head = stride_used(a.out, 1);
  if (a.lse.defined()) {
    p.l_token = stride_used(a.lse, 0);
    p.l_head = stride_used(a.lse, 1);
  }
  p.num_threads = a.options.num_threads;
  p.stream = a.options.stream;
  return p;
}

}  // namespace flashattn::api
