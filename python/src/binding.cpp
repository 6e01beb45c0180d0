// flashattn._C: the C++ API for Python, without any framework below this line.
//
// Tensors cross as View objects, which are TensorViews plus what keeps their memory alive:
//   * View(data, dtype, device, device_index, shape, strides): raw fields that the Python layer
//     reads off a torch tensor or a NumPy array (cheap, and it holds the tensor for the call);
//   * View.from_dlpack(obj, writable): any DLPack producer, imported zero-copy through nanobind.
// Every operation validates in the library (flashattn::Error on a bad argument) and runs with the
// GIL released, so other Python threads go on while the CPU engine or a GPU launch works.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using flashattn::DeviceType;
using flashattn::DType;
using flashattn::TensorView;

struct View {
  TensorView t;
  // DLPack views hold the imported array (and through it the producer's buffer); raw views hold
  // nothing, their owner is kept by the Python caller for the duration of the call.
  nb::ndarray<nb::ro> imported_ro;
  nb::ndarray<> imported_rw;
};

View raw_view(uintptr_t data, int dtype, int device, int device_index, const std::vector<int64_t>& shape,
              const std::vector<int64_t>& strides) {
  if (shape.size() != strides.size())
    throw nb::value_error(("View: shape has " + std::to_string(shape.size()) + " dimensions but strides has " +
                           std::to_string(strides.size()))
                              .c_str());
  if (shape.empty() || shape.size() > size_t(flashattn::kMaxRank))
    throw nb::value_error(("View: rank " + std::to_string(shape.size()) + " is out of range [1, " +
                           std::to_string(flashattn::kMaxRank) + "]")
                              .c_str());
  if (dtype < int(DType::f16) || dtype > int(DType::i32))
    throw nb::value_error(("View: unknown dtype code " + std::to_string(dtype)).c_str());
  if (device != int(DeviceType::cpu) && device != int(DeviceType::cuda))
    throw nb::value_error(("View: unknown device code " + std::to_string(device)).c_str());
  View v;
  v.t.data = reinterpret_cast<void*>(data);
  v.t.dtype = DType(dtype);
  v.t.device = DeviceType(device);
  v.t.device_index = device_index;
  v.t.rank = int32_t(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    v.t.shape[i] = shape[i];
    v.t.stride[i] = strides[i];
  }
  return v;
}

template <class Array>
void fill_from_dlpack(TensorView& t, const Array& a) {
  const auto dt = a.dtype();
  using code = nb::dlpack::dtype_code;
  if (dt.lanes != 1) throw nb::type_error("from_dlpack: vector (multi-lane) dtypes are not supported");
  if (dt.code == uint8_t(code::Float) && dt.bits == 16) t.dtype = DType::f16;
  else if (dt.code == uint8_t(code::Bfloat) && dt.bits == 16) t.dtype = DType::bf16;
  else if (dt.code == uint8_t(code::Float) && dt.bits == 32) t.dtype = DType::f32;
  else if (dt.code == uint8_t(code::Float) && dt.bits == 64) t.dtype = DType::f64;
  else if (dt.code == uint8_t(code::Int) && dt.bits == 32) t.dtype = DType::i32;
  else
    throw nb::type_error(("from_dlpack: dtype (code " + std::to_string(dt.code) + ", " + std::to_string(dt.bits) +
                          " bits) is not one of f16, bf16, f32, f64, i32")
                             .c_str());
  if (a.device_type() == nb::device::cpu::value) {
    t.device = DeviceType::cpu;
  } else if (a.device_type() == nb::device::cuda::value) {
    t.device = DeviceType::cuda;
  } else {
    throw nb::type_error(("from_dlpack: DLPack device type " + std::to_string(a.device_type()) +
                          " is neither the CPU nor a CUDA device")
                             .c_str());
  }
  t.device_index = a.device_id();
  if (a.ndim() < 1 || a.ndim() > size_t(flashattn::kMaxRank))
    throw nb::value_error(("from_dlpack: rank " + std::to_string(a.ndim()) + " is out of range [1, " +
                           std::to_string(flashattn::kMaxRank) + "]")
                              .c_str());
  t.rank = int32_t(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    t.shape[i] = int64_t(a.shape(i));
    t.stride[i] = a.stride(i);
  }
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
}

// writable: the operation writes through this view (an output, or a KV cache appended to), so a
// read-only producer must be refused rather than silently written.
View dlpack_view(nb::handle obj, bool writable) {
  View v;
  if (writable) {
    if (!nb::try_cast(obj, v.imported_rw))
      throw nb::type_error(("from_dlpack: expected a writable array that supports DLPack, got " +
                            std::string(nb::type_name(obj.type()).c_str()))
                               .c_str());
    fill_from_dlpack(v.t, v.imported_rw);
  } else {
    if (!nb::try_cast(obj, v.imported_ro))
      throw nb::type_error(("from_dlpack: expected an array that supports DLPack, got " +
                            std::string(nb::type_name(obj.type()).c_str()))
                               .c_str());
    fill_from_dlpack(v.t, v.imported_ro);
  }
  return v;
}

TensorView opt(const View* v) { return v ? v->t : TensorView{}; }

flashattn::AttnOptions options(float softmax_scale, bool causal, int64_t window_left, int64_t window_right,
                               float softcap, int num_threads, uintptr_t stream) {
  flashattn::AttnOptions o;
  o.softmax_scale = softmax_scale;
  o.causal = causal;
  o.window_left = window_left;
  o.window_right = window_right;
  o.softcap = softcap;
  o.num_threads = num_threads;
  o.stream = reinterpret_cast<void*>(stream);
  return o;
}

void forward(const View& q, const View& k, const View& v, const View& out, const View* lse, const View* cu_seqlens_q,
             const View* cu_seqlens_k, float softmax_scale, bool causal, int64_t window_left, int64_t window_right,
             float softcap, int num_threads, uintptr_t stream) {
  flashattn::ForwardArgs a;
  a.q = q.t;
  a.k = k.t;
  a.v = v.t;
  a.out = out.t;
  a.lse = opt(lse);
  a.cu_seqlens_q = opt(cu_seqlens_q);
  a.cu_seqlens_k = opt(cu_seqlens_k);
  a.options = options(softmax_scale, causal, window_left, window_right, softcap, num_threads, stream);
  nb::gil_scoped_release release;
  flashattn::forward(a);
}

void backward(const View& dout, const View& q, const View& k, const View& v, const View& out, const View& lse,
              const View& dq, const View& dk, const View& dv, const View* cu_seqlens_q, const View* cu_seqlens_k,
              float softmax_scale, bool causal, int64_t window_left, int64_t window_right, float softcap,
              bool deterministic, int num_threads, uintptr_t stream) {
  flashattn::BackwardArgs a;
  a.dout = dout.t;
  a.q = q.t;
  a.k = k.t;
  a.v = v.t;
  a.out = out.t;
  a.lse = lse.t;
  a.dq = dq.t;
  a.dk = dk.t;
  a.dv = dv.t;
  a.cu_seqlens_q = opt(cu_seqlens_q);
  a.cu_seqlens_k = opt(cu_seqlens_k);
  a.options = options(softmax_scale, causal, window_left, window_right, softcap, num_threads, stream);
  a.deterministic = deterministic;
  nb::gil_scoped_release release;
  flashattn::backward(a);
}

flashattn::DecodeArgs decode_args(const View& q, const View& k_cache, const View& v_cache, const View* block_table,
                                  const View& cache_seqlens, const View* k_new, const View* v_new, const View& out,
                                  const View* lse, int num_splits, float softmax_scale, bool causal,
                                  int64_t window_left, int64_t window_right, float softcap, int num_threads,
                                  uintptr_t stream) {
  flashattn::DecodeArgs a;
  a.q = q.t;
  a.k_cache = k_cache.t;
  a.v_cache = v_cache.t;
  a.block_table = opt(block_table);
  a.cache_seqlens = cache_seqlens.t;
  a.k_new = opt(k_new);
  a.v_new = opt(v_new);
  a.out = out.t;
  a.lse = opt(lse);
  a.num_splits = num_splits;
  a.options = options(softmax_scale, causal, window_left, window_right, softcap, num_threads, stream);
  return a;
}

// Without a plan: validate on the host (reading the lengths and block table), plan, run. With one
// (from plan_decode, and a workspace of plan.workspace_bytes): nothing is read back to the host, so
// the step can be captured in a CUDA graph.
void decode(const View& q, const View& k_cache, const View& v_cache, const View* block_table,
            const View& cache_seqlens, const View* k_new, const View* v_new, const View& out, const View* lse,
            int num_splits, float softmax_scale, bool causal, int64_t window_left, int64_t window_right,
            float softcap, int num_threads, uintptr_t stream, const flashattn::DecodePlan* plan, uintptr_t workspace) {
  flashattn::DecodeArgs a = decode_args(q, k_cache, v_cache, block_table, cache_seqlens, k_new, v_new, out, lse,
                                        num_splits, softmax_scale, causal, window_left, window_right, softcap,
                                        num_threads, stream);
  nb::gil_scoped_release release;
  if (plan)
    flashattn::decode(a, *plan, reinterpret_cast<void*>(workspace));
  else
    flashattn::decode(a);
}

flashattn::DecodePlan plan_decode(const View& q, const View& k_cache, const View& v_cache, const View* block_table,
                                  const View& cache_seqlens, const View* k_new, const View* v_new, const View& out,
                                  const View* lse, int num_splits, float softmax_scale, bool causal,
                                  int64_t window_left, int64_t window_right, float softcap, int num_threads,
                                  uintptr_t stream, int64_t max_cache_seqlen) {
  flashattn::DecodeArgs a = decode_args(q, k_cache, v_cache, block_table, cache_seqlens, k_new, v_new, out, lse,
                                        num_splits, softmax_scale, causal, window_left, window_right, softcap,
                                        num_threads, stream);
  nb::gil_scoped_release release;
  return flashattn::plan_decode(a, max_cache_seqlen);
}

void merge_states(const View& o_parts, const View& lse_parts, const View& out, const View* lse, int num_threads,
                  uintptr_t stream) {
  flashattn::MergeArgs a;
  a.o_parts = o_parts.t;
  a.lse_parts = lse_parts.t;
  a.out = out.t;
  a.lse = opt(lse);
  a.options.num_threads = num_threads;
  a.options.stream = reinterpret_cast<void*>(stream);
  nb::gil_scoped_release release;
  flashattn::merge_states(a);
}

nb::dict build_info() {
  flashattn::BuildInfo b = flashattn::build_info();
  nb::dict d;
  d["version"] = b.version;
  d["cuda_compiled"] = b.cuda_compiled;
  d["cuda_kernels"] = b.cuda_kernels;
  d["cpu_features"] = b.cpu_features;
  d["cpu_kernel"] = b.cpu_kernel;
  d["cpu_threads"] = b.cpu_threads;
  d["cuda_devices"] = b.cuda_devices;
  d["cuda_device_names"] = b.cuda_device_names;
  return d;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "flashattn's C++ API (internal: use the functions of the flashattn package)";

  // The library's status decides the Python exception: a bad argument is a ValueError, something
  // valid but not available in this build or on this device is a NotImplementedError, the rest
  // (CUDA runtime errors, internal errors) are RuntimeErrors. The message is the library's.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const flashattn::Error& e) {
      PyObject* type = PyExc_RuntimeError;
      if (e.status() == flashattn::Status::invalid_argument) type = PyExc_ValueError;
      else if (e.status() == flashattn::Status::unsupported) type = PyExc_NotImplementedError;
      PyErr_SetString(type, e.what());
    }
  });

  nb::class_<View>(m, "View")
      .def_static("raw", &raw_view, "data"_a, "dtype"_a, "device"_a, "device_index"_a, "shape"_a, "strides"_a)
      .def_static("from_dlpack", &dlpack_view, "obj"_a, "writable"_a)
      .def_prop_ro("dtype", [](const View& v) { return int(v.t.dtype); })
      .def_prop_ro("device", [](const View& v) { return int(v.t.device); })
      .def_prop_ro("device_index", [](const View& v) { return v.t.device_index; })
      .def_prop_ro("shape", [](const View& v) { return std::vector<int64_t>(v.t.shape, v.t.shape + v.t.rank); })
      .def_prop_ro("strides", [](const View& v) { return std::vector<int64_t>(v.t.stride, v.t.stride + v.t.rank); });

  m.attr("F16") = int(DType::f16);
  m.attr("BF16") = int(DType::bf16);
  m.attr("F32") = int(DType::f32);
  m.attr("F64") = int(DType::f64);
  m.attr("I32") = int(DType::i32);
  m.attr("CPU") = int(DeviceType::cpu);
  m.attr("CUDA") = int(DeviceType::cuda);

  m.def("forward", &forward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "cu_seqlens_q"_a.none(),
        "cu_seqlens_k"_a.none(), "softmax_scale"_a, "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a,
        "num_threads"_a, "stream"_a);
  m.def("backward", &backward, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a,
        "cu_seqlens_q"_a.none(), "cu_seqlens_k"_a.none(), "softmax_scale"_a, "causal"_a, "window_left"_a,
        "window_right"_a, "softcap"_a, "deterministic"_a, "num_threads"_a, "stream"_a);
  nb::class_<flashattn::DecodePlan>(m, "DecodePlan")
      .def_ro("max_cache_seqlen", &flashattn::DecodePlan::max_cache_seqlen)
      .def_ro("num_splits", &flashattn::DecodePlan::num_splits)
      .def_ro("workspace_bytes", &flashattn::DecodePlan::workspace_bytes);
  m.def("decode", &decode, "q"_a, "k_cache"_a, "v_cache"_a, "block_table"_a.none(), "cache_seqlens"_a,
        "k_new"_a.none(), "v_new"_a.none(), "out"_a, "lse"_a.none(), "num_splits"_a, "softmax_scale"_a, "causal"_a,
        "window_left"_a, "window_right"_a, "softcap"_a, "num_threads"_a, "stream"_a, "plan"_a.none() = nb::none(),
        "workspace"_a = 0);
  m.def("plan_decode", &plan_decode, "q"_a, "k_cache"_a, "v_cache"_a, "block_table"_a.none(), "cache_seqlens"_a,
        "k_new"_a.none(), "v_new"_a.none(), "out"_a, "lse"_a.none(), "num_splits"_a, "softmax_scale"_a, "causal"_a,
        "window_left"_a, "window_right"_a, "softcap"_a, "num_threads"_a, "stream"_a, "max_cache_seqlen"_a);
  m.def("merge_states", &merge_states, "o_parts"_a, "lse_parts"_a, "out"_a, "lse"_a.none(), "num_threads"_a,
        "stream"_a);
  m.def("last_gpu_kernel", [] { return flashattn::last_gpu_kernel(); },
        "The GPU forward or backward kernel that ran last on the calling thread, e.g. 'fwd hopper hdim128 bf16 "
        "sm90a' or 'fwd portable hdim96 f16 sm80' ('' before the first GPU call): which path a problem took.");
  m.def("build_info", &build_info,
        "What this build and machine offer: version, CUDA kernels compiled in, CPU features and the SIMD level "
        "the CPU engine uses, thread and GPU counts.");
}
