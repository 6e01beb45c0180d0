// The tiled FlashAttention loop nest of the CPU engine, shared by forward and decode.
//
// One query tile (at most block_rows(d) rows, each with its own query position) stays resident as Q^T
// while key tiles of kBlockN keys stream past: S^T = K Q^T, softcap, mask (boundary tiles only),
// online-softmax update, O~^T = f O~^T + V^T P^T. Key tiles outside the causal / window range are
// never visited (core::tile_range). Only the tile-sized buffers of one Workspace per worker are
// used, never anything of size N x N or N x d.
//
// Scores: without a softcap the tile holds q.k and the softmax scale is applied inside the
// exponent, exp2((s - m) * scale * log2(e)); with a softcap the tile's q.k are multiplied by
// scale / softcap inside the softcap pass and the tile holds softcap * tanh(scale * q.k / softcap),
// exponentiated with factor log2(e). (Multiplying q by scale / softcap before the products instead
// rounded every term of q.k once more: at softcap 0.25 and d = 256 an f32 lse then missed the
// accuracy rule, found by the fuzzer.) Either way every exponential is an exp2
// (core/softmax_state.h), and the difference s - m is taken before scaling, so large scores
// (q.k ~ 1e4) lose no precision.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

#include "core/block_range.h"
#include "core/numeric.h"
#include "core/softmax_state.h"
#include "cpu/simd.h"

namespace flashattn::cpu {

// Query rows per tile. Each key tile is packed once per query tile, and its rows are scattered in
// memory (one head-stride apart, a page apart for typical strides), so fetching them is latency
// bound: the more rows share a packed tile, the smaller that share of the time. The bound is L2:
// Q^T and O~^T together stay near 384 KiB (384 rows at d = 128). A multiple of every level's
// micro-tile width (24, 48), so full tiles need no remainder kernels.
inline int64_t block_rows(int64_t head_dim) {
  int64_t rows = (49152 / head_dim) / 48 * 48;
  return rows < 48 ? 48 : (rows > kMaxTileRows ? kMaxTileRows : rows);
}
// Keys per tile: a panel of the score tile (64 keys x one micro-tile of rows) stays in L1 in P V.
inline constexpr int64_t kBlockN = 64;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A 64-byte aligned array (cache lines, and every vector width).
template <class T>
class AlignedArray {
 public:
  explicit AlignedArray(int64_t n)
      : p_(static_cast<T*>(::operator new(size_t(n > 0 ? n : 1) * sizeof(T), std::align_val_t{64}))),
        bytes_(size_t(n > 0 ? n : 1) * sizeof(T)) {}
  ~AlignedArray() { ::operator delete(p_, std::align_val_t{64}); }
  AlignedArray(const AlignedArray&) = delete;
  AlignedArray& operator=(const AlignedArray&) = delete;
  T* get() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  T* p_;
  size_t bytes_;
};

// Row stride of the packed key / value tiles: the head dimension rounded up to whole cache lines,
// plus one line when that count is even. Tensors' own row strides are usually large powers of two
// (heads * d), which map every key row of a tile onto the same few L1 sets; packed rows an odd
// number of lines apart spread over all sets, so a whole tile stays in L1.
inline int64_t packed_stride(int64_t d, int64_t elem_bytes) {
  const int64_t line = 64 / elem_bytes;
  int64_t lines = ceil_div(d, line);
  return (lines % 2 == 0 ? lines + 1 : lines) * line;
}

// Which float operand tiles a Workspace holds: all of them; the query tile alone (decoding's heads
// share one workspace's key tiles, decode.cpp); or none (the AMX path brings its operands in its
// own forms, amx_engine.h).
enum class FloatTiles { all, queries, none };

// One worker's scratch space: O(block_m * d + block_n * d) values. block_m query rows at most per
// tile, block_n keys per key tile (kBlockN, or the AMX path's own).
template <class T>
struct Workspace {
  explicit Workspace(int64_t head_dim, int64_t rows_per_tile = 0, int64_t keys_per_tile = kBlockN,
                     FloatTiles tiles = FloatTiles::all)
      : d(head_dim),
        ld(packed_stride(head_dim, sizeof(T))),
        block_m(rows_per_tile > 0 ? rows_per_tile : block_rows(head_dim)),
        block_n(keys_per_tile),
        qt(tiles != FloatTiles::none ? d * block_m : 0),
        ot(d * block_m),
        st(block_n * block_m),
        kt(tiles == FloatTiles::all ? block_n * ld : 0),
        vt(tiles == FloatTiles::all ? block_n * ld : 0) {}
  int64_t d, ld, block_m, block_n;
  AlignedArray<T> qt, ot, st;  // [d][mpad], [d][mpad], [block_n][mpad]
  AlignedArray<T> kt, vt;      // the current key / value tile, [block_n][ld]
  alignas(64) T m[kMaxTileRows], l[kMaxTileRows], f[kMaxTileRows];
  int64_t lo[kMaxTileRows], hi[kMaxTileRows];  // visible keys [lo, hi) of each row
  int64_t rows = 0, mpad = 0;
  bool row_major = false;  // qt and ot hold q and o~ as [rows][d] (begin_rows), not transposed
  size_t bytes() const { return sizeof(*this) + qt.bytes() + ot.bytes() + st.bytes() + kt.bytes() + vt.bytes(); }
};

// What a tile's arithmetic needs to know about the problem.
template <class T>
struct TileConfig {
  DType dtype;       // storage type of q, k, v
  T tanh_scale;      // multiplies q.k inside the softcap's tanh: scale / softcap (unused without)
  T softcap;         // 0 = off
  T exp2_scale;      // c in exp2((s - m) * c): scale * log2(e), or log2(e) with a softcap
  double lse_scale;  // the same c in double, to turn m into the exp2 domain at the end
  core::MaskSpec mask;
};

template <class T>
TileConfig<T> make_config(DType dtype, float scale, float softcap, const core::MaskSpec& mask) {
  TileConfig<T> c;
  c.dtype = dtype;
  c.mask = mask;
  c.softcap = T(softcap);
  c.tanh_scale = softcap > 0.f ? T(scale) / T(softcap) : T(1);
  c.lse_scale = softcap > 0.f ? core::kLog2e : double(scale) * core::kLog2e;  // scale > 0 (validated)
  c.exp2_scale = T(c.lse_scale);
  return c;
}

// Copies one row of d values of the tensor's dtype into dst as T (a copy, or a widening).
template <class T>
void copy_row(const TileKernels<T>& kern, DType dtype, const void* src, T* dst, int64_t d) {
  if (dtype_size(dtype) == int64_t(sizeof(T)))
    std::memcpy(dst, src, size_t(d) * sizeof(T));
  else
    kern.widen(src, dtype, dst, d);
}

// Starts a query tile of `rows` rows, row i at query position pos(i) (nondecreasing in i): its
// padded row count (a multiple of row_align), visible key ranges and a fresh softmax state and o~.
template <class T, class Pos>
void reset_tile(Workspace<T>& ws, int64_t row_align, const TileConfig<T>& cfg, int64_t rows, const Pos& pos) {
  ws.rows = rows;
  ws.mpad = ceil_div(rows, row_align) * row_align;
  ws.row_major = false;
  for (int64_t i = 0; i < ws.mpad; ++i) {
    ws.lo[i] = i < rows ? cfg.mask.lo(pos(i)) : 0;
    ws.hi[i] = i < rows ? cfg.mask.hi(pos(i)) : 0;
    ws.m[i] = core::neg_inf<T>();
    ws.l[i] = T(0);
  }
  T* ot = ws.ot.get();
  for (int64_t e = 0; e < ws.d * ws.mpad; ++e) ot[e] = T(0);
}

// Starts a query tile (reset_tile) whose row i has its q values at q_row(i), and packs Q^T
// (zero-padded to mpad). Rows are first copied whole into a free key buffer (ws's own, or that of
// `keys` when ws holds no key tiles), so the reads from the tensor are row-contiguous, then
// transposed from there.
template <class T, class QRow, class Pos>
void begin_tile(Workspace<T>& ws, const TileKernels<T>& kern, const TileConfig<T>& cfg, int64_t rows,
                const QRow& q_row, const Pos& pos, const Workspace<T>* keys = nullptr) {
  reset_tile(ws, kern.row_align, cfg, rows, pos);
  const int64_t d = ws.d;
  T* qt = ws.qt.get();
  T* staged = (keys ? keys : &ws)->kt.get();
  for (int64_t r0 = 0; r0 < ws.mpad; r0 += ws.block_n) {
    const int64_t r1 = r0 + ws.block_n < ws.mpad ? r0 + ws.block_n : ws.mpad;
    for (int64_t i = r0; i < r1; ++i) {
      T* row = staged + (i - r0) * ws.ld;
      if (i < rows) copy_row(kern, cfg.dtype, q_row(i), row, d);
      else std::fill(row, row + d, T(0));
    }
    kern.transpose(staged, ws.ld, qt + r0, ws.mpad, r1 - r0, d);
  }
}

// Packs keys [k0, k0 + nk) into ws.kt / ws.vt. key_rows(t) returns the (k, v) row pointers of key t.
template <class T, class KeyRows>
void load_keys(Workspace<T>& ws, const TileKernels<T>& kern, DType dtype, int64_t k0, int64_t nk,
               const KeyRows& key_rows) {
  for (int64_t j = 0; j < nk; ++j) {
    auto [k, v] = key_rows(k0 + j);
    copy_row(kern, dtype, k, ws.kt.get() + j * ws.ld, ws.d);
    copy_row(kern, dtype, v, ws.vt.get() + j * ws.ld, ws.d);
  }
}

// A key tile for the float kernels: its K and V rows packed ws.ld apart. attend_tiles asks a tile
// for its two products and the softmax between them, over query rows [i0, i0 + rows) of the
// workspace.
template <class T>
struct PackedTile {
  const T* k;
  const T* v;
  void scores(Workspace<T>& ws, const TileKernels<T>& kern, int64_t nk, int64_t i0, int64_t rows) const {
    kern.scores(k, ws.ld, nk, ws.qt.get() + i0, ws.d, rows, ws.mpad, ws.st.get() + i0);
  }
  void softmax(Workspace<T>& ws, const TileKernels<T>& kern, T c, int64_t nk, int64_t i0, int64_t rows) const {
    kern.softmax(ws.st.get() + i0, nk, rows, ws.mpad, c, ws.m + i0, ws.l + i0, ws.f + i0);
  }
  void accumulate(Workspace<T>& ws, const TileKernels<T>& kern, int64_t nk, int64_t i0, int64_t rows) const {
    kern.accumulate(v, ws.ld, nk, ws.st.get() + i0, rows, ws.mpad, ws.d, ws.f + i0, ws.ot.get() + i0);
  }
};

// Decoding's few query rows (kernel_impl.h's *_rows kernels): q and o~ row-major in the workspace's
// qt and ot ([rows][d]), the key tile's K and V rows wherever they lie, of dtype t (T's own, or
// 16-bit, widened as the kernels load them), and the scores row-major in st ([rows][ld], keys in
// the vector lanes: with 4 rows, the query-minor layout would leave three quarters of each vector
// idle in the softmax). attend_tiles hands a tile rows rounded out to whole vectors; only the real
// ones are computed. The tile applies its softcap and mask itself (masked_scores), in its layout.
template <class T>
struct RowTile {
  static constexpr bool kScoresRowMajor = true;
  const void* const* k;
  const void* const* v;
  DType t;
  static int64_t real_rows(const Workspace<T>& ws, int64_t i0, int64_t rows) {
    return ws.rows - i0 < rows ? ws.rows - i0 : rows;
  }
  static int64_t ld(const Workspace<T>& ws, const TileKernels<T>& kern) {
    return ceil_div(ws.block_n, kern.row_align) * kern.row_align;
  }
  // S for keys [k0, k0 + nk), capped, masked (when the tile needs it: keys outside a row's [lo, hi)
  // get -inf), and -inf past nk up to the next whole vector, as softmax_rows reads them.
  void masked_scores(Workspace<T>& ws, const TileKernels<T>& kern, const TileConfig<T>& cfg, int64_t k0, int64_t nk,
                     int64_t i0, int64_t rows, bool masked) const {
    const int64_t real = real_rows(ws, i0, rows), lds = ld(ws, kern);
    const int64_t n = ceil_div(nk, kern.row_align) * kern.row_align;
    T* s = ws.st.get() + i0 * lds;
    kern.scores_rows(k, t, nk, ws.qt.get() + i0 * ws.d, ws.d, real, lds, s);
    for (int64_t i = 0; i < real; ++i) {
      T* row = s + i * lds;
      if (cfg.softcap != T(0)) kern.softcap(row, n, cfg.softcap, cfg.tanh_scale);
      if (masked) {
        const int64_t lo = ws.lo[i0 + i] - k0, hi = ws.hi[i0 + i] - k0;
        for (int64_t j = 0; j < nk; ++j)
          if (j < lo || j >= hi) row[j] = core::neg_inf<T>();
      }
      for (int64_t j = nk; j < n; ++j) row[j] = core::neg_inf<T>();
    }
  }
  void softmax(Workspace<T>& ws, const TileKernels<T>& kern, T c, int64_t nk, int64_t i0, int64_t rows) const {
    const int64_t lds = ld(ws, kern);
    kern.softmax_rows(ws.st.get() + i0 * lds, nk, real_rows(ws, i0, rows), lds, c, ws.m + i0, ws.l + i0, ws.f + i0);
  }
  void accumulate(Workspace<T>& ws, const TileKernels<T>& kern, int64_t nk, int64_t i0, int64_t rows) const {
    const int64_t lds = ld(ws, kern);
    kern.accumulate_rows(v, t, nk, ws.st.get() + i0 * lds, real_rows(ws, i0, rows), lds, ws.d, ws.f + i0,
                         ws.ot.get() + i0 * ws.d);
  }
};

// Starts a query tile for RowTile: reset_tile, and row i's q values copied to row i of qt.
template <class T, class QRow, class Pos>
void begin_rows(Workspace<T>& ws, const TileKernels<T>& kern, const TileConfig<T>& cfg, int64_t rows,
                const QRow& q_row, const Pos& pos) {
  reset_tile(ws, kern.row_align, cfg, rows, pos);
  ws.row_major = true;
  for (int64_t i = 0; i < rows; ++i) copy_row(kern, cfg.dtype, q_row(i), ws.qt.get() + i * ws.d, ws.d);
}

// The usual key source of attend_tiles: packs each key tile into the workspace from the rows that
// key_rows(t) points to.
template <class T, class KeyRows>
auto packed_per_tile(Workspace<T>& ws, const TileKernels<T>& kern, DType dtype, const KeyRows& key_rows) {
  return [&ws, &kern, dtype, &key_rows](int64_t k0, int64_t nk) {
    load_keys(ws, kern, dtype, k0, nk, key_rows);
    return PackedTile<T>{ws.kt.get(), ws.vt.get()};
  };
}

// Sets the scores of keys a row may not see to -inf (boundary tiles only), for rows [i0, i1) (real
// rows, whose lo and hi are nondecreasing). For each key the rows that see it are one run [a, b):
// those before have hi <= key, those from b on lo > key, and both bounds only move forward as the
// key does, so the masked entries are two runs per key, found without a test per element.
template <class T>
void apply_mask(Workspace<T>& ws, int64_t k0, int64_t nk, int64_t i0, int64_t i1) {
  T* st = ws.st.get();
  int64_t a = i0, b = i0;
  for (int64_t j = 0; j < nk; ++j) {
    const int64_t key = k0 + j;
    while (a < i1 && ws.hi[a] <= key) ++a;
    while (b < i1 && ws.lo[b] <= key) ++b;
    T* s = st + j * ws.mpad;
    for (int64_t i = i0; i < a; ++i) s[i] = core::neg_inf<T>();
    for (int64_t i = b > a ? b : a; i < i1; ++i) s[i] = core::neg_inf<T>();
  }
}

inline int64_t tile_keys(int64_t seqlen_k, int64_t n, int64_t block_n) {
  return seqlen_k - n * block_n < block_n ? seqlen_k - n * block_n : block_n;
}

// Streams key tiles [n_begin, n_end) of a sequence with seqlen_k keys through the current query
// tile; `range` says which of them need the element-wise mask; tiles(k0, nk) returns keys [k0, k0 +
// nk) as a tile with the two products and the softmax (PackedTile, or amx_engine.h's AmxTile). On
// a tile that only some rows can see (the diagonal of a causal mask, the edges of a window) the
// products and the softmax run on those rows alone, rounded out to whole vectors: the others would
// take P = 0 and f = 1.
template <class T, class KeyTiles>
void attend_tiles(Workspace<T>& ws, const TileKernels<T>& kern, const TileConfig<T>& cfg, const core::TileRange& range,
                  int64_t n_begin, int64_t n_end, const KeyTiles& tiles) {
  const int64_t mpad = ws.mpad, align = kern.row_align;
  for (int64_t n = n_begin; n < n_end; ++n) {
    int64_t k0 = n * ws.block_n, nk = tile_keys(cfg.mask.seqlen_k, n, ws.block_n);
    // lo and hi are nondecreasing over the real rows: the rows that see a key of [k0, k0 + nk)
    // are one run [i0, i1), and the keys any of them sees one run too. The tile is cut to that run
    // (its start in steps of 32 keys, so an AMX tile's reads stay within the tile's padded keys):
    // under a causal mask with long key tiles most of the diagonal tile is above the diagonal.
    int64_t i0 = 0, i1 = mpad;
    if (range.needs_mask(n)) {
      while (i0 < ws.rows && ws.hi[i0] <= k0) ++i0;
      int64_t last = ws.rows;
      while (last > i0 && ws.lo[last - 1] >= k0 + nk) --last;
      if (last <= i0) continue;
      const int64_t first_key = ws.lo[i0] > k0 ? k0 + (ws.lo[i0] - k0) / 32 * 32 : k0;
      const int64_t end_key = ws.hi[last - 1] < k0 + nk ? ws.hi[last - 1] : k0 + nk;
      nk = end_key - first_key;
      k0 = first_key;
      i1 = ceil_div(last, align) * align;
      i0 = i0 / align * align;
    }
    const int64_t rows = i1 - i0;
    const auto tile = tiles(k0, nk);
    if constexpr (requires { decltype(tile)::kScoresRowMajor; }) {
      tile.masked_scores(ws, kern, cfg, k0, nk, i0, rows, range.needs_mask(n));
    } else {
      T* st = ws.st.get() + i0;
      tile.scores(ws, kern, nk, i0, rows);
      if (cfg.softcap != T(0))
        for (int64_t j = 0; j < nk; ++j) kern.softcap(st + j * mpad, rows, cfg.softcap, cfg.tanh_scale);
      if (range.needs_mask(n)) apply_mask(ws, k0, nk, i0, i1 < ws.rows ? i1 : ws.rows);
    }
    tile.softmax(ws, kern, cfg.exp2_scale, nk, i0, rows);
    tile.accumulate(ws, kern, nk, i0, rows);
  }
}

// Row i's natural-log lse, formed in double so that a large max keeps its digits; -inf for a row
// that saw no key (core::finalize_lse).
template <class T>
T row_lse(const Workspace<T>& ws, const TileConfig<T>& cfg, int64_t i) {
  return T(core::finalize_lse(double(ws.m[i]) * cfg.lse_scale, double(ws.l[i])));
}

// Writes value v into element i of a tensor of dtype t.
template <class T>
void store_value(void* base, DType t, int64_t i, T v) {
  switch (t) {
    case DType::f16: static_cast<core::half_t*>(base)[i] = core::to_half(float(v)); break;
    case DType::bf16: static_cast<core::bfloat16_t*>(base)[i] = core::to_bf16(float(v)); break;
    case DType::f32: static_cast<float*>(base)[i] = float(v); break;
    default: static_cast<double*>(base)[i] = double(v); break;
  }
}

// d values o * scale into dst of dtype t: a 16-bit row narrowed in whole vectors (kern.narrow, the
// values of store_value's rounding; element by element, the conversion took most of a decode step
// over a short cache).
template <class T>
void store_row(const TileKernels<T>& kern, const T* o, T scale, DType t, void* dst, int64_t d) {
  if constexpr (std::is_same_v<T, float>) {
    if (t == DType::bf16 || t == DType::f16) return kern.narrow(o, scale, t, dst, d);
  }
  if (t == DType::f32) {
    auto* out = static_cast<float*>(dst);
    for (int64_t x = 0; x < d; ++x) out[x] = float(o[x] * scale);
    return;
  }
  for (int64_t x = 0; x < d; ++x) store_value(dst, t, x, o[x] * scale);
}

// The query tile's rows out, in order: emit(i, o, scale, lse) with row i's o~ (d values, row-major),
// its scale 1 / l (core::finalize_scale: a row that saw no key gets 0) and its lse (-inf then). A
// transposed o~ is turned back 16 rows at a time (kern.transpose's blocks): read a column at a
// time, element by element, it took a third of a forward over 64 tokens.
template <class T, class Emit>
void finish_rows(const Workspace<T>& ws, const TileKernels<T>& kern, const TileConfig<T>& cfg, const Emit& emit) {
  if (ws.row_major) {
    for (int64_t i = 0; i < ws.rows; ++i)
      emit(i, ws.ot.get() + i * ws.d, core::finalize_scale(ws.l[i]), row_lse(ws, cfg, i));
    return;
  }
  constexpr int64_t kChunk = 16;  // a multiple of every level's row_align (mpad's granule)
  alignas(64) T rows[kChunk * kMaxHeadDim];
  for (int64_t r0 = 0; r0 < ws.rows; r0 += kChunk) {
    kern.transpose(ws.ot.get() + r0, ws.mpad, rows, ws.d, ws.d, std::min(kChunk, ws.mpad - r0));
    for (int64_t i = r0; i < std::min(ws.rows, r0 + kChunk); ++i)
      emit(i, rows + (i - r0) * ws.d, core::finalize_scale(ws.l[i]), row_lse(ws, cfg, i));
  }
}

}  // namespace flashattn::cpu
