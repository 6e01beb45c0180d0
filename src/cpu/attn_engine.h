// The tiled FlashAttention loop nest of the CPU engine, shared by forward and decode.
//
// One query tile (at most kBlockM rows, each with its own query position) stays resident as Q^T
// while key tiles of kBlockN keys stream past: S^T = K Q^T, softcap, mask (boundary tiles only),
// online-softmax update, O~^T = f O~^T + V^T P^T. Key tiles outside the causal / window range are
// never visited (core::tile_range). Only the tile-sized buffers of one Workspace per worker are
// used, never anything of size N x N or N x d.
//
// Scores: without a softcap the tile holds q.k and the softmax scale is applied inside the
// exponent, exp2((s - m) * scale * log2(e)); with a softcap the query tile is pre-multiplied by
// scale / softcap and the tile holds softcap * tanh(scale * q.k / softcap), exponentiated with
// factor log2(e). Either way every exponential is an exp2 (core/softmax_state.h), and the
// difference s - m is taken before scaling, so large scores (q.k ~ 1e4) lose no precision.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#include "core/block_range.h"
#include "core/numeric.h"
#include "core/softmax_state.h"
#include "cpu/simd.h"

namespace flashattn::cpu {

// Query rows per tile: a multiple of every level's micro-tile width (16, 24, 48), so full tiles
// need no remainder kernels; large enough that each key row read from memory is used 96 times.
inline constexpr int64_t kBlockM = 96;
// Keys per tile: the score tile (64 x 96 floats, 24 KiB) stays in L1 between the softmax and P V.
inline constexpr int64_t kBlockN = 64;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A 64-byte aligned array (cache lines, and every vector width).
template <class T>
class AlignedArray {
 public:
  explicit AlignedArray(int64_t n)
      : p_(static_cast<T*>(::operator new(size_t(n > 0 ? n : 1) * sizeof(T), std::align_val_t{64}))) {}
  ~AlignedArray() { ::operator delete(p_, std::align_val_t{64}); }
  AlignedArray(const AlignedArray&) = delete;
  AlignedArray& operator=(const AlignedArray&) = delete;
  T* get() const { return p_; }

 private:
  T* p_;
};

// One worker's scratch space: O(kBlockM * d + kBlockN * d) values.
template <class T>
struct Workspace {
  explicit Workspace(int64_t head_dim)
      : d(head_dim), qt(d * kBlockM), ot(d * kBlockM), st(kBlockN * kBlockM), kbuf(kBlockN * d), vbuf(kBlockN * d) {}
  int64_t d;
  AlignedArray<T> qt, ot, st;  // [d][mpad], [d][mpad], [kBlockN][mpad]
  AlignedArray<T> kbuf, vbuf;  // widened 16-bit key / value rows, [kBlockN][d]
  alignas(64) T m[kBlockM], l[kBlockM], f[kBlockM];
  int64_t lo[kBlockM], hi[kBlockM];  // visible keys [lo, hi) of each row
  const T* krow[kBlockN];
  const T* vrow[kBlockN];
  int64_t rows = 0, mpad = 0;
};

// What a tile's arithmetic needs to know about the problem.
template <class T>
struct TileConfig {
  DType dtype;       // storage type of q, k, v
  T q_scale;         // multiplies q: scale / softcap, or 1 without a softcap
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
  c.q_scale = softcap > 0.f ? T(scale) / T(softcap) : T(1);
  c.lse_scale = softcap > 0.f ? core::kLog2e : double(scale) * core::kLog2e;  // scale > 0 (validated)
  c.exp2_scale = T(c.lse_scale);
  return c;
}

template <class T>
T load_value(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::f16: return T(core::to_float(static_cast<const core::half_t*>(base)[i]));
    case DType::bf16: return T(core::to_float(static_cast<const core::bfloat16_t*>(base)[i]));
    case DType::f32: return T(static_cast<const float*>(base)[i]);
    default: return T(static_cast<const double*>(base)[i]);
  }
}

// Starts a query tile of `rows` rows: row i has its q values at q_row(i) and query position
// pos(i) (nondecreasing in i). Packs Q^T (scaled, zero-padded to mpad) and resets the state.
template <class T, class QRow, class Pos>
void begin_tile(Workspace<T>& ws, const TileKernels<T>& kern, const TileConfig<T>& cfg, int64_t rows,
                const QRow& q_row, const Pos& pos) {
  const int64_t d = ws.d;
  ws.rows = rows;
  ws.mpad = ceil_div(rows, kern.row_align) * kern.row_align;
  T* qt = ws.qt.get();
  for (int64_t i = 0; i < ws.mpad; ++i) {
    if (i < rows) {
      const void* q = q_row(i);
      for (int64_t x = 0; x < d; ++x) qt[x * ws.mpad + i] = load_value<T>(q, cfg.dtype, x) * cfg.q_scale;
      ws.lo[i] = cfg.mask.lo(pos(i));
      ws.hi[i] = cfg.mask.hi(pos(i));
    } else {
      for (int64_t x = 0; x < d; ++x) qt[x * ws.mpad + i] = T(0);
    }
    ws.m[i] = core::neg_inf<T>();
    ws.l[i] = T(0);
  }
  T* ot = ws.ot.get();
  for (int64_t e = 0; e < d * ws.mpad; ++e) ot[e] = T(0);
}

// Points ws.krow / ws.vrow at keys [k0, k0 + nk): in place for f32 / f64 storage, widened into
// the workspace for f16 / bf16. key_rows(t) returns the (k, v) row pointers of key t.
template <class T, class KeyRows>
void load_keys(Workspace<T>& ws, const TileKernels<T>& kern, DType dtype, int64_t k0, int64_t nk,
               const KeyRows& key_rows) {
  const bool in_place = (dtype == DType::f32 && sizeof(T) == 4) || (dtype == DType::f64 && sizeof(T) == 8);
  for (int64_t j = 0; j < nk; ++j) {
    auto [k, v] = key_rows(k0 + j);
    if (in_place) {
      ws.krow[j] = static_cast<const T*>(k);
      ws.vrow[j] = static_cast<const T*>(v);
    } else {
      T* kd = ws.kbuf.get() + j * ws.d;
      T* vd = ws.vbuf.get() + j * ws.d;
      kern.widen(k, dtype, kd, ws.d);
      kern.widen(v, dtype, vd, ws.d);
      ws.krow[j] = kd;
      ws.vrow[j] = vd;
    }
  }
}

// Sets the scores of keys a row may not see to -inf (boundary tiles only).
template <class T>
void apply_mask(Workspace<T>& ws, int64_t k0, int64_t nk) {
  T* st = ws.st.get();
  for (int64_t j = 0; j < nk; ++j) {
    int64_t key = k0 + j;
    T* s = st + j * ws.mpad;
    for (int64_t i = 0; i < ws.rows; ++i)
      if (key < ws.lo[i] || key >= ws.hi[i]) s[i] = core::neg_inf<T>();
  }
}

// Streams key tiles [n_begin, n_end) of a sequence with seqlen_k keys through the current query
// tile; `range` says which of them need the element-wise mask.
template <class T, class KeyRows>
void attend_tiles(Workspace<T>& ws, const TileKernels<T>& kern, const TileConfig<T>& cfg, const core::TileRange& range,
                  int64_t n_begin, int64_t n_end, const KeyRows& key_rows) {
  const int64_t d = ws.d, mpad = ws.mpad;
  for (int64_t n = n_begin; n < n_end; ++n) {
    const int64_t k0 = n * kBlockN;
    const int64_t nk = cfg.mask.seqlen_k - k0 < kBlockN ? cfg.mask.seqlen_k - k0 : kBlockN;
    load_keys(ws, kern, cfg.dtype, k0, nk, key_rows);
    kern.scores(ws.krow, nk, ws.qt.get(), d, mpad, ws.st.get());
    if (cfg.softcap != T(0)) kern.softcap(ws.st.get(), nk * mpad, cfg.softcap);
    if (range.needs_mask(n)) apply_mask(ws, k0, nk);
    kern.softmax(ws.st.get(), nk, mpad, cfg.exp2_scale, ws.m, ws.l, ws.f);
    kern.accumulate(ws.vrow, nk, ws.st.get(), mpad, d, ws.f, ws.ot.get());
  }
}

// Row i's final output o~ / l, written through `store(x, value)`; returns its natural-log lse,
// formed in double so that a large max keeps its digits. A row that saw no key gets 0 and -inf
// (core::finalize_*).
template <class T, class Store>
T finish_row(const Workspace<T>& ws, const TileConfig<T>& cfg, int64_t i, const Store& store) {
  T scale = core::finalize_scale(ws.l[i]);
  const T* ot = ws.ot.get();
  for (int64_t x = 0; x < ws.d; ++x) store(x, ot[x * ws.mpad + i] * scale);
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

}  // namespace flashattn::cpu
