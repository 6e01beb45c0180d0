// Ring attention on the GPU: forward, merge_states and backward on device tensors compose to the
// full problem's attention and gradients within the accuracy rule, on the path dispatch picks and
// on the portable one, in both backward modes (tests/common/ring_attention.h says how the ring is
// played out). Chunks of 80 tokens are not a multiple of any tile; each pair's lse is a strided
// view into the merge's layout.
#include <array>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_util.h"
#include "ring_attention.h"

namespace fa_test {
namespace {

using flashattn::DType;
using namespace ring;

using Params = std::tuple<DType, int64_t, bool>;  // dtype, head dim, causal
class GpuRingAttention : public GpuTest, public ::testing::WithParamInterface<Params> {};

TEST_P(GpuRingAttention, ComposesToFullAttentionAndGradients) {
  const auto [t, d, causal] = GetParam();
  if (skip_unbuilt("fwd", d, t) || skip_unbuilt("bwd", d, t)) return;
  const Ring r{2, 3, 80, 4, 2, d};
  const Inputs in(t, r, 5);
  DeviceTensor d_q(in.q), d_k(in.k), d_v(in.v), d_dout(in.dout);
  flashattn::AttnOptions opts;
  flashattn::AttnOptions full_opts = opts;
  full_opts.causal = causal;
  const Full full = full_problem(r, in, full_opts);

  for (bool portable : {false, true}) {
    SCOPED_TRACE(portable ? "portable paths forced" : "default paths");
    const char* force = portable ? "portable" : nullptr;
    ScopedEnv fwd_path("FLASHATTN_GPU_FORWARD", force), bwd_path("FLASHATTN_GPU_BACKWARD", force);
    std::vector<State> host_state;
    for (int64_t i = 0; i < r.ranks; ++i) host_state.emplace_back(t, r);
    // Per rank: o, lse, merged, merged_lse on the device (merged poisoned: the merge writes it all).
    std::vector<std::array<std::unique_ptr<DeviceTensor>, 4>> dev;
    std::vector<StateViews> views;
    for (State& st : host_state) {
      auto& b = dev.emplace_back();
      b = {std::make_unique<DeviceTensor>(st.o), std::make_unique<DeviceTensor>(st.lse),
           std::make_unique<DeviceTensor>(st.merged), std::make_unique<DeviceTensor>(st.merged_lse)};
      b[2]->poison();
      b[3]->poison();
      views.push_back({b[0]->view, b[1]->view, b[2]->view, b[3]->view});
    }
    run_forward(r, causal, opts, d_q.view, d_k.view, d_v.view, views, [](void* dst, const void* src, size_t bytes) {
      ASSERT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
    });
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<double> out(full.ref.out.size()), lse(full.ref.lse.size());
    for (int64_t i = 0; i < r.ranks; ++i) {
      dev[size_t(i)][0]->copy_to(host_state[size_t(i)].o);
      dev[size_t(i)][1]->copy_to(host_state[size_t(i)].lse);
      gather(r, i, values(part_out(host_state[size_t(i)].o.view, 0, r)),
             values(part_lse(host_state[size_t(i)].lse.view, 0, r)), out, lse);
    }
    EXPECT_TRUE(within_rule(out, full.ref.out, full.plain.out, t, 2.0, "ring out"));
    EXPECT_TRUE(within_rule(lse, full.ref.lse, full.plain.lse, lse_dtype(t), 2.0, "ring lse"));

    for (bool deterministic : {false, true}) {
      SCOPED_TRACE(deterministic ? "deterministic" : "default mode");
      std::vector<double> gq(full.gref.dq.size(), 0.0), gk(full.gref.dk.size(), 0.0), gv(full.gref.dv.size(), 0.0);
      for_each_backward_pair(r, causal, opts, d_q.view, d_k.view, d_v.view, d_dout.view, views,
                             [&](int64_t i, int64_t j, flashattn::BackwardArgs& a) {
                               HostTensor pq(t, {r.batch, r.chunk, r.heads_q, r.d}),
                                   pk(t, {r.batch, r.chunk, r.heads_kv, r.d}),
                                   pv(t, {r.batch, r.chunk, r.heads_kv, r.d});
                               DeviceTensor dpq(pq), dpk(pk), dpv(pv);
                               dpq.poison(), dpk.poison(), dpv.poison();
                               a.dq = dpq.view, a.dk = dpk.view, a.dv = dpv.view;
                               a.deterministic = deterministic;
                               flashattn::backward(a);
                               ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                               dpq.copy_to(pq), dpk.copy_to(pk), dpv.copy_to(pv);
                               add_chunk(r, gq, pq.values(), i * r.chunk, r.heads_q);
                               add_chunk(r, gk, pk.values(), j * r.chunk, r.heads_kv);
                               add_chunk(r, gv, pv.values(), j * r.chunk, r.heads_kv);
                             });
      EXPECT_TRUE(within_rule(gq, full.gref.dq, full.gplain.dq, t, 3.0, "ring dq"));
      EXPECT_TRUE(within_rule(gk, full.gref.dk, full.gplain.dk, t, 3.0, "ring dk"));
      EXPECT_TRUE(within_rule(gv, full.gref.dv, full.gplain.dv, t, 3.0, "ring dv"));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuRingAttention,
                         ::testing::Combine(::testing::Values(DType::bf16, DType::f16),
                                            ::testing::Values(int64_t(64), int64_t(128), int64_t(256)),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<Params>& info) {
                           return std::string(flashattn::dtype_name(std::get<0>(info.param))) + "_d" +
                                  std::to_string(std::get<1>(info.param)) + (std::get<2>(info.param) ? "_causal" : "");
                         });

}  // namespace
}  // namespace fa_test
