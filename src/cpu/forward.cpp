// The CPU forward pass: one task per (sequence, query head, query tile), each running the tiled
// loop of attn_engine.h over the key tiles its rows can see. Tasks write disjoint rows of out and
// lse, so the result does not depend on the number of threads or on the schedule.
#include <algorithm>
#include <memory>
#include <tuple>
#include <type_traits>
#include <vector>

#include "api/backends.h"
#include "cpu/amx_engine.h"
#include "cpu/attn_engine.h"
#include "cpu/parallel.h"
#include "cpu/scratch_cache.h"

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

// K and V of one (sequence, KV head), packed once per worker and reused by that worker's next tasks
// of the same head: tasks of a head are adjacent (its query tiles, then the other query heads of a
// GQA group). Packing each key tile again for every query tile fetched rows a head stride apart,
// each on its own page, and cost 12-15% of the forward. Heads larger than kMaxPackBytes fall back
// to per-tile packing, so the extra memory stays bounded per worker.
inline constexpr int64_t kMaxPackBytes = int64_t(16) << 20;

template <class T>
struct HeadPack {
  int64_t b = -1, hk = -1, capacity = 0;
  std::unique_ptr<AlignedArray<T>> k, v;

  // Packs keys [0, keys) of (b, hk) unless they are already here.
  template <class KeyRows>
  void fill(int64_t batch, int64_t kv_head, int64_t keys, int64_t ld, int64_t d, const TileKernels<T>& kern,
            DType dtype, const KeyRows& key_rows) {
    if (batch == b && kv_head == hk) return;
    if (keys * ld > capacity) {
      capacity = keys * ld;
      k = std::make_unique<AlignedArray<T>>(capacity);
      v = std::make_unique<AlignedArray<T>>(capacity);
    }
    for (int64_t key = 0; key < keys; ++key) {
      auto [kr, vr] = key_rows(key);
      copy_row(kern, dtype, kr, k->get() + key * ld, d);
      copy_row(kern, dtype, vr, v->get() + key * ld, d);
    }
    b = batch;
    hk = kv_head;
  }
  size_t bytes() const { return k ? k->bytes() + v->bytes() : 0; }
};

// A call's per-worker spaces, kept between calls (scratch_cache.h): a forward over short sequences
// takes microseconds, less than allocating them. Measured on a 2-core Sapphire Rapids VM (f32, 8
// heads x 16 tokens, d = 64, causal, the C++ API in a loop): 28 us a call on one thread and 89 on
// two when every call mapped its spaces fresh (and unmapping them interrupted the other thread to
// flush its TLB), 21 and 17.5 with the spaces kept.
template <class T>
struct ForwardScratch {
  using Shape = std::tuple<int64_t, int64_t, int64_t, bool, bool>;  // d, bm, bn, amx, fp16 split
  Shape shape{};
  std::vector<std::unique_ptr<Workspace<T>>> spaces;
  std::vector<HeadPack<T>> packs;
  std::vector<std::unique_ptr<AmxSpace>> amx_spaces;

  // Ready for a call of `workers` workers: spaces of another shape dropped, and every pack made to
  // forget its head (it holds the previous call's K and V).
  void fit(int workers, const Shape& want) {
    if (want != shape) {
      spaces.clear();
      amx_spaces.clear();
      shape = want;
    }
    const size_t n = std::max(spaces.size(), size_t(workers));
    spaces.resize(n);
    amx_spaces.resize(n);
    packs.resize(n);
    for (HeadPack<T>& pk : packs) pk.b = pk.hk = -1;
    for (auto& as : amx_spaces)
      if (as) as->b = as->hk = -1;
  }
  size_t bytes() const {
    size_t n = sizeof(*this);
    for (const auto& s : spaces) n += s ? s->bytes() : 0;
    for (const auto& pk : packs) n += pk.bytes();
    for (const auto& as : amx_spaces) n += as ? as->bytes() : 0;
    return n;
  }
};

// Query tiles per task. One tile per task unless the AMX kernels run: their packs of K and V^T cost
// a transposition per worker and head, so a task takes several of a head's tiles as long as every
// worker still gets about 4 tasks (the tiles of a head cost the same without a mask, and about
// the same in total under one).
int64_t tiles_per_task(const core::ForwardParams& p, int64_t tiles_per_head, bool amx) {
  if (!amx) return 1;
  const int64_t heads = p.batch * p.heads_q, workers = workers_for(heads * tiles_per_head, p.num_threads);
  const int64_t per_task = heads * tiles_per_head / (4 * workers);
  return std::clamp<int64_t>(per_task, 1, std::max<int64_t>(1, tiles_per_head));
}

// amx: the AMX kernels for a bf16 or fp16 problem, or null for the float (or double) kernels alone.
template <class T>
void run(const core::ForwardParams& p, const TileKernels<T>& kern, const AmxKernels* amx) {
  const int64_t esize = dtype_size(p.dtype), d = p.head_dim;
  auto mask_of = [&](const Span& s) { return core::MaskSpec{s.sq, s.sk, p.window_left, p.window_right}; };

  // Tasks of one head are adjacent, so the threads share that head's K and V in cache; within a
  // head the last query tiles come first, as with a causal mask they see the most keys and should
  // not be the ones left running at the end.
  const int64_t bm = amx ? kAmxBlockM : block_rows(d), bn = amx ? kAmxBlockN : kBlockN;
  int64_t max_sq = 0;
  for (int64_t b = 0; b < p.batch; ++b) max_sq = std::max(max_sq, span_of(p, b).sq);
  const int64_t task_rows = bm * tiles_per_task(p, ceil_div(max_sq, bm), amx != nullptr);
  std::vector<Task> tasks;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t sq = span_of(p, b).sq;
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t r0 = (ceil_div(sq, task_rows) - 1) * task_rows; r0 >= 0; r0 -= task_rows)
        tasks.push_back({b, h, r0, std::min(sq, r0 + task_rows)});
  }

  const int workers = workers_for(int64_t(tasks.size()), p.num_threads);
  KeptScratch<ForwardScratch<T>> scratch;
  scratch->fit(workers, {d, bm, bn, amx != nullptr, p.dtype == DType::f16});
  auto& spaces = scratch->spaces;
  auto& packs = scratch->packs;
  auto& amx_spaces = scratch->amx_spaces;
  const auto* q = static_cast<const char*>(p.q);
  const auto* k = static_cast<const char*>(p.k);
  const auto* v = static_cast<const char*>(p.v);
  auto* out = static_cast<char*>(p.out);
  const DType lse_type = p.dtype == DType::f64 ? DType::f64 : DType::f32;

  parallel_for(int64_t(tasks.size()), p.num_threads, [&](int64_t t, int worker) {
    auto& slot = spaces[size_t(worker)];
    if (!slot) slot = std::make_unique<Workspace<T>>(d, bm, bn, amx ? FloatTiles::none : FloatTiles::all);
    Workspace<T>& ws = *slot;
    const Task& task = tasks[size_t(t)];
    const Span s = span_of(p, task.b);
    const int64_t hk = task.h / p.group();
    const TileConfig<T> cfg = make_config<T>(p.dtype, p.scale, p.softcap, mask_of(s));
    auto key_rows = [&](int64_t key) {
      return std::pair<const void*, const void*>(k + esize * p.k_s.offset(task.b, s.k0 + key, hk),
                                                 v + esize * p.v_s.offset(task.b, s.k0 + key, hk));
    };
    for (int64_t r0 = task.r0; r0 < task.r1; r0 += bm) {
      const int64_t r1 = std::min(task.r1, r0 + bm);
      auto q_row = [&](int64_t i) { return q + esize * p.q_s.offset(task.b, s.q0 + r0 + i, task.h); };
      auto pos = [&](int64_t i) { return r0 + i; };
      const core::TileRange tr = core::tile_range(cfg.mask, r0, r1, bn);
      auto out_row = [&](int64_t i) { return out + esize * p.o_s.offset(task.b, s.q0 + r0 + i, task.h); };
      auto store_lse = [&](int64_t i, T lse) {
        if (p.lse) store_value(p.lse, lse_type, p.lse_s.offset(task.b, s.q0 + r0 + i, task.h), lse);
      };
      if constexpr (std::is_same_v<T, float>) {
        if (amx) {
          auto& aslot = amx_spaces[size_t(worker)];
          if (!aslot) aslot = std::make_unique<AmxSpace>(d, bm, bn, p.dtype == DType::f16);
          reset_tile(ws, kern.row_align, cfg, r1 - r0, pos);
          prefetch_rows(out_row, r1 - r0, d * esize, true);  // written at the end of the tile
          attend_amx(ws, *aslot, *amx, kern, cfg, tr, q_row, key_rows, s.sk, task.b, hk, kMaxPackBytes);
          finish_amx(ws, *amx, cfg, out_row, store_lse);
          continue;
        }
      }
      begin_tile(ws, kern, cfg, r1 - r0, q_row, pos);
      if (s.sk * ws.ld * int64_t(sizeof(T)) * 2 <= kMaxPackBytes) {
        HeadPack<T>& pack = packs[size_t(worker)];
        pack.fill(task.b, hk, s.sk, ws.ld, d, kern, p.dtype, key_rows);
        attend_tiles(ws, kern, cfg, tr, tr.n_begin, tr.n_end, [&](int64_t k0, int64_t) {
          return PackedTile<T>{pack.k->get() + k0 * ws.ld, pack.v->get() + k0 * ws.ld};
        });
      } else {
        attend_tiles(ws, kern, cfg, tr, tr.n_begin, tr.n_end, packed_per_tile(ws, kern, p.dtype, key_rows));
      }
      finish_rows(ws, kern, cfg, [&](int64_t i, const T* o, T scale, T lse) {
        store_row(kern, o, scale, p.dtype, out_row(i), d);
        store_lse(i, lse);
      });
    }
  });
}

}  // namespace

void forward(const core::ForwardParams& p) {
  if (p.dtype == DType::f64) return run<double>(p, double_kernels(), nullptr);
  const AmxKernels* amx = nullptr;
#if defined(__x86_64__)
  // The tiles take 32 head-dim values a step; other head dims run the float kernels.
  const bool half = p.dtype == DType::bf16 || p.dtype == DType::f16;
  if (half && p.head_dim % 32 == 0 && active_level() == KernelLevel::amx) amx = &amx_kernels();
#endif
  run<float>(p, float_kernels(), amx);
}

}  // namespace flashattn::cpu
