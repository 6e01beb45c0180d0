// Plain host/device arithmetic of the backward's workspace layout and of the deterministic mode's
// split count and turn order (no CUDA headers, so tests/cpu/bwd_layout_test.cpp checks it on any
// machine).
//
// Tiled rows (the Hopper path): lse2, delta and the dQ accumulator are [heads_q][tiles][tile_m
// rows], a sequence's query tiles consecutive from tile_base(b), so one query tile's values are one
// aligned, contiguous block the copy engine moves in a single bulk operation. Varlen sequences
// start at tile floor(cu_seqlens_q[b] / tile_m) + b: sequence b needs ceil(len / tile_m) tiles and
// floor(c1 / m) - floor(c0 / m) + 1 >= ceil((c1 - c0) / m), so sequences never share a tile, and
// tiles_per_head = total_q / tile_m + batch + 1 covers them all.
#pragma once

#include <cstdint>

#include "core/params.h"
#include "core/softmax_state.h"  // FA_HD

namespace flashattn::cuda {

// First tile of sequence b in the tiled layout.
FA_HD int64_t tile_base(const core::AttnShape& p, int tile_m, int64_t b) {
  return p.cu_seqlens_q != nullptr ? int64_t(p.cu_seqlens_q[b]) / tile_m + b
                                   : b * ((p.seqlen_q + tile_m - 1) / tile_m);
}

// Tiles per query head in the tiled layout.
inline int64_t tiles_per_head(const core::AttnShape& p, int tile_m) {
  return p.cu_seqlens_q != nullptr ? p.total_q / tile_m + p.batch + 1 : p.batch * ((p.seqlen_q + tile_m - 1) / tile_m);
}

// The Hopper backward's deterministic mode (src/cuda/sm90/bwd_schedule.cuh, KeySteps): the key tiles
// that visit a dQ tile add into it one after another, and the order of their walks and turns
// decides how long they wait:
//   * `down`: key tiles ascending, each walking its query tiles down from the last, turns in
//     key-tile order (a tile waits only for lower ones, which start first). Without a mask every
//     key tile starts at the last query tile, and key tile n waits n turns before its first addition.
//   * `up`, under a right bound (causal, windows): key tiles descending, walking up from the
//     diagonal, turns from the last key tile down (a tile waits only for higher ones, launched first),
//     so none waits before its first addition; but the longest key tiles start last and the grid's
//     tail grows. Deterministic TFLOP/s, up against down (bench/ab_compare.py --deterministic, H200,
//     bf16, 16k tokens, hidden 2048, causal, 2k / 4k / 8k / 16k;
//     bench/results/h200_bwd_det_up_2026-12-02.txt): d=128 337 / 403 / 441 / 454 against 289 / 348 /
//     408 / 486 (a simulated list schedule of the grid loses 6% more to the tail at 16k than down);
//     d=256 212 / 243 / 262 / 274 against 164 / 198 / 213 / 249; d=64 281 / 344 / 380 / 409 against
//     246 / 293 / 339 / 372 for the per-split dQ slices it replaced. So `up` for kernels of head dim
//     other than 128 and, at 128, up to 64 key tiles per sequence.
//     The d = 256 kernel (one CTA per key tile, grid (key tiles, KV heads, batch)) runs its grid's
//     last (KV head, batch) pair `down` when there are several pairs, so that the launch ends with
//     that pair's shortest key tiles instead of a longest one; the pair's key tiles wait only for
//     its lower ones, launched before them. bench/det_order_sim.py puts the makespan at 1.013 /
//     1.032 / 1.067 / 1.085 of the even share at 16k / 8k / 4k / 2k (all `up`: 1.069 / 1.081 /
//     1.086 / 1.088); measured, deterministic causal d=256, B/A 1.011 / 1.023 / 1.030 / 1.036 at 2k
//     / 4k / 8k / 16k (bench/results/h200_hopper_bwd_det_last_pair_2026-12-02.txt). The portable
//     kernel does the same (sm80/bwd_kernel.cuh gives its figures).
//   * `around`, without a mask: each key tile starts at its diagonal, walks up and wraps round
//     (core::around_turn), so in self-attention none ever waits. A key tile may wait for a higher
//     one, launched after it: safe where a sequence's key tiles all fit on the GPU at once, since
//     only the sequences before it in the grid (which never wait for it) can hold the SMs in between;
//     used where they fit twice over (the margin covers SMs taken by other work), and within
//     core::around_turn's 32 bits. Deterministic non-causal TFLOP/s, around against down (same
//     conditions, 2k / 4k / 8k; bench/results/h200_bwd_det_around_2026-12-02.txt): d=64 382 / 415 /
//     431 against 316 / 355 / 403; d=128 411 / 446 / 465 against 392 / 434 / 470; d=256 (2k / 4k) 292 /
//     315 against 251 / 290.
enum class TurnOrder : uint8_t { down, up, around };

// The order for a deterministic call with n_blocks key tiles and query_tiles query tiles in the
// longest sequence, on a GPU that holds `resident` of the kernel's CTAs at once: `up` under a right
// bound, `around` without a mask where a sequence's key tiles fit twice over, else `down`.
inline TurnOrder turn_order(int64_t window_left, int64_t window_right, int64_t n_blocks, int64_t query_tiles,
                            int64_t resident) {
  if (window_right >= 0) return TurnOrder::up;
  if (window_left < 0 && 2 * n_blocks <= resident && query_tiles * (n_blocks + 1) < (int64_t(1) << 32))
    return TurnOrder::around;
  return TurnOrder::down;
}

// The Hopper kernels' order (one CTA per SM, `sms` of them): turn_order, but `down` at head dim 128
// beyond 64 key tiles (the measurement above).
inline TurnOrder hopper_turn_order(int64_t window_left, int64_t window_right, int kernel_head_dim, int64_t n_blocks,
                                   int64_t query_tiles, int64_t sms) {
  if (window_right >= 0 && kernel_head_dim == 128 && n_blocks > 64) return TurnOrder::down;
  return turn_order(window_left, window_right, n_blocks, query_tiles, sms);
}

}  // namespace flashattn::cuda
