// GPU decode against the fp64 reference under the accuracy rule: paged caches (pages scattered and
// shuffled, every slot that holds no token NaN, so a read past a length poisons its rows) and
// contiguous ones, lengths 0, 1, page - 1, page, page + 1 and long, page sizes 1..256, 1..16 new
// tokens, GQA 1/4/8, windows, softcap; append writes exactly its slots (the whole cache is compared
// bitwise); split counts agree; CUDA-graph replay as lengths grow equals direct runs; bad indices
// give clear errors on the validated path and NaN rows plus a fault status on the planned path
// (run under compute-sanitizer memcheck: nothing out of bounds is touched).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "c_abi_util.h"
#include "flashattn/flashattn.h"
#include "gpu_util.h"

namespace fa_test {
namespace {

namespace ref = flashattn::reference;
using flashattn::DType;

struct Case {
  DType dtype = DType::bf16;
  std::vector<int32_t> lens = {10};  // cache_seqlens, one per sequence
  int64_t sn = 1, hq = 8, hkv = 2, d = 128;
  int64_t page_size = 16;  // 0 = contiguous cache
  bool append = true;
  bool causal = false;
  int64_t wl = -1, wr = -1;
  float softcap = 0.f;
  int32_t splits = 0;
  bool with_lse = true;
  double q_scale = 1.0;
  int64_t room = 0;  // cache capacity past the longest sequence (for tests that grow lengths)
};

std::string describe(const Case& c) {
  std::string r = std::string(flashattn::dtype_name(c.dtype)) + " lens{";
  for (int32_t l : c.lens) r += std::to_string(l) + ",";
  r += "} sn" + std::to_string(c.sn) + " hq" + std::to_string(c.hq) + " hkv" + std::to_string(c.hkv) + " d" +
       std::to_string(c.d) + (c.page_size ? " page" + std::to_string(c.page_size) : " contiguous");
  if (c.append) r += " append";
  if (c.causal) r += " causal";
  if (c.wl >= 0 || c.wr >= 0) r += " window(" + std::to_string(c.wl) + "," + std::to_string(c.wr) + ")";
  if (c.softcap > 0) r += " softcap";
  return r + " splits" + std::to_string(c.splits);
}

// Host tensors, their device copies, and the arguments over each.
struct Problem {
  Case c;
  HostTensor q, k_cache, v_cache, table, lens, k_new, v_new, out, lse;
  std::unique_ptr<DeviceTensor> dq, dk, dv, dtable, dlens, dkn, dvn, dout, dlse;
  flashattn::DecodeArgs host, dev;

  const int32_t* table_data() const { return reinterpret_cast<const int32_t*>(table.storage.data()); }
  int64_t pages_per_seq() const { return c.page_size > 0 ? table.view.shape[1] : 1; }
  // (page, slot) of token t of sequence b.
  std::pair<int64_t, int64_t> where(int64_t b, int64_t t) const {
    if (c.page_size == 0) return {b, t};
    return {table_data()[b * pages_per_seq() + t / c.page_size], t % c.page_size};
  }
  // Host <-> device copies and poisoning run on the legacy stream; the device synchronization
  // orders them with work on any other stream (the graph test uses a non-blocking one).
  void upload() {  // host -> device, every input
    for (auto [h, d] : {std::pair{&q, &dq}, {&k_cache, &dk}, {&v_cache, &dv}, {&table, &dtable}, {&lens, &dlens},
                        {&k_new, &dkn}, {&v_new, &dvn}})
      if (*d) cudaMemcpy((*d)->ptr, h->storage.data(), h->storage.size(), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
  }
  void download() {  // device -> host: outputs and caches
    for (auto [h, d] : {std::pair{&out, &dout}, {&lse, &dlse}, {&k_cache, &dk}, {&v_cache, &dv}}) (*d)->copy_to(*h);
  }
  void poison_outputs() {
    dout->poison();
    dlse->poison();
    cudaDeviceSynchronize();
  }
};

Problem make_problem(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p;
  p.c = c;
  const int64_t batch = int64_t(c.lens.size()), extra = c.append ? c.sn : 0;
  int64_t longest = 0;
  for (int32_t l : c.lens) longest = std::max<int64_t>(longest, l + extra + c.room);
  std::vector<int64_t> cache_shape;
  if (c.page_size > 0) {
    const int64_t per_seq = std::max<int64_t>(1, (longest + c.page_size - 1) / c.page_size);
    const int64_t num_pages = batch * per_seq + 3;  // three pages no sequence uses
    std::vector<int32_t> ids(static_cast<size_t>(num_pages));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    p.table = int_tensor(std::vector<int32_t>(ids.begin(), ids.begin() + batch * per_seq));
    p.table.view.rank = 2;
    p.table.view.shape[0] = batch;
    p.table.view.shape[1] = per_seq;
    p.table.view.stride[0] = per_seq;
    p.table.view.stride[1] = 1;
    cache_shape = {num_pages, c.page_size, c.hkv, c.d};
  } else {
    cache_shape = {batch, longest + 5, c.hkv, c.d};
  }
  p.k_cache = HostTensor(c.dtype, cache_shape);
  p.v_cache = HostTensor(c.dtype, cache_shape);
  p.k_cache.fill_normal(rng);
  p.v_cache.fill_uniform(rng);
  // Every slot that holds no cached token is NaN (including those append will write).
  std::vector<bool> used(size_t(cache_shape[0] * cache_shape[1]), false);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < c.lens[size_t(b)]; ++t) {
      auto [page, slot] = p.where(b, t);
      used[size_t(page * cache_shape[1] + slot)] = true;
    }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const int64_t row = c.hkv * c.d;
  for (int64_t s = 0; s < int64_t(used.size()); ++s)
    if (!used[size_t(s)])
      for (int64_t e = 0; e < row; ++e) {
        p.k_cache.set(s * row + e, nan);
        p.v_cache.set(s * row + e, nan);
      }
  p.q = HostTensor(c.dtype, {batch, c.sn, c.hq, c.d});
  p.q.fill_normal(rng, c.q_scale);
  p.lens = int_tensor(c.lens);
  p.out = HostTensor(c.dtype, {batch, c.sn, c.hq, c.d});
  p.lse = HostTensor(DType::f32, {batch, c.hq, c.sn});
  if (c.append) {
    p.k_new = HostTensor(c.dtype, {batch, c.sn, c.hkv, c.d});
    p.v_new = HostTensor(c.dtype, {batch, c.sn, c.hkv, c.d});
    p.k_new.fill_normal(rng);
    p.v_new.fill_uniform(rng);
  }

  p.dq = std::make_unique<DeviceTensor>(p.q);
  p.dk = std::make_unique<DeviceTensor>(p.k_cache);
  p.dv = std::make_unique<DeviceTensor>(p.v_cache);
  p.dlens = std::make_unique<DeviceTensor>(p.lens);
  p.dout = std::make_unique<DeviceTensor>(p.out);
  p.dlse = std::make_unique<DeviceTensor>(p.lse);
  if (c.page_size > 0) p.dtable = std::make_unique<DeviceTensor>(p.table);
  if (c.append) {
    p.dkn = std::make_unique<DeviceTensor>(p.k_new);
    p.dvn = std::make_unique<DeviceTensor>(p.v_new);
  }
  p.poison_outputs();
  for (auto [args, on_device] : {std::pair{&p.host, false}, {&p.dev, true}}) {
    auto pick = [&](HostTensor& h, std::unique_ptr<DeviceTensor>& d) { return on_device ? d->view : h.view; };
    flashattn::DecodeArgs& a = *args;
    a.q = pick(p.q, p.dq);
    a.k_cache = pick(p.k_cache, p.dk);
    a.v_cache = pick(p.v_cache, p.dv);
    if (c.page_size > 0) a.block_table = pick(p.table, p.dtable);
    a.cache_seqlens = pick(p.lens, p.dlens);
    if (c.append) {
      a.k_new = pick(p.k_new, p.dkn);
      a.v_new = pick(p.v_new, p.dvn);
    }
    a.out = pick(p.out, p.dout);
    if (c.with_lse) a.lse = pick(p.lse, p.dlse);
    a.num_splits = c.splits;
    a.options.causal = c.causal;
    a.options.window_left = c.wl;
    a.options.window_right = c.wr;
    a.options.softcap = c.softcap;
  }
  return p;
}

// The cache bytes after appending k_new / v_new of the sequences in `appended` to `before`.
std::vector<unsigned char> with_appended(const Problem& p, const HostTensor& cache, const HostTensor& fresh,
                                         const std::vector<unsigned char>& before, const std::vector<int64_t>& appended) {
  std::vector<unsigned char> want = before;
  const int64_t es = flashattn::dtype_size(p.c.dtype);
  for (int64_t b : appended)
    for (int64_t t = 0; t < p.c.sn; ++t) {
      auto [page, slot] = p.where(b, p.c.lens[size_t(b)] + t);
      for (int64_t h = 0; h < p.c.hkv; ++h) {
        const int64_t dst = (page * cache.view.stride[0] + slot * cache.view.stride[1] + h * cache.view.stride[2]) * es;
        const int64_t src = (b * fresh.view.stride[0] + t * fresh.view.stride[1] + h * fresh.view.stride[2]) * es;
        std::copy_n(fresh.storage.begin() + src, p.c.d * es, want.begin() + dst);
      }
    }
  return want;
}

std::vector<int64_t> all_sequences(const Problem& p) {
  std::vector<int64_t> v(p.c.lens.size());
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Runs decode(args) on the GPU; checks out / lse against the reference and the caches bitwise.
// Returns the output values (for comparisons between runs).
std::vector<double> run_and_check(const Case& c, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  Problem p = make_problem(c, seed);
  const ref::Output exact = ref::decode(p.host, ref::Precision::f64);
  const ref::Output plain = ref::decode(p.host, ref::Precision::same_as_input);
  const std::vector<unsigned char> k_before = p.k_cache.storage, v_before = p.v_cache.storage;
  flashattn::decode(p.dev);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  p.download();
  std::vector<double> out = p.out.values();
  EXPECT_TRUE(within_rule(out, exact.out, plain.out, c.dtype, 2.0, "out"));
  if (c.with_lse) {
    EXPECT_TRUE(within_rule(p.lse.values(), exact.lse, plain.lse, c.dtype, 2.0, "lse"));
  } else {
    for (double x : p.lse.values()) EXPECT_TRUE(std::isnan(x)) << "lse was written although absent";
  }
  std::vector<int64_t> appended = c.append ? all_sequences(p) : std::vector<int64_t>{};
  EXPECT_TRUE(p.k_cache.storage == with_appended(p, p.k_cache, p.k_new, k_before, appended))
      << "k_cache differs from the old cache plus the appended rows";
  EXPECT_TRUE(p.v_cache.storage == with_appended(p, p.v_cache, p.v_new, v_before, appended))
      << "v_cache differs from the old cache plus the appended rows";
  return out;
}

class GpuDecode : public GpuTest {};

TEST_F(GpuDecode, PageSizesAndLengths) {
  uint32_t seed = 1;
  // Pages of 8, 24 and 100 tokens: the sm90 kernel's TMA boxes shrink to the largest power of two
  // dividing the page size (8, 8, 4 rows), so no box crosses a page.
  for (int64_t page : {1, 8, 16, 24, 64, 100, 256}) {
    Case c;
    c.page_size = page;
    c.lens = {0, 1, int32_t(page - 1), int32_t(page), int32_t(page + 1), int32_t(2000 + page / 2)};
    c.append = page != 64;  // keys = lens + 1 across page boundaries, and the cache alone
    run_and_check(c, seed++);
  }
  Case contiguous;
  contiguous.page_size = 0;
  contiguous.lens = {0, 1, 63, 64, 65, 1500};
  run_and_check(contiguous, seed++);
  contiguous.append = false;
  run_and_check(contiguous, seed++);
}

// 1..16 new tokens (causal among them) x GQA 1, 4, 8: 2 to 128 query rows per KV head, so every
// warp layout (16, 32, 64 rows per CTA) and several row tiles per KV head.
TEST_F(GpuDecode, NewTokensAndGroupedHeads) {
  uint32_t seed = 100;
  for (int64_t sn : {1, 3, 16})
    for (int64_t group : {1, 4, 8}) {
      Case c;
      c.sn = sn;
      c.hkv = 2;
      c.hq = 2 * group;
      c.causal = true;
      c.lens = {5, 200, 777};
      run_and_check(c, seed++);
    }
  Case mqa;  // one KV head for 32 query heads, no append: rows that see only cached keys
  mqa.hq = 32;
  mqa.hkv = 1;
  mqa.sn = 2;
  mqa.append = false;
  mqa.causal = true;
  mqa.lens = {1, 333};
  run_and_check(mqa, seed++);
}

TEST_F(GpuDecode, WindowsAndSoftcap) {
  uint32_t seed = 200;
  const std::pair<int64_t, int64_t> windows[] = {{37, 0}, {100, -1}, {0, 0}, {5, 3}, {-1, 2}};
  for (auto [wl, wr] : windows) {
    Case c;
    c.sn = 4;
    c.page_size = 64;
    c.lens = {300, 1500, 2};
    c.wl = wl;
    c.wr = wr;
    run_and_check(c, seed++);
  }
  for (bool causal : {false, true}) {
    Case c;
    c.sn = 3;
    c.softcap = 5.f;
    c.q_scale = 4.0;  // scores well past the cap
    c.causal = causal;
    c.lens = {50, 900};
    run_and_check(c, seed++);
  }
  Case none;  // causal rows whose window holds no key: out 0 and lse -inf
  none.sn = 4;
  none.append = false;
  none.causal = true;
  none.lens = {2, 0};
  run_and_check(none, seed++);
}

TEST_F(GpuDecode, HeadDimsAndDtypes) {
  uint32_t seed = 300;
  for (DType t : {DType::bf16, DType::f16})
    for (int64_t d : {32, 64, 72, 96, 128, 192, 256}) {
      if (skip_unbuilt("decode", d, t)) continue;
      Case c;
      c.dtype = t;
      c.d = d;
      c.sn = 2;
      c.causal = true;
      c.lens = {17, 640};
      run_and_check(c, seed++);
    }
}

// Split counts 1..64 (and the automatic choice) all meet the rule and agree within rounding of
// the output dtype: only the order of fp32 additions differs. Paged and contiguous caches; with
// these 8 rows per CTA, up to 16 splits the combine stages the partials in shared memory and
// weighs them (decode_combine.cuh), 64 take merge_row.cuh's batches from global memory.
TEST_F(GpuDecode, SplitCountsAgree) {
  for (int64_t page : {16, 0}) {
    Case c;
    c.page_size = page;
    c.lens = {1000, 5000, 77};
    c.sn = 2;
    c.causal = true;
    std::vector<double> first;
    for (int32_t s : {1, 2, 3, 7, 16, 64, 0}) {
      c.splits = s;
      std::vector<double> out = run_and_check(c, 400);  // same seed: the same problem
      if (first.empty()) {
        first = out;
        continue;
      }
      double peak = 0;
      for (double x : first) peak = std::max(peak, std::fabs(x));
      EXPECT_LE(max_abs_diff(out, first), 4.0 * std::ldexp(peak, -8)) << "page " << page << " splits " << s << " vs 1";
    }
  }
}

// lse is optional: without it the kernel and the split combine write out alone (the Python
// package passes none unless return_lse is asked for).
TEST_F(GpuDecode, OutWithoutLse) {
  for (int32_t splits : {1, 6}) {
    Case c;
    c.lens = {2500, 0, 31};
    c.sn = 2;
    c.causal = true;
    c.splits = splits;
    c.with_lse = false;
    run_and_check(c, 450 + uint32_t(splits));
  }
}

// The planned path with the same split count gives the same bits as decode(args).
TEST_F(GpuDecode, PlannedRunEqualsDirectCall) {
  Case c;
  c.lens = {129, 4000};
  c.sn = 3;
  c.causal = true;
  Problem p = make_problem(c, 500);
  const std::vector<unsigned char> k0 = p.k_cache.storage, v0 = p.v_cache.storage;
  flashattn::DecodePlan plan = flashattn::plan_decode(p.dev);
  EXPECT_GE(plan.num_splits, 1);
  p.dev.num_splits = plan.num_splits;  // decode(args) must take the same split count
  flashattn::decode(p.dev);
  FA_CUDA_OK(cudaDeviceSynchronize());
  p.download();
  const std::vector<unsigned char> out_direct = p.out.storage, lse_direct = p.lse.storage;
  p.upload();  // the cache as before the append
  p.poison_outputs();
  void* ws = nullptr;
  FA_CUDA_OK(cudaMalloc(&ws, size_t(plan.workspace_bytes)));
  flashattn::decode(p.dev, plan, ws);
  EXPECT_TRUE(flashattn::decode_status(plan, ws).ok());
  p.download();
  EXPECT_TRUE(p.out.storage == out_direct);
  EXPECT_TRUE(p.lse.storage == lse_direct);
  EXPECT_TRUE(p.k_cache.storage != k0 && p.v_cache.storage != v0);  // appended
  cudaFree(ws);
}

// A decode step captured once in a CUDA graph and replayed while cache_seqlens grows on the device
// (within the plan's max_cache_seqlen) equals direct runs of the plan, bit for bit, and the
// reference under the rule; each replay appends its tokens where the direct run does.
// A graph captured once and replayed as lengths grow within the plan's bound, on a paged and on a
// contiguous cache.
void graph_replay_as_lengths_grow(int64_t page) {
  SCOPED_TRACE("page " + std::to_string(page));
  Case c;
  c.page_size = page;
  c.lens = {100, 7, 1000};
  c.sn = 2;
  c.causal = true;
  c.room = 8;
  c.with_lse = true;
  Problem p = make_problem(c, 600);
  cudaStream_t stream;
  FA_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  p.dev.options.stream = stream;
  const int64_t steps = 3;
  flashattn::DecodePlan plan = flashattn::plan_decode(p.dev, 1000 + (steps - 1) * c.sn);
  void* ws = nullptr;
  FA_CUDA_OK(cudaMalloc(&ws, size_t(plan.workspace_bytes)));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  FA_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  flashattn::decode(p.dev, plan, ws);
  FA_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  FA_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  std::mt19937 rng(601);
  for (int64_t step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    if (step > 0) {  // the next tokens: lengths grow by sn, fresh q / k_new / v_new
      for (int32_t& l : p.c.lens) l += int32_t(c.sn);
      std::memcpy(p.lens.storage.data(), p.c.lens.data(), p.c.lens.size() * 4);
      p.q.fill_normal(rng);
      p.k_new.fill_normal(rng);
      p.v_new.fill_uniform(rng);
      p.upload();
    }
    const ref::Output exact = ref::decode(p.host, ref::Precision::f64);
    const ref::Output plain = ref::decode(p.host, ref::Precision::same_as_input);
    const std::vector<unsigned char> k_before = p.k_cache.storage, v_before = p.v_cache.storage;
    p.poison_outputs();
    FA_CUDA_OK(cudaGraphLaunch(exec, stream));
    FA_CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(flashattn::decode_status(plan, ws, stream).ok());
    p.download();
    const std::vector<unsigned char> out_graph = p.out.storage, lse_graph = p.lse.storage;
    const std::vector<unsigned char> k_graph = p.k_cache.storage, v_graph = p.v_cache.storage;
    EXPECT_TRUE(within_rule(p.out.values(), exact.out, plain.out, c.dtype, 2.0, "out"));
    EXPECT_TRUE(within_rule(p.lse.values(), exact.lse, plain.lse, c.dtype, 2.0, "lse"));
    EXPECT_TRUE(k_graph == with_appended(p, p.k_cache, p.k_new, k_before, all_sequences(p)));
    EXPECT_TRUE(v_graph == with_appended(p, p.v_cache, p.v_new, v_before, all_sequences(p)));

    p.k_cache.storage = k_before;  // the same step again, as a direct call
    p.v_cache.storage = v_before;
    p.upload();
    p.poison_outputs();
    flashattn::decode(p.dev, plan, ws);
    FA_CUDA_OK(cudaStreamSynchronize(stream));
    p.download();
    EXPECT_TRUE(p.out.storage == out_graph) << "graph replay and direct run differ";
    EXPECT_TRUE(p.lse.storage == lse_graph);
    EXPECT_TRUE(p.k_cache.storage == k_graph && p.v_cache.storage == v_graph);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(ws);
  cudaStreamDestroy(stream);
}

TEST_F(GpuDecode, GraphReplayAsLengthsGrow) {
  graph_replay_as_lengths_grow(16);
  graph_replay_as_lengths_grow(0);
}

// decode(args) and plan_decode read the indices to the host and reject bad ones by name before
// anything is written.
TEST_F(GpuDecode, ValidatedPathRejectsBadIndices) {
  Case c;
  c.lens = {40, 70};
  auto expect_rejected = [](Problem& p, const std::string& arg, const char* what) {
    SCOPED_TRACE(what);
    const std::vector<unsigned char> k0 = p.k_cache.storage;
    for (int planned = 0; planned < 2; ++planned) {
      try {
        if (planned)
          flashattn::plan_decode(p.dev);
        else
          flashattn::decode(p.dev);
        ADD_FAILURE() << "expected an error naming '" << arg << "'";
      } catch (const flashattn::Error& e) {
        EXPECT_EQ(e.status(), flashattn::Status::invalid_argument);
        EXPECT_NE(std::string(e.what()).find("'" + arg + "'"), std::string::npos) << e.what();
      }
    }
    p.download();
    for (double x : p.out.values()) ASSERT_TRUE(std::isnan(x)) << "out was written";
    EXPECT_TRUE(p.k_cache.storage == k0) << "the cache was written";
  };
  Problem p = make_problem(c, 700);
  int32_t* table = reinterpret_cast<int32_t*>(p.table.storage.data());
  table[1 * p.pages_per_seq() + 2] = int32_t(p.k_cache.view.shape[0]);  // one past the last page
  p.upload();
  expect_rejected(p, "block_table", "page id == num_pages");
  table[1 * p.pages_per_seq() + 2] = -1;
  p.upload();
  expect_rejected(p, "block_table", "negative page id");

  Problem q = make_problem(c, 701);
  const int32_t capacity = int32_t(q.pages_per_seq() * c.page_size);
  reinterpret_cast<int32_t*>(q.lens.storage.data())[0] = capacity;  // + 1 appended token
  q.upload();
  expect_rejected(q, "cache_seqlens", "length + seqlen_new past the capacity");
  reinterpret_cast<int32_t*>(q.lens.storage.data())[0] = -2;
  q.upload();
  expect_rejected(q, "cache_seqlens", "negative length");

  Problem r = make_problem(c, 702);
  for (int64_t bad : {int64_t(39), int64_t(r.pages_per_seq() * c.page_size)}) {  // below 70; no room to append
    try {
      flashattn::plan_decode(r.dev, bad);
      ADD_FAILURE() << "max_cache_seqlen " << bad << " accepted";
    } catch (const flashattn::Error& e) {
      EXPECT_NE(std::string(e.what()).find("'max_cache_seqlen'"), std::string::npos) << e.what();
    }
  }
}

// The planned path reads no index on the host: the kernels guard them. A bad page id (far past the
// cache, or negative), a length past the capacity, past the plan, or negative: nothing out of
// bounds is touched (memcheck), the faulty sequences' rows are NaN, the others are right, only
// valid appends happen, and decode_status names the faults and the first faulty sequence. The
// next valid run clears the status.
TEST_F(GpuDecode, PlannedPathGuardsEveryIndex) {
  for (int32_t splits : {1, 4}) {
    SCOPED_TRACE("splits " + std::to_string(splits));
    Case c;
    c.lens = {300, 40, 500, 64, 20, 9, 32};
    c.sn = 2;
    c.splits = splits;
    Problem p = make_problem(c, 800 + uint32_t(splits));
    const ref::Output exact = ref::decode(p.host, ref::Precision::f64);
    const ref::Output plain = ref::decode(p.host, ref::Precision::same_as_input);
    flashattn::DecodePlan plan = flashattn::plan_decode(p.dev);  // max_cache_seqlen 500
    ASSERT_EQ(plan.num_splits, splits);
    void* ws = nullptr;
    FA_CUDA_OK(cudaMalloc(&ws, size_t(plan.workspace_bytes)));
    const std::vector<unsigned char> k0 = p.k_cache.storage, v0 = p.v_cache.storage;

    HostTensor bad_table = int_tensor(std::vector<int32_t>(p.table_data(), p.table_data() + p.table.numel()));
    HostTensor bad_lens = int_tensor(c.lens);
    int32_t* t = reinterpret_cast<int32_t*>(bad_table.storage.data());
    int32_t* l = reinterpret_cast<int32_t*>(bad_lens.storage.data());
    const int64_t per = p.pages_per_seq();
    t[1 * per + 1] = 1 << 30;  // seq 1 reads keys 16..31 from a page far past the cache
    l[2] = int32_t(per * c.page_size);  // seq 2: with the appended tokens past the capacity
    t[3 * per + 0] = -7;                // seq 3 reads keys 0..15 from a negative page
    l[4] = 501;                         // seq 4: past the plan's max_cache_seqlen
    l[5] = -3;                          // seq 5: negative
    t[6 * per + 2] = 1 << 30;           // seq 6 (32 cached) would append tokens 32, 33 to a bad page
    FA_CUDA_OK(cudaMemcpy(p.dtable->ptr, bad_table.storage.data(), bad_table.storage.size(), cudaMemcpyHostToDevice));
    FA_CUDA_OK(cudaMemcpy(p.dlens->ptr, bad_lens.storage.data(), bad_lens.storage.size(), cudaMemcpyHostToDevice));
    FA_CUDA_OK(cudaDeviceSynchronize());
    flashattn::decode(p.dev, plan, ws);
    const flashattn::DecodeStatus st = flashattn::decode_status(plan, ws);
    EXPECT_EQ(st.faults, flashattn::kDecodeFaultLength | flashattn::kDecodeFaultPage);
    EXPECT_EQ(st.first_sequence, 1);
    p.download();

    // Sequence 0 is right; every row of sequences 1..6 is NaN (out and lse).
    const int64_t row = c.sn * c.hq * c.d, lrow = c.hq * c.sn;
    const std::vector<double> out = p.out.values(), lse = p.lse.values();
    EXPECT_TRUE(within_rule(std::vector<double>(out.begin(), out.begin() + row),
                            std::vector<double>(exact.out.begin(), exact.out.begin() + row),
                            std::vector<double>(plain.out.begin(), plain.out.begin() + row), c.dtype, 2.0, "out"));
    EXPECT_TRUE(within_rule(std::vector<double>(lse.begin(), lse.begin() + lrow),
                            std::vector<double>(exact.lse.begin(), exact.lse.begin() + lrow),
                            std::vector<double>(plain.lse.begin(), plain.lse.begin() + lrow), c.dtype, 2.0, "lse"));
    for (int64_t i = row; i < int64_t(out.size()); ++i) ASSERT_TRUE(std::isnan(out[size_t(i)])) << "out element " << i;
    for (int64_t i = lrow; i < int64_t(lse.size()); ++i) ASSERT_TRUE(std::isnan(lse[size_t(i)])) << "lse element " << i;
    // Appended: the sequences whose length and append page are valid (bad read pages do not stop
    // an append to a good page).
    EXPECT_TRUE(p.k_cache.storage == with_appended(p, p.k_cache, p.k_new, k0, {0, 1, 3}));
    EXPECT_TRUE(p.v_cache.storage == with_appended(p, p.v_cache, p.v_new, v0, {0, 1, 3}));

    p.k_cache.storage = k0;  // valid indices again: the status is clear
    p.v_cache.storage = v0;
    p.upload();
    flashattn::decode(p.dev, plan, ws);
    EXPECT_TRUE(flashattn::decode_status(plan, ws).ok());
    p.download();
    EXPECT_TRUE(within_rule(p.out.values(), exact.out, plain.out, c.dtype, 2.0, "out"));
    cudaFree(ws);
  }
}

TEST_F(GpuDecode, PlanMustMatchTheArguments) {
  Case c;
  c.lens = {10, 20};
  Problem p = make_problem(c, 900);
  flashattn::DecodePlan plan = flashattn::plan_decode(p.dev);
  void* ws = nullptr;
  FA_CUDA_OK(cudaMalloc(&ws, size_t(plan.workspace_bytes)));
  flashattn::DecodeArgs other = p.dev;
  other.q.shape[0] = other.out.shape[0] = 1;  // batch 1 instead of 2
  other.cache_seqlens.shape[0] = other.block_table.shape[0] = other.k_new.shape[0] = other.v_new.shape[0] = 1;
  other.lse.shape[0] = 1;
  try {
    flashattn::decode(other, plan, ws);
    ADD_FAILURE() << "a plan for batch 2 ran with batch 1";
  } catch (const flashattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'plan'"), std::string::npos) << e.what();
  }
  try {
    flashattn::decode(p.dev, plan, nullptr);
    ADD_FAILURE() << "a NULL workspace was accepted";
  } catch (const flashattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'workspace'"), std::string::npos) << e.what();
  }
  p.download();
  for (double x : p.out.values()) ASSERT_TRUE(std::isnan(x)) << "out was written";
  cudaFree(ws);
}

// The C ABI's plan / run / status give the C++ API's results.
TEST_F(GpuDecode, CAbiPlanRunStatus) {
  Case c;
  c.lens = {33, 700};
  c.sn = 2;
  Problem p = make_problem(c, 1000);
  const ref::Output exact = ref::decode(p.host, ref::Precision::f64);
  const ref::Output plain = ref::decode(p.host, ref::Precision::same_as_input);
  flashattn_decode_args a = c_decode_args(p.dev);
  flashattn_decode_plan plan{};
  plan.struct_size = sizeof(plan);
  ASSERT_EQ(flashattn_plan_decode(&a, 0, &plan), FLASHATTN_OK) << flashattn_last_error();
  EXPECT_EQ(plan.max_cache_seqlen, 700);
  void* ws = nullptr;
  FA_CUDA_OK(cudaMalloc(&ws, size_t(plan.workspace_bytes)));
  ASSERT_EQ(flashattn_decode_run(&a, &plan, ws), FLASHATTN_OK) << flashattn_last_error();
  uint32_t faults = 99;
  int64_t first = 99;
  ASSERT_EQ(flashattn_decode_status(&plan, ws, nullptr, &faults, &first), FLASHATTN_OK) << flashattn_last_error();
  EXPECT_EQ(faults, 0u);
  EXPECT_EQ(first, -1);
  p.download();
  EXPECT_TRUE(within_rule(p.out.values(), exact.out, plain.out, c.dtype, 2.0, "out"));
  plan.struct_size = 4;
  EXPECT_EQ(flashattn_decode_run(&a, &plan, ws), FLASHATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("plan->struct_size"), std::string::npos) << flashattn_last_error();
  cudaFree(ws);
}

}  // namespace
}  // namespace fa_test
