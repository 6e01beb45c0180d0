#include "fuzz_case.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include "fuzz_device.h"
#include "test_util.h"

namespace fa_fuzz {

using flashattn::AttnOptions;
using flashattn::DeviceType;

bool g_on_gpu = false;

namespace {

constexpr size_t kMaxBytes = size_t(8) << 20;  // larger views (bytes or elements) are only validated

// Pointer mutations, once the buffers exist: null data, or an output pointed at an input.
void mutate_pointers(ByteSource& in, Case& c) {
  std::vector<Tensor*> ts = c.present(), outs, ins;
  for (Tensor* t : ts) (t->role == Role::output ? outs : ins).push_back(t);
  if (ts.empty()) return;
  if (in.chance(1, 2)) {
    Tensor& t = *ts[size_t(in.below(int64_t(ts.size())))];
    t.view->data = nullptr;
    c.note(std::string(t.name) + " data = null");
  } else if (!outs.empty() && !ins.empty()) {
    Tensor& o = *outs[size_t(in.below(int64_t(outs.size())))];
    Tensor& i = *ins[size_t(in.below(int64_t(ins.size())))];
    if (i.size < o.size) return;  // the output's new memory must still hold its whole span
    o.view->data = i.view->data;
    c.note(std::string(o.name) + " aliases " + i.name);
  }
}

// Why the case as it now stands must be rejected, whatever the rest of it: what no valid call has
// (judged from the final views and options, since a later mutation may undo or drop an earlier one).
std::string must_reject(const Case& c) {
  const TensorView& first = *c.tensors.front().view;
  for (const Tensor& t : c.tensors) {
    const TensorView& v = *t.view;
    if (v.rank == 0) continue;
    const std::string at = std::string(" (") + t.name + ")";
    if (v.rank < 0 || v.rank > flashattn::kMaxRank) return "a rank out of range" + at;
    for (int i = 0; i < v.rank; ++i) {
      if (v.shape[i] < 0) return "a negative size" + at;
      if (v.stride[i] < 0) return "a negative stride" + at;
    }
    if (int(v.dtype) < 0 || int(v.dtype) > 4) return "an unknown dtype" + at;
    if (v.device != first.device || v.device_index != first.device_index) return "a tensor on another device" + at;
    if (!t.size || v.numel() == 0) continue;
    if (v.data == nullptr) return "null data" + at;
    if (t.role == Role::output && v.data != t.bytes.get())
      for (const Tensor& other : c.tensors)
        if (&other != &t && other.view->rank != 0 && v.data == other.bytes.get() && other.view->numel() > 0)
          return std::string("an output aliasing '") + other.name + "'" + at;
  }
  const AttnOptions& o = *c.options;
  if (o.num_threads < 0) return "a negative thread count";
  if (!c.attention_options) return "";
  if (!std::isfinite(o.softmax_scale) || o.softmax_scale < 0) return "a bad scale";
  if (!std::isfinite(o.softcap) || o.softcap < 0) return "a bad softcap";
  if (o.window_left < -1 || o.window_right < -1 || (o.causal && o.window_right > 0)) return "a bad window";
  if (c.num_splits && (*c.num_splits < 0 || *c.num_splits > flashattn::kMaxSplits)) return "a split count out of range";
  return "";
}

std::string describe(const Case& c, const std::string& op) {
  std::ostringstream s;
  s << op << " [";
  for (const Tensor& t : c.tensors) {
    if (t.view->rank == 0) continue;
    s << " " << t.name << flashattn::dtype_name(t.view->dtype) << "(";
    for (int i = 0; i < std::min(t.view->rank, flashattn::kMaxRank); ++i)
      s << (i ? "," : "") << t.view->shape[i] << ":" << t.view->stride[i];
    s << ")";
  }
  const AttnOptions& o = *c.options;
  s << " ] causal " << o.causal << " window " << o.window_left << "," << o.window_right << " softcap " << o.softcap
    << " scale " << o.softmax_scale << (c.log.empty() ? "" : " | mutations: " + c.log);
  return s.str();
}

}  // namespace

void store(TensorView& v, int64_t off, double x) { fa_test::store(v.data, v.dtype, off, x); }

int mutation_count(ByteSource& in) { return in.chance(1, 2) ? 0 : int(in.in(1, 3)); }

void gen_options(ByteSource& in, AttnOptions& o) {
  o.causal = in.chance(1, 3);
  if (in.chance(1, 3)) o.window_left = in.in(0, 40);
  if (!o.causal && in.chance(1, 3)) o.window_right = in.in(0, 40);
  if (o.causal && in.chance(1, 4)) o.window_right = 0;
  if (in.chance(1, 4)) o.softcap = float(in.in(1, 60)) / 4.f;
  if (in.chance(1, 3)) o.softmax_scale = float(in.in(1, 64)) / 64.f;
  o.num_threads = int32_t(in.below(4));
}

void mutate_views(ByteSource& in, Case& c) {
  std::vector<Tensor*> ts = c.present();
  if (ts.empty()) return;  // every tensor dropped already
  Tensor& t = *ts[size_t(in.below(int64_t(ts.size())))];
  TensorView& v = *t.view;
  const std::string at = std::string(t.name) + " ";
  const int64_t big = int64_t(1) << 40, huge = std::numeric_limits<int64_t>::max();
  const bool sane = v.rank >= 1 && v.rank <= flashattn::kMaxRank;  // a rank already out of range
  auto near = [&](int64_t x) { return x > -big && x < big; };         // ... or sizes past any +-1
  switch (in.below(8)) {
    case 0: {
      if (!sane) break;
      int i = int(in.below(v.rank));
      const int64_t x = v.shape[i];
      v.shape[i] = near(x) ? in.pick<int64_t>({0, x - 1, x + 1, 2 * x + 1, big, huge, -1})
                           : in.pick<int64_t>({0, 1, -1});
      c.note(at + "shape[" + std::to_string(i) + "] = " + std::to_string(v.shape[i]));
      break;
    }
    case 1: {
      if (!sane) break;
      int i = int(in.below(v.rank));
      const int64_t x = v.stride[i];
      v.stride[i] = near(x) ? in.pick<int64_t>({-1, 0, x + 1, x - 1, big, huge / 2}) : in.pick<int64_t>({-1, 0, 1});
      c.note(at + "stride[" + std::to_string(i) + "] = " + std::to_string(v.stride[i]));
      break;
    }
    case 2: {
      const int r = in.pick<int>({v.rank - 1, v.rank + 1, 5, -1});
      if (r >= 1 && r > v.rank && r <= flashattn::kMaxRank) v.shape[r - 1] = 1, v.stride[r - 1] = 1;
      v.rank = r;
      c.note(at + "rank = " + std::to_string(r));
      break;
    }
    case 3: {
      int d = in.pick<int>({0, 1, 2, 3, 4, 7, -1});
      v.dtype = DType(d);
      c.note(at + "dtype = " + std::to_string(d));
      break;
    }
    case 4:
      if (&t == &c.tensors.front()) break;  // the first tensor sets the device the rest must share
      // A GPU other than the case's (index 7), so that it still differs once a GPU run has placed
      // the CPU tensors on GPU 0; or an unknown device type.
      if (in.chance(1, 2)) {
        v.device = DeviceType::cuda;
        v.device_index = 7;
      } else {
        v.device = DeviceType(9);
      }
      c.note(at + "device = " + std::to_string(int(v.device)) + ":" + std::to_string(v.device_index));
      break;
    case 5: {
      std::vector<Tensor*> idx;
      for (Tensor* p : ts)
        if (p->role == Role::index && !p->ints.empty()) idx.push_back(p);
      if (idx.empty()) break;
      Tensor& x = *idx[size_t(in.below(int64_t(idx.size())))];
      int32_t& e = x.ints[size_t(in.below(int64_t(x.ints.size())))];
      const int64_t was = e, lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
      e = int32_t(std::clamp<int64_t>(in.pick<int64_t>({-1, -7, was + 1, was - 1, was + 17, 1 << 30, hi, lo}), lo, hi));
      c.note(std::string(x.name) + " entry = " + std::to_string(e));
      break;
    }
    case 6: {
      AttnOptions& o = *c.options;
      const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
      switch (c.attention_options ? in.below(7) : 5) {
        case 0: o.softmax_scale = in.pick<float>({nan, inf, -1.f}); c.note("softmax_scale bad"); break;
        case 1: o.softcap = in.pick<float>({nan, inf, -0.5f}); c.note("softcap bad"); break;
        case 2: o.window_left = in.pick<int64_t>({-2, -huge}); c.note("window_left < -1"); break;
        case 3: o.window_right = in.pick<int64_t>({-2, -huge}); c.note("window_right < -1"); break;
        case 4: o.causal = true; o.window_right = in.in(1, 9); c.note("causal with window_right > 0"); break;
        case 5: o.num_threads = -1; c.note("num_threads = -1"); break;
        default:
          if (!c.num_splits) break;
          *c.num_splits = in.pick<int32_t>({-1, flashattn::kMaxSplits + 1, 1000});
          c.note("num_splits = " + std::to_string(*c.num_splits));
      }
      break;
    }
    default:
      v.rank = 0;
      c.note(at + "dropped");
  }
}

std::string conclude(ByteSource& in, Case& c, const std::string& op, const Run& run, std::mt19937& rng) {
  for (Tensor* t : c.present()) {
    std::optional<size_t> span = span_bytes(*t->view, kMaxBytes);
    if (!span) {  // not allocatable: the validation alone must answer, and sanely
      try {
        run.validate();
      } catch (const flashattn::Error&) {
        return "";
      }
      const std::string reject = must_reject(c);
      return reject.empty() ? "" : describe(c, op) + ": validation accepted " + reject;
    }
    materialize(*t, *span, rng, store);
  }
  if (in.chance(1, 6)) mutate_pointers(in, c);
  const std::string what = describe(c, op);
  // A crash (a sanitizer's report) ends the process before any message: say the case first.
  if (std::getenv("FLASHATTN_FUZZ_PRINT")) std::fprintf(stderr, "flashattn fuzz case: %s\n", what.c_str());
  if (run.prepare) run.prepare();
  for (Tensor* t : c.present()) t->before.assign(t->bytes.get(), t->bytes.get() + t->size);
  bool ref_ok = true;
  try {
    run.reference();
  } catch (const flashattn::Error&) {
    ref_ok = false;
  }
  // On a GPU the call gets device copies of every buffer (pointers that name a buffer, aliases
  // included, follow it; null stays null), and what it wrote comes back before the checks.
  std::vector<std::pair<Tensor*, void*>> placed;
  std::vector<TensorView> host_views;
  if (g_on_gpu) {
    for (Tensor* t : c.present()) {
      placed.push_back({t, gpu_alloc(t->size)});
      gpu_upload(placed.back().second, t->bytes.get(), t->size);
    }
    for (Tensor* t : c.present()) {
      host_views.push_back(*t->view);
      for (auto [owner, dev] : placed)
        if (t->view->data && t->view->data == owner->bytes.get()) t->view->data = dev;
      if (t->view->device == DeviceType::cpu) t->view->device = DeviceType::cuda;
    }
  }
  auto unplace = [&] {
    if (!g_on_gpu) return;
    size_t i = 0;
    for (Tensor* t : c.present()) *t->view = host_views[i++];
    for (auto [t, dev] : placed) {
      gpu_download(t->bytes.get(), dev, t->size);
      gpu_free(dev);
    }
  };
  try {
    run.call();
    unplace();
  } catch (const flashattn::Error& e) {
    unplace();
    const std::string msg = e.what();
    if (g_on_gpu && e.status() == flashattn::Status::unsupported) {  // valid, but not on this path
      for (Tensor* t : c.present())
        if (t->size && std::memcmp(t->bytes.get(), t->before.data(), t->size) != 0)
          return what + ": unsupported (" + msg + ") but '" + t->name + "' was written";
      return "";
    }
    if (e.status() != flashattn::Status::invalid_argument)
      return what + ": rejected with status " + std::to_string(int(e.status())) + " (" + msg + ")";
    if (msg.find("argument '") == std::string::npos) return what + ": the error names no argument: " + msg;
    // The GPU path's own layout needs (16-byte rows, element pairs): the generator gives a GPU case
    // such layouts, and a mutation may take them away.
    const bool gpu_layout = g_on_gpu && msg.find("the GPU path") != std::string::npos;
    if (ref_ok && !gpu_layout) return what + ": the engine rejected what the reference accepted: " + msg;
    if (c.mutations == 0) return what + ": a valid case was rejected: " + msg;
    for (Tensor* t : c.present())
      if (t->size && std::memcmp(t->bytes.get(), t->before.data(), t->size) != 0)
        return what + ": rejected (" + msg + ") but '" + t->name + "' was written";
    return "";
  } catch (const std::exception& e) {
    unplace();
    return what + ": threw something other than flashattn::Error: " + e.what();
  }
  if (const std::string reject = must_reject(c); !reject.empty()) return what + ": accepted " + reject;
  if (!ref_ok) return what + ": the engine accepted what the reference rejected";
  for (Tensor* t : c.present()) {
    if (!t->size) continue;
    const unsigned char* now = t->bytes.get();
    if (t->role == Role::output) {
      for (size_t b = 0; b < t->size; ++b)
        if (!t->element[b] && now[b] != t->before[b])
          return what + ": wrote byte " + std::to_string(b) + " of '" + t->name + "', which is no element of it";
    } else if (t->role == Role::inout) {
      std::vector<unsigned char> want = t->before;
      run.expected_inout(*t, want);
      if (std::memcmp(now, want.data(), t->size) != 0)
        return what + ": '" + t->name + "' is not as the append leaves it";
    } else if (std::memcmp(now, t->before.data(), t->size) != 0) {
      return what + ": wrote to the input '" + t->name + "'";
    }
  }
  std::string bad = run.check();
  return bad.empty() ? "" : what + ": " + bad;
}

}  // namespace fa_fuzz
