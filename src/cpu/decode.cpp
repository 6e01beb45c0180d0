// The CPU decode pass: a few new query tokens per sequence against a (paged or contiguous) KV cache.
//
//   1. append: k_new / v_new are copied into the cache slots [cache_seqlens[b], + seqlen_new), and
//      nothing else of the cache is written;
//   2. attention: the rows of a query tile are all the query heads that share one KV head, times
//      the new tokens (row r = token * group + head-in-group), so each K/V row is read once per
//      tile. Each sequence's visible key tiles are cut into num_splits chunks computed in parallel
//      (each chunk for every KV head, tile by tile: kDecodeBlockN) as partial (o, lse) states, then
//      merged with core::MergeState (the merge_states rule).
//
// The automatic split count depends only on the problem, never on the number of threads, so results
// are the same whatever num_threads is.
#include <algorithm>
#include <atomic>
#include <cstring>
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

// Automatic splits aim at this many independent tasks: enough to keep 64 threads busy when the
// batch is small, without making chunks shorter than kMinSplitTiles key tiles; where the splits
// cannot get there (short caches), the KV heads are dealt out in groups too.
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

// Keys per tile. A task reads one key tile of every KV head of its group before the next tile: the
// heads' rows of a key lie side by side in the cache, so a tile's rows of all heads are one run of
// memory. Read head after head, each head's rows lie a row of all heads apart, and a read probe on
// a 2-core Sapphire Rapids VM ran at 12.8 GB/s that way against 20.5 by tiles of 64 keys across 8
// heads (24 contiguous). Decoding there (32 query heads on 8 KV heads, d = 128, 8k-32k keys) took
// the same or less time with 256-key tiles than with 64 (bf16 32k: 14.0 against 16.6 ms); a tile
// of 8 such heads is 1 MiB of bf16 K and V, within L2.
constexpr int64_t kDecodeBlockN = 256;

// A worker's space: the query tile and softmax state of each KV head of a group (with the AMX
// kernels, its Q packed in amx_heads), and one space more whose key tile buffers take each head's
// keys in turn.
template <class T>
struct DecodeSpace {
  int64_t d = 0, rows = 0;
  bool amx = false;
  std::vector<std::unique_ptr<Workspace<T>>> heads;
  std::vector<std::unique_ptr<AmxSpace>> amx_heads;
  std::unique_ptr<Workspace<T>> keys;
  std::unique_ptr<AmxSpace> amx_keys;

  // Room for group_heads heads of head dim d_ and rows_ query rows, keeping what already fits.
  void fit(int64_t d_, int64_t rows_, int64_t group_heads, bool amx_) {
    if (d != d_ || rows != rows_ || amx != amx_) {
      *this = DecodeSpace{};
      d = d_;
      rows = rows_;
      amx = amx_;
    }
    while (int64_t(heads.size()) < group_heads) {
      const FloatTiles tiles = amx ? FloatTiles::none : FloatTiles::queries;
      heads.push_back(std::make_unique<Workspace<T>>(d, rows, kDecodeBlockN, tiles));
      // A head's Q alone: no key tiles (0), as amx_keys holds the keys and the P scratch.
      if (amx) amx_heads.push_back(std::make_unique<AmxSpace>(d, rows, 0, false));
    }
    if (amx && !amx_keys) amx_keys = std::make_unique<AmxSpace>(d, rows, kDecodeBlockN, false);
    if (!amx && !keys) keys = std::make_unique<Workspace<T>>(d, rows, kDecodeBlockN);
  }
  size_t bytes() const {
    size_t n = sizeof(*this) + (keys ? keys->bytes() : 0) + (amx_keys ? amx_keys->bytes() : 0);
    for (const auto& h : heads) n += h->bytes();
    for (const auto& h : amx_heads) n += h->bytes();
    return n;
  }
};

// What a call works in: a space per worker, the splits' partial states, and the count of finished
// splits of each (sequence, row tile, head group), whose last split merges them.
template <class T>
struct DecodeScratch {
  std::vector<std::unique_ptr<DecodeSpace<T>>> spaces;
  std::vector<T> part_o, part_lse;
  std::vector<std::atomic<int64_t>> done;

  size_t bytes() const {
    size_t n = sizeof(*this) + (part_o.capacity() + part_lse.capacity()) * sizeof(T) +
               done.capacity() * sizeof(std::atomic<int64_t>);
    for (const auto& s : spaces) n += s ? s->bytes() : 0;
    return n;
  }
};

// A worker for each kWorkerElems elements of K and V a call reads (1 MB of bf16 or fp16, 2 MB of
// f32): waking a pool thread costs more than it saves on a short cache. Elements, not bytes, as the
// float kernels' time goes by element (fp16 rows are widened to f32). On a 2-core VM (32 query heads
// on 8, d = 128), with two workers against one: 128 keys (256K elements) fp16 98-137 against
// 131-140 us, f32 94-117 against 108-121, bf16 56-65 against 50; 512 keys bf16 126-178 against
// 168-170. The second thread there at times wakes hundreds of microseconds late (a VM's vCPU); on
// bare metal the break-even is lower still.
constexpr int64_t kWorkerElems = int64_t(256) << 10;

// Whether a tile of `rows` rows runs the few-rows kernels (kernel_impl.h: the head dim in the vector
// lanes, key rows read where they lie): where its rows would fill at most half of each vector of
// the usual kernels, which keep rows in the lanes (4 rows, 32 query heads on 8 KV heads and one new
// token, use 4 of AVX-512's 16). Measured on a 2-core VM:
// bench/results/cpu_decode_fewrows_2026-12-05.txt.
template <class T>
bool uses_rows_kernels(const TileKernels<T>& kern, int64_t rows) {
  return rows * 2 <= kern.row_align;
}

// amx: the AMX kernels for a bf16 cache (amx.h), or null for the float (or double) kernels.
// Few query rows meet each key here, and the float kernels keep rows in vector lanes, so with 4 rows
// three quarters of their lanes idle; a tile product pads the rows to 16 as well, but at 16 times
// the multiply-adds per cycle: bf16 decoding ran 2.5x (8k keys) and 1.7x (32k) as fast as on the
// float kernels, 32 query heads on 8 KV heads, d = 128 (before the few-rows kernels, which now take
// such tiles: decode() below). fp16 caches stay on the float kernels: split into halves (amx.h) they
// took 1.25x as long at 32k keys.
template <class T>
void attend(const Cache& c, const TileKernels<T>& kern, const AmxKernels* amx) {
  const core::DecodeParams& p = c.p;
  const int64_t d = p.head_dim, group = p.heads_q / p.heads_kv, hkv = p.heads_kv;
  const int64_t rows = group * p.seqlen_new;            // rows per KV head
  const int64_t bm = amx ? kAmxBlockM : block_rows(d), bn = kDecodeBlockN;
  const int64_t row_tiles = ceil_div(rows, bm);
  const int64_t tile_rows = std::min(rows, bm);         // rows of the largest tile
  // A workspace as tall as the largest tile, in whole micro-tiles (48 rows: a multiple of every
  // level's row alignment), not block_rows(d): a task holds one per KV head.
  const int64_t ws_rows = std::min(bm, ceil_div(tile_rows, 48) * 48);
  const int64_t units = p.batch * row_tiles;            // (sequence, row tile) pairs
  if (units == 0 || hkv == 0) return;

  int64_t max_tiles = 1, kv_elems = 0;  // kv_elems: elements of K and V the call reads
  for (int64_t b = 0; b < p.batch; ++b) {
    max_tiles = std::max(max_tiles, ceil_div(c.keys(b), bn));
    kv_elems += c.keys(b) * hkv * d * 2;
  }
  int64_t splits = p.num_splits > 0 ? p.num_splits
                                    : std::clamp(ceil_div(kTargetTasks, units), int64_t(1),
                                                 std::max<int64_t>(1, max_tiles / kMinSplitTiles));
  splits = std::min(splits, max_tiles);  // more chunks than key tiles would only add empty ones
  const int64_t group_heads = ceil_div(hkv, std::clamp(ceil_div(kTargetTasks, units * splits), int64_t(1), hkv));
  const int64_t head_groups = ceil_div(hkv, group_heads);
  // Task (group, split) takes the key tiles of one split for the group_heads KV heads of one
  // (sequence, row tile, head group) triple, group = (b * row_tiles + row tile) * head_groups + head group.
  const int64_t groups = units * head_groups, tasks = groups * splits;

  // A worker per kWorkerElems of K and V, within the threads asked for.
  const int threads = int(std::min<int64_t>(p.num_threads > 0 ? p.num_threads : default_threads(),
                                            std::max<int64_t>(1, kv_elems / kWorkerElems)));
  const int workers = workers_for(tasks, threads);
  KeptScratch<DecodeScratch<T>> scratch;
  if (scratch->spaces.size() < size_t(workers)) scratch->spaces.resize(size_t(workers));

  // Partial states of every (sequence, KV head, row tile, split) when splitting:
  // [b][hk][row tile][split][row][d] and [b][hk][row tile][split][row].
  std::vector<T>& part_o = scratch->part_o;
  std::vector<T>& part_lse = scratch->part_lse;
  if (splits > 1) {
    part_o.resize(std::max(part_o.size(), size_t(units * hkv * splits * tile_rows * d)));
    part_lse.resize(std::max(part_lse.size(), size_t(units * hkv * splits * tile_rows)));
    if (scratch->done.size() < size_t(groups)) scratch->done = std::vector<std::atomic<int64_t>>(size_t(groups));
    for (int64_t i = 0; i < groups; ++i) scratch->done[size_t(i)].store(0, std::memory_order_relaxed);
  }
  auto part_at = [&](int64_t b, int64_t hk, int64_t rt, int64_t split, int64_t i) {
    return (((b * hkv + hk) * row_tiles + rt) * splits + split) * tile_rows + i;
  };
  const int64_t esize = c.esize;
  const DType lse_type = p.dtype == DType::f64 ? DType::f64 : DType::f32;
  auto mask_of = [&](int64_t b) { return core::MaskSpec{p.seqlen_new, c.keys(b), p.window_left, p.window_right}; };

  // The splits of each row of row tile rt of (b, hk) merged: o = sum_s w_s o_s / sum_s w_s with
  // w_s = exp(lse_s - max lse), in split order whichever task runs it.
  auto merge = [&](int64_t b, int64_t hk, int64_t rt) {
    const int64_t r0 = rt * bm, r1 = std::min(rows, r0 + bm);
    alignas(64) T acc[256];  // head_dim <= 256 (validated)
    for (int64_t i = 0; i < r1 - r0; ++i) {
      auto at = [&](int64_t s) { return part_at(b, hk, rt, s, i); };
      core::MergeState<T> ms;
      for (int64_t s = 0; s < splits; ++s) ms.see(part_lse[size_t(at(s))]);
      std::fill(acc, acc + d, T(0));
      for (int64_t s = 0; s < splits; ++s) {
        T w = ms.add_weight(part_lse[size_t(at(s))]);
        const T* o = part_o.data() + at(s) * d;
        for (int64_t x = 0; x < d; ++x) acc[x] += w * o[x];
      }
      const int64_t t = (r0 + i) / group, h = hk * group + (r0 + i) % group;
      char* o = static_cast<char*>(p.out) + esize * p.o_s.offset(b, t, h);
      T scale = ms.out_scale();
      for (int64_t x = 0; x < d; ++x) store_value(o, p.dtype, x, acc[x] * scale);
      if (p.lse) store_value(p.lse, lse_type, p.lse_s.offset(b, t, h), ms.lse());
    }
  };

  parallel_for(tasks, threads, [&](int64_t task, int worker) {
    std::unique_ptr<DecodeSpace<T>>& slot = scratch->spaces[size_t(worker)];
    if (!slot) slot = std::make_unique<DecodeSpace<T>>();
    DecodeSpace<T>& space = *slot;
    space.fit(d, ws_rows, group_heads, amx != nullptr);
    const int64_t group_id = task / splits, split = task % splits, unit = group_id / head_groups;
    const int64_t b = unit / row_tiles, rt = unit % row_tiles;
    const int64_t hk0 = group_id % head_groups * group_heads, hk1 = std::min(hkv, hk0 + group_heads);
    const int64_t r0 = rt * bm, r1 = std::min(rows, r0 + bm);
    const TileConfig<T> cfg = make_config<T>(p.dtype, p.scale, p.softcap, mask_of(b));
    auto token = [&](int64_t i) { return (r0 + i) / group; };
    auto head = [&](int64_t hk, int64_t i) { return hk * group + (r0 + i) % group; };
    const core::TileRange tr = core::tile_range(cfg.mask, token(0), token(r1 - r0 - 1) + 1, bn);
    const int64_t per_split = ceil_div(tr.n_end - tr.n_begin, splits);
    const int64_t n_begin = std::min(tr.n_end, tr.n_begin + split * per_split);
    const int64_t n_end = std::min(tr.n_end, n_begin + per_split);
    auto q_rows = [&](int64_t hk) {
      return [&, hk](int64_t i) {
        return static_cast<const char*>(p.q) + esize * p.q_s.offset(b, token(i), head(hk, i));
      };
    };
    auto key_rows = [&](int64_t hk) {
      return [&, hk](int64_t key) {
        return std::pair<const void*, const void*>(c.k_row(b, key, hk), c.v_row(b, key, hk));
      };
    };

    bool on_tiles = false;
    if constexpr (std::is_same_v<T, float>) {
      if (amx) {
        for (int64_t hk = hk0; hk < hk1; ++hk) {
          Workspace<T>& ws = *space.heads[size_t(hk - hk0)];
          reset_tile(ws, kern.row_align, cfg, r1 - r0, token);
          pack_amx_queries(ws, q_rows(hk), *amx, *space.amx_heads[size_t(hk - hk0)]);
        }
        const AmxScope scope(*amx);
        for (int64_t n = n_begin; n < n_end; ++n)
          for (int64_t hk = hk0; hk < hk1; ++hk)
            attend_amx_per_tile(*space.heads[size_t(hk - hk0)], *space.amx_keys, *space.amx_heads[size_t(hk - hk0)],
                                *amx, kern, cfg, tr, n, n + 1, key_rows(hk));
        on_tiles = true;
      }
    }
    // A tile of at most half a vector of rows: the few-rows kernels (uses_rows_kernels above).
    if (!on_tiles && uses_rows_kernels(kern, r1 - r0)) {
      for (int64_t hk = hk0; hk < hk1; ++hk)
        begin_rows(*space.heads[size_t(hk - hk0)], kern, cfg, r1 - r0, q_rows(hk), token);
      // The cache's rows are read where they lie, 16-bit ones widened as the kernels load them.
      const void* k_at[kDecodeBlockN];
      const void* v_at[kDecodeBlockN];
      for (int64_t n = n_begin; n < n_end; ++n)
        for (int64_t hk = hk0; hk < hk1; ++hk)
          attend_tiles(*space.heads[size_t(hk - hk0)], kern, cfg, tr, n, n + 1, [&](int64_t k0, int64_t nk) {
            const auto rows_of = key_rows(hk);
            for (int64_t j = 0; j < nk; ++j) std::tie(k_at[j], v_at[j]) = rows_of(k0 + j);
            return RowTile<T>{k_at, v_at, p.dtype};
          });
    } else if (!on_tiles) {
      Workspace<T>& keys = *space.keys;
      for (int64_t hk = hk0; hk < hk1; ++hk) {
        Workspace<T>& ws = *space.heads[size_t(hk - hk0)];
        begin_tile(ws, kern, cfg, r1 - r0, q_rows(hk), token, &keys);
      }
      for (int64_t n = n_begin; n < n_end; ++n)
        for (int64_t hk = hk0; hk < hk1; ++hk)
          attend_tiles(*space.heads[size_t(hk - hk0)], kern, cfg, tr, n, n + 1, [&](int64_t k0, int64_t nk) {
            load_keys(keys, kern, p.dtype, k0, nk, key_rows(hk));
            return PackedTile<T>{keys.kt.get(), keys.vt.get()};
          });
    }

    for (int64_t hk = hk0; hk < hk1; ++hk)
      finish_rows(*space.heads[size_t(hk - hk0)], kern, cfg, [&](int64_t i, const T* o, T scale, T lse) {
        if (splits > 1) {
          const int64_t at = part_at(b, hk, rt, split, i);
          T* part = part_o.data() + at * d;
          for (int64_t x = 0; x < d; ++x) part[x] = o[x] * scale;
          part_lse[size_t(at)] = lse;
        } else {
          char* row = static_cast<char*>(p.out) + esize * p.o_s.offset(b, token(i), head(hk, i));
          store_row(kern, o, scale, p.dtype, row, d);
          if (p.lse) store_value(p.lse, lse_type, p.lse_s.offset(b, token(i), head(hk, i)), lse);
        }
      });
    // The last split of its group to finish merges them all: acq_rel makes the other splits'
    // partial states visible to it.
    if (splits > 1 && scratch->done[size_t(group_id)].fetch_add(1, std::memory_order_acq_rel) == splits - 1)
      for (int64_t hk = hk0; hk < hk1; ++hk) merge(b, hk, rt);
  });
}

}  // namespace

void decode(const core::DecodeParams& p) {
  Cache c{p, dtype_size(p.dtype)};
  if (p.append) append(c);
  if (p.dtype == DType::f64) return attend<double>(c, double_kernels(), nullptr);
  // bf16 caches only: an fp16 one would take three tile products and the split of every row
  // (amx.h), which measured slower here than the float kernels (b=1, 8 KV heads, 8k-32k keys). And
  // only for tiles with more rows than the few-rows kernels take: with 4 rows those ran bf16 at
  // 1.1-1.7x the AMX kernels' speed at 16, 1k and 8k keys, 0.94x at 256
  // (bench/results/cpu_decode_fewrows_2026-12-05.txt).
  const TileKernels<float>& kern = float_kernels();
  const AmxKernels* amx = nullptr;
#if defined(__x86_64__)
  if (p.dtype == DType::bf16 && p.head_dim % 32 == 0 && active_level() == KernelLevel::amx &&
      !uses_rows_kernels(kern, p.heads_q / p.heads_kv * p.seqlen_new))
    amx = &amx_kernels();
#endif
  attend<float>(c, kern, amx);
}

}  // namespace flashattn::cpu
