// The C ABI: a forward built in C (c_abi_c.c, compiled as C99) and one with strided tensors passed
// through the C structs both match flashattn::forward bit for bit; the helpers fill structs as
// documented; errors come back as status codes with the message in flashattn_last_error().
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "flashattn/flashattn.h"
#include "flashattn/flashattn.hpp"
#include "c_abi_util.h"
#include "test_util.h"

extern "C" {
int c_abi_forward_f32(float* q, float* k, float* v, float* out, float* lse, const int64_t shape[6], int causal);
const char* c_abi_version(void);
int c_abi_bad_head_dim(float* buf);
}

namespace {

using fa_test::HostTensor;
using flashattn::DType;

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.storage.size() == b.storage.size() && std::memcmp(a.storage.data(), b.storage.data(), a.storage.size()) == 0;
}

TEST(CAbi, ForwardFromCMatchesCppBitwise) {
  const int64_t b = 2, sq = 7, sk = 13, hq = 4, hkv = 2, d = 64;
  std::mt19937 rng(21);
  HostTensor q(DType::f32, {b, sq, hq, d}), k(DType::f32, {b, sk, hkv, d}), v(DType::f32, {b, sk, hkv, d});
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  for (int causal : {0, 1}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    HostTensor out_c(DType::f32, {b, sq, hq, d}), lse_c(DType::f32, {b, hq, sq});
    HostTensor out_cpp(DType::f32, {b, sq, hq, d}), lse_cpp(DType::f32, {b, hq, sq});
    out_c.poison();
    lse_c.poison();
    out_cpp.poison();
    lse_cpp.poison();
    const int64_t shape[6] = {b, sq, sk, hq, hkv, d};
    ASSERT_EQ(c_abi_forward_f32(static_cast<float*>(q.view.data), static_cast<float*>(k.view.data),
                                static_cast<float*>(v.view.data), static_cast<float*>(out_c.view.data),
                                static_cast<float*>(lse_c.view.data), shape, causal),
              FLASHATTN_OK)
        << flashattn_last_error();
    EXPECT_STREQ(flashattn_last_error(), "");
    flashattn::ForwardArgs a;
    a.q = q.view;
    a.k = k.view;
    a.v = v.view;
    a.out = out_cpp.view;
    a.lse = lse_cpp.view;
    a.options.causal = causal != 0;
    flashattn::forward(a);
    for (double x : out_c.values()) ASSERT_FALSE(std::isnan(x)) << "an output element was not written";
    EXPECT_TRUE(same_bytes(out_c, out_cpp));
    EXPECT_TRUE(same_bytes(lse_c, lse_cpp));
  }
}

TEST(CAbi, StridedBf16ForwardMatchesCppBitwise) {
  // Padded (non-contiguous) tensors: the C structs must carry every stride through.
  const int64_t b = 1, sq = 5, sk = 3, hq = 2, hkv = 1, d = 96;
  std::mt19937 rng(22);
  HostTensor q(DType::bf16, {b, sq, hq, d}, 8), k(DType::bf16, {b, sk, hkv, d}, 16), v(DType::bf16, {b, sk, hkv, d}, 8);
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  HostTensor out_c(DType::bf16, {b, sq, hq, d}, 8), out_cpp(DType::bf16, {b, sq, hq, d}, 8);
  out_c.poison();
  out_cpp.poison();

  flashattn::ForwardArgs a;
  a.q = q.view;
  a.k = k.view;
  a.v = v.view;
  a.out = out_c.view;
  a.options.window_left = 2;
  a.options.softcap = 5.f;
  flashattn_forward_args ca = fa_test::c_forward_args(a);
  ASSERT_EQ(flashattn_forward(&ca), FLASHATTN_OK) << flashattn_last_error();
  a.out = out_cpp.view;
  flashattn::forward(a);
  EXPECT_TRUE(same_bytes(out_c, out_cpp));
  // Only the padding between rows may remain poison.
  for (double x : out_c.values()) ASSERT_FALSE(std::isnan(x)) << "an output element was not written";
}

TEST(CAbi, Helpers) {
  flashattn_options o = flashattn_default_options();
  EXPECT_EQ(o.window_left, -1);
  EXPECT_EQ(o.window_right, -1);
  EXPECT_EQ(o.causal, 0);
  EXPECT_EQ(o.softmax_scale, 0.f);
  EXPECT_EQ(o.softcap, 0.f);
  EXPECT_EQ(o.num_threads, 0);
  EXPECT_EQ(o.stream, nullptr);

  float buf[1];
  const int64_t shape[3] = {2, 3, 5};
  flashattn_tensor t = flashattn_contiguous(buf, FLASHATTN_BF16, FLASHATTN_CPU, 3, shape);
  EXPECT_EQ(t.data, buf);
  EXPECT_EQ(t.dtype, FLASHATTN_BF16);
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.stride[0], 15);
  EXPECT_EQ(t.stride[1], 5);
  EXPECT_EQ(t.stride[2], 1);
  // A rank the struct cannot hold gives an absent tensor (rank 0), which validation then reports.
  EXPECT_EQ(flashattn_contiguous(buf, FLASHATTN_F32, FLASHATTN_CPU, 5, shape).rank, 0);

  EXPECT_EQ(std::string(c_abi_version()), flashattn::build_info().version);
  EXPECT_EQ(std::string(flashattn_version()), flashattn::build_info().version);
}

TEST(CAbi, ErrorsMapToStatusCodes) {
  float buf[80] = {};
  EXPECT_EQ(c_abi_bad_head_dim(buf), FLASHATTN_INVALID_ARGUMENT);
  std::string msg = flashattn_last_error();
  EXPECT_NE(msg.find("'q'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("head_dim"), std::string::npos) << msg;

  // Status codes and C++ statuses are the same numbers.
  EXPECT_EQ(FLASHATTN_INVALID_ARGUMENT, int(flashattn::Status::invalid_argument));
  EXPECT_EQ(FLASHATTN_UNSUPPORTED, int(flashattn::Status::unsupported));
  EXPECT_EQ(FLASHATTN_CUDA_ERROR, int(flashattn::Status::cuda_error));
  EXPECT_EQ(FLASHATTN_INTERNAL, int(flashattn::Status::internal));
}

TEST(CAbi, CudaTensorsWithoutCudaAreUnsupported) {
  if (flashattn::build_info().cuda_compiled)
    GTEST_SKIP() << "this build has CUDA; the 'unsupported' path exists only in CPU-only builds";
  // Valid shapes tagged as CUDA: validation passes, and the missing backend says so.
  const int64_t shape[4] = {1, 2, 1, 32};
  float q[64], k[64], v[64], out[64];
  flashattn_forward_args a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  a.q = flashattn_contiguous(q, FLASHATTN_F16, FLASHATTN_CUDA, 4, shape);
  a.k = flashattn_contiguous(k, FLASHATTN_F16, FLASHATTN_CUDA, 4, shape);
  a.v = flashattn_contiguous(v, FLASHATTN_F16, FLASHATTN_CUDA, 4, shape);
  a.out = flashattn_contiguous(out, FLASHATTN_F16, FLASHATTN_CUDA, 4, shape);
  a.options = flashattn_default_options();
  EXPECT_EQ(flashattn_forward(&a), FLASHATTN_UNSUPPORTED);
  EXPECT_NE(std::string(flashattn_last_error()).find("without CUDA"), std::string::npos) << flashattn_last_error();
}

TEST(CAbi, LastGpuKernelIsEmptyWhereNoGpuKernelRan) {
  // CPU calls leave it alone: a thread that never reached a GPU kernel reports "" in both APIs.
  float q[64] = {}, out[64];
  flashattn::ForwardArgs a;
  a.q = a.k = a.v = flashattn::TensorView::contiguous(q, flashattn::DType::f32, {1, 2, 1, 32});
  a.out = flashattn::TensorView::contiguous(out, flashattn::DType::f32, {1, 2, 1, 32});
  flashattn::forward(a);
  EXPECT_EQ(flashattn::last_gpu_kernel(), "");
  EXPECT_STREQ(flashattn_last_gpu_kernel(), "");
}

}  // namespace
