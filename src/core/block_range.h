// Which keys a query row may see, and which key tiles a query tile must visit, for causal and
// sliding-window masks. One definition for every backend.
//
// Alignment is bottom-right (as FlashAttention): with seqlen_q rows and seqlen_k keys, row i sits
// on diagonal d(i) = i + seqlen_k - seqlen_q, and sees key j iff
//     (window_left  < 0 or j >= d(i) - window_left) and
//     (window_right < 0 or j <= d(i) + window_right).
// causal is window_right = 0. The visible range of row i is [lo(i), hi(i)), both nondecreasing in
// i, so a tile of rows [r0, r1) touches keys [lo(r0), hi(r1 - 1)) and needs no mask on a key tile
// [c0, c1) with lo(r1 - 1) <= c0 and c1 <= hi(r0) (and c1 <= seqlen_k).
#pragma once

#include <cstdint>

#include "softmax_state.h"  // FA_HD

namespace flashattn::core {

struct MaskSpec {
  int64_t seqlen_q = 0, seqlen_k = 0;
  int64_t window_left = -1;   // -1 = unbounded
  int64_t window_right = -1;  // -1 = unbounded; causal is 0

  FA_HD int64_t diag(int64_t i) const { return i + seqlen_k - seqlen_q; }
  FA_HD bool has_mask() const { return window_left >= 0 || window_right >= 0; }

  // First visible key of row i (may exceed seqlen_k when the row sees nothing).
  FA_HD int64_t lo(int64_t i) const {
    if (window_left < 0) return 0;
    int64_t v = diag(i) - window_left;
    return v < 0 ? 0 : v;
  }
  // One past the last visible key of row i (may be <= lo when the row sees nothing).
  FA_HD int64_t hi(int64_t i) const {
    if (window_right < 0) return seqlen_k;
    int64_t v = diag(i) + window_right + 1;
    return v > seqlen_k ? seqlen_k : (v < 0 ? 0 : v);
  }
  FA_HD bool visible(int64_t i, int64_t j) const { return j >= lo(i) && j < hi(i); }

  // Query rows [first, last) that see at least one key of [c0, c1) (the backward's loop over query
  // tiles for one key tile): hi(i) > c0 and lo(i) < c1, solved for i and clamped to [0, seqlen_q).
  FA_HD void rows_seeing(int64_t c0, int64_t c1, int64_t* first, int64_t* last) const {
    int64_t f = window_right < 0 ? 0 : c0 - (seqlen_k - seqlen_q) - window_right;
    int64_t l = window_left < 0 ? seqlen_q : c1 - (seqlen_k - seqlen_q) + window_left;
    *first = f < 0 ? 0 : f;
    *last = l > seqlen_q ? seqlen_q : l;
    if (c1 <= c0 || *last < *first) *last = *first;
  }
};

// Query tiles [m_begin, m_end) (tile size block_m) holding a row that sees a key of [c0, c1): the
// backward's loop over query tiles for one key tile. Empty when no row sees those keys.
struct QueryTiles {
  int64_t m_begin = 0, m_end = 0;
};

FA_HD QueryTiles query_tiles_seeing(const MaskSpec& m, int64_t c0, int64_t c1, int64_t block_m) {
  int64_t first, last;
  m.rows_seeing(c0, c1, &first, &last);
  QueryTiles t;
  t.m_begin = first / block_m;
  t.m_end = last > first ? (last + block_m - 1) / block_m : t.m_begin;
  return t;
}

// Full query tiles (tile size block_m) that need no element-wise mask against the key tile
// [c0, c0 + block_n): every row sees every key of it, lo(last row) <= c0 and c0 + block_n <=
// hi(first row) (so none when the key tile runs past seqlen_k). Both bounds are monotone in the
// query tile, so they are a range: the backward's steps outside it (and the partial last query
// tile) take the mask. The same test as tile_range's n_nomask range, solved for the query tile.
FA_HD QueryTiles query_tiles_unmasked(const MaskSpec& m, int64_t c0, int64_t block_n, int64_t block_m) {
  QueryTiles t;
  const int64_t off = m.seqlen_k - m.seqlen_q;  // diag(i) = i + off
  if (c0 < 0 || c0 + block_n > m.seqlen_k) return t;
  // hi(first row) >= c0 + block_n: first row >= c0 + block_n - off - window_right - 1.
  int64_t first = 0;
  if (m.window_right >= 0) {
    const int64_t need = c0 + block_n - off - m.window_right - 1;
    first = need <= 0 ? 0 : (need + block_m - 1) / block_m;
  }
  // lo(last row) <= c0: last row = t * block_m + block_m - 1 <= c0 - off + window_left.
  int64_t end = m.seqlen_q / block_m;  // full tiles only
  if (m.window_left >= 0) {
    const int64_t top = c0 - off + m.window_left - (block_m - 1);  // t * block_m <= top
    const int64_t last = top < 0 ? -1 : top / block_m;
    end = last + 1 < end ? last + 1 : end;
  }
  t.m_begin = first;
  t.m_end = end > first ? end : first;
  return t;
}

// The first key tile (tile size block_n) whose query_tiles_seeing range holds query tile m, given
// that one does: the key tiles that visit a query tile are consecutive (both ends of rows_seeing
// are nondecreasing in the keys), so a visiting key tile n is number n - this among them, and the
// deterministic GPU backward adds their dQ into tile m in that order. Without a left window every
// nonempty key tile's rows run to seqlen_q, so it is 0; with one, the first n whose rows_seeing end
// c1 - (seqlen_k - seqlen_q) + window_left passes m * block_m, c1 = (n + 1) * block_n.
FA_HD int64_t first_key_tile_seeing(const MaskSpec& mask, int64_t m, int64_t block_m, int64_t block_n) {
  if (mask.window_left < 0) return 0;
  const int64_t x = m * block_m + (mask.seqlen_k - mask.seqlen_q) - mask.window_left;
  return x <= 0 ? 0 : x / block_n;
}

// The last key tile whose query_tiles_seeing range holds query tile m, given that one does, under a
// right bound (window_right >= 0): key tile n starts at query tile rows_seeing's first row / block_m,
// first = max(0, n * block_n - (seqlen_k - seqlen_q) - window_right), and m is visited by every n
// whose first row lies below (m + 1) * block_m, up to the last key tile.
FA_HD int64_t last_key_tile_seeing(const MaskSpec& mask, int64_t m, int64_t block_m, int64_t block_n) {
  const int64_t x = (m + 1) * block_m + (mask.seqlen_k - mask.seqlen_q) + mask.window_right - 1;
  const int64_t last = (mask.seqlen_k + block_n - 1) / block_n - 1;
  const int64_t n = x < 0 ? -1 : x / block_n;
  return n < last ? n : last;
}

// The deterministic GPU backward's turn order without a mask ("around"): each of n_tiles key tiles
// visits all m_tiles query tiles, key tile n starting at around_first_query_tile (n * m_tiles /
// n_tiles, its diagonal) and walking up, wrapping past the last. At query tile m the key tiles add
// in the order they arrive: from the last one that starts at or below m downward, wrapping past
// key tile 0 to the last key tile (key tile n's place: around_turn). Key tile n reaches m after
// (m - first(n)) mod m_tiles steps, so an earlier turn never arrives later (equal starts: the
// higher key tile first, at every query tile alike), and when n_tiles divides m_tiles no two key
// tiles reach one query tile in the same step: none waits. (Walking down in key-tile order, all
// start at the last query tile, and key tile n waits n turns before its first addition.)
// Both in 32 bits (a 64-bit division is a call, whose saved registers spill in the GPU kernels):
// the caller ensures m_tiles * (n_tiles + 1) < 2^32.
FA_HD int around_first_query_tile(int n, int n_tiles, int m_tiles) {
  return int(uint32_t(n) * uint32_t(m_tiles) / uint32_t(n_tiles));
}

FA_HD int around_turn(int n, int m, int n_tiles, int m_tiles) {
  // The last key tile starting at or below m: the largest n with n * m_tiles < (m + 1) * n_tiles.
  const int last = int((uint32_t(m + 1) * uint32_t(n_tiles) + uint32_t(m_tiles) - 1) / uint32_t(m_tiles)) - 1;
  return last >= n ? last - n : last - n + n_tiles;
}

// A mask around one (query row q0, key k0) pair in 32-bit offsets: element (q0 + dq, k0 + dk), dq
// and dk >= 0, is visible iff the query row and the key are inside their sequences (dq < rows, dk
// < keys) and dk - dq lies in the window's diagonal band [lo, hi] (MaskSpec's lo and hi, taken
// relative to the pair). Bounds are clamped to +-2^30, far past any offset within a tile, so each
// element of a tile is a few 32-bit compares against constants: the GPU backward's boundary steps
// (MaskSpec::lo and hi per element cost 64-bit arithmetic, ~1500 instructions per thread per step).
struct MaskBand {
  int lo, hi, rows, keys;
  FA_HD bool visible(int dq, int dk) const { return dq < rows && dk < keys && dk - dq >= lo && dk - dq <= hi; }
};

FA_HD int clamp_to_band(int64_t v) {
  constexpr int64_t kFar = int64_t(1) << 30;
  return int(v < -kFar ? -kFar : (v > kFar ? kFar : v));
}

FA_HD MaskBand mask_band(const MaskSpec& m, int64_t q0, int64_t k0) {
  constexpr int64_t kUnbounded = int64_t(1) << 31;  // clamps to the band's far bound
  const int64_t base = k0 - q0, off = m.seqlen_k - m.seqlen_q;
  MaskBand b;
  b.lo = clamp_to_band(m.window_left < 0 ? -kUnbounded : off - m.window_left - base);
  b.hi = clamp_to_band(m.window_right < 0 ? kUnbounded : off + m.window_right - base);
  b.rows = clamp_to_band(m.seqlen_q - q0);
  b.keys = clamp_to_band(m.seqlen_k - k0);
  return b;
}

// Key tiles [n_begin, n_end) (tile size block_n) that query rows [r0, r1) must visit, and the
// sub-range [n_nomask_begin, n_nomask_end) of those that need no element-wise mask.
struct TileRange {
  int64_t n_begin = 0, n_end = 0;
  int64_t n_nomask_begin = 0, n_nomask_end = 0;
  FA_HD bool empty() const { return n_end <= n_begin; }
  FA_HD bool needs_mask(int64_t n) const { return n < n_nomask_begin || n >= n_nomask_end; }
};

FA_HD TileRange tile_range(const MaskSpec& m, int64_t r0, int64_t r1, int64_t block_n) {
  TileRange t;
  if (r1 <= r0 || m.seqlen_k <= 0) return t;
  int64_t k_lo = m.lo(r0), k_hi = m.hi(r1 - 1);
  if (k_hi <= k_lo) return t;
  t.n_begin = k_lo / block_n;
  t.n_end = (k_hi + block_n - 1) / block_n;
  // Tiles fully inside every row's range: start >= lo(last row) and end <= min(hi(first row), sk).
  int64_t full_lo = m.lo(r1 - 1), full_hi = m.hi(r0);
  int64_t nb = (full_lo + block_n - 1) / block_n;
  int64_t ne = full_hi / block_n;  // tiles ending at or before full_hi (a partial last tile masks)
  if (nb < t.n_begin) nb = t.n_begin;
  if (ne > t.n_end) ne = t.n_end;
  if (ne < nb) ne = nb;
  t.n_nomask_begin = nb;
  t.n_nomask_end = ne;
  return t;
}

}  // namespace flashattn::core
