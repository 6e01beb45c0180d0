// The C ABI: converts the plain C structs to the C++ argument structs and turns exceptions into
// status codes plus a thread-local message.
#include <cstring>
#include <string>

#include "flashattn/flashattn.h"
#include "flashattn/flashattn.hpp"
#include "flashattn/version.h"

namespace {

thread_local std::string g_last_error;

flashattn::TensorView view(const flashattn_tensor& t) {
  flashattn::TensorView v;
  v.data = t.data;
  v.dtype = static_cast<flashattn::DType>(t.dtype);
  v.device = static_cast<flashattn::DeviceType>(t.device);
  v.device_index = t.device_index;
  v.rank = t.rank;
  for (int i = 0; i < FLASHATTN_MAX_RANK; ++i) {
    v.shape[i] = t.shape[i];
    v.stride[i] = t.stride[i];
  }
  return v;
}

flashattn::AttnOptions options(const flashattn_options& o) {
  flashattn::AttnOptions r;
  r.softmax_scale = o.softmax_scale;
  r.causal = o.causal != 0;
  r.window_left = o.window_left;
  r.window_right = o.window_right;
  r.softcap = o.softcap;
  r.num_threads = o.num_threads;
  r.stream = o.stream;
  return r;
}

// Rejects enum values a C caller can put in a tensor but the C++ enums do not hold.
void check_tensor(const flashattn_tensor& t, const char* name) {
  if (t.rank == 0) return;
  if (t.dtype < FLASHATTN_F16 || t.dtype > FLASHATTN_I32)
    throw flashattn::Error(flashattn::Status::invalid_argument,
                           std::string("argument '") + name + "': unknown dtype code " + std::to_string(t.dtype));
  if (t.device != FLASHATTN_CPU && t.device != FLASHATTN_CUDA)
    throw flashattn::Error(flashattn::Status::invalid_argument,
                           std::string("argument '") + name + "': unknown device code " + std::to_string(t.device));
}

template <class Args>
void check_header(const Args* a, const char* op, const char* name = "args") {
  if (a == nullptr)
    throw flashattn::Error(flashattn::Status::invalid_argument, std::string(op) + ": " + name + " is NULL");
  if (a->struct_size < sizeof(Args))
    throw flashattn::Error(flashattn::Status::invalid_argument,
                           std::string(op) + ": " + name + "->struct_size is " + std::to_string(a->struct_size) +
                               ", expected sizeof = " + std::to_string(sizeof(Args)));
}

template <class F>
int guarded(F&& f) {
  try {
    f();
    g_last_error.clear();
    return FLASHATTN_OK;
  } catch (const flashattn::Error& e) {
    g_last_error = e.what();
    return static_cast<int>(e.status());
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return FLASHATTN_INTERNAL;
  } catch (...) {
    g_last_error = "unknown internal error";
    return FLASHATTN_INTERNAL;
  }
}


flashattn::DecodeArgs decode_args(const flashattn_decode_args* a) {
  check_header(a, "decode");
  flashattn::DecodeArgs f;
  const std::pair<const flashattn_tensor*, flashattn::TensorView*> ts[] = {
      {&a->q, &f.q}, {&a->k_cache, &f.k_cache}, {&a->v_cache, &f.v_cache}, {&a->block_table, &f.block_table},
      {&a->cache_seqlens, &f.cache_seqlens}, {&a->k_new, &f.k_new}, {&a->v_new, &f.v_new}, {&a->out, &f.out},
      {&a->lse, &f.lse}};
  const char* names[] = {"q", "k_cache", "v_cache", "block_table", "cache_seqlens", "k_new", "v_new", "out", "lse"};
  for (size_t i = 0; i < std::size(ts); ++i) {
    check_tensor(*ts[i].first, names[i]);
    *ts[i].second = view(*ts[i].first);
  }
  f.num_splits = a->num_splits;
  f.options = options(a->options);
  return f;
}

flashattn_decode_plan c_plan(const flashattn::DecodePlan& p, uint32_t struct_size) {
  flashattn_decode_plan c;
  std::memset(&c, 0, sizeof(c));
  c.struct_size = struct_size;
  c.device = static_cast<int32_t>(p.device);
  c.device_index = p.device_index;
  c.dtype = static_cast<int32_t>(p.dtype);
  c.batch = p.batch;
  c.seqlen_new = p.seqlen_new;
  c.heads_q = p.heads_q;
  c.heads_kv = p.heads_kv;
  c.head_dim = p.head_dim;
  c.paged = p.paged;
  c.append = p.append;
  c.num_pages = p.num_pages;
  c.page_size = p.page_size;
  c.max_pages_per_seq = p.max_pages_per_seq;
  c.max_cache_seqlen = p.max_cache_seqlen;
  c.num_splits = p.num_splits;
  c.workspace_bytes = p.workspace_bytes;
  return c;
}

flashattn::DecodePlan cpp_plan(const flashattn_decode_plan& c) {
  if ((c.device != FLASHATTN_CPU && c.device != FLASHATTN_CUDA) || c.dtype < FLASHATTN_F16 || c.dtype > FLASHATTN_I32)
    throw flashattn::Error(flashattn::Status::invalid_argument, "decode: argument 'plan': is not a plan made by plan_decode");
  flashattn::DecodePlan p;
  p.device = static_cast<flashattn::DeviceType>(c.device);
  p.device_index = c.device_index;
  p.dtype = static_cast<flashattn::DType>(c.dtype);
  p.batch = c.batch;
  p.seqlen_new = c.seqlen_new;
  p.heads_q = c.heads_q;
  p.heads_kv = c.heads_kv;
  p.head_dim = c.head_dim;
  p.paged = c.paged != 0;
  p.append = c.append != 0;
  p.num_pages = c.num_pages;
  p.page_size = c.page_size;
  p.max_pages_per_seq = c.max_pages_per_seq;
  p.max_cache_seqlen = c.max_cache_seqlen;
  p.num_splits = c.num_splits;
  p.workspace_bytes = c.workspace_bytes;
  return p;
}

}  // namespace

extern "C" {

flashattn_options flashattn_default_options(void) {
  flashattn_options o;
  std::memset(&o, 0, sizeof(o));
  o.window_left = -1;
  o.window_right = -1;
  return o;
}

flashattn_tensor flashattn_contiguous(void* data, int32_t dtype, int32_t device, int32_t rank, const int64_t* shape) {
  flashattn_tensor t;
  std::memset(&t, 0, sizeof(t));
  if (rank < 0 || rank > FLASHATTN_MAX_RANK || (rank > 0 && shape == nullptr)) return t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = rank;
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.stride[i] = stride;
    stride *= shape[i];
  }
  return t;
}

int flashattn_forward(const flashattn_forward_args* a) {
  return guarded([&] {
    check_header(a, "forward");
    flashattn::ForwardArgs f;
    const std::pair<const flashattn_tensor*, flashattn::TensorView*> ts[] = {
        {&a->q, &f.q}, {&a->k, &f.k}, {&a->v, &f.v}, {&a->out, &f.out}, {&a->lse, &f.lse},
        {&a->cu_seqlens_q, &f.cu_seqlens_q}, {&a->cu_seqlens_k, &f.cu_seqlens_k}};
    const char* names[] = {"q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k"};
    for (size_t i = 0; i < std::size(ts); ++i) {
      check_tensor(*ts[i].first, names[i]);
      *ts[i].second = view(*ts[i].first);
    }
    f.options = options(a->options);
    flashattn::forward(f);
  });
}

int flashattn_backward(const flashattn_backward_args* a) {
  return guarded([&] {
    check_header(a, "backward");
    flashattn::BackwardArgs f;
    const std::pair<const flashattn_tensor*, flashattn::TensorView*> ts[] = {
        {&a->dout, &f.dout}, {&a->q, &f.q}, {&a->k, &f.k}, {&a->v, &f.v}, {&a->out, &f.out}, {&a->lse, &f.lse},
        {&a->dq, &f.dq}, {&a->dk, &f.dk}, {&a->dv, &f.dv}, {&a->cu_seqlens_q, &f.cu_seqlens_q},
        {&a->cu_seqlens_k, &f.cu_seqlens_k}};
    const char* names[] = {"dout", "q", "k", "v", "out", "lse", "dq", "dk", "dv", "cu_seqlens_q", "cu_seqlens_k"};
    for (size_t i = 0; i < std::size(ts); ++i) {
      check_tensor(*ts[i].first, names[i]);
      *ts[i].second = view(*ts[i].first);
    }
    f.options = options(a->options);
    f.deterministic = a->deterministic != 0;
    flashattn::backward(f);
  });
}

int flashattn_decode(const flashattn_decode_args* a) {
  return guarded([&] { flashattn::decode(decode_args(a)); });
}

int flashattn_plan_decode(const flashattn_decode_args* a, int64_t max_cache_seqlen, flashattn_decode_plan* plan) {
  return guarded([&] {
    check_header(plan, "plan_decode", "plan");
    *plan = c_plan(flashattn::plan_decode(decode_args(a), max_cache_seqlen), plan->struct_size);
  });
}

int flashattn_decode_run(const flashattn_decode_args* a, const flashattn_decode_plan* plan, void* workspace) {
  return guarded([&] {
    check_header(plan, "decode", "plan");
    flashattn::decode(decode_args(a), cpp_plan(*plan), workspace);
  });
}

int flashattn_decode_status(const flashattn_decode_plan* plan, const void* workspace, void* stream, uint32_t* faults,
                            int64_t* first_sequence) {
  return guarded([&] {
    check_header(plan, "decode_status", "plan");
    if (faults == nullptr)
      throw flashattn::Error(flashattn::Status::invalid_argument, "decode_status: argument 'faults': is NULL");
    flashattn::DecodeStatus st = flashattn::decode_status(cpp_plan(*plan), workspace, stream);
    *faults = st.faults;
    if (first_sequence != nullptr) *first_sequence = st.first_sequence;
  });
}

int flashattn_merge_states(const flashattn_merge_args* a) {
  return guarded([&] {
    check_header(a, "merge_states");
    flashattn::MergeArgs f;
    const std::pair<const flashattn_tensor*, flashattn::TensorView*> ts[] = {
        {&a->o_parts, &f.o_parts}, {&a->lse_parts, &f.lse_parts}, {&a->out, &f.out}, {&a->lse, &f.lse}};
    const char* names[] = {"o_parts", "lse_parts", "out", "lse"};
    for (size_t i = 0; i < std::size(ts); ++i) {
      check_tensor(*ts[i].first, names[i]);
      *ts[i].second = view(*ts[i].first);
    }
    f.options = options(a->options);
    flashattn::merge_states(f);
  });
}

const char* flashattn_last_error(void) { return g_last_error.c_str(); }

const char* flashattn_version(void) { return FLASHATTN_VERSION_STRING; }

const char* flashattn_last_gpu_kernel(void) {
  static thread_local std::string name;
  name = flashattn::last_gpu_kernel();
  return name.c_str();
}

}  // extern "C"
