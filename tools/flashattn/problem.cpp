#include "problem.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>
#include <sstream>

#include "core/numeric.h"
#include "gpu.h"
#include "reference/reference.h"

namespace fatool {
namespace {

// Reference work above which the check moves to a subset: the fp64 reference is a plain loop, and
// the command must stay interactive.
constexpr double kVerifyMultiplyAdds = 6e8;

// Splitmix64: a fast, fixed generator so inputs are the same on every machine.
struct SplitMix {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (double(next() >> 11) + 0.5) * 0x1.0p-53; }  // in (0, 1)
};

void store(unsigned char* dst, DType t, int64_t i, double x) {
  switch (t) {
    case DType::f16: reinterpret_cast<flashattn::core::half_t*>(dst)[i] = flashattn::core::to_half(float(x)); break;
    case DType::bf16: reinterpret_cast<flashattn::core::bfloat16_t*>(dst)[i] = flashattn::core::to_bf16(float(x)); break;
    case DType::f32: reinterpret_cast<float*>(dst)[i] = float(x); break;
    case DType::f64: reinterpret_cast<double*>(dst)[i] = x; break;
    case DType::i32: reinterpret_cast<int32_t*>(dst)[i] = int32_t(x); break;
  }
}

Tensor make(DeviceType dev, DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t;
  t.view = TensorView::contiguous(nullptr, dtype, shape, dev);
  t.buf = Buffer(dev, t.view.numel() * flashattn::dtype_size(dtype));
  t.view.data = t.buf.data();
  return t;
}

Tensor random_tensor(DeviceType dev, DType dtype, std::initializer_list<int64_t> shape, uint64_t seed) {
  Tensor t = make(dev, dtype, shape);
  t.buf.upload(random_values(dtype, t.view.numel(), seed));
  return t;
}

Tensor nan_tensor(DeviceType dev, DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t = make(dev, dtype, shape);
  t.buf.upload(std::vector<unsigned char>(size_t(t.buf.bytes()), 0xff));  // all-ones bytes: NaN in every format
  return t;
}

Tensor int_tensor(DeviceType dev, const std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  Tensor t = make(dev, DType::i32, shape);
  std::vector<unsigned char> bytes(v.size() * 4);
  std::memcpy(bytes.data(), v.data(), bytes.size());
  t.buf.upload(bytes);
  return t;
}

// A host copy of a tensor and a view of it with the same strides; `skip` moves the view's start.
struct HostCopy {
  std::vector<unsigned char> bytes;
  TensorView view;
  explicit HostCopy(const Tensor& t) : bytes(t.buf.download()), view(t.view) {
    view.data = bytes.data();
    view.device = DeviceType::cpu;
  }
  // Keeps only `n` entries of dimension `dim`, starting at `first`.
  TensorView narrowed(std::initializer_list<std::array<int64_t, 3>> dims) const {
    TensorView v = view;
    for (auto [dim, first, n] : dims) {
      v.data = static_cast<unsigned char*>(v.data) + first * v.stride[dim] * flashattn::dtype_size(v.dtype);
      v.shape[dim] = n;
    }
    return v;
  }
};

// The values of a strided view in logical (row-major) order.
std::vector<double> values_of(const TensorView& v) {
  std::vector<double> out(size_t(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i) {
    int64_t off = 0, rest = i;
    for (int d = v.rank - 1; d >= 0; --d) {
      off += (rest % v.shape[d]) * v.stride[d];
      rest /= v.shape[d];
    }
    out[size_t(i)] = flashattn::reference::load(v.data, v.dtype, off);
  }
  return out;
}

// Query heads checked: one whole group of query heads sharing a KV head (at least two heads), or all.
int64_t checked_heads(const Shape& s) {
  const int64_t group = s.h / s.h_kv;
  return std::min(s.h, group == 1 ? int64_t(2) : group);
}

std::string heads_scope(const Shape& s, int64_t vh) {
  return vh == s.h ? "all heads" : "heads 0-" + std::to_string(vh - 1) + " of " + std::to_string(s.h);
}

}  // namespace

flashattn::AttnOptions Shape::options() const {
  flashattn::AttnOptions o;
  o.causal = causal;
  o.window_left = window_left;
  o.window_right = window_right;
  o.num_threads = threads;
  return o;
}

float Shape::scale() const { return float(1.0 / std::sqrt(double(d))); }

std::string Shape::describe() const {
  std::ostringstream s;
  s << op_name(op) << " b=" << b << " h=" << h << " h_kv=" << h_kv << " s_q=" << s_q << " s_k=" << s_k << " d=" << d
    << (causal ? " causal" : "");
  if (window_left >= 0 || window_right >= 0) s << " window=(" << window_left << "," << window_right << ")";
  if (op == Op::decode && page_size > 0) s << " page=" << page_size;
  s << " " << flashattn::dtype_name(dtype) << " " << device_name(device);
  return s.str();
}

const char* op_name(Op op) { return op == Op::fwd ? "fwd" : op == Op::bwd ? "bwd" : "decode"; }
const char* device_name(DeviceType d) { return d == DeviceType::cpu ? "cpu" : "cuda"; }

DType parse_dtype(const std::string& s) {
  for (DType t : {DType::f16, DType::bf16, DType::f32, DType::f64})
    if (s == flashattn::dtype_name(t)) return t;
  throw std::invalid_argument("unknown dtype '" + s + "'");
}

Buffer::Buffer(DeviceType device, int64_t bytes) : device_(device), bytes_(bytes) {
  if (bytes <= 0) return;
  data_ = device == DeviceType::cpu ? ::operator new(size_t(bytes), std::align_val_t{64}) : gpu::alloc(size_t(bytes));
}

Buffer::~Buffer() {
  if (data_ == nullptr) return;
  if (device_ == DeviceType::cpu)
    ::operator delete(data_, std::align_val_t{64});
  else
    gpu::release(data_);
}

Buffer::Buffer(Buffer&& o) noexcept { *this = std::move(o); }

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  std::swap(device_, o.device_);
  std::swap(data_, o.data_);
  std::swap(bytes_, o.bytes_);
  return *this;
}

void Buffer::upload(const std::vector<unsigned char>& host) {
  if (bytes_ == 0) return;
  if (device_ == DeviceType::cpu)
    std::memcpy(data_, host.data(), size_t(bytes_));
  else
    gpu::upload(data_, host.data(), size_t(bytes_));
}

std::vector<unsigned char> Buffer::download() const {
  std::vector<unsigned char> host(static_cast<size_t>(bytes_));
  if (bytes_ == 0) return host;
  if (device_ == DeviceType::cpu)
    std::memcpy(host.data(), data_, size_t(bytes_));
  else
    gpu::download(host.data(), data_, size_t(bytes_));
  return host;
}

std::vector<unsigned char> random_values(DType dtype, int64_t n, uint64_t seed) {
  std::vector<unsigned char> bytes(size_t(n * flashattn::dtype_size(dtype)));
  SplitMix rng{seed};
  for (int64_t i = 0; i < n; i += 2) {  // Box-Muller: two normal values per pair of uniforms
    double r = std::sqrt(-2.0 * std::log(rng.uniform())), t = 2.0 * std::numbers::pi * rng.uniform();
    store(bytes.data(), dtype, i, r * std::cos(t));
    if (i + 1 < n) store(bytes.data(), dtype, i + 1, r * std::sin(t));
  }
  return bytes;
}

Problem::Problem(const Shape& s, uint64_t seed) : shape_(s) {
  const DeviceType dev = s.device;
  const DType t = s.dtype, lse_t = t == DType::f64 ? DType::f64 : DType::f32;
  q_ = random_tensor(dev, t, {s.b, s.s_q, s.h, s.d}, seed);
  out_ = nan_tensor(dev, t, {s.b, s.s_q, s.h, s.d});
  lse_ = nan_tensor(dev, lse_t, {s.b, s.h, s.s_q});
  if (s.op == Op::decode && s.page_size > 0) {
    // A paged cache whose pages are handed out in a shuffled order, as an allocator would.
    const int64_t per_seq = (s.s_k + s.page_size - 1) / s.page_size, pages = s.b * per_seq;
    k_ = random_tensor(dev, t, {pages, s.page_size, s.h_kv, s.d}, seed + 1);
    v_ = random_tensor(dev, t, {pages, s.page_size, s.h_kv, s.d}, seed + 2);
    std::vector<int32_t> ids(static_cast<size_t>(pages));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(uint32_t(seed)));
    block_table_ = int_tensor(dev, ids, {s.b, per_seq});
  } else {
    k_ = random_tensor(dev, t, {s.b, s.s_k, s.h_kv, s.d}, seed + 1);
    v_ = random_tensor(dev, t, {s.b, s.s_k, s.h_kv, s.d}, seed + 2);
  }
  if (s.op == Op::fwd) std_out_ = nan_tensor(dev, t, {s.b, s.s_q, s.h, s.d});
  if (s.op == Op::decode) cache_seqlens_ = int_tensor(dev, std::vector<int32_t>(size_t(s.b), int32_t(s.s_k)), {s.b});
  if (s.op == Op::bwd) {
    dout_ = random_tensor(dev, t, {s.b, s.s_q, s.h, s.d}, seed + 3);
    dq_ = nan_tensor(dev, t, {s.b, s.s_q, s.h, s.d});
    dk_ = nan_tensor(dev, t, {s.b, s.s_k, s.h_kv, s.d});
    dv_ = nan_tensor(dev, t, {s.b, s.s_k, s.h_kv, s.d});
  }
}

flashattn::ForwardArgs Problem::forward_args() const {
  flashattn::ForwardArgs a;
  a.q = q_.view;
  a.k = k_.view;
  a.v = v_.view;
  a.out = out_.view;
  a.lse = lse_.view;
  a.options = shape_.options();
  return a;
}

flashattn::BackwardArgs Problem::backward_args() const {
  flashattn::BackwardArgs a;
  a.dout = dout_.view;
  a.q = q_.view;
  a.k = k_.view;
  a.v = v_.view;
  a.out = out_.view;
  a.lse = lse_.view;
  a.dq = dq_.view;
  a.dk = dk_.view;
  a.dv = dv_.view;
  a.options = shape_.options();
  return a;
}

flashattn::DecodeArgs Problem::decode_args() const {
  flashattn::DecodeArgs a;
  a.q = q_.view;
  a.k_cache = k_.view;
  a.v_cache = v_.view;
  a.block_table = block_table_.view;
  a.cache_seqlens = cache_seqlens_.view;
  a.out = out_.view;
  a.lse = lse_.view;
  a.options = shape_.options();
  return a;
}

StandardArgs Problem::standard_args(void* s, void* p) const {
  StandardArgs a;
  a.dtype = shape_.dtype;
  a.b = shape_.b;
  a.h = shape_.h;
  a.h_kv = shape_.h_kv;
  a.s_q = shape_.s_q;
  a.s_k = shape_.s_k;
  a.d = shape_.d;
  a.scale = shape_.scale();
  a.window_left = shape_.window_left;
  a.window_right = shape_.causal ? 0 : shape_.window_right;
  a.q = q_.view.data;
  a.k = k_.view.data;
  a.v = v_.view.data;
  a.out = std_out_.view.data;
  a.s = s;
  a.p = p;
  a.threads = shape_.threads;
  return a;
}

double max_abs_error(const std::vector<double>& x, const std::vector<double>& ref) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  if (x.size() != ref.size()) return inf;
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) != std::isnan(ref[i])) return inf;
    if (std::isnan(x[i])) continue;
    if (std::isinf(x[i]) || std::isinf(ref[i])) {
      if (x[i] != ref[i]) return inf;
      continue;
    }
    m = std::max(m, std::fabs(x[i] - ref[i]));
  }
  return m;
}

Problem::Check Problem::verify(bool with_standard) const {
  switch (shape_.op) {
    case Op::fwd: return verify_forward(with_standard);
    case Op::bwd: return verify_backward();
    case Op::decode: return verify_decode();
  }
  return {};
}

// Checks the last `rows` query rows of the first heads. Bottom-right alignment makes this exact:
// the last r rows of a problem see the keys they see in the whole problem when run alone as a
// problem of r rows against all s_k keys.
Problem::Check Problem::verify_forward(bool with_standard) const {
  const Shape& s = shape_;
  const double per_row = double(s.s_k) * double(s.d) * double(s.b);
  int64_t vh = s.h, rows = s.s_q;
  if (per_row * double(vh) * double(rows) > kVerifyMultiplyAdds) vh = checked_heads(s);
  if (per_row * double(vh) * double(rows) > kVerifyMultiplyAdds)
    rows = std::max<int64_t>(1, int64_t(kVerifyMultiplyAdds / (per_row * double(vh))));
  const int64_t vhk = vh / (s.h / s.h_kv), skip = s.s_q - rows;
  HostCopy q(q_), k(k_), v(v_), out(out_), lse(lse_);
  flashattn::ForwardArgs a;
  a.q = q.narrowed({{1, skip, rows}, {2, 0, vh}});
  a.k = k.narrowed({{2, 0, vhk}});
  a.v = v.narrowed({{2, 0, vhk}});
  a.out = out.narrowed({{1, skip, rows}, {2, 0, vh}});
  a.options = s.options();
  flashattn::reference::Output ref = flashattn::reference::forward(a);
  Check c;
  c.flash = std::max(max_abs_error(values_of(a.out), ref.out),
                     max_abs_error(values_of(lse.narrowed({{1, 0, vh}, {2, skip, rows}})), ref.lse));
  if (with_standard) {
    HostCopy so(std_out_);
    c.standard = max_abs_error(values_of(so.narrowed({{1, skip, rows}, {2, 0, vh}})), ref.out);
  }
  c.scope = heads_scope(s, vh) + (rows == s.s_q ? ", all rows" : ", last " + std::to_string(rows) + " of " +
                                                                       std::to_string(s.s_q) + " rows");
  return c;
}

Problem::Check Problem::verify_backward() const {
  const Shape& s = shape_;
  int64_t vh = s.h;
  const double per_head = double(s.b) * double(s.s_q) * double(s.s_k) * double(s.d) * 3;  // S, dP, and the grads
  if (per_head * double(vh) > kVerifyMultiplyAdds) vh = checked_heads(s);
  Check c;
  if (per_head * double(vh) > kVerifyMultiplyAdds) {
    c.flash = -1;
    c.scope = "not checked: too large for the fp64 reference";
    return c;
  }
  const int64_t vhk = vh / (s.h / s.h_kv);
  HostCopy q(q_), k(k_), v(v_), out(out_), lse(lse_), dout(dout_), dq(dq_), dk(dk_), dv(dv_);
  flashattn::BackwardArgs a;
  a.q = q.narrowed({{2, 0, vh}});
  a.out = out.narrowed({{2, 0, vh}});
  a.dout = dout.narrowed({{2, 0, vh}});
  a.lse = lse.narrowed({{1, 0, vh}});
  a.dq = dq.narrowed({{2, 0, vh}});
  a.k = k.narrowed({{2, 0, vhk}});
  a.v = v.narrowed({{2, 0, vhk}});
  a.dk = dk.narrowed({{2, 0, vhk}});
  a.dv = dv.narrowed({{2, 0, vhk}});
  a.options = s.options();
  flashattn::reference::Grads ref = flashattn::reference::backward(a);
  c.flash = std::max({max_abs_error(values_of(a.dq), ref.dq), max_abs_error(values_of(a.dk), ref.dk),
                      max_abs_error(values_of(a.dv), ref.dv)});
  c.scope = heads_scope(s, vh) + " (dq, dk, dv)";
  return c;
}

Problem::Check Problem::verify_decode() const {
  const Shape& s = shape_;
  int64_t vh = s.h;
  const double per_head = double(s.b) * double(s.s_q) * double(s.s_k) * double(s.d);
  if (per_head * double(vh) > kVerifyMultiplyAdds) vh = checked_heads(s);
  Check c;
  if (per_head * double(vh) > kVerifyMultiplyAdds) {
    c.flash = -1;
    c.scope = "not checked: too large for the fp64 reference";
    return c;
  }
  const int64_t vhk = vh / (s.h / s.h_kv);
  HostCopy q(q_), k(k_), v(v_), out(out_), lse(lse_), table(block_table_), lens(cache_seqlens_);
  flashattn::DecodeArgs a;
  a.q = q.narrowed({{2, 0, vh}});
  a.k_cache = k.narrowed({{2, 0, vhk}});
  a.v_cache = v.narrowed({{2, 0, vhk}});
  a.block_table = table.view;
  a.cache_seqlens = lens.view;
  a.out = out.narrowed({{2, 0, vh}});
  a.options = s.options();
  flashattn::reference::Output ref = flashattn::reference::decode(a);
  c.flash = std::max(max_abs_error(values_of(a.out), ref.out),
                     max_abs_error(values_of(lse.narrowed({{1, 0, vh}})), ref.lse));
  c.scope = heads_scope(s, vh);
  return c;
}

}  // namespace fatool
