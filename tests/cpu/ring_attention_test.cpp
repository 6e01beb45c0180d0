// Ring attention on the CPU: the pieces of the public API (forward, merge_states, backward) compose
// to the full problem's attention and gradients within the accuracy rule (tests/common/ring_attention.h
// says how the ring is played out).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "ring_attention.h"
#include "test_util.h"

namespace {

using fa_test::HostTensor;
using flashattn::DType;
using namespace fa_test::ring;

using Params = std::tuple<DType, bool, float>;  // dtype, causal, softcap
class RingAttention : public ::testing::TestWithParam<Params> {};

TEST_P(RingAttention, ComposesToFullAttentionAndGradients) {
  const auto [t, causal, softcap] = GetParam();
  const Ring r{2, 3, 23, 4, 2, 32};  // an odd chunk, GQA 2:1
  const Inputs in(t, r, 7);
  flashattn::AttnOptions opts;
  opts.softcap = softcap;

  std::vector<State> state;
  std::vector<StateViews> views;
  for (int64_t i = 0; i < r.ranks; ++i) state.emplace_back(t, r);
  for (State& st : state) views.push_back({st.o.view, st.lse.view, st.merged.view, st.merged_lse.view});
  run_forward(r, causal, opts, in.q.view, in.k.view, in.v.view, views,
              [](void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); });

  flashattn::AttnOptions full_opts = opts;
  full_opts.causal = causal;
  const Full full = full_problem(r, in, full_opts);
  std::vector<double> out(full.ref.out.size()), lse(full.ref.lse.size());
  for (int64_t i = 0; i < r.ranks; ++i)
    gather(r, i, fa_test::values(part_out(state[size_t(i)].o.view, 0, r)),
           fa_test::values(part_lse(state[size_t(i)].lse.view, 0, r)), out, lse);
  // Each pair's output is rounded to the dtype before it is merged, and the merge rounds again.
  EXPECT_TRUE(fa_test::within_rule(out, full.ref.out, full.plain.out, t, 2.0, "ring out"));
  EXPECT_TRUE(fa_test::within_rule(lse, full.ref.lse, full.plain.lse, lse_dtype(t), 2.0, "ring lse"));

  std::vector<double> dq(full.gref.dq.size(), 0.0), dk(full.gref.dk.size(), 0.0), dv(full.gref.dv.size(), 0.0);
  for_each_backward_pair(r, causal, opts, in.q.view, in.k.view, in.v.view, in.dout.view, views,
                         [&](int64_t i, int64_t j, flashattn::BackwardArgs& a) {
                           HostTensor pdq(t, {r.batch, r.chunk, r.heads_q, r.d}),
                               pdk(t, {r.batch, r.chunk, r.heads_kv, r.d}), pdv(t, {r.batch, r.chunk, r.heads_kv, r.d});
                           a.dq = pdq.view, a.dk = pdk.view, a.dv = pdv.view;
                           flashattn::backward(a);
                           add_chunk(r, dq, pdq.values(), i * r.chunk, r.heads_q);
                           add_chunk(r, dk, pdk.values(), j * r.chunk, r.heads_kv);
                           add_chunk(r, dv, pdv.values(), j * r.chunk, r.heads_kv);
                         });
  EXPECT_TRUE(fa_test::within_rule(dq, full.gref.dq, full.gplain.dq, t, 3.0, "ring dq"));
  EXPECT_TRUE(fa_test::within_rule(dk, full.gref.dk, full.gplain.dk, t, 3.0, "ring dk"));
  EXPECT_TRUE(fa_test::within_rule(dv, full.gref.dv, full.gplain.dv, t, 3.0, "ring dv"));
}

INSTANTIATE_TEST_SUITE_P(Cpu, RingAttention,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16, DType::f16), ::testing::Bool(),
                                            ::testing::Values(0.f, 5.f)),
                         [](const ::testing::TestParamInfo<Params>& info) {
                           return std::string(flashattn::dtype_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_causal" : "") +
                                  (std::get<2>(info.param) > 0 ? "_softcap" : "");
                         });

}  // namespace
