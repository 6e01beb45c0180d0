// The bf16 forward's query tile on AMX tiles (amx.h): the operands put into the tiles' forms, then
// the float engine's loop (attn_engine.h attend_tiles) with AmxTile's products.
//
// Shapes: query tiles of kAmxBlockM rows and key tiles of kAmxBlockN keys. The tile products load
// and store their fp32 results (S^T, O~^T) through memory, so O~^T is loaded and stored once per
// key tile: few query rows keep O~^T (d x 64 fp32, 32 KiB at d = 128) in L1, and long key tiles
// amortize its pass over more products. Measured on a 2-core Sapphire Rapids VM (bf16, b=1, s=2048,
// 2026-12-05, bench/results/cpu_amx_2026-12-05.txt): the first version, on the float engine's
// 384-row tiles of 64 keys and one tile per task, ran 702 GFLOP/s at d=128; these shapes, with
// several tiles per task, 869; 32-128 rows x 128-1024 keys came within +-5% of these at d=64, 128
// and 256, the VM's noise.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "cpu/amx.h"
#include "cpu/attn_engine.h"

namespace flashattn::cpu {

inline constexpr int64_t kAmxBlockM = 64;
inline constexpr int64_t kAmxBlockN = 256;

// A worker's operands in the tiles' forms: Q of the current query tile as VNNI words, the P
// scratch, and K rows and V^T of one (sequence, KV head), packed once and reused by the worker's
// next query tiles of that head; a head past max_pack_bytes is packed a key tile at a time instead.
// For fp16 inputs (split) each operand has its lo half beside it (amx.h), at a fixed offset:
// lo_q (qv, pv), 32 * d (staged) and capacity (k, vt). block_n 0: a space for a query tile alone,
// with no P scratch (decoding's heads, whose key tiles share one space).
struct AmxSpace {
  AmxSpace(int64_t d, int64_t block_m, int64_t block_n, bool split_f16)
      : split(split_f16),
        lo_q(split ? std::max(d, block_n) / 2 * block_m : 0),
        qv(d / 2 * block_m + lo_q),
        pv(block_n / 2 * block_m + lo_q),
        staged(32 * d * (split ? 3 : 1)) {}
  bool split;
  int64_t lo_q;
  AlignedArray<uint32_t> qv, pv;  // [d/2][mpad], [block_n/2][mpad]
  AlignedArray<uint16_t> staged;  // up to 32 rows copied whole before a transposition (fp16: then split)
  int64_t b = -1, hk = -1, capacity = 0;
  std::unique_ptr<AlignedArray<uint16_t>> k, vt;  // [keys][d], [d][ldv]

  void reserve(int64_t elems) {
    if (k && elems <= capacity) return;
    capacity = elems;
    k = std::make_unique<AlignedArray<uint16_t>>(capacity * (split ? 2 : 1));
    vt = std::make_unique<AlignedArray<uint16_t>>(capacity * (split ? 2 : 1));
  }
  size_t bytes() const {
    return sizeof(*this) + qv.bytes() + pv.bytes() + staged.bytes() + (k ? k->bytes() + vt->bytes() : 0);
  }
  uint32_t* qv_lo() const { return split ? qv.get() + lo_q : nullptr; }
  uint32_t* pv_lo() const { return split ? pv.get() + lo_q : nullptr; }
  uint16_t* k_lo() const { return split ? k->get() + capacity : nullptr; }
  uint16_t* vt_lo() const { return split ? vt->get() + capacity : nullptr; }
};

// Prefetches the cache lines of n rows of `bytes` bytes each, row(j) for j < n: the tensors' rows
// lie a head stride apart (a page apart at typical shapes), where the hardware prefetchers do not
// follow, so without this each line of a cold row is a separate wait.
template <class Row>
void prefetch_rows(const Row& row, int64_t n, int64_t bytes, bool for_write) {
  for (int64_t j = 0; j < n; ++j) {
    const char* r = static_cast<const char*>(row(j));
    for (int64_t b = 0; b < bytes; b += 64) {
      if (for_write) __builtin_prefetch(r + b, 1, 3);
      else __builtin_prefetch(r + b, 0, 3);
    }
  }
}

// Copies `n` rows of d bf16 values (row(j) for j < n) into staged [32][d]; rows n..31 become zero.
// The rows are prefetched first, so their loads overlap; the transpositions then read the copy
// from L1.
template <class Row>
void stage_rows(const Row& row, int64_t n, int64_t d, uint16_t* staged) {
  prefetch_rows(row, n < 32 ? n : 32, d * 2, false);
  for (int64_t j = 0; j < 32; ++j) {
    if (j < n) std::memcpy(staged + j * d, row(j), size_t(d) * 2);
    else std::memset(staged + j * d, 0, size_t(d) * 2);
  }
}

// The 32 rows at `staged` (fp16 when as.split) as bf16 rows: themselves, or their hi halves, with the
// lo halves 32 * d further on.
inline const uint16_t* split_staged(const AmxKernels& amx, const AmxSpace& as, int64_t d) {
  uint16_t* staged = as.staged.get();
  if (!as.split) return staged;
  amx.split_f16(staged, 32 * d, staged + 32 * d, staged + 64 * d);
  return staged + 32 * d;
}

// The rows of ws's query tile into qv[r][i] = the bf16 pair (q_i[2r], q_i[2r + 1]), 0 past ws.rows.
template <class QRow>
void pack_amx_queries(const Workspace<float>& ws, const QRow& q_row, const AmxKernels& amx, AmxSpace& as) {
  const int64_t d = ws.d;
  for (int64_t i0 = 0; i0 < ws.mpad; i0 += 32) {
    const int64_t cols = ws.mpad - i0 < 32 ? ws.mpad - i0 : 32;
    stage_rows([&](int64_t j) { return q_row(i0 + j); }, ws.rows - i0, d, as.staged.get());
    const uint16_t* rows = split_staged(amx, as, d);
    amx.pack_q(rows, d, as.qv.get(), ws.mpad, i0, cols);
    if (as.split) amx.pack_q(rows + 32 * d, d, as.qv_lo(), ws.mpad, i0, cols);
  }
}

// Keys [k0, k0 + n) of a head into K rows [n rounded up to 32][d] and V^T [d][ldv] (and their lo
// halves), the padding zero: the products read a tile's keys up to its end rounded up to 32, and
// every tile starts at a multiple of 32. 32 keys at a time, K and V together, each group's rows
// prefetched a group ahead (prefetch_rows).
template <class KeyRows>
void pack_amx_keys(const KeyRows& key_rows, int64_t k0, int64_t n, int64_t d, const AmxKernels& amx, AmxSpace& as,
                   int64_t ldv) {
  const int64_t padded = ceil_div(n, 32) * 32;
  uint16_t* const ks[2] = {as.k->get(), as.k_lo()};
  uint16_t* const vts[2] = {as.vt->get(), as.vt_lo()};
  auto prefetch_group = [&](int64_t j0) {
    const int64_t rows = n - j0 < 32 ? n - j0 : 32;
    prefetch_rows([&](int64_t j) { return key_rows(k0 + j0 + j).first; }, rows, d * 2, false);
    prefetch_rows([&](int64_t j) { return key_rows(k0 + j0 + j).second; }, rows, d * 2, false);
  };
  prefetch_group(0);
  for (int64_t j0 = 0; j0 < padded; j0 += 32) {
    prefetch_group(j0 + 32);
    for (int64_t j = j0; j < j0 + 32; ++j) {
      if (j >= n) {
        for (uint16_t* k : ks)
          if (k) std::memset(k + j * d, 0, size_t(d) * 2);
      } else if (as.split) {
        amx.split_f16(static_cast<const uint16_t*>(key_rows(k0 + j).first), d, ks[0] + j * d, ks[1] + j * d);
      } else {
        std::memcpy(ks[0] + j * d, key_rows(k0 + j).first, size_t(d) * 2);
      }
    }
    uint16_t* staged = as.staged.get();
    for (int64_t j = 0; j < 32; ++j) {
      if (j0 + j < n) std::memcpy(staged + j * d, key_rows(k0 + j0 + j).second, size_t(d) * 2);
      else std::memset(staged + j * d, 0, size_t(d) * 2);
    }
    const uint16_t* rows = split_staged(amx, as, d);
    for (int half = 0; half < (as.split ? 2 : 1); ++half, rows += 32 * d) amx.pack_vt(rows, d, vts[half], ldv, j0);
  }
}

// A key tile of attend_tiles on the AMX kernels. The lo operands are null for bf16 inputs.
struct AmxTile {
  const AmxKernels* amx;
  const uint16_t *k, *k_lo;    // the tile's first key row, d apart
  const uint16_t *vt, *vt_lo;  // its first V^T column, ldv apart
  int64_t ldv;
  const uint32_t *qv, *qv_lo;
  uint32_t *pv, *pv_lo;
  void scores(Workspace<float>& ws, const TileKernels<float>&, int64_t nk, int64_t i0, int64_t rows) const {
    amx->scores(k, k_lo, ws.d, nk, qv + i0, qv_lo ? qv_lo + i0 : nullptr, ws.d, rows, ws.mpad, ws.st.get() + i0);
  }
  void softmax(Workspace<float>& ws, const TileKernels<float>&, float c, int64_t nk, int64_t i0, int64_t rows) const {
    amx->softmax(ws.st.get() + i0, nk, rows, ws.mpad, c, ws.m + i0, ws.l + i0, ws.f + i0, pv, pv_lo);
  }
  void accumulate(Workspace<float>& ws, const TileKernels<float>&, int64_t nk, int64_t i0, int64_t rows) const {
    amx->accumulate(vt, vt_lo, ldv, nk, pv, pv_lo, rows, ws.mpad, ws.d, ws.f + i0, ws.ot.get() + i0);
  }
};

// Holds our tile configuration for a scope and restores the thread's however the scope ends.
class AmxScope {
 public:
  explicit AmxScope(const AmxKernels& amx) : amx_(amx) { amx_.begin(&saved_); }
  ~AmxScope() { amx_.end(&saved_); }
  AmxScope(const AmxScope&) = delete;
  AmxScope& operator=(const AmxScope&) = delete;

 private:
  const AmxKernels& amx_;
  AmxSavedState saved_;
};

// The key tile at `key` of the K and V^T packs in `keys` (V^T rows ldv apart, P^T going to its P
// scratch), against the query tile packed in `queries` (the same space, but for decoding's heads).
inline AmxTile packed_amx_tile(const AmxKernels& amx, const AmxSpace& keys, const AmxSpace& queries, int64_t d,
                               int64_t key, int64_t ldv) {
  return AmxTile{&amx,
                 keys.k->get() + key * d,
                 keys.split ? keys.k_lo() + key * d : nullptr,
                 keys.vt->get() + key,
                 keys.split ? keys.vt_lo() + key : nullptr,
                 ldv,
                 queries.qv.get(),
                 queries.qv_lo(),
                 keys.pv.get(),
                 keys.pv_lo()};
}

// Streams key tiles [n_begin, n_end) of those `tr` asks for through the query tile of ws and
// `queries` (packed, our tile configuration loaded), each packed into `keys` as it comes.
template <class KeyRows>
void attend_amx_per_tile(Workspace<float>& ws, AmxSpace& keys, const AmxSpace& queries, const AmxKernels& amx,
                         const TileKernels<float>& kern, const TileConfig<float>& cfg, const core::TileRange& tr,
                         int64_t n_begin, int64_t n_end, const KeyRows& key_rows) {
  const int64_t tile_ldv = packed_stride(ws.block_n, 2);
  keys.reserve(tile_ldv * ws.d);
  keys.b = -1;  // the buffers no longer hold a whole head
  attend_tiles(ws, kern, cfg, tr, n_begin, n_end, [&](int64_t k0, int64_t nk) {
    pack_amx_keys(key_rows, k0, nk, ws.d, amx, keys, tile_ldv);
    return packed_amx_tile(amx, keys, queries, ws.d, 0, tile_ldv);
  });
}

// One query tile (its state already reset in ws) against keys [0, sk) of head (b, hk), whose rows
// key_rows(key) gives: packs Q, packs the head's K and V^T unless `as` holds them, and streams the
// key tiles `tr` asks for. Heads whose K and V^T would pass max_pack_bytes are packed per key tile.
template <class QRow, class KeyRows>
void attend_amx(Workspace<float>& ws, AmxSpace& as, const AmxKernels& amx, const TileKernels<float>& kern,
                const TileConfig<float>& cfg, const core::TileRange& tr, const QRow& q_row, const KeyRows& key_rows,
                int64_t sk, int64_t b, int64_t hk, int64_t max_pack_bytes) {
  const int64_t d = ws.d, bn = ws.block_n;
  pack_amx_queries(ws, q_row, amx, as);
  const AmxScope scope(amx);
  const int64_t padded = ceil_div(sk, bn) * bn, head_ldv = packed_stride(padded, 2);
  if ((padded + head_ldv) * d * 2 * (as.split ? 2 : 1) > max_pack_bytes) {
    attend_amx_per_tile(ws, as, as, amx, kern, cfg, tr, tr.n_begin, tr.n_end, key_rows);
    return;
  }
  as.reserve(head_ldv * d);
  if (as.b != b || as.hk != hk) {
    pack_amx_keys(key_rows, 0, sk, d, amx, as, head_ldv);
    as.b = b;
    as.hk = hk;
  }
  attend_tiles(ws, kern, cfg, tr, tr.n_begin, tr.n_end,
               [&](int64_t k0, int64_t) { return packed_amx_tile(amx, as, as, d, k0, head_ldv); });
}

// The query tile's rows out: o~ / l (core::finalize_scale) rounded to bf16 or fp16 by the AMX
// kernels' 16 x 16 transposes into out_row(i), and each row's lse through store_lse(i, lse).
template <class OutRow, class StoreLse>
void finish_amx(const Workspace<float>& ws, const AmxKernels& amx, const TileConfig<float>& cfg, const OutRow& out_row,
                const StoreLse& store_lse) {
  alignas(64) float scale[kMaxTileRows];
  void* rows[kMaxTileRows];
  for (int64_t i = 0; i < ws.mpad; ++i) {
    const bool real = i < ws.rows;
    scale[i] = real ? core::finalize_scale(ws.l[i]) : 0.f;
    rows[i] = real ? static_cast<void*>(out_row(i)) : nullptr;
    if (real) store_lse(i, row_lse(ws, cfg, i));
  }
  amx.finish(ws.ot.get(), ws.mpad, ws.mpad, ws.d, scale, cfg.dtype == DType::f16, rows);
}

}  // namespace flashattn::cpu
