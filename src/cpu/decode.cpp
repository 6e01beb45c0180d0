// The CPU decode pass: a few new query tokens per sequence against a (paged or contiguous) KV cache.
//
//   1. append: k_new / v_new are copied into the cache slots [cache_seqlens[b], + seqlen_new), and
//      nothing else of the cache is written;
//   2. attention: the rows of a query tile are all the query heads that share one KV head, times
//      the new tokens (row r = token * group + head-in-group), so each K/V row is read once per
//      tile. Each sequence's visible key tiles are cut into num_splits chunks computed in parallel
//      as partial (o, lse) states, then merged with core::MergeState (the merge_states rule).
//
// The automatic split count depends only on the problem, never on the number of threads, so results
// are the same whatever num_threads is.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "api/backends.h"
#include "cpu/attn_engine.h"
#include "cpu/parallel.h"

namespace flashattn::cpu {
namespace {

// Automatic splits aim at this many independent tasks: enough to keep 64 threads busy when
// batch * heads_kv is small, without making chunks shorter than kMinSplitTiles key tiles.
constexpr int64_t kTargetTasks = 64;
constexpr int64_t kMinSplitTiles = 2;

struct Cache {
  const core::DecodeParams& p;
  int64_t esize;

  int64_t len(int64_t b) const { return p.cache_seqlens[b * p.cache_seqlens_stride]; }
  int64_t keys(int64_t b) const { return len(b) + (p.append ? p.seqlen_new : 0); }
  // Element offset of token t of sequence b in a cache with strides (page, row, head).
  int64_t offset(int64_t b, int64_t t, int64_t hk, int64_t s_page, int64_t s_row, int64_t s_head) const {
    int64_t page = b, slot = t;
    if (p.paged) {
      page = p.block_table[b * p.block_table_row_stride + (t / p.page_size) * p.block_table_col_stride];
      slot = t % p.page_size;
    }
    return page * s_page + slot * s_row + hk * s_head;
  }
  char* k_row(int64_t b, int64_t t, int64_t hk) const {
    return static_cast<char*>(p.k_cache) + esize * offset(b, t, hk, p.kc_page, p.kc_row, p.kc_head);
  }
  char* v_row(int64_t b, int64_t t, int64_t hk) const {
    return static_cast<char*>(p.v_cache) + esize * offset(b, t, hk, p.vc_page, p.vc_row, p.vc_head);
  }
};

// A few rows per sequence: a plain loop, cheaper than waking threads.
void append(const Cache& c) {
  const core::DecodeParams& p = c.p;
  const size_t row_bytes = size_t(p.head_dim * c.esize);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t t = 0; t < p.seqlen_new; ++t)
      for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
        std::memcpy(c.k_row(b, c.len(b) + t, hk),
                    static_cast<const char*>(p.k_new) + c.esize * p.knew_s.offset(b, t, hk), row_bytes);
        std::memcpy(c.v_row(b, c.len(b) + t, hk),
                    static_cast<const char*>(p.v_new) + c.esize * p.vnew_s.offset(b, t, hk), row_bytes);
      }
}

template <class T>
void attend(const Cache& c, const TileKernels<T>& kern) {
  const core::DecodeParams& p = c.p;
  const int64_t d = p.head_dim, group = p.heads_q / p.heads_kv;
  const int64_t rows = group * p.seqlen_new;            // rows per KV head
  const int64_t bm = block_rows(d);
  const int64_t row_tiles = ceil_div(rows, bm);
  const int64_t tile_rows = std::min(rows, bm);         // rows of the largest tile
  const int64_t units = p.batch * p.heads_kv * row_tiles;
  if (units == 0) return;

  int64_t max_tiles = 1;
  for (int64_t b = 0; b < p.batch; ++b) max_tiles = std::max(max_tiles, ceil_div(c.keys(b), kBlockN));
  int64_t splits = p.num_splits > 0 ? p.num_splits
                                    : std::clamp(ceil_div(kTargetTasks, units), int64_t(1),
                                                 std::max<int64_t>(1, max_tiles / kMinSplitTiles));
  splits = std::min(splits, max_tiles);  // more chunks than key tiles would only add empty ones

  // Partial states of every (unit, split) when splitting: [unit][split][row][d] and [unit][split][row].
  std::vector<T> part_o, part_lse;
  if (splits > 1) {
    part_o.resize(size_t(units * splits * tile_rows * d));
    part_lse.resize(size_t(units * splits * tile_rows));
  }
  const int64_t esize = c.esize;
  const DType lse_type = p.dtype == DType::f64 ? DType::f64 : DType::f32;
  auto mask_of = [&](int64_t b) { return core::MaskSpec{p.seqlen_new, c.keys(b), p.window_left, p.window_right}; };

  const int workers = workers_for(units * splits, p.num_threads);
  std::vector<std::unique_ptr<Workspace<T>>> spaces(static_cast<size_t>(workers));
  parallel_for(units * splits, p.num_threads, [&](int64_t task, int worker) {
    auto& slot = spaces[size_t(worker)];
    if (!slot) slot = std::make_unique<Workspace<T>>(d);
    Workspace<T>& ws = *slot;
    const int64_t unit = task / splits, split = task % splits;
    const int64_t b = unit / (p.heads_kv * row_tiles);
    const int64_t hk = (unit / row_tiles) % p.heads_kv;
    const int64_t r0 = (unit % row_tiles) * bm, r1 = std::min(rows, r0 + bm);
    const TileConfig<T> cfg = make_config<T>(p.dtype, p.scale, p.softcap, mask_of(b));
    auto token = [&](int64_t i) { return (r0 + i) / group; };
    auto head = [&](int64_t i) { return hk * group + (r0 + i) % group; };

    begin_tile(
        ws, kern, cfg, r1 - r0,
        [&](int64_t i) { return static_cast<const char*>(p.q) + esize * p.q_s.offset(b, token(i), head(i)); }, token);
    core::TileRange tr = core::tile_range(cfg.mask, token(0), token(r1 - r0 - 1) + 1, kBlockN);
    const int64_t per_split = ceil_div(tr.n_end - tr.n_begin, splits);
    const int64_t n_begin = std::min(tr.n_end, tr.n_begin + split * per_split);
    const int64_t n_end = std::min(tr.n_end, n_begin + per_split);
    auto key_rows = [&](int64_t key) {
      return std::pair<const void*, const void*>(c.k_row(b, key, hk), c.v_row(b, key, hk));
    };
    attend_tiles(ws, kern, cfg, tr, n_begin, n_end, packed_per_tile(ws, kern, p.dtype, key_rows));

    for (int64_t i = 0; i < ws.rows; ++i) {
      if (splits > 1) {
        const int64_t at = (task * tile_rows + i);
        T* o = part_o.data() + at * d;
        part_lse[size_t(at)] = finish_row(ws, cfg, i, [&](int64_t x, T val) { o[x] = val; });
      } else {
        char* o = static_cast<char*>(p.out) + esize * p.o_s.offset(b, token(i), head(i));
        T lse = finish_row(ws, cfg, i, [&](int64_t x, T val) { store_value(o, p.dtype, x, val); });
        if (p.lse) store_value(p.lse, lse_type, p.lse_s.offset(b, token(i), head(i)), lse);
      }
    }
  });
  if (splits == 1) return;

  // Merge the splits of each row: o = sum_s w_s o_s / sum_s w_s with w_s = exp(lse_s - max lse).
  parallel_for(units, p.num_threads, [&](int64_t unit, int) {
    const int64_t b = unit / (p.heads_kv * row_tiles);
    const int64_t hk = (unit / row_tiles) % p.heads_kv;
    const int64_t r0 = (unit % row_tiles) * bm, r1 = std::min(rows, r0 + bm);
    std::vector<T> acc(static_cast<size_t>(d));
    for (int64_t i = 0; i < r1 - r0; ++i) {
      auto at = [&](int64_t s) { return (unit * splits + s) * tile_rows + i; };
      core::MergeState<T> ms;
      for (int64_t s = 0; s < splits; ++s) ms.see(part_lse[size_t(at(s))]);
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t s = 0; s < splits; ++s) {
        T w = ms.add_weight(part_lse[size_t(at(s))]);
        const T* o = part_o.data() + at(s) * d;
        for (int64_t x = 0; x < d; ++x) acc[size_t(x)] += w * o[x];
      }
      const int64_t t = (r0 + i) / group, h = hk * group + (r0 + i) % group;
      char* o = static_cast<char*>(p.out) + esize * p.o_s.offset(b, t, h);
      T scale = ms.out_scale();
      for (int64_t x = 0; x < d; ++x) store_value(o, p.dtype, x, acc[size_t(x)] * scale);
      if (p.lse) store_value(p.lse, lse_type, p.lse_s.offset(b, t, h), ms.lse());
    }
  });
}

}  // namespace

void decode(const core::DecodeParams& p) {
  Cache c{p, dtype_size(p.dtype)};
  if (p.append) append(c);
  if (p.dtype == DType::f64)
    attend<double>(c, double_kernels());
  else
    attend<float>(c, float_kernels());
}

}  // namespace flashattn::cpu
