// The CPU forward pass: one task per (sequence, query head, query tile), each running the tiled
// loop of attn_engine.h over the key tiles its rows can see. Tasks write disjoint rows of out and
// lse, so the result does not depend on the number of threads or on the schedule.
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "api/backends.h"
#include "cpu/amx.h"
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
};

// bf16 on AMX tiles (amx.h): a worker's operands in the tiles' forms. Q of the current query tile
// as VNNI words, the P scratch, and K rows and V^T of one (sequence, KV head) packed once and
// reused as HeadPack does; a head past kMaxPackBytes is packed a key tile at a time instead.
struct AmxSpace {
  AmxSpace(int64_t d, int64_t block_m) : qv(d / 2 * block_m), pv(kBlockN / 2 * block_m) {}
  AlignedArray<uint32_t> qv, pv;  // [d/2][mpad], [32][mpad]
  int64_t b = -1, hk = -1, ldv = 0, capacity = 0;
  std::unique_ptr<AlignedArray<uint16_t>> k, vt;  // [keys][d], [d][ldv]

  void reserve(int64_t elems) {
    if (k && elems <= capacity) return;
    capacity = elems;
    k = std::make_unique<AlignedArray<uint16_t>>(capacity);
    vt = std::make_unique<AlignedArray<uint16_t>>(capacity);
  }
};

// The rows of ws's query tile into qv[r][i] = the bf16 pair (q_i[2r], q_i[2r + 1]), 0 past ws.rows.
template <class QRow>
void pack_amx_queries(const Workspace<float>& ws, const QRow& q_row, uint32_t* qv) {
  for (int64_t i = 0; i < ws.mpad; ++i) {
    const auto* src = i < ws.rows ? static_cast<const char*>(q_row(i)) : nullptr;
    for (int64_t r = 0; r < ws.d / 2; ++r) {
      uint32_t w = 0;
      if (src) std::memcpy(&w, src + 4 * r, 4);
      qv[r * ws.mpad + i] = w;
    }
  }
}

// Keys [k0, k0 + n) of a head into K rows [n rounded up to kBlockN][d] and V^T [d][ldv], the padding
// zero. V^T is written 32 keys at a time, so each key's row is fetched once and stays in L1 while
// its values go out column by column.
template <class KeyRows>
void pack_amx_keys(const KeyRows& key_rows, int64_t k0, int64_t n, int64_t d, uint16_t* k, uint16_t* vt,
                   int64_t ldv) {
  const int64_t padded = ceil_div(n, kBlockN) * kBlockN;
  for (int64_t j = 0; j < padded; ++j) {
    if (j < n) std::memcpy(k + j * d, key_rows(k0 + j).first, size_t(d) * 2);
    else std::memset(k + j * d, 0, size_t(d) * 2);
  }
  const uint16_t* rows[32];
  for (int64_t j0 = 0; j0 < padded; j0 += 32) {
    for (int64_t j = 0; j < 32; ++j)
      rows[j] = j0 + j < n ? static_cast<const uint16_t*>(key_rows(k0 + j0 + j).second) : nullptr;
    for (int64_t x = 0; x < d; ++x) {
      uint16_t* dst = vt + x * ldv + j0;
      for (int64_t j = 0; j < 32; ++j) dst[j] = rows[j] ? rows[j][x] : uint16_t(0);
    }
  }
}

// A key tile of attend_tiles on the AMX kernels.
struct AmxTile {
  const AmxKernels* amx;
  const uint16_t* k;   // the tile's first key row, d apart
  const uint16_t* vt;  // its first V^T column, ldv apart
  int64_t ldv;
  const uint32_t* qv;
  uint32_t* pv;
  float mul;  // TileConfig::q_scale, which the float path folds into its Q^T
  void scores(Workspace<float>& ws, const TileKernels<float>&, int64_t nk, int64_t i0, int64_t rows) const {
    amx->scores(k, ws.d, nk, qv + i0, ws.d, rows, ws.mpad, mul, ws.st.get() + i0);
  }
  void accumulate(Workspace<float>& ws, const TileKernels<float>&, int64_t nk, int64_t i0, int64_t rows) const {
    amx->accumulate(vt, ldv, nk, ws.st.get() + i0, rows, ws.mpad, ws.d, ws.f + i0, ws.ot.get() + i0, pv);
  }
};

// Releases the tiles however the task ends.
struct AmxScope {
  const AmxKernels* amx;
  explicit AmxScope(const AmxKernels* a) : amx(a) { amx->begin(); }
  ~AmxScope() { amx->end(); }
  AmxScope(const AmxScope&) = delete;
  AmxScope& operator=(const AmxScope&) = delete;
};

// amx: the AMX kernels for a bf16 problem, or null for the float (or double) kernels alone.
template <class T>
void run(const core::ForwardParams& p, const TileKernels<T>& kern, const AmxKernels* amx) {
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
  std::vector<HeadPack<T>> packs(static_cast<size_t>(workers));
  std::vector<std::unique_ptr<AmxSpace>> amx_spaces(static_cast<size_t>(amx ? workers : 0));
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

    auto q_row = [&](int64_t i) { return q + esize * p.q_s.offset(task.b, s.q0 + task.r0 + i, task.h); };
    auto pos = [&](int64_t i) { return task.r0 + i; };
    core::TileRange tr = core::tile_range(cfg.mask, task.r0, task.r1, kBlockN);
    auto key_rows = [&](int64_t key) {
      return std::pair<const void*, const void*>(k + esize * p.k_s.offset(task.b, s.k0 + key, hk),
                                                 v + esize * p.v_s.offset(task.b, s.k0 + key, hk));
    };
    if constexpr (std::is_same_v<T, float>) {
      if (amx) {
        auto& aslot = amx_spaces[size_t(worker)];
        if (!aslot) aslot = std::make_unique<AmxSpace>(d, ws.block_m);
        AmxSpace& as = *aslot;
        reset_tile(ws, kern.row_align, cfg, task.r1 - task.r0, pos);
        pack_amx_queries(ws, q_row, as.qv.get());
        const AmxScope scope(amx);
        const int64_t padded = ceil_div(s.sk, kBlockN) * kBlockN, head_ldv = packed_stride(padded, 2);
        AmxTile tile{amx, nullptr, nullptr, 0, as.qv.get(), as.pv.get(), float(cfg.q_scale)};
        if ((padded + head_ldv) * d * 2 <= kMaxPackBytes) {
          as.reserve(std::max(padded, head_ldv) * d);
          if (as.b != task.b || as.hk != hk) {
            pack_amx_keys(key_rows, 0, s.sk, d, as.k->get(), as.vt->get(), head_ldv);
            as.b = task.b;
            as.hk = hk;
          }
          attend_tiles(ws, kern, cfg, tr, tr.n_begin, tr.n_end, [&](int64_t k0, int64_t) {
            tile.k = as.k->get() + k0 * d;
            tile.vt = as.vt->get() + k0;
            tile.ldv = head_ldv;
            return tile;
          });
        } else {
          const int64_t tile_ldv = packed_stride(kBlockN, 2);
          as.reserve(tile_ldv * d);
          as.b = -1;  // the buffers no longer hold a whole head
          attend_tiles(ws, kern, cfg, tr, tr.n_begin, tr.n_end, [&](int64_t k0, int64_t nk) {
            pack_amx_keys(key_rows, k0, nk, d, as.k->get(), as.vt->get(), tile_ldv);
            tile.k = as.k->get();
            tile.vt = as.vt->get();
            tile.ldv = tile_ldv;
            return tile;
          });
        }
      }
    }
    if (!amx) {
      begin_tile(ws, kern, cfg, task.r1 - task.r0, q_row, pos);
      if (s.sk * ws.ld * int64_t(sizeof(T)) * 2 <= kMaxPackBytes) {
        HeadPack<T>& pack = packs[size_t(worker)];
        pack.fill(task.b, hk, s.sk, ws.ld, d, kern, p.dtype, key_rows);
        attend_tiles(ws, kern, cfg, tr, tr.n_begin, tr.n_end, [&](int64_t k0, int64_t) {
          return PackedTile<T>{pack.k->get() + k0 * ws.ld, pack.v->get() + k0 * ws.ld};
        });
      } else {
        attend_tiles(ws, kern, cfg, tr, tr.n_begin, tr.n_end, packed_per_tile(ws, kern, p.dtype, key_rows));
      }
    }
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
  if (p.dtype == DType::f64) return run<double>(p, double_kernels(), nullptr);
  const AmxKernels* amx = nullptr;
#if defined(__x86_64__)
  // The tiles take 32 head-dim values a step; other head dims run the float kernels.
  if (p.dtype == DType::bf16 && p.head_dim % 32 == 0 && active_level() == KernelLevel::amx) amx = &amx_kernels();
#endif
  run<float>(p, float_kernels(), amx);
}

}  // namespace flashattn::cpu
