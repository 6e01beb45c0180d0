// GPU backward against the fp64 reference gradients under the gradient accuracy rule (3x the error
// of a plain same-precision implementation + atol), over the forward's option matrix; determinism
// of the deterministic mode and of dk, dv in the default mode. The forward output and lse the
// backward consumes come from the GPU forward, as in training.
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include "gpu_util.h"

namespace fa_test {
namespace {

using flashattn::DType;

struct Case {
  DType dtype = DType::bf16;
  int64_t batch = 1, heads_q = 2, heads_kv = 1, seqlen_q = 64, seqlen_k = 64, head_dim = 64;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.f;
  std::vector<int32_t> varlen_q, varlen_k;
  int32_t outside = 0;  // varlen: packed rows before and after every sequence
  int64_t pad = 0;
  bool deterministic = false;
  // Broadcast inputs (stride 0, as torch's expand gives), bits: 1 = K and V shared by the batch,
  // 2 = every row of dO the same. A tensor map cannot describe them: the portable path runs.
  int broadcast = 0;
};

std::string describe(const Case& c) {
  std::ostringstream s;
  s << flashattn::dtype_name(c.dtype) << " b" << c.batch << " hq" << c.heads_q << " hkv" << c.heads_kv << " sq" << c.seqlen_q
    << " sk" << c.seqlen_k << " d" << c.head_dim << (c.causal ? " causal" : "") << " win(" << c.window_left << ","
    << c.window_right << ") cap" << c.softcap << (c.varlen_q.empty() ? "" : " varlen") << " pad" << c.pad
    << (c.deterministic ? " deterministic" : "")
    << (c.broadcast ? " broadcast" + std::to_string(c.broadcast) : "");
  return s.str();
}

// Host and device copies of one backward problem; `run` executes forward + backward on the GPU.
struct Problem {
  Case c;
  HostTensor q, k, v, dout, out, lse, dq, dk, dv, cuq, cuk;
  std::unique_ptr<DeviceTensor> d_q, d_k, d_v, d_dout, d_out, d_lse, d_dq, d_dk, d_dv, d_cuq, d_cuk;

  explicit Problem(const Case& cs, uint32_t seed) : c(cs) {
    std::mt19937 rng(seed);
    const bool varlen = !c.varlen_q.empty();
    std::vector<int64_t> qs, ks, ls;
    if (varlen) {
      auto cq = cu_seqlens_of(c.varlen_q), ck = cu_seqlens_of(c.varlen_k);
      for (auto* cu : {&cq, &ck})
        for (int32_t& x : *cu) x += c.outside;
      qs = {cq.back() + c.outside, c.heads_q, c.head_dim};
      ks = {ck.back() + c.outside, c.heads_kv, c.head_dim};
      ls = {c.heads_q, qs[0]};
      cuq = int_tensor(cq);
      cuk = int_tensor(ck);
    } else {
      qs = {c.batch, c.seqlen_q, c.heads_q, c.head_dim};
      ks = {c.batch, c.seqlen_k, c.heads_kv, c.head_dim};
      ls = {c.batch, c.heads_q, c.seqlen_q};
    }
    q = HostTensor(c.dtype, qs, c.pad);
    k = HostTensor(c.dtype, ks, c.pad);
    v = HostTensor(c.dtype, ks, c.pad);
    dout = HostTensor(c.dtype, qs, c.pad);
    out = HostTensor(c.dtype, qs, c.pad);
    lse = HostTensor(DType::f32, ls);
    dq = HostTensor(c.dtype, qs, c.pad);
    dk = HostTensor(c.dtype, ks, c.pad);
    dv = HostTensor(c.dtype, ks, c.pad);
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
    dout.fill_normal(rng);
    if (c.broadcast & 1) broadcast_batch(k), broadcast_batch(v);
    if (c.broadcast & 2) broadcast_rows(dout);
    for (auto [h, d] : {std::pair{&q, &d_q}, {&k, &d_k}, {&v, &d_v}, {&dout, &d_dout}, {&out, &d_out}, {&lse, &d_lse},
                        {&dq, &d_dq}, {&dk, &d_dk}, {&dv, &d_dv}})
      *d = std::make_unique<DeviceTensor>(*h);
    if (varlen) {
      d_cuq = std::make_unique<DeviceTensor>(cuq);
      d_cuk = std::make_unique<DeviceTensor>(cuk);
    }
  }

  flashattn::AttnOptions options() const {
    flashattn::AttnOptions o;
    o.causal = c.causal;
    o.window_left = c.window_left;
    o.window_right = c.window_right;
    o.softcap = c.softcap;
    return o;
  }

  flashattn::BackwardArgs host_args() const {
    flashattn::BackwardArgs a;
    a.dout = dout.view;
    a.q = q.view;
    a.k = k.view;
    a.v = v.view;
    a.out = out.view;
    a.lse = lse.view;
    a.dq = dq.view;
    a.dk = dk.view;
    a.dv = dv.view;
    if (!c.varlen_q.empty()) {
      a.cu_seqlens_q = cuq.view;
      a.cu_seqlens_k = cuk.view;
    }
    a.options = options();
    return a;
  }

  void forward() {
    flashattn::ForwardArgs f;
    f.q = d_q->view;
    f.k = d_k->view;
    f.v = d_v->view;
    f.out = d_out->view;
    f.lse = d_lse->view;
    if (d_cuq) {
      f.cu_seqlens_q = d_cuq->view;
      f.cu_seqlens_k = d_cuk->view;
    }
    f.options = options();
    flashattn::forward(f);
  }

  void backward() {
    poison_grads();
    flashattn::backward(device_args());
    if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("backward failed on the device");
    fetch_grads();
  }

  void poison_grads() {
    d_dq->poison();
    d_dk->poison();
    d_dv->poison();
  }

  void fetch_grads() {
    d_dq->copy_to(dq);
    d_dk->copy_to(dk);
    d_dv->copy_to(dv);
  }

  flashattn::BackwardArgs device_args() const {
    flashattn::BackwardArgs a;
    a.dout = d_dout->view;
    a.q = d_q->view;
    a.k = d_k->view;
    a.v = d_v->view;
    a.out = d_out->view;
    a.lse = d_lse->view;
    a.dq = d_dq->view;
    a.dk = d_dk->view;
    a.dv = d_dv->view;
    if (d_cuq) {
      a.cu_seqlens_q = d_cuq->view;
      a.cu_seqlens_k = d_cuk->view;
    }
    a.options = options();
    a.deterministic = c.deterministic;
    return a;
  }
};

// The kernel of the last backward, checked against the path dispatch must pick.
void expect_path(const Case& c, bool portable) {
  const std::string kernel = flashattn::last_gpu_kernel();
  EXPECT_EQ(kernel.find("hopper") != std::string::npos,
            !portable && c.broadcast == 0 && expect_hopper("bwd", c.head_dim, c.dtype))
      << kernel;
}

// A gradient's values, where rows outside every sequence must have kept their poison (NaN) and are
// set to the reference's zeros.
std::vector<double> outside_untouched(const HostTensor& t, const Problem& pr, bool keys) {
  std::vector<double> v = t.values();
  if (pr.c.varlen_q.empty()) return v;
  const HostTensor& cu = keys ? pr.cuk : pr.cuq;
  const int32_t* x = reinterpret_cast<const int32_t*>(cu.storage.data());
  const int64_t lo = x[0], hi = x[cu.numel() - 1], row = t.view.shape[1] * t.view.shape[2];
  for (size_t i = 0; i < v.size(); ++i) {
    const int64_t r = int64_t(i) / row;
    if (r >= lo && r < hi) continue;
    EXPECT_TRUE(std::isnan(v[i])) << "gradient row " << r << " is in no sequence but was written";
    v[i] = 0;
  }
  return v;
}

// Each case runs on the path dispatch picks (the Hopper path where it applies) and on the portable
// path, which stays the fallback for everything the Hopper path does not cover.
void check_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  if (skip_unbuilt("bwd", c.head_dim, c.dtype)) return;
  Problem pr(c, seed);
  pr.forward();
  pr.d_out->copy_to(pr.out);
  pr.d_lse->copy_to(pr.lse);
  auto ref = flashattn::reference::backward(pr.host_args());
  auto plain = flashattn::reference::backward(pr.host_args(), flashattn::reference::Precision::same_as_input);
  on_both_paths("FLASHATTN_GPU_BACKWARD", [&](bool portable) {
    pr.backward();
    expect_path(c, portable);
    EXPECT_TRUE(within_rule(outside_untouched(pr.dq, pr, false), ref.dq, plain.dq, c.dtype, 3.0, "dq"));
    EXPECT_TRUE(within_rule(outside_untouched(pr.dk, pr, true), ref.dk, plain.dk, c.dtype, 3.0, "dk"));
    EXPECT_TRUE(within_rule(outside_untouched(pr.dv, pr, true), ref.dv, plain.dv, c.dtype, 3.0, "dv"));
  });
}

// Two GPU runs of the same gradient (different kernels or schedules) agree to rounding: within 1%
// of the largest magnitude of `want`, which must not be all zeros.
::testing::AssertionResult agree_to_rounding(const std::vector<double>& got, const std::vector<double>& want) {
  double scale = 0;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  if (scale == 0.0) return ::testing::AssertionFailure() << "the reference gradient is all zeros";
  const double diff = max_abs_diff(got, want);
  if (diff > 1e-2 * scale) return ::testing::AssertionFailure() << "max |diff| " << diff << " > 1e-2 x " << scale;
  return ::testing::AssertionSuccess();
}

// `runs` more backward passes of `pr` (forward and backward already run) give bitwise its dq, dk, dv.
void expect_bitwise_repeatable(Problem& pr, int runs) {
  const std::vector<unsigned char> dq0 = pr.dq.storage, dk0 = pr.dk.storage, dv0 = pr.dv.storage;
  for (int run = 0; run < runs; ++run) {
    pr.backward();
    ASSERT_EQ(pr.dq.storage, dq0) << "run " << run;
    ASSERT_EQ(pr.dk.storage, dk0) << "run " << run;
    ASSERT_EQ(pr.dv.storage, dv0) << "run " << run;
  }
}

// A causal varlen batch of these query and key lengths, 4 query heads sharing 2 KV heads.
Case grouped_varlen_case(std::vector<int32_t> lengths_q, std::vector<int32_t> lengths_k) {
  Case c;
  c.batch = int64_t(lengths_q.size());
  c.varlen_q = std::move(lengths_q);
  c.varlen_k = std::move(lengths_k);
  c.heads_q = 4;
  c.heads_kv = 2;
  c.causal = true;
  return c;
}

// Each test picks its paths itself (on_both_paths, ScopedEnv): a FLASHATTN_GPU_BACKWARD set by
// whoever runs the suite would have the tests that name the Hopper path compare a path with itself.
class GpuBackward : public GpuTest {
  ScopedEnv default_path_{"FLASHATTN_GPU_BACKWARD", nullptr};
};

TEST_F(GpuBackward, EveryHeadDimAndDtype) {
  uint32_t seed = 1;
  for (DType dt : {DType::bf16, DType::f16})
    for (int64_t d : {32, 64, 96, 128, 192, 256})
      for (bool causal : {false, true}) {
        Case c;
        c.dtype = dt;
        c.batch = 2;
        c.seqlen_q = 113;
        c.seqlen_k = 113;
        c.head_dim = d;
        c.causal = causal;
        check_case(c, seed++);
      }
}

TEST_F(GpuBackward, AwkwardSequenceLengths) {
  uint32_t seed = 100;
  const std::pair<int64_t, int64_t> lens[] = {{1, 1}, {17, 17}, {1, 150}, {150, 1}, {100, 230}, {230, 100}};
  // The Hopper kernels' three step orders: d=64 issues dV before dS (rows past the sequence then
  // meet the mask twice), d=128 runs 80-row tiles with dQ transposed, d=256 splits the head dim.
  for (int64_t d : {64, 128, 256})
    for (auto [sq, sk] : lens)
      for (bool causal : {false, true}) {
        Case c;
        c.seqlen_q = sq;
        c.seqlen_k = sk;
        c.head_dim = d;
        c.causal = causal;
        check_case(c, seed++);
      }
}

TEST_F(GpuBackward, WindowsSoftcapAndGroupedHeads) {
  uint32_t seed = 200;
  for (auto [wl, wr] : {std::pair<int64_t, int64_t>{37, 11}, {0, 0}, {-1, 5}}) {
    Case c;
    c.seqlen_q = 150;
    c.seqlen_k = 180;
    c.window_left = wl;
    c.window_right = wr;
    check_case(c, seed++);
  }
  for (bool causal : {false, true}) {
    Case c;
    c.seqlen_q = 130;
    c.seqlen_k = 130;
    c.softcap = 5.f;
    c.causal = causal;
    check_case(c, seed++);
  }
  for (int64_t d : {128, 256}) {
    Case g;
    g.heads_q = 8;
    g.heads_kv = 2;
    g.seqlen_q = 100;
    g.seqlen_k = 140;
    g.causal = true;
    g.head_dim = d;
    check_case(g, seed++);
  }
  Case w;  // every option at once on the d=256 kernel
  w.heads_q = 4;
  w.heads_kv = 2;
  w.seqlen_q = 150;
  w.seqlen_k = 180;
  w.window_left = 37;
  w.window_right = 11;
  w.softcap = 5.f;
  w.head_dim = 256;
  check_case(w, seed++);
}

TEST_F(GpuBackward, VarlenStridesAndOddHeadDims) {
  Case c = grouped_varlen_case({0, 17, 130, 1, 64}, {5, 0, 130, 90, 64});
  check_case(c, 300);
  Case s;
  s.pad = 8;
  s.seqlen_q = 77;
  s.seqlen_k = 91;
  check_case(s, 301);
  Case o;
  o.head_dim = 72;  // rounded up to the d=96 kernel
  o.seqlen_q = 65;
  o.seqlen_k = 129;
  check_case(o, 302);
  Case v = c;
  v.head_dim = 256;
  check_case(v, 303);
  Case w = s;
  w.head_dim = 256;
  check_case(w, 304);
}

// Head dims below their kernel's own (112 runs the d=128 kernels, 240 the d=256 ones): the columns
// past the head dim are zero-filled on load and never reach dq, in both modes (on the portable path
// on Hopper they add zeros into the fragment-ordered accumulator's padding and the convert kernel
// writes only the columns below the head dim: at 240 the last warp along the head dim owns 6 of
// its 8 chunks).
// Packed rows before the first sequence and after the last belong to none: never read or written.
TEST_F(GpuBackward, VarlenRowsOutsideEverySequenceUntouched) {
  uint32_t seed = 520;
  for (bool deterministic : {false, true})
    for (int64_t d : {64, 128, 256}) {
      Case c = grouped_varlen_case({3, 0, 77}, {40, 9, 130});
      c.head_dim = d;
      c.outside = 5;
      c.deterministic = deterministic;
      check_case(c, seed++);
    }
}

// No query row in any sequence (the GPU fuzzer's find: the preprocess kernel was launched on a grid
// of zero blocks and failed): dK = dV = 0 over the sequences' key rows, rows outside every sequence
// and dQ's untouched, on both paths and in both modes.
TEST_F(GpuBackward, NoQueryRowsGiveZeroKeyGradients) {
  uint32_t seed = 530;
  for (bool varlen : {false, true})
    for (bool deterministic : {false, true})
      for (int64_t d : {64, 128}) {
        Case c;
        if (varlen) {
          c = grouped_varlen_case({0, 0, 0}, {5, 0, 130});
          c.outside = 3;
        } else {
          c.batch = 2;
          c.seqlen_q = 0;
          c.seqlen_k = 50;
        }
        c.head_dim = d;
        c.deterministic = deterministic;
        SCOPED_TRACE(describe(c));
        if (skip_unbuilt("bwd", c.head_dim, c.dtype)) continue;
        Problem pr(c, seed++);
        pr.forward();
        on_both_paths("FLASHATTN_GPU_BACKWARD", [&](bool) {
          pr.backward();
          for (const HostTensor* g : {&pr.dk, &pr.dv})
            for (double x : outside_untouched(*g, pr, true)) ASSERT_EQ(x, 0.0);
          for (double x : outside_untouched(pr.dq, pr, false)) ASSERT_EQ(x, 0.0);
        });
      }
}

// Broadcast inputs (stride 0 over the batch or dO's rows): the Hopper path once read other rows
// for them (the GPU fuzzer's find: dQ inf or 10x the rule); they run on the portable path, exact.
TEST_F(GpuBackward, BroadcastInputs) {
  uint32_t seed = 540;
  for (int broadcast : {1, 2})
    for (int64_t d : {64, 128, 256}) {
      Case c;
      c.batch = 3;
      c.head_dim = d;
      c.seqlen_q = 77;
      c.seqlen_k = 91;
      c.causal = broadcast == 1;
      c.broadcast = broadcast;
      check_case(c, seed++);
    }
}

TEST_F(GpuBackward, HeadDimsBelowTheKernelsOwn) {
  uint32_t seed = 700;
  for (int64_t d : {112, 240})
    for (bool deterministic : {false, true})
      for (bool causal : {false, true}) {
        Case c;
        c.head_dim = d;
        c.seqlen_q = 150;
        c.seqlen_k = 170;
        c.causal = causal;
        c.deterministic = deterministic;
        check_case(c, seed++);
      }
}

// Several key tiles per head and more query steps than pipeline stages (the Q/dO ring, the dQ
// buffers and the K/V barrier phases wrap), GQA, and key tiles that no query sees (their dk and dv
// must be written as zeros).
TEST_F(GpuBackward, LongerSequencesAndUnseenKeyTiles) {
  uint32_t seed = 350;
  for (int64_t d : {64, 128, 256})
    for (bool causal : {false, true}) {
      Case c;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.seqlen_q = 700;
      c.seqlen_k = 700;
      c.head_dim = d;
      c.causal = causal;
      check_case(c, seed++);
    }
  Case w;
  w.seqlen_q = 64;
  w.seqlen_k = 400;
  w.window_left = 10;
  w.window_right = 0;
  w.head_dim = 128;
  check_case(w, seed++);
}

// One query head per KV head and an odd number of query tiles (5 of 64 rows, 3 of 128), so that a
// key tile's steps are odd in number: the default mode at d = 64 and 128 (and the deterministic one
// at d = 64) computes each step's dQ on one warpgroup, the two in turns by step, so the turn a key
// tile starts with alternates. More work
// tiles than an H200 has SMs, so persistent CTAs carry the turns from one key tile to the next.
TEST_F(GpuBackward, DqTurnsCarryAcrossKeyTiles) {
  uint32_t seed = 380;
  for (int64_t d : {64, 128})
    for (bool causal : {false, true}) {
      Case c;
      c.batch = 3;
      c.heads_q = 10;
      c.heads_kv = 10;
      c.seqlen_q = 300;
      c.seqlen_k = 520;
      c.head_dim = d;
      c.causal = causal;
      check_case(c, seed++);
    }
}

// Causal, grouped heads, and a length that is no multiple of any tile.
Case deterministic_case(int64_t d) {
  Case c;
  c.deterministic = true;
  c.seqlen_q = 300;
  c.seqlen_k = 300;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = d;
  c.causal = true;
  return c;
}

TEST_F(GpuBackward, DeterministicModeIsBitwiseRepeatable) {
  // Both paths' turn orders: key tiles walking up from their diagonal under a right bound
  // (causal), round from each key tile's diagonal without a mask (at d=128 on Hopper, in 80-row
  // query tiles).
  for (auto [d, causal] :
       {std::pair<int64_t, bool>{64, true}, {64, false}, {128, true}, {128, false}, {256, true}}) {
    if (skip_unbuilt("bwd", d, deterministic_case(d).dtype)) continue;
    on_both_paths("FLASHATTN_GPU_BACKWARD", [&](bool portable) {
      Case c = deterministic_case(d);
      c.causal = causal;
      SCOPED_TRACE(describe(c));
      Problem pr(c, 401);
      pr.forward();
      pr.backward();
      expect_path(c, portable);
      expect_bitwise_repeatable(pr, 50);
    });
  }
}

// The deterministic paths are also within the accuracy rule, including a left window, where the
// first key tile adding into a query tile is not the first key tile.
TEST_F(GpuBackward, DeterministicModeWithinTheRule) {
  check_case(deterministic_case(128), 400);
  check_case(deterministic_case(256), 402);
  for (int64_t d : {64, 128, 256}) {
    Case w = deterministic_case(d);
    w.seqlen_q = 700;
    w.seqlen_k = 760;
    w.causal = false;
    w.window_left = 150;
    w.window_right = 20;
    check_case(w, 403 + uint32_t(d));
    // No mask, more query tiles than key tiles and fewer: the `around` order's key tiles start
    // at query tiles spread unevenly, and some start together (one waits for the other).
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{700, 300}, {200, 900}}) {
      Case a = deterministic_case(d);
      a.causal = false;
      a.seqlen_q = sq;
      a.seqlen_k = sk;
      check_case(a, 407 + uint32_t(d + sq));
    }
  }
}

// Varlen batches (empty and short sequences, sequences of fewer key tiles than the grid's, whose
// missing key tiles come first in the causal order) with grouped heads: the ordered mode's turns
// stay within the accuracy rule and repeat bitwise, on both paths.
TEST_F(GpuBackward, DeterministicModeVarlen) {
  for (int64_t d : {64, 128, 256})
    for (bool causal : {false, true}) {
      Case c = grouped_varlen_case({0, 17, 330, 1, 200}, {5, 0, 330, 450, 70});
      c.head_dim = d;
      c.causal = causal;
      c.deterministic = true;
      if (skip_unbuilt("bwd", d, c.dtype)) continue;
      check_case(c, 420 + uint32_t(d) + (causal ? 1 : 0));
      SCOPED_TRACE(describe(c));
      Problem pr(c, 430);
      pr.forward();
      on_both_paths("FLASHATTN_GPU_BACKWARD", [&](bool portable) {
        pr.backward();
        expect_path(c, portable);
        expect_bitwise_repeatable(pr, 10);
      });
    }
}

// One head's key tiles outnumber what the GPU holds at once (24000 keys: 188 key tiles of 128 at
// d=128 and d=256, one CTA per SM, two per key tile at d=256): key tiles wait for turns of CTAs
// that are not resident yet, and the ordered mode must still finish (a key tile only ever waits
// for key tiles that start before it: lower ones, or higher ones under a right bound, which then
// start first), repeat bitwise, and agree with the default mode to rounding. The same for the
// `around` order (no mask) at the most key tiles per sequence it takes on an H200 (8400 keys: 66 of
// 128 at d=64, 132 SMs), where a key tile waits for higher ones and eight heads' CTAs do not fit at
// once; and d=256 without a mask just past that order's reach there (5000 keys: 40 key tiles of
// 128, two CTAs each, where 33 fit twice over), so the `down` order. On both paths (the portable
// one launches one CTA per key tile, descending in the `up` order).
TEST_F(GpuBackward, DeterministicModeFinishesOnGridsLargerThanTheGpu) {
  struct Shape {
    int64_t d;
    bool causal;
    int64_t seqlen, heads;
  };
  // Several heads under a causal mask: the portable grid's last (KV head) pair walks down after
  // the others walked up (284 and 282 CTAs there, one per SM).
  const Shape shapes[] = {{128, false, 24000, 1}, {128, true, 24000, 1}, {256, true, 24000, 1},
                          {64, false, 8400, 8},    {256, false, 5000, 2}, {128, true, 9000, 4},
                          {256, true, 6000, 3}};
  for (const Shape& sh : shapes) {
    if (skip_unbuilt("bwd", sh.d, Case{}.dtype)) continue;
    on_both_paths("FLASHATTN_GPU_BACKWARD", [&](bool portable) {
      Case c;
      c.heads_q = c.heads_kv = sh.heads;
      c.seqlen_q = c.seqlen_k = sh.seqlen;
      c.head_dim = sh.d;
      c.causal = sh.causal;
      SCOPED_TRACE(describe(c));
      Problem fast(c, 410);
      fast.forward();
      fast.backward();
      c.deterministic = true;
      Problem det(c, 410);
      det.forward();
      det.backward();
      expect_path(c, portable);
      expect_bitwise_repeatable(det, 1);
      for (auto [a, b] : {std::pair{&det.dq, &fast.dq}, {&det.dk, &fast.dk}, {&det.dv, &fast.dv}})
        EXPECT_TRUE(agree_to_rounding(a->values(), b->values()));
    });
  }
}

// More work tiles than the GPU has SMs, so the Hopper path's persistent CTAs each draw several
// (varlen with empty and short sequences, whose missing key tiles are skipped; grouped heads; causal
// tiles of every length). Its gradients agree with the portable path's (an independent kernel) to
// rounding, and dk, dv repeat bitwise although the tiles land on other CTAs from run to run.
TEST_F(GpuBackward, PersistentGridWalksMoreTilesThanSms) {
  for (int64_t d : {64, 128})
    for (bool causal : {false, true}) {
      Case c;
      c.varlen_q = {1000, 0, 1500, 37, 1300, 2000};
      c.varlen_k = {1000, 0, 1500, 37, 1300, 2000};
      c.heads_q = 8;
      c.heads_kv = 4;
      c.head_dim = d;
      c.causal = causal;
      SCOPED_TRACE(describe(c));
      Problem hopper(c, 420 + uint32_t(d)), portable(c, 420 + uint32_t(d));
      hopper.forward();
      hopper.backward();
      expect_path(c, false);
      const std::vector<unsigned char> dk0 = hopper.dk.storage, dv0 = hopper.dv.storage;
      hopper.backward();
      EXPECT_EQ(hopper.dk.storage, dk0);
      EXPECT_EQ(hopper.dv.storage, dv0);
      {
        ScopedEnv force("FLASHATTN_GPU_BACKWARD", "portable");
        portable.forward();
        portable.backward();
        expect_path(c, true);
      }
      for (auto [a, b] : {std::pair{&hopper.dq, &portable.dq}, {&hopper.dk, &portable.dk}, {&hopper.dv, &portable.dv}})
        EXPECT_TRUE(agree_to_rounding(a->values(), b->values()));
    }
}

// Every warpgroup of the d = 256 kernel waits for the dO tile before its products read it: in the
// previous kernel one warpgroup waited only for Q, and its dV read dO before the tile landed in
// some runs (wrong dV at causal 4k-8k on the H200, about one run in three on one build). Repeated
// runs of such a shape agree with the portable path.
TEST_F(GpuBackward, WideHeadsDvWaitsForDo) {
  Case c;
  c.batch = 2;
  c.heads_q = c.heads_kv = 8;
  c.seqlen_q = c.seqlen_k = 4096;
  c.head_dim = 256;
  c.causal = true;
  if (skip_unbuilt("bwd", c.head_dim, c.dtype)) return;
  SCOPED_TRACE(describe(c));
  Problem hopper(c, 430), portable(c, 430);
  hopper.forward();
  {
    ScopedEnv force("FLASHATTN_GPU_BACKWARD", "portable");
    portable.forward();
    portable.backward();
    expect_path(c, true);
  }
  const std::vector<double> ref = portable.dv.values();
  for (int run = 0; run < 6; ++run) {
    hopper.backward();
    expect_path(c, false);
    ASSERT_TRUE(agree_to_rounding(hopper.dv.values(), ref)) << "run " << run;
  }
}

TEST_F(GpuBackward, DefaultModeKeepsDkDvBitwiseEqual) {
  for (int64_t d : {64, 256}) {
    if (skip_unbuilt("bwd", d, Case{}.dtype)) continue;
    on_both_paths("FLASHATTN_GPU_BACKWARD", [&](bool portable) {
      Case c;
      c.seqlen_q = 300;
      c.seqlen_k = 300;
      c.head_dim = d;
      Problem pr(c, 500);
      pr.forward();
      pr.backward();
      expect_path(c, portable);
      std::vector<unsigned char> dk0 = pr.dk.storage, dv0 = pr.dv.storage;
      std::vector<double> dq0 = pr.dq.values();
      double dq_max = 0;
      for (double x : dq0) dq_max = std::max(dq_max, std::fabs(x));
      for (int run = 0; run < 100; ++run) {
        pr.backward();
        ASSERT_EQ(pr.dk.storage, dk0) << "run " << run;
        ASSERT_EQ(pr.dv.storage, dv0) << "run " << run;
        // dq sums fp32 additions in a varying order: equal within two bf16 ulps of the largest value.
        EXPECT_LE(max_abs_diff(pr.dq.values(), dq0), dq_max * std::ldexp(1.0, -6)) << "run " << run;
      }
    });
  }
}

// The portable path's cut tail: without a mask, key tiles filling whole waves of SMs and part of
// one more have the last, partial wave's tiles computed in pieces (shares of the query tiles) on
// separate CTAs and merged (tile_scheduler.h, plan_tail_pieces). On a 132-SM H100/H200 these
// shapes are cut (one CTA per SM: 160, 192 and 144 key tiles), with a partial last key and query
// tile, GQA, seqlen_q != seqlen_k and softcap; the gradients are within the rule and dk, dv repeat
// bitwise.
TEST_F(GpuBackward, PortableTailCutIntoPieces) {
  ScopedEnv force("FLASHATTN_GPU_BACKWARD", "portable");
  uint32_t seed = 520;
  for (const GqaShape& sh : {GqaShape{64, 5, 20, 4, 1000, 1000, 0.f}, GqaShape{256, 3, 8, 4, 1000, 1000, 5.f},
                             GqaShape{128, 4, 8, 4, 700, 1100, 0.f}}) {
    const Case c = shaped_case<Case>(sh);
    SCOPED_TRACE(describe(c));
    if (skip_unbuilt("bwd", c.head_dim, c.dtype)) continue;
    Problem pr(c, seed++);
    pr.forward();
    pr.d_out->copy_to(pr.out);
    pr.d_lse->copy_to(pr.lse);
    auto ref = flashattn::reference::backward(pr.host_args());
    auto plain = flashattn::reference::backward(pr.host_args(), flashattn::reference::Precision::same_as_input);
    pr.backward();
    expect_path(c, true);
    EXPECT_TRUE(within_rule(pr.dq.values(), ref.dq, plain.dq, c.dtype, 3.0, "dq"));
    EXPECT_TRUE(within_rule(pr.dk.values(), ref.dk, plain.dk, c.dtype, 3.0, "dk"));
    EXPECT_TRUE(within_rule(pr.dv.values(), ref.dv, plain.dv, c.dtype, 3.0, "dv"));
    const std::vector<unsigned char> dk0 = pr.dk.storage, dv0 = pr.dv.storage;
    pr.backward();
    EXPECT_EQ(pr.dk.storage, dk0);
    EXPECT_EQ(pr.dv.storage, dv0);
  }
}

// Training loops capture the backward in CUDA graphs. Captured on a stream of its own (workspace
// from the stream-ordered allocator, more work tiles than SMs so that the persistent CTAs draw
// them from the counter the preprocess kernel zeroes) and replayed twice, it gives what a direct
// call gives: dk and dv bitwise, dq to rounding (its fp32 additions run in a varying order).
TEST_F(GpuBackward, CapturedInACudaGraphAndReplayed) {
  for (int64_t d : {64, 128}) {
    Case c;
    c.batch = 2;
    c.heads_q = 8;
    c.heads_kv = 4;
    c.seqlen_q = c.seqlen_k = 4000;
    c.head_dim = d;
    c.causal = d == 128;
    SCOPED_TRACE(describe(c));
    if (skip_unbuilt("bwd", c.head_dim, c.dtype)) continue;
    Problem pr(c, 700 + uint32_t(d));
    pr.forward();
    pr.backward();
    expect_path(c, false);
    const std::vector<unsigned char> dk0 = pr.dk.storage, dv0 = pr.dv.storage;
    const std::vector<double> dq0 = pr.dq.values();

    cudaStream_t stream = nullptr;
    FA_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    flashattn::BackwardArgs a = pr.device_args();
    a.options.stream = stream;
    cudaGraph_t graph = nullptr;
    FA_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    flashattn::backward(a);
    FA_CUDA_OK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    FA_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; ++replay) {
      pr.poison_grads();
      FA_CUDA_OK(cudaDeviceSynchronize());  // the poison ran on the default stream
      FA_CUDA_OK(cudaGraphLaunch(exec, stream));
      FA_CUDA_OK(cudaStreamSynchronize(stream));
      pr.fetch_grads();
      EXPECT_EQ(pr.dk.storage, dk0) << "replay " << replay;
      EXPECT_EQ(pr.dv.storage, dv0) << "replay " << replay;
      EXPECT_TRUE(agree_to_rounding(pr.dq.values(), dq0)) << "replay " << replay;
    }
    FA_CUDA_OK(cudaGraphExecDestroy(exec));
    FA_CUDA_OK(cudaGraphDestroy(graph));
    FA_CUDA_OK(cudaStreamDestroy(stream));
  }
}

TEST_F(GpuBackward, EnvironmentVariableIsValidated) {
  ScopedEnv bad("FLASHATTN_GPU_BACKWARD", "fast");
  Case c;
  Problem pr(c, 600);
  pr.forward();
  if (!hopper_device()) GTEST_SKIP() << "the variable is read where a Hopper path exists";
  try {
    pr.backward();
    ADD_FAILURE() << "expected an error naming FLASHATTN_GPU_BACKWARD";
  } catch (const flashattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("FLASHATTN_GPU_BACKWARD"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fa_test
