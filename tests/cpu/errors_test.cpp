// Every argument error of the API: flashattn::Error with Status::invalid_argument, a message that
// names the argument, and not one byte written anywhere (outputs are poisoned first and every
// buffer of the problem is compared byte for byte after the call).
//
// Each problem is first checked to be valid as built (Baseline tests), so that every error test
// below changes exactly one thing and the error it sees comes from that change.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "api/validate.h"
#include "flashattn/flashattn.h"
#include "flashattn/flashattn.hpp"
#include "c_abi_util.h"
#include "test_util.h"

namespace {

using fa_test::HostTensor;
using flashattn::DeviceType;
using flashattn::DType;
using flashattn::Status;
using flashattn::TensorView;

// Buffers of one problem; snapshot() and unchanged() prove that a rejected call wrote nothing.
class Buffers {
 public:
  HostTensor& add(HostTensor t, bool output, std::mt19937& rng) {
    owned_.push_back(std::make_unique<HostTensor>(std::move(t)));
    HostTensor& h = *owned_.back();
    if (output)
      h.poison();
    else if (h.view.dtype != DType::i32)
      h.fill_uniform(rng);
    return h;
  }
  void snapshot() {
    saved_.clear();
    for (auto& t : owned_) saved_.push_back(t->storage);
  }
  ::testing::AssertionResult unchanged() const {
    for (size_t i = 0; i < owned_.size(); ++i)
      if (owned_[i]->storage != saved_[i]) return ::testing::AssertionFailure() << "buffer " << i << " was written";
    return ::testing::AssertionSuccess();
  }

 private:
  std::vector<std::unique_ptr<HostTensor>> owned_;
  std::vector<std::vector<unsigned char>> saved_;
};

// Runs `call`, expects an invalid_argument error naming `arg` (as 'arg') and no buffer written.
void expect_rejected(Buffers& bufs, const std::function<void()>& call, const std::string& arg) {
  bufs.snapshot();
  try {
    call();
    ADD_FAILURE() << "no error was thrown; expected one naming '" << arg << "'";
  } catch (const flashattn::Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument) << e.what();
    EXPECT_NE(std::string(e.what()).find("'" + arg + "'"), std::string::npos)
        << "message does not name '" << arg << "': " << e.what();
  }
  EXPECT_TRUE(bufs.unchanged());
}

HostTensor ints(const std::vector<int32_t>& v) { return fa_test::int_tensor(v); }

// ---- forward ---------------------------------------------------------------------------------

// b = 2, s_q = 3, s_k = 5, heads 4 / 2 (GQA), f32.
struct ForwardProblem {
  std::mt19937 rng{7};
  Buffers bufs;
  HostTensor *q, *k, *v, *out, *lse;
  flashattn::ForwardArgs args;

  explicit ForwardProblem(int64_t d = 32, int64_t heads_kv = 2) {
    q = &bufs.add(HostTensor(DType::f32, {2, 3, 4, d}), false, rng);
    k = &bufs.add(HostTensor(DType::f32, {2, 5, heads_kv, d}), false, rng);
    v = &bufs.add(HostTensor(DType::f32, {2, 5, heads_kv, d}), false, rng);
    out = &bufs.add(HostTensor(DType::f32, {2, 3, 4, d}), true, rng);
    lse = &bufs.add(HostTensor(DType::f32, {2, 4, 3}), true, rng);
    args.q = q->view;
    args.k = k->view;
    args.v = v->view;
    args.out = out->view;
    args.lse = lse->view;
  }
  HostTensor& extra(HostTensor t, bool output) { return bufs.add(std::move(t), output, rng); }
  void expect(const flashattn::ForwardArgs& a, const std::string& arg) {
    expect_rejected(bufs, [&] { flashattn::forward(a); }, arg);
  }
};

// Packed batch of 3 sequences (q lengths 3, 0, 5; k lengths 5, 1, 5): total_q 8, total_k 11.
struct VarlenProblem {
  std::mt19937 rng{8};
  Buffers bufs;
  HostTensor *cu_q, *cu_k, *out;
  flashattn::ForwardArgs args;

  VarlenProblem() {
    auto& q = bufs.add(HostTensor(DType::f32, {8, 4, 32}), false, rng);
    auto& k = bufs.add(HostTensor(DType::f32, {11, 2, 32}), false, rng);
    auto& v = bufs.add(HostTensor(DType::f32, {11, 2, 32}), false, rng);
    out = &bufs.add(HostTensor(DType::f32, {8, 4, 32}), true, rng);
    auto& lse = bufs.add(HostTensor(DType::f32, {4, 8}), true, rng);
    cu_q = &bufs.add(ints({0, 3, 3, 8}), false, rng);
    cu_k = &bufs.add(ints({0, 5, 6, 11}), false, rng);
    args.q = q.view;
    args.k = k.view;
    args.v = v.view;
    args.out = out->view;
    args.lse = lse.view;
    args.cu_seqlens_q = cu_q->view;
    args.cu_seqlens_k = cu_k->view;
  }
  void set_cu(HostTensor* t, const std::vector<int32_t>& v) { std::memcpy(t->storage.data(), v.data(), v.size() * 4); }
  void expect(const std::string& arg) {
    expect_rejected(bufs, [&] { flashattn::forward(args); }, arg);
  }
};

TEST(Errors, BaselineProblemsAreValid) {
  ForwardProblem f;
  EXPECT_NO_THROW(flashattn::api::validate_forward(f.args));
  VarlenProblem vl;
  EXPECT_NO_THROW(flashattn::api::validate_forward(vl.args));
}

TEST(Errors, ForwardWrongRank) {
  ForwardProblem p;
  auto a = p.args;
  a.q.rank = 3;  // [2, 3, 4] without cu_seqlens
  p.expect(a, "q");
  a = p.args;
  a.k.rank = 5;
  p.expect(a, "k");
}

TEST(Errors, ForwardKVShapeMismatch) {
  ForwardProblem p;
  auto a = p.args;
  a.v.shape[1] = 4;  // v has fewer keys than k
  p.expect(a, "v");
  a = p.args;
  a.k.shape[3] = 64;  // head_dim of k differs from q's
  p.expect(a, "k");
  a = p.args;
  a.k.shape[0] = 1;  // batch of k differs from q's
  p.expect(a, "k");
}

TEST(Errors, ForwardOutShapeMismatch) {
  ForwardProblem p;
  auto& wrong = p.extra(HostTensor(DType::f32, {2, 4, 4, 32}), true);
  auto a = p.args;
  a.out = wrong.view;
  p.expect(a, "out");
}

TEST(Errors, ForwardLseShapeMismatch) {
  ForwardProblem p;
  auto& wrong = p.extra(HostTensor(DType::f32, {2, 3, 4}), true);  // [b, s_q, h] instead of [b, h, s_q]
  auto a = p.args;
  a.lse = wrong.view;
  p.expect(a, "lse");
}

TEST(Errors, ForwardMismatchedDtypes) {
  ForwardProblem p;
  auto& k16 = p.extra(HostTensor(DType::f16, {2, 5, 2, 32}), false);
  auto& out_bf16 = p.extra(HostTensor(DType::bf16, {2, 3, 4, 32}), true);
  auto& lse64 = p.extra(HostTensor(DType::f64, {2, 4, 3}), true);
  auto a = p.args;
  a.k = k16.view;
  p.expect(a, "k");
  a = p.args;
  a.out = out_bf16.view;
  p.expect(a, "out");
  a = p.args;
  a.lse = lse64.view;  // f64 lse is for f64 inputs only
  p.expect(a, "lse");
  a = p.args;
  a.q.dtype = DType::i32;
  p.expect(a, "q");
}

TEST(Errors, ForwardMismatchedDevices) {
  ForwardProblem p;
  auto a = p.args;
  a.k.device = DeviceType::cuda;
  p.expect(a, "k");
  a = p.args;
  a.out.device = DeviceType::cuda;
  p.expect(a, "out");
  a = p.args;
  a.lse.device = DeviceType::cuda;
  p.expect(a, "lse");
}

TEST(Errors, ForwardUnsupportedHeadDim) {
  for (int64_t d : {20, 264, 100, 8, 0}) {
    SCOPED_TRACE("head_dim " + std::to_string(d));
    ForwardProblem p(d);
    p.expect(p.args, "q");
  }
}

TEST(Errors, ForwardHeadsNotAMultiple) {
  ForwardProblem p(32, 3);  // 4 query heads over 3 KV heads
  p.expect(p.args, "k");
}

TEST(Errors, ForwardLastDimNotContiguous) {
  ForwardProblem p;
  auto& wide = p.extra(HostTensor(DType::f32, {2, 3, 4, 64}), false);
  auto a = p.args;
  a.q = wide.view;
  a.q.shape[3] = 32;
  a.q.stride[3] = 2;  // every other element of a wider tensor
  p.expect(a, "q");
  auto& wide_out = p.extra(HostTensor(DType::f32, {2, 3, 4, 64}), true);
  a = p.args;
  a.out = wide_out.view;
  a.out.shape[3] = 32;
  a.out.stride[3] = 2;
  p.expect(a, "out");
}

TEST(Errors, ForwardNegativeStrides) {
  ForwardProblem p;
  auto a = p.args;
  // The same sequence read backwards: the last token first.
  a.k.data = static_cast<float*>(a.k.data) + 4 * a.k.stride[1];
  a.k.stride[1] = -a.k.stride[1];
  p.expect(a, "k");
  a = p.args;
  a.out.data = static_cast<float*>(a.out.data) + 2 * a.out.stride[1];
  a.out.stride[1] = -a.out.stride[1];
  p.expect(a, "out");
}

TEST(Errors, ForwardNullData) {
  ForwardProblem p;
  for (const char* name : {"q", "k", "v", "out", "lse"}) {
    auto a = p.args;
    TensorView* t = std::string(name) == "q"   ? &a.q
                    : std::string(name) == "k" ? &a.k
                    : std::string(name) == "v" ? &a.v
                    : std::string(name) == "out" ? &a.out
                                                 : &a.lse;
    t->data = nullptr;
    SCOPED_TRACE(name);
    p.expect(a, name);
  }
}

// A negative rank is not "absent" (rank 0): an optional tensor with one is rejected, not skipped
// (found by tests/fuzz).
TEST(Errors, ForwardNegativeRankOfAnOptionalTensor) {
  ForwardProblem p;
  auto a = p.args;
  a.lse.rank = -1;
  p.expect(a, "lse");
}

TEST(Errors, ForwardWindowAndCausalOptions) {
  ForwardProblem p;
  auto a = p.args;
  a.options.window_left = -2;
  p.expect(a, "options.window_left");
  a = p.args;
  a.options.window_right = -5;
  p.expect(a, "options.window_right");
  a = p.args;
  a.options.causal = true;
  a.options.window_right = 1;  // causal sees no future key
  p.expect(a, "options.window_right");
}

TEST(Errors, ForwardSoftcapAndScale) {
  ForwardProblem p;
  auto a = p.args;
  a.options.softcap = -1.f;
  p.expect(a, "options.softcap");
  a.options.softcap = std::numeric_limits<float>::quiet_NaN();
  p.expect(a, "options.softcap");
  a.options.softcap = std::numeric_limits<float>::infinity();
  p.expect(a, "options.softcap");
  a = p.args;
  a.options.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  p.expect(a, "options.softmax_scale");
  a.options.softmax_scale = -0.5f;
  p.expect(a, "options.softmax_scale");
  a = p.args;
  a.options.num_threads = -1;
  p.expect(a, "options.num_threads");
}

TEST(Errors, ForwardOutputsAliasingInputs) {
  ForwardProblem p;
  auto a = p.args;
  a.out = a.q;  // out == q
  p.expect(a, "out");
  a = p.args;
  a.lse = TensorView::contiguous(p.out->view.data, DType::f32, {2, 4, 3});  // lse inside out
  p.expect(a, "lse");
  a = p.args;
  a.lse = TensorView::contiguous(static_cast<float*>(p.v->view.data) + 7, DType::f32, {2, 4, 3});
  p.expect(a, "lse");
}

TEST(Errors, ForwardOutputWithZeroStride) {
  ForwardProblem p;
  auto a = p.args;
  a.out.stride[1] = 0;  // three query rows would be written to one place
  p.expect(a, "out");
}

TEST(Errors, ForwardOutputWithOverlappingStrides) {
  ForwardProblem p;
  auto a = p.args;
  a.out.stride[2] = 16;  // head h starts inside head h - 1 (head_dim 32)
  p.expect(a, "out");
  a = p.args;
  a.lse.stride[1] = 1;  // lse[b, h, i] and lse[b, h + 1, i - 1] are one element
  p.expect(a, "lse");
}

TEST(Errors, VarlenCuSeqlensNotMonotone) {
  VarlenProblem p;
  p.set_cu(p.cu_q, {0, 4, 3, 8});
  p.expect("cu_seqlens_q");
  VarlenProblem p2;
  p2.set_cu(p2.cu_k, {0, 5, 6, 2});
  p2.expect("cu_seqlens_k");
  VarlenProblem p3;
  p3.set_cu(p3.cu_q, {-1, 3, 3, 8});
  p3.expect("cu_seqlens_q");
}

TEST(Errors, VarlenCuSeqlensPastTheEnd) {
  VarlenProblem p;
  p.set_cu(p.cu_k, {0, 5, 6, 12});  // k has 11 packed rows
  p.expect("cu_seqlens_k");
  VarlenProblem p2;
  p2.set_cu(p2.cu_q, {0, 3, 3, 9});
  p2.expect("cu_seqlens_q");
}

TEST(Errors, VarlenOnlyOneCuSeqlens) {
  VarlenProblem p;
  p.args.cu_seqlens_k = TensorView();
  p.expect("cu_seqlens_k");
  VarlenProblem p2;
  p2.args.cu_seqlens_q = TensorView();
  p2.expect("cu_seqlens_q");
}

TEST(Errors, VarlenCuSeqlensWrongKind) {
  VarlenProblem p;
  p.args.cu_seqlens_k.shape[0] = 3;  // batch + 1 must agree with cu_seqlens_q
  p.expect("cu_seqlens_k");
  VarlenProblem p2;
  p2.args.cu_seqlens_q.dtype = DType::f32;
  p2.expect("cu_seqlens_q");
  VarlenProblem p3;
  p3.args.cu_seqlens_q.device = DeviceType::cuda;
  p3.expect("cu_seqlens_q");
}

// ---- backward --------------------------------------------------------------------------------

struct BackwardProblem {
  std::mt19937 rng{9};
  Buffers bufs;
  HostTensor *dq, *dk, *dv;
  flashattn::BackwardArgs args;

  BackwardProblem() {
    auto in = [&](std::vector<int64_t> s) -> HostTensor& { return bufs.add(HostTensor(DType::f32, s), false, rng); };
    auto outp = [&](std::vector<int64_t> s) -> HostTensor& { return bufs.add(HostTensor(DType::f32, s), true, rng); };
    args.q = in({1, 3, 2, 32}).view;
    args.k = in({1, 4, 2, 32}).view;
    args.v = in({1, 4, 2, 32}).view;
    args.out = in({1, 3, 2, 32}).view;
    args.dout = in({1, 3, 2, 32}).view;
    args.lse = in({1, 2, 3}).view;
    dq = &outp({1, 3, 2, 32});
    dk = &outp({1, 4, 2, 32});
    dv = &outp({1, 4, 2, 32});
    args.dq = dq->view;
    args.dk = dk->view;
    args.dv = dv->view;
  }
  void expect(const flashattn::BackwardArgs& a, const std::string& arg) {
    expect_rejected(bufs, [&] { flashattn::backward(a); }, arg);
  }
};

TEST(Errors, BackwardBaselineIsValid) {
  BackwardProblem p;
  EXPECT_NO_THROW(flashattn::api::validate_backward(p.args));
}

TEST(Errors, BackwardGradientAliasing) {
  BackwardProblem p;
  auto a = p.args;
  a.dq = a.dout;  // dq aliasing dout
  p.expect(a, "dq");
  a = p.args;
  a.dv = a.dk;
  p.expect(a, "dk");
  a = p.args;
  a.dk = a.v;
  p.expect(a, "dk");
}

TEST(Errors, BackwardShapesAndLse) {
  BackwardProblem p;
  auto a = p.args;
  a.lse = TensorView();
  p.expect(a, "lse");
  a = p.args;
  a.dk.shape[1] = 3;
  p.expect(a, "dk");
  a = p.args;
  a.dout.dtype = DType::f16;
  p.expect(a, "dout");
  a = p.args;
  a.dv.device = DeviceType::cuda;
  p.expect(a, "dv");
}

// ---- decode ----------------------------------------------------------------------------------

// Paged cache: 6 pages of 4 tokens, 2 sequences of 3 pages each (capacity 12), lengths 5 and 9.
struct DecodeProblem {
  std::mt19937 rng{10};
  Buffers bufs;
  HostTensor *table, *lens, *k_cache, *v_cache;
  flashattn::DecodeArgs args;

  explicit DecodeProblem(int64_t page_size = 4, int64_t num_pages = 6) {
    args.q = bufs.add(HostTensor(DType::f32, {2, 1, 4, 32}), false, rng).view;
    k_cache = &bufs.add(HostTensor(DType::f32, {num_pages, page_size, 2, 32}), false, rng);
    v_cache = &bufs.add(HostTensor(DType::f32, {num_pages, page_size, 2, 32}), false, rng);
    table = &bufs.add(ints({0, 1, 2, 3, 4, 5}), false, rng);
    lens = &bufs.add(ints({5, 9}), false, rng);
    args.k_cache = k_cache->view;
    args.v_cache = v_cache->view;
    args.block_table = TensorView::contiguous(table->view.data, DType::i32, {2, 3});
    args.cache_seqlens = lens->view;
    args.out = bufs.add(HostTensor(DType::f32, {2, 1, 4, 32}), true, rng).view;
    args.lse = bufs.add(HostTensor(DType::f32, {2, 4, 1}), true, rng).view;
  }
  void with_append() {
    args.k_new = bufs.add(HostTensor(DType::f32, {2, 1, 2, 32}), false, rng).view;
    args.v_new = bufs.add(HostTensor(DType::f32, {2, 1, 2, 32}), false, rng).view;
  }
  void set(HostTensor* t, const std::vector<int32_t>& v) { std::memcpy(t->storage.data(), v.data(), v.size() * 4); }
  void expect(const flashattn::DecodeArgs& a, const std::string& arg) {
    expect_rejected(bufs, [&] { flashattn::decode(a); }, arg);
  }
};

TEST(Errors, DecodeBaselineIsValid) {
  DecodeProblem p;
  EXPECT_NO_THROW(flashattn::api::validate_decode(p.args));
  p.with_append();
  EXPECT_NO_THROW(flashattn::api::validate_decode(p.args));
}

TEST(Errors, DecodeBlockTableOutOfRange) {
  DecodeProblem p;
  p.set(p.table, {0, 1, 2, 3, -1, 5});  // sequence 1 (9 tokens) uses its second page
  p.expect(p.args, "block_table");
  DecodeProblem p2;
  p2.set(p2.table, {0, 6, 2, 3, 4, 5});  // 6 == num_pages
  p2.expect(p2.args, "block_table");
  DecodeProblem p3;
  p3.args.block_table.dtype = DType::f32;
  p3.expect(p3.args, "block_table");
}

TEST(Errors, DecodeCacheSeqlensPastCapacity) {
  DecodeProblem p;
  p.set(p.lens, {5, 13});
  p.expect(p.args, "cache_seqlens");
  DecodeProblem p2;
  p2.set(p2.lens, {12, 9});
  p2.with_append();  // 12 cached + 1 new token does not fit in 12
  p2.expect(p2.args, "cache_seqlens");
  DecodeProblem p3;
  p3.set(p3.lens, {-1, 9});
  p3.expect(p3.args, "cache_seqlens");
}

// Sequences may share pages they only read (a common prefix), but a slot one appends to must hold
// no other token (found by tests/fuzz: the other sequence saw the new key, as the step appends
// before it attends).
TEST(Errors, DecodeAppendIntoASharedSlot) {
  DecodeProblem p;  // lengths 5 and 9, pages of 4: sequence 0 appends token 5 to its page 1, slot 1
  p.with_append();
  p.set(p.table, {0, 1, 2, 3, 1, 5});  // sequence 1 holds tokens 4-7 in page 1 too
  p.expect(p.args, "block_table");
  p.set(p.table, {0, 1, 1, 3, 4, 5});  // sequence 0 lists page 1 twice; its token 9 is not used
  EXPECT_NO_THROW(flashattn::api::validate_decode(p.args));
  p.set(p.lens, {9, 5});  // ... but now its append (token 9) lands on its own token 5
  p.expect(p.args, "block_table");
  DecodeProblem shared;  // both read page 0 (a shared prefix of 4 tokens) and append to their own
  shared.with_append();
  shared.set(shared.table, {0, 1, 2, 0, 4, 5});
  EXPECT_NO_THROW(flashattn::api::validate_decode(shared.args));
  shared.args.k_new = shared.args.v_new = TensorView();  // and without an append any sharing is fine
  shared.set(shared.table, {0, 1, 2, 0, 1, 5});
  EXPECT_NO_THROW(flashattn::api::validate_decode(shared.args));
}

TEST(Errors, DecodeBadPageSize) {
  DecodeProblem p(0);
  p.expect(p.args, "k_cache");
  DecodeProblem p2(2048, 1);
  p2.expect(p2.args, "k_cache");
}

TEST(Errors, DecodeNumSplitsOutOfRange) {
  DecodeProblem p;
  for (int32_t n : {-1, 257}) {
    auto a = p.args;
    a.num_splits = n;
    p.expect(a, "num_splits");
  }
}

TEST(Errors, DecodeOnlyOneOfKNewVNew) {
  DecodeProblem p;
  p.with_append();
  auto a = p.args;
  a.v_new = TensorView();
  p.expect(a, "v_new");
  a = p.args;
  a.k_new = TensorView();
  p.expect(a, "k_new");
}

TEST(Errors, DecodeNullsDevicesAndAliasing) {
  DecodeProblem p;
  auto a = p.args;
  a.k_cache.data = nullptr;
  p.expect(a, "k_cache");
  a = p.args;
  a.v_cache.device = DeviceType::cuda;
  p.expect(a, "v_cache");
  a = p.args;
  a.cache_seqlens.device = DeviceType::cuda;
  p.expect(a, "cache_seqlens");
  a = p.args;
  a.out = a.q;
  p.expect(a, "out");
  a = p.args;
  a.options.causal = true;
  a.options.window_right = 2;
  p.expect(a, "options.window_right");
  p.with_append();
  a = p.args;
  a.v_cache = a.k_cache;  // appending writes both caches: they must not overlap
  p.expect(a, "k_cache");
}

// ---- merge_states ----------------------------------------------------------------------------

struct MergeProblem {
  std::mt19937 rng{11};
  Buffers bufs;
  flashattn::MergeArgs args;
  MergeProblem() {
    args.o_parts = bufs.add(HostTensor(DType::f32, {3, 4, 2, 32}), false, rng).view;
    args.lse_parts = bufs.add(HostTensor(DType::f32, {3, 4, 2}), false, rng).view;
    args.out = bufs.add(HostTensor(DType::f32, {4, 2, 32}), true, rng).view;
    args.lse = bufs.add(HostTensor(DType::f32, {4, 2}), true, rng).view;
  }
  void expect(const flashattn::MergeArgs& a, const std::string& arg) {
    expect_rejected(bufs, [&] { flashattn::merge_states(a); }, arg);
  }
};

TEST(Errors, MergeShapeErrors) {
  MergeProblem p;
  EXPECT_NO_THROW(flashattn::api::validate_merge(p.args));
  auto a = p.args;
  a.lse_parts.shape[0] = 2;  // fewer lse parts than o parts
  p.expect(a, "lse_parts");
  a = p.args;
  a.out.shape[1] = 3;
  p.expect(a, "out");
  a = p.args;
  a.lse.shape[0] = 3;
  p.expect(a, "lse");
  a = p.args;
  a.o_parts.rank = 3;
  p.expect(a, "o_parts");
  a = p.args;
  a.lse_parts.dtype = DType::f16;
  p.expect(a, "lse_parts");
  a = p.args;
  a.out = TensorView::contiguous(static_cast<float*>(a.o_parts.data) + 32, DType::f32, {4, 2, 32});
  p.expect(a, "out");
  a = p.args;
  a.out.stride[0] = 32;  // token t + 1 would rewrite head 1 of token t
  p.expect(a, "out");
}

// ---- the C ABI -------------------------------------------------------------------------------

TEST(Errors, CAbiReturnsStatusAndMessage) {
  ForwardProblem p;
  flashattn_forward_args a = fa_test::c_forward_args(p.args);
  a.options.softcap = -2.f;
  p.bufs.snapshot();
  EXPECT_EQ(flashattn_forward(&a), FLASHATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("'options.softcap'"), std::string::npos) << flashattn_last_error();
  EXPECT_TRUE(p.bufs.unchanged());

  a.options = flashattn_default_options();
  a.k.dtype = 99;
  EXPECT_EQ(flashattn_forward(&a), FLASHATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("'k'"), std::string::npos) << flashattn_last_error();
  a.k.dtype = FLASHATTN_F32;
  a.v.device = 7;
  EXPECT_EQ(flashattn_forward(&a), FLASHATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("'v'"), std::string::npos) << flashattn_last_error();
  a.v.device = FLASHATTN_CPU;
  a.q.rank = 5;
  EXPECT_EQ(flashattn_forward(&a), FLASHATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("'q'"), std::string::npos) << flashattn_last_error();
  EXPECT_TRUE(p.bufs.unchanged());
}

TEST(Errors, CAbiRejectsUndersizedStructAndNull) {
  ForwardProblem p;
  flashattn_forward_args a = fa_test::c_forward_args(p.args);
  p.bufs.snapshot();
  a.struct_size = sizeof(a) - 8;  // a caller compiled against an older, smaller struct
  EXPECT_EQ(flashattn_forward(&a), FLASHATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("struct_size"), std::string::npos) << flashattn_last_error();
  EXPECT_EQ(flashattn_forward(nullptr), FLASHATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("NULL"), std::string::npos) << flashattn_last_error();

  flashattn_backward_args b;
  std::memset(&b, 0, sizeof(b));
  b.struct_size = 4;
  EXPECT_EQ(flashattn_backward(&b), FLASHATTN_INVALID_ARGUMENT);
  flashattn_decode_args d;
  std::memset(&d, 0, sizeof(d));
  d.struct_size = 0;
  EXPECT_EQ(flashattn_decode(&d), FLASHATTN_INVALID_ARGUMENT);
  flashattn_merge_args m;
  std::memset(&m, 0, sizeof(m));
  m.struct_size = sizeof(m) - 1;
  EXPECT_EQ(flashattn_merge_states(&m), FLASHATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("merge_states"), std::string::npos) << flashattn_last_error();
  EXPECT_TRUE(p.bufs.unchanged());
}

TEST(Errors, CAbiDecodeErrorNamesArgument) {
  DecodeProblem p;
  p.set(p.table, {0, 1, 2, 3, 9, 5});
  flashattn_decode_args a;
  std::memset(&a, 0, sizeof(a));
  a.struct_size = sizeof(a);
  a.q = fa_test::c_view(p.args.q);
  a.k_cache = fa_test::c_view(p.args.k_cache);
  a.v_cache = fa_test::c_view(p.args.v_cache);
  a.block_table = fa_test::c_view(p.args.block_table);
  a.cache_seqlens = fa_test::c_view(p.args.cache_seqlens);
  a.out = fa_test::c_view(p.args.out);
  a.lse = fa_test::c_view(p.args.lse);
  a.options = flashattn_default_options();
  p.bufs.snapshot();
  EXPECT_EQ(flashattn_decode(&a), FLASHATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("'block_table'"), std::string::npos) << flashattn_last_error();
  EXPECT_TRUE(p.bufs.unchanged());
}

}  // namespace
