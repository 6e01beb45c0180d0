// The CPU forward pass: one task per (sequence, query head, query tile), each running the tiled
// loop of attn_engine.h over the key tiles its rows can see. Tasks write disjoint rows of out and
// lse, so the result does not depend on the number of threads or on the schedule.
#include <algorithm>
#include <memory>
#include <vector>

#include "api/backends.h"
#include "cpu/attn_engine.h"
#include "cpu/parallel.h"

namespace flashattn::cpu {
namespace {

struct Span {  // one sequence of the batch: its first q / k token and its lengths
  int64_t q0, sq, k0, sk;
};

Span span_of(const core::ForwardParams& p, int64_t b) {
  if (!p.varlen()) return {0, p.seqlen_q, 0, p.seqlen_k};
  return {p.cu_seqlens_q[b], p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b], p.cu_seqlens_k[b],
          p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b]};
}

struct Task {
  int64_t b, h, r0, r1;
};

template <class T>
void run(const core::ForwardParams& p, const TileKernels<T>& kern) {
  const int64_t esize = dtype_size(p.dtype), d = p.head_dim;
  auto mask_of = [&](const Span& s) { return core::MaskSpec{s.sq, s.sk, p.window_left, p.window_right}; };

  // Tasks of one head are adjacent, so the threads share that head's K and V in cache; within a
  // head the last query tiles come first, as with a causal mask they see the most keys and should
  // not be the ones left running at the end.
  const int64_t bm = block_rows(d);
  std::vector<Task> tasks;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t sq = span_of(p, b).sq;
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t r0 = (ceil_div(sq, bm) - 1) * bm; r0 >= 0; r0 -= bm) tasks.push_back({b, h, r0, std::min(sq, r0 + bm)});
  }

  const int workers = workers_for(int64_t(tasks.size()), p.num_threads);
  std::vector<std::unique_ptr<Workspace<T>>> spaces(static_cast<size_t>(workers));
  const auto* q = static_cast<const char*>(p.q);
  const auto* k = static_cast<const char*>(p.k);
  const auto* v = static_cast<const char*>(p.v);
  auto* out = static_cast<char*>(p.out);

  parallel_for(int64_t(tasks.size()), p.num_threads, [&](int64_t t, int worker) {
    auto& slot = spaces[size_t(worker)];
    if (!slot) slot = std::make_unique<Workspace<T>>(d);
    Workspace<T>& ws = *slot;
    const Task& task = tasks[size_t(t)];
    const Span s = span_of(p, task.b);
    const int64_t hk = task.h / p.group();
    const TileConfig<T> cfg = make_config<T>(p.dtype, p.scale, p.softcap, mask_of(s));

    begin_tile(
        ws, kern, cfg, task.r1 - task.r0,
        [&](int64_t i) { return q + esize * p.q_s.offset(task.b, s.q0 + task.r0 + i, task.h); },
        [&](int64_t i) { return task.r0 + i; });
    core::TileRange tr = core::tile_range(cfg.mask, task.r0, task.r1, kBlockN);
    attend_tiles(ws, kern, cfg, tr, tr.n_begin, tr.n_end, [&](int64_t key) {
      return std::pair<const void*, const void*>(k + esize * p.k_s.offset(task.b, s.k0 + key, hk),
                                                 v + esize * p.v_s.offset(task.b, s.k0 + key, hk));
    });
    for (int64_t i = 0; i < ws.rows; ++i) {
      const int64_t token = s.q0 + task.r0 + i;
      char* o = out + esize * p.o_s.offset(task.b, token, task.h);
      T lse = finish_row(ws, cfg, i, [&](int64_t x, T val) { store_value(o, p.dtype, x, val); });
      if (p.lse) store_value(p.lse, p.dtype == DType::f64 ? DType::f64 : DType::f32,
                             p.lse_s.offset(task.b, token, task.h), lse);
    }
  });
}

}  // namespace

void forward(const core::ForwardParams& p) {
  if (p.dtype == DType::f64)
    run<double>(p, double_kernels());
  else
    run<float>(p, float_kernels());
}

}  // namespace flashattn::cpu
