// One table: (path, target arch, head dim) -> tile shape, warps, pipeline stages, with the reason
// for each entry. The portable path (mma.sync) is compiled separately per target arch, so each
// arch gets tiles that fit its shared memory: 99 KB per block on sm86/sm89 (the sm80 build runs
// there too, so its entries must fit 99 KB, but for its large entries, which only GPUs of 160 KB
// or more take: kLargeSmemBlockBytes), 227 KB on sm90.
//
// Terms: block_m = 16 * warps / d_split * m_tiles query rows per CTA; each warp owns 16 * m_tiles
// rows and reads every K/V tile from shared memory once per step, so m_tiles = 2 halves
// shared-memory traffic per FLOP at the price of registers (O: m_tiles*head_dim/2 fp32 per thread,
// S: m_tiles*block_n/2); with d_split = 2 two warps share their rows, each holding half of S and
// half of O, so that m_tiles = 2 fits where O alone would not. q_in_regs keeps the Q fragments in
// registers (m_tiles*head_dim/4 per thread) for the whole K/V loop; otherwise they are re-read
// from shared memory each k-step, which costs less than spilling.
#pragma once

#include <cstdint>

namespace flashattn::cuda {

struct PortableFwdTile {
  int block_n;
  int warps;
  int m_tiles;
  int stages;  // K/V tiles in flight (cp.async ring); 1: K and V in separate groups (FlashAttention-2)
  bool q_in_regs;
  // 2: warps in pairs on the same rows, splitting each tile's keys in S and the head dim in P V
  // (sm80::FwdTraits::kDSplit), which leaves each warp the registers of a second m-tile.
  int d_split = 1;
  // O out through the Q tile's shared memory in 16-byte chunks of rows (sm80::FwdTraits::kStageO)
  // instead of each quad's 4-byte pairs. On an H100 against the pairs' stores at d=256, 2k / 8k
  // (bench/results/h200_session49_2026-12-06.txt, call 7): 1.019 / 1.007 without a mask, 1.027 /
  // 1.006 causal (ptxas: the pair kernel's spills 48 -> 56 bytes). Off at the other head dims: at
  // d=64 and 128 it read 0.97-1.00 of the pairs' stores (H100, bench/results/h100_session50_2026-12-06.txt,
  // call 4), and the sm80 build has not run it.
  bool stage_o = false;
  constexpr int block_m() const { return 16 * warps / d_split * m_tiles; }
};

// Entries for sm90 come from bench/tile_sweep.cu on an H200 (bf16, 16k tokens, hidden 2048; 2026-11-29,
// bench/results/h200_portable_fwd_split_2026-11-29.txt), TFLOP/s at s = 2k / 4k / 8k / 16k:
//   d=64:  block_n 64, 4 warps, 2 m-tiles, 2 stages: 304 / 315 / 321 / 324 (causal 257 / 282 / 300 /
//          324). One stage (FlashAttention-2's schedule) 1-3% slower, block_n 128 1-5% slower causal;
//          capping registers for 3 CTAs per SM spills (288 / 295 / 300 / 301), 8 warps of one m-tile
//          258-272, 1 m-tile at 4 CTAs per SM 280-288; Q kept in registers 299-305;
//   d=128: block_n 64, 4 warps, 2 m-tiles, one stage: 350 / 361 / 368 / 365 (causal 281 / 307 / 332 /
//          330), 4-5% above the same tile on a two-stage ring (335 / 347 / 350 / 356): 64 KB instead
//          of 96 KB; block_n 128 spills (245-254); 1 m-tile with Q in registers 313-322;
//   d=256: block_n 64, 4 warps, one stage: 321 / 332 / 325 / 331 (causal 270 / 298 / 296 / 344); Q, K
//          and V take 96 KB, so two CTAs share an SM (as FlashAttention-2 runs d=256 on Hopper). 8
//          warps on a two-stage ring (192 KB, one CTA per SM) 302 / 308 / 320 / 323 (causal 241 / 275
//          / 276 / 326); 8 warps on one stage 300-313; block_n 32 292-304; Q in registers 270-287;
//   the tile scheduler's longest-first order beat query tiles ascending under a causal mask by up
//   to 15% at 16k (d=256 344 against 299) and was within 1-2% elsewhere; letting a warp skip a
//   diagonal tile its rows cannot see was within 1% at d <= 128 and cost d=256 8-12% (registers).
// Causal 2k at d=64 again (2026-12-02, bench/results/h200_portable_fwd_causal2k_2026-12-02.txt): the
//   table's tile 257 TFLOP/s; 3 stages 254, block_n 32 209-212, block_n 128 249, 8 warps of one m-tile
//   187. Persistent CTAs (one grid of resident CTAs walking the tiles, a tile's last step loading
//   the next one's Q and first K/V tile) ran 0.88-1.01 of one CTA per tile at every head dim.
// Head dims 32, 96 and 192 take their neighbours' shapes (unmeasured).
// The sm80 build's large entries (large_smem below) are for GPUs whose blocks may have this much
// shared memory or more: the A100 and sm87 (163 KB), Hopper running the build's PTX (227 KB). sm86
// and sm89 (99 KB) keep the entries made for them, also where a large one would fit.
constexpr int kLargeSmemBlockBytes = 160 * 1024;
// Whether a GPU whose blocks may opt in to `optin` bytes of shared memory takes a large entry that
// needs `bytes` (tests/cpu/tile_table_test.cpp).
constexpr bool takes_large_entry(int optin, int bytes) { return optin >= kLargeSmemBlockBytes && optin >= bytes; }

// large_smem (sm80 builds only): the entry for a GPU that gives a block kLargeSmemBlockBytes or
// more: the sm90 entries, which the launcher takes where they fit (FlashAttention-2 runs 128 x 64
// tiles on 8 warps at d=256 there). Measured on an H100 running an sm80 build's PTX (no A100 here;
// bf16, 16k tokens, hidden 2048; bench/results/h100_session42_2026-12-05.txt, call 4), B/A over
// the 99 KB entries at 2k / 4k / 8k / 16k: d=256 1.16 / 1.20 / 1.16 / 1.19 (causal 1.20 / 1.22 /
// 1.21 / 1.11), d=128 1.03 / 1.02 / 1.00 / 1.00 (causal 1.03 / 1.03 / 1.03 / 1.02); d=64's entry
// is the same. Beside FlashAttention-2's kernels (sm80 code too) d=256 then ran 1.02-1.06 (causal
// 1.01-1.11), where it had run 0.84-0.88.
template <int kArch>
constexpr PortableFwdTile portable_fwd_tile(int head_dim, bool right_bound = false, bool large_smem = false) {
  if constexpr (kArch < 90)
    if (large_smem) {
      PortableFwdTile t = portable_fwd_tile<90>(head_dim, right_bound);
      t.stage_o = false;  // measured on sm90 code only
      return t;
    }
  if constexpr (kArch >= 90) {
    // H100/H200: 227 KB of shared memory per block; registers decide.
    // d=256 without a right bound: 8 warps in pairs (kDSplit), 128 rows, one CTA per SM: Q 64 KB +
    // K, V 64 KB + P 16 KB. Per key tile a pair reads K and V once between two warps' 32 rows, a
    // quarter less shared-memory traffic than warps of 16 rows each. H200, bench/ab_compare.py
    // against the 4-warp tile below, 3 rounds (bench/results/h200_session33_2026-12-04.txt), 2k /
    // 4k / 8k / 16k: call 3 0.983 / 1.018 / 1.018 / 1.040, call 2 1.035 / 1.054 / 1.056 / 1.076
    // (whose baseline ran 2-4% below its usual figures); causal (call 2) 0.958 / 0.994 / 1.001 /
    // 1.047, the 128-row tiles computing twice the masked keys on the diagonal, so a right bound
    // keeps the 4-warp tile. Same call: pairs of 4 warps (64 rows, two CTAs per SM) 1.010-1.027,
    // causal 0.983-1.020; call 3: the 8-warp pairs on a two-stage ring (208 KB) 0.967-0.996. The
    // 4-warp tile again, for d=256 2k (0.993 of FlashAttention-2, the H200's session 49 bars), on
    // an H100 against these pairs (bench/results/h200_session49_2026-12-06.txt, call 6), 1k / 2k /
    // 4k / 8k: 1.035 / 0.982 / 0.931 / 0.931.
    if (head_dim == 256 && !right_bound) return {64, 8, 2, 1, false, 2, /*stage_o=*/true};
    switch (head_dim) {
      case 32:  return {64, 4, 2, 2, false};   // as d=64
      case 64:  return {64, 4, 2, 2, false};   // measured best; O 64 + S 64 regs, no spill
      case 96:  return {64, 4, 2, 1, false};   // as d=128
      case 128: return {64, 4, 2, 1, false};   // measured best; block_m 128, O 128 + S 64 regs, 64 KB
      case 192: return {64, 4, 1, 1, false};   // as d=256
      default:  return {64, 4, 1, 1, false, 1, /*stage_o=*/true};  // 256: measured best; Q + K + V 96 KB: 2 CTAs per SM
    }
  } else {
    // sm80 build: fit 99 KB per block (sm86/sm89) so one binary serves all of Ampere and Ada
    // (unmeasured there: shapes follow the sm90 measurements within that budget).
    switch (head_dim) {
      case 32:  return {64, 4, 2, 2, false};   // smem Q 8 + K/V 2x2x4 KB = 24 KB
      case 64:  return {64, 4, 2, 2, false};   // 16 + 2x2x8 = 48 KB
      case 96:  return {64, 4, 2, 2, false};   // 24 + 2x2x12 = 72 KB
      case 128: return {64, 4, 2, 2, false};   // 32 + 2x2x16 = 96 KB
      case 192: return {32, 8, 1, 2, false};   // 48 + 2x2x12 = 96 KB
      default:  return {32, 4, 1, 2, false};   // 256: block_m 64: 32 + 2x2x16 = 96 KB
    }
  }
}

// Backward (src/cuda/sm80/bwd_kernel.cuh): block_n keys per CTA, block_m query rows per step. dK
// and dV stay in registers: per thread 2 * block_n * head_dim / (32 * warps) fp32. Each query step
// moves the Q/dO tiles and a block_m x head_dim fp32 dQ tile through L2 for 4 * block_m * block_n *
// head_dim matmul FLOPs, so a wider block_n halves that traffic per FLOP (ncu on the H200: block_n
// 64 at d=128 ran L2-bound at 67% of L2 throughput with 23% issue utilization, when dQ went out as
// scalar atomics). Stages = Q/dO tiles in flight. Shared memory: K, V 2 * block_n * d + Q, dO 2 *
// stages * block_m * d + P, dS 2 * block_n * block_m elements. Warp layouts of the three phases (a
// warp of 32 rows reads each shared-memory B fragment once for two m16 tiles): key_warps_s along
// the keys of S^T/dP^T, key_warps_kv along the keys of dK/dV, row_warps_q along the query rows of
// dQ, the remaining warps of each phase along the other side.
// The sm90 entries come from bench/bwd_tile_sweep.cu on an H200 (bf16, 16k tokens, hidden 2048,
// 2026-11-29, bench/results/h200_portable_bwd_layouts_2026-11-29.txt, run A: deterministic mode
// still a runtime flag), whole backward in TFLOP/s at 2k / 8k non-causal, deterministic after '|':
//   d=64:  128 keys, 4/4/2: 182 / 198 | 161 / 174; the old all-keys layout 8/8/4 164 / 176; 64 keys
//          on 4 warps at 2 CTAs per SM 184 / 196 | 135 / 152 (kept 4/4/2 for the deterministic
//          mode); capping 4/4/2 at 128 registers for 2 CTAs per SM spills (178 / 195);
//   d=128: 4/4/2: 203 / 234 | 168 / 184; 4/4/4 203 / 228; 8/4/2 197 / 224; 8/8/4 183 / 204; 64 keys
//          on 4 warps at 2 CTAs per SM 205 / 223 | 137 / 144;
//   d=256: 64 keys, 4/2/2: 173 / 188 | 121 / 127; 2/2/2 176 / 191 | 110 / 114 (kept 4/2/2 for the
//          deterministic mode); 4/2/4 162 / 176; the old 4/4/4 158 / 171. Again after the kernel's
//          steps lost a fifth of their instructions (2026-12-02, bench/results/
//          h200_portable_bwd_lean_2026-12-02.txt): 4/2/2 188 / 209 | 137 / 143, 4/2/4 189 / 207 | 138
//          / 150, 2/2/2 187 / 206 | 145 / 145, 4/4/4 176 / 197: 4/2/2 stays.
// The deterministic figures above ran that mode's former per-CTA dQ slices; on turns (2026-12-02,
// bench/results/h200_portable_bwd_det_turns_2026-12-02.txt) it runs at 0.86-0.95 of the default
// in these layouts, which were not re-swept for it; 0.91-0.97 with the dQ staged in shared memory
// that fragment_dq replaced (docs/performance.md, Backward).
// 128 query rows per step at d=64 (FlashAttention-2's 128 x 128 shape there; 2026-12-01, H200, the
// same sweep, default | deterministic at 2k / 8k, non-causal then causal): 4/4/2 on 2 stages 198 /
// 226 | 192 / 213, causal 148 / 207 | 141 / 191, against 64 rows 175 / 196 | 167 / 186, causal 132 /
// 181; one stage 191 / 219; 8/4/4 192 / 214.
struct PortableBwdTile {
  int block_n;
  int warps;
  int stages;
  int key_warps_s;
  int key_warps_kv;
  int row_warps_q;
  int min_ctas;  // CTAs per SM the registers are capped for (__launch_bounds__)
  int block_m = 64;  // query rows per step
  // The dQ accumulator in the accumulator fragments' order (sm80::FragmentDq; sm90, both modes):
  // each warp's red.global.add.v4.f32 then covers 512 contiguous bytes, where in dQ's own rows it
  // touches 8 rows (8 cache lines) per instruction. FlashAttention-2 lays its accumulator out the
  // same way for its scalar atomics (ncu: 4 sectors per reduction against our 8). It replaced dQ
  // staged through shared memory and added in whole rows (a barrier, stores and reads back per
  // step), which removed the load/store-queue stalls behind the reductions but added as much again.
  // Against that, on an H100 (bench/results/h100_session40_2026-12-05.txt, call 3, the default
  // mode, 2k / 8k / 16k): d=64 1.03 / 1.06 / 1.07x (causal 1.00 / 1.05 / 1.06x), d=128 1.03 /
  // 1.06 / 1.04x (causal 1.00 / 1.05 / 1.07x), d=256 1.08 / 1.12 / 1.12x (causal 1.06 / 1.10 /
  // 1.12x); the deterministic mode, its warps adding in turns as before (call 4) 0.98-1.04x at d=64
  // and 128, 1.05-1.11x at d=256. Issued between dV and dK instead, as FlashAttention-2 orders
  // them, 0.94-1.09x (call 3, B2), not kept. d=32 and 96 unmeasured. sm80 has only scalar
  // reductions: there each float4 is interleaved across four 32-float rows, so that a warp's scalar
  // reduction covers one 128-byte line (FlashAttention-2's 4 sectors), 1.21-1.31x over dQ's rows in
  // the sm80 entries for 160+ KB parts (below); the 99 KB entries keep dQ's rows (unmeasured there).
  bool fragment_dq = false;
  // P^T and dS^T stored by stmatrix (sm90), 16 x 16 at a time, instead of four 32-bit stores per
  // lane. H200, bench/ab_compare.py (bench/results/h200_portable_bwd_stmatrix_2026-12-03.txt, call
  // 14), 2k / 8k, causal and not: d=64 1.04-1.05x (deterministic 1.00x), d=256 1.02-1.03x in both
  // modes. d=128 ran 0.94-0.97x (call 4: ptxas spilled its default kernel, 40 / 60 bytes), and
  // 0.98x in blocks of 32 rows of one n8 tile (one n8 tile's lse and D live at a time), so it keeps
  // per-lane stores. d=192 follows d=256 (unmeasured); d=32 and 96 unmeasured, off.
  bool stmatrix_ps = false;
};

// large_smem (sm80 builds only): the entry for a GPU that gives a block kLargeSmemBlockBytes or more
// (the A100's 163 KB, and Hopper running this build's PTX); the launcher takes it there and the
// 99 KB entry elsewhere (sm86/89), as FlashAttention-2 picks its backward tiles by the device's
// shared memory.
template <int kArch>
constexpr PortableBwdTile portable_bwd_tile(int head_dim, bool large_smem = false) {
  if constexpr (kArch >= 90) {
    // d=32 and d=96 take 4/4/4 (measured within 3% of 4/4/2 at d=128): with 4 warps along the head
    // dim, dQ would give each warp 8 or 24 columns, not whole ldmatrix.x4 pairs (unmeasured there).
    if (head_dim <= 32) return {128, 8, 2, 4, 4, 4, 1, 64, true};  // 16 + 16 + 32 = 64 KB
    // d=64: 4 warps along the query rows for dQ (32 x 32 per warp, FlashAttention-2's layout; with
    // dQ added from the accumulators in its own rows, 2 had measured best); 160 KB.
    if (head_dim <= 64) return {128, 8, 2, 4, 4, 4, 1, 128, true, /*stmatrix_ps=*/true};
    if (head_dim <= 96) return {128, 8, 2, 4, 4, 4, 1, 64, true};  // 48 + 48 + 32 = 128 KB
    // d=128 measured best; dK+dV 128 regs; 64 + 64 + 32 = 160 KB.
    if (head_dim <= 128) return {128, 8, 2, 4, 4, 2, 1, 64, true};
    // d=256 measured (d=192 alike, unmeasured); 64 + 128 + 16 = 208 KB, dK+dV 128 regs.
    return {64, 8, 2, 4, 2, 2, 1, 64, true, /*stmatrix_ps=*/true};
  } else {
    // 160+ KB: the sm90 build's shapes for d <= 128 (128 keys per CTA on 8 warps, two Q/dO stages;
    // 64, 128 and 160 KB), dQ in fragment order with each float4 interleaved for sm80's scalar
    // reductions (sm80::FragmentDq). This build has no A100 to run on, so it was measured on an
    // H100 running its compute_80 PTX, bf16, 16k tokens, hidden 2048, against main's 99 KB tiles
    // with dQ in rows (bench/results/h100_session41_2026-12-05.txt, call 4; 2k / 8k): these
    // shapes with dQ in rows 1.59 / 1.62 at d=64 (causal 1.46 / 1.57), 1.72 / 1.83 at d=128 (causal
    // 1.57 / 1.76); the fragment order on top 1.27 / 1.31 (causal 1.21 / 1.29) and 1.26 / 1.30
    // (causal 1.21 / 1.31). Beside FlashAttention-2's kernels in the same call: 1.03-1.21.
    if (large_smem && head_dim <= 128) {
      PortableBwdTile t = portable_bwd_tile<90>(head_dim);
      t.stmatrix_ps = false;  // stmatrix is sm90's
      return t;
    }
    // 99 KB on sm86/89: d <= 96 double-buffers, d=128 single-buffers (80 KB); d > 128 needs an
    // sm80/sm90-class 160+ KB part (the launcher reports unsupported elsewhere). Every warp owns
    // 16 keys in phases 1 and 2 and 16 query rows in phase 3 (unmeasured on sm8x).
    if (head_dim <= 96) return {64, 4, 2, 4, 4, 4, 1};
    if (head_dim <= 128) return {64, 4, 1, 4, 4, 4, 1};
    // d=192/256, 144 KB (so only on 160+ KB parts): the sm90 d=256 warp layout (4/2/2, about a
    // tenth faster than 4/4/4 there) on one Q/dO stage, dQ in fragment order. Same H100 call: 4/2/2
    // 1.05 / 1.05 (causal 1.04 / 1.06) against 4/4/4 with dQ in rows, the fragment order on top
    // 1.62 / 1.70 (causal 1.56 / 1.69); 0.88-1.07 of FlashAttention-2.
    return {64, 8, 1, 4, 2, 2, 1, 64, true};
  }
}

// Hopper forward (src/cuda/sm90/fwd_kernel.cuh): consumer_wgs warpgroups of 64 query rows each
// (block_m = 64 * consumer_wgs) plus one producer warpgroup; K/V tiles of block_n keys in a ring
// of `stages`. Per consumer thread: S block_n/2 fp32, P block_n/4 b32, O head_dim/2 fp32, within
// 240 registers (2 consumer warpgroups) or 160 (3). Shared memory: Q block_m*d + K, V
// 2*stages*block_n*d (+ an O buffer of block_m*d where it fits), 2 bytes each, <= 227 KB.
// ping_pong: the consumer warpgroups take turns issuing GEMMs. One CTA per SM walks the tiles;
// dynamic: CTAs draw their next tile from a counter (causal tiles differ in length, and a static
// stride left some SMs with several times the work of others), else a static stride. For
// non-causal tiles (all equal) drawing measured the same as the stride, B/A 0.99-1.02 at d=64,
// 128, 256 and 2k-16k (bench/results/h200_hopper_fwd_dynamic_noncausal_2026-12-02.txt).
// Entries from bench/hopper_tile_sweep.cu on an H200 (bf16, 16k tokens, hidden 2048, s = 2k, 8k
// and 16k; 2026-11-29, bench/results/h200_hopper_sweep_dynamic_2026-11-29.txt), TFLOP/s at 2k/8k/16k:
//   d=64:  non-causal 3 x 128 with ping-pong (443/483/489; 2 warpgroups gave 406-445 in an earlier
//          sweep); causal 3 x 128, dynamic, no ping-pong (339/439/445; 2 warpgroups 328/429/442,
//          with ping-pong 323/431/451); 3 warpgroups get 160 registers each and spill a little;
//   d=128: 2 x 128 with ping-pong (602/611/619; 517/553/580 without); causal dynamic (457/602/586
//          against 451/547/531 static); block_n 112 and 176 were slower (176 spills), and so were
//          144 and 160 (no spills in the main loop) from 512 to 4k, equal at 8k-16k
//          (bench/results/h200_session23_2026-12-03.txt, call 2);
//   d=256: 2 x 80 (block_n 64: 548/635 in an earlier sweep); non-causal with ping-pong
//          (685/716/717; 628/699/729 without), causal dynamic without (498/621/704; static
//          485/572/470). O does not fit beside Q, K and V (224 KB), so it is written from the
//          accumulators, in 16-byte chunks after a quad transpose by shuffles. Against 4-byte
//          pairs, one sweep binary each, two rounds (bench/results/h200_fwd_epilogues_2026-12-03.txt,
//          call 5), 2k / 4k / 8k: non-causal 682 -> 750, 678 -> 782, 706 -> 722 and 685 -> 743,
//          708 -> 714, 721 -> 713; causal 488 -> 549, 611 -> 633, 655 -> 688 and 487 -> 519,
//          589 -> 658, 627 -> 672 TFLOP/s (d=192 takes the same path, unmeasured). Staging O in
//          the V ring instead (a TMA store; the producer holding the next tile's first V until the
//          epilogue has read O out) ran 0.58-0.83 of the pairs, with 270-310 bytes of spills in
//          the main loop (same log).
// A second Q stage (the next tile's Q loading during this one) did not pay: d=128 601/605/620
// with one stage against 581/612/617 with two (causal 463/577/578 against 440/569/584), d=64
// within 3% either way (H200, 2026-11-29; the side-by-side log with two stages is
// bench/results/h200_hopper_fwd_qstages2_2026-11-29.txt). Again at short sequences (2026-12-03,
// bench/results/h200_session22_2026-12-03.txt, call 2; both kernels with the main loop's V wait
// moved before the S fence, a variant not kept), second round at 512 / 1k / 2k / 4k, two stages
// against one: d=64 1.02 / 0.99 / 1.01 / 1.01 (causal 1.01 / 1.00 / 1.00 / 0.99), d=128 1.01 /
// 1.01 / 1.00 / 1.00 (causal 1.04 / 1.00 / 1.00 / 1.00): the Q load is not what costs short
// sequences their speed.
// Since the ping-pong turn ring runs on across work tiles (one warpgroup's epilogue under the
// next one's first GEMMs; bench/results/h200_hopper_fwd_ring_2026-11-29.txt, one build, sdpa_compare,
// TFLOP/s at 2k/4k/8k/16k, ring per tile -> across tiles): d=64 non-causal 437/444/472/477 ->
// 470/464/496/504 (ours/cuDNN 0.99 -> 1.06 at 2k); d=128 and d=256 within +-1.5% (their tiles
// are two warpgroups and the gap there is not the epilogue). With the ring, ping-pong now pays
// for causal d=64 too: 341/392/430 -> 351/401/445 at 2k/4k/8k; causal d=256 unchanged (485/579/602
// without, 486/574/606 with), so it stays off. Releasing Q after the tile's last S instead of its
// last P V (the next Q loads under the last P V and the epilogue) measured the same within 1-2%
// (bench/results/h200_hopper_fwd_qrelease_2026-11-29.txt) and was not kept.
// Two ways to hide the work between two tiles' GEMMs (about 2 us per tile at d=128: the
// epilogue, and ~1400 cycles of per-tile setup, by a clock64 timeline) were measured against this
// kernel and not kept (bench/results/h200_session9_2026-12-01.txt): one turn loop over a tile's
// key tiles carrying its last P V into the next tile's first turn, with 2 Q stages, ran 0.83-0.96
// of it (its loop took spills and branches); storing a tile's O only after the next tile's first
// S was issued, with 2 Q stages, ran 0.73 at d <= 128 (d=256 unchanged). A third, with the steady
// loop untouched (no spills there): a tile's last P V and the next tile's first S in one turn, the
// next softmax under that P V and the epilogue after it, where every warpgroup of both tiles visits
// all key tiles; against this kernel in one binary, d=128 0.87-0.96 at 512-4k, d=64 0.92-0.97, and a
// prefetch of the next tile's Q into L2 gained nothing (bench/results/h200_session24_2026-12-03.txt).
// A fourth: the producer working out each work tile (the scheduler's and the mask's divisions) and
// handing it to the consumers through shared memory, which cut their instructions by 13% but made
// them spill 13 words: 0.97-1.02 at d=128, 1.00-1.03 at d=64 (bench/results/
// h200_session25_2026-12-03.txt, call 1). A fifth: each consumer working out the next tile between
// its last P V's commit and wait, so that work runs under the P V: 0.96-1.01 (same log, call 3).
struct HopperFwdTile {
  int block_n;
  int consumer_wgs;
  int stages;
  bool ping_pong;
  bool dynamic;
  int q_stages;  // 2: the next tile's Q loads during this one's last steps
  // Each consumer warpgroup computes only the key tiles its own 64 rows see, and masks only its
  // own boundary tiles. Under a causal mask the first warpgroups of a 192 x 128 tile (d=64) stop a
  // key tile short of the last: by the tile arithmetic the keys computed past the diagonal at
  // causal 2k drop from 18% to 6%. Measured on the H200 against main's kernel in one process
  // (bench/ab_compare.py, bench/results/h200_hopper_fwd_own_tiles_2026-12-01.txt), at 2k / 4k / 8k /
  // 16k: d=64 causal +10% / +9% / +5% / +7%, non-causal +2% / +3% / +4% / +1% (one kernel serves
  // both; its main loop is 699 instructions against 732); d=128 +0-4% (no tile skipped at 128 x
  // 128; the same kernel for both); causal d=256 (128 x 80) -1% to 0%, so d=192/256 do without.
  bool own_tiles;
  // O / l through its own shared-memory buffer to a TMA store where it fits; false: straight from
  // the accumulators in 16-byte chunks (the d = 192, 256 epilogue, whose O buffer does not fit).
  // d=64 goes straight: no epilogue barriers or proxy fence, and ptxas spills 16 bytes instead of
  // 156. Against staged O (H200, bench/ab_compare.py, 3 rounds, bench/results/
  // h200_session23_2026-12-03.txt, call 4), B/A at 512 / 2k / 8k: d=64 1.020 / 1.007 / 1.001, causal
  // 1.029 / 1.020 / 1.004; d=128 0.973 / 0.998 / 0.985, causal 0.995 / 0.993 / 1.008, so d=128
  // keeps the buffer; 3 K/V stages in the freed 32 KB ran 0.96-1.0 of 2 there (sweep, second rounds
  // at 512-4k and causal 8k). d=96 needs it: it runs in 128-column tiles, and the accumulator
  // epilogue stores whole tile rows (fwd_kernel.cuh asserts kTileDim == d there). O reaches the
  // buffer by stmatrix (8 instructions per thread at d=128 where 4-byte pairs took 32; the consumer
  // warpgroups then spill nothing, 104 bytes before): B/A 0.99-1.04 at d=128, 512-16k, causal and
  // not, geometric mean 1.008 (bench/results/h200_session25_2026-12-03.txt, call 1).
  bool stage_o = true;
  // Non-causal tiles of equal length: the stream-K tail where the plan says it pays (up to two
  // whole waves; src/cuda/tile_scheduler.h). H200, bench/ab_compare.py against the stride, 5 rounds
  // (bench/results/h200_session26_2026-12-03.txt, call 4; b = 1): d=128 s=1536 24 heads (288 tiles)
  // 1.10 (0.95 -> 1.05 of cuDNN), s=3072 12 heads 1.17 (0.97 -> 1.13); d=64 s=1024 48 heads 1.07;
  // call 5: d=128 s=4096 10 heads (320 tiles) 1.10, s=8192 5 heads 1.11, s=1280 16 heads (160
  // tiles of 10 key tiles) 1.02; d=64 s=2048 16 heads 1.09.
  // Cut at more waves it ran 0.97-1.02 (calls 1-3), which the plan now leaves alone, and d=256
  // (80-key tiles, a merge slot twice d=128's) 0.93 at s=1024 24 heads and 0.97-1.02 from 2k: off
  // there and at d=192 (unmeasured), whose kernels leave the merge out. The causal entries carry
  // it too, so one traits type serves both at d <= 128; under a mask it is never planned, and a
  // launch that cuts no tile runs that type's Unsplit kernel (the merge compiled in cost 1-2% at
  // d=128 2k: bench/results/h200_session27_2026-12-04.txt, calls 2-3).
  bool stream_k = false;
  // Pairs of CTAs share K and V (a cluster of 2 on adjacent query tiles of one head, each loading
  // half of every K/V tile into both by TMA multicast; FlashAttention-3 does so at d >= 128
  // without a mask). Only where the stride takes equal tiles two by two (fwd_launch.cuh). H200,
  // bench/ab_compare.py against the unpaired kernel, non-causal, 16k tokens, hidden 2048
  // (bench/results/h200_session27_2026-12-04.txt, call 4): d=128 1.011 / 1.029 / 1.033 at 2k / 4k
  // / 8k (0.97 -> 0.98, 0.98 -> 1.01, 0.99 -> 1.02 of cuDNN), d=256 1.033 / 1.022 at 2k / 8k; d=64
  // 1.001 / 0.999, so d=64 keeps one CTA per cluster. Call 8, at 2k / 4k / 8k: d=96 (21 heads)
  // 1.011 / 1.009 / 1.004, d=192 (10 heads) 1.014 / 1.013 / 1.041.
  bool pair_kv = false;
  // The softmax of S_i under P_{i-1} V_{i-1} in the machine code: ptxas hoisted the wait for P V
  // ahead of the softmax in every variant (bench/sass_overlap.py), so only ping-pong hid it; waiting
  // through ptx::warpgroup_wait_after keeps all of its exps before the wait. H100 (session 42,
  // bench/ab_compare.py, 3 rounds, bench/results/h100_session42_2026-12-05.txt, call 1), B/A at 2k /
  // 4k / 8k / 16k: d=128 1.027 / 1.042 / 1.042 / 1.054, causal 1.034 / 1.031 / 1.031 / 1.035 (d=96,
  // in the same tiles, unmeasured; no spills added); d=64 0.93-1.00 (three consumer warpgroups at 160
  // registers: ptxas spills 36-60 bytes more) and d=256 0.97-1.01 (spills 40 -> 176-188 bytes in the
  // ping-pong kernels; d=192's likewise), so those wait as before.
  bool softmax_under_pv = false;
};

// d=96 runs in d=128 tiles (the same shared memory and registers; S = Q K^T takes 6 k-steps
// instead of 8, P V stays 128 columns wide with zeros past d). d=192 has tiles of its own: 3 column
// blocks, P V one N=192 wgmma (O 96 fp32 per thread); block_n 112 is the widest whose K/V ring
// fits beside Q (48 + 2x2x42 = 216 KB; 128 would need 240 KB), no O buffer (it does not fit).
// They follow their neighbours' ping-pong and dynamic choices (other shapes unmeasured). Measured
// (H200, bf16, 16k tokens, hidden 2048 -> 21 heads at d=96, 10 at 192; TFLOP/s and ours/cuDNN at
// 2k / 8k, bench/results/h200_hopper_fwd_ring_2026-11-29.txt): d=96 491 (1.08) / 491 (1.05),
// causal 371 (1.00) / 454 (1.07); d=192 584 (0.96) / 670 (1.07), causal 478 (0.94) / 629 (1.11).
constexpr HopperFwdTile hopper_fwd_tile(int head_dim, bool causal) {
  if (head_dim <= 64)
    return {128, 3, 2, true, causal, 1, true, /*stage_o=*/false, /*stream_k=*/true};
  // 96 and 128
  if (head_dim <= 128)
    return {128, 2, 2, true, causal, 1, true, true, /*stream_k=*/true, /*pair_kv=*/true, /*softmax_under_pv=*/true};
  if (head_dim <= 192)
    return {112, 2, 2, !causal, causal, 1, false, /*stage_o=*/true, /*stream_k=*/false, /*pair_kv=*/true};
  return {80, 2, 2, !causal, causal, 1, false, /*stage_o=*/true, /*stream_k=*/false, /*pair_kv=*/true};
}

// Hopper backward (src/cuda/sm90/bwd_kernel.cuh): 128 keys per CTA (64 per consumer warpgroup,
// dK + dV = d fp32 registers per thread) and block_m query rows per step (S^T and dP^T: block_m/2
// fp32 each). Shared memory: K, V 2 * 128 * d + Q, dO 2 * stages * block_m * d + dS^T 2 * 128 *
// block_m (2 bytes each) + dq_buffers fp32 dQ tiles of block_m * d, <= 227 KB.
//   d=64:  block_m 128 (FlashAttention-3's shape): 32 + 64 + 64 + 32 = 192 KB, one dQ buffer (a
//          second one is 2 KB over the limit); registers 64 + 64 + 64 (dK, dV, S^T, dP^T). Both
//          modes compute dQ as d=128's default does below, one warpgroup per step, both 64-row
//          blocks (64 more registers once dV and dK are done), the two warpgroups writing the one
//          dQ buffer in turns. Against the two warpgroups splitting dQ's rows every step (H200,
//          bench/ab_compare.py, B/A at 2k / 4k / 8k / 16k, bench/results/
//          h200_session30_2026-12-04.txt, call 11, 3 rounds): non-causal 1.055 / 1.059 / 1.063 /
//          1.075, causal 1.030 / 1.045 / 1.044 / 1.040 (call 10, 5 rounds: 1.026-1.092), and dV
//          issued after dS there 1.003-1.032x more (call 13). The deterministic mode alternates
//          too: against the split there (B/A, deterministic, 2k / 4k / 8k / 16k, bench/results/
//          h200_session32_2026-12-04.txt, call 1, 3 rounds) non-causal 1.062 / 1.055 / 1.066 /
//          1.082, causal 1.054 / 1.051 / 1.049 / 1.058, though its ordered kernel spills more
//          (240 / 276 bytes against 208 / 248);
//   d=128, default mode: block_m 64 with dQ computed by one warpgroup per step, the two in turns
//          (BwdTraits::kDqAlternate, the design of cuDNN's kernel): 64 + 64 + 32 + 2 x 32 = 224 KB,
//          a dQ buffer per warpgroup; registers 128 + 32 + 32 (dK, dV, S^T, dP^T), then 64 for dQ
//          once dV and dK are done. Against the 80-row kernel below (H200, bench/ab_compare.py, 5
//          rounds, B/A at 2k / 4k / 8k / 16k, bench/results/h200_session30_2026-12-04.txt, call 6):
//          non-causal 1.048 / 1.037 / 1.017 / 1.034, causal 1.041 / 1.033 / 1.022 / 1.012. In the
//          deterministic mode it ran 0.953-0.989 of it (call 7), so that mode keeps block_m 80:
//   d=128, deterministic mode: block_m 80 (FlashAttention-3's non-causal shape): 64 + 80 + 40 +
//          40 = 224 KB with one dQ buffer; registers 128 + 40 + 40 (d=96 runs in the d=128 tiles
//          of either mode, src/cuda/sm90/bwd_launch.cuh). wgmma's M is a multiple of 64, so dQ is
//          computed transposed (dQ^T = K^T dS^T, dS stored [query][key]); dK reads dS^T from that
//          tile too, so no dS fragments stay in registers and dV, dK and dQ^T fit in flight
//          together (with dK from registers ptxas serialized every wgmma unless dV and dK completed
//          first; B/A 1.002-1.025 at 2k-16k, bench/results/h200_session28_2026-12-04.txt, call 4).
//          Against the former block_m 64 with two dQ buffers (H200, bf16, 16k tokens, hidden 2048,
//          bench/ab_compare.py, B/A at 2k / 4k / 8k / 16k, bench/results/
//          h200_hopper_bwd_m80_2026-12-02.txt): non-causal 0.996 / 1.005 / 1.007 / 1.021, again 1.013 / 1.013 / 1.010 / 1.024 (deterministic 1.039 at 2k,
//          1.051 at 8k); causal 0.986 / 1.013 / 1.021 / 1.033, again 0.979 / 0.994 / 1.028 / 1.033
//          (deterministic 1.000, 1.024), where the same comparison of two identical block_m 64
//          kernels read 0.987 / 1.000 / 0.987 / 0.982. So 80 rows with and without a mask.
//          dQ^T in two m64n40 halves, the first under dV and dK, measured 0.967-0.996 of this.
//          block_m 128 would need 128 + 64 + 64 accumulator registers, more than the 240 a
//          consumer has. Earlier, at block_m 64, three Q/dO stages with one dQ buffer measured
//          0.97-1.01 of two with two (bench/results/h200_hopper_bwd_stages3_2026-12-02.txt).
//   d=256: src/cuda/sm90/bwd_wide_kernel.cuh, 64 query rows per step on two CTAs per 128 keys, each
//          CTA one half of the head dim's columns of dK, dV and dQ (each warpgroup 64 keys x 128
//          columns: 64 + 64 accumulator registers). K, V 2 * 64 + one stage of Q, dO 2 * 32 + dS^T
//          2 * 16 = 224 KB, so one stage (K and V of 128 keys take what a second would) and no
//          dQ staging buffer: dQ is added from registers (red.v4); dq_buffers 0. Against the
//          previous kernel (64 keys per CTA, all columns, two stages): default mode 1.03-1.06x
//          without a mask, 0.97-1.04x causal (the lowest at 2k; A/B runs of calls 6 and 7
//          chained), deterministic 1.10-1.18x (call 8); H200, 2k-16k,
//          bench/results/h200_session31_2026-12-04.txt.
// Measured on an H200 (bf16, 16k tokens, hidden 2048, 2026-12-01, the whole backward in TFLOP/s
// at 2k / 8k, bench/results/h200_bwd_persistent_2026-12-01.txt, calls 7 and 8): d=64 382 / 433
// (causal 299 / 398), d=128 443 / 501 (causal 361 / 457), d=256 326 / 368 (causal 268 / 352),
// 0.94-1.04 of cuDNN from 2k to 16k.
// P^T and dS^T reach shared memory by stmatrix (four 8 x 8 blocks per instruction, where each lane
// made 16 to 32 4-byte stores per step): B/A against per-lane stores (H200, bench/ab_compare.py,
// 2k / 8k, non-causal then causal, bench/results/h200_hopper_bwd_stmatrix_2026-12-03.txt): d=64
// 1.027 / 1.003, 1.059 / 1.027 (deterministic 1.011 / 1.010, 1.033 / 1.036); d=256 1.000 / 1.020,
// 1.031 / 1.004 (deterministic 1.030 / 1.011, 1.047 / 1.012). d=128 already stored dS by
// stmatrix.trans.
// With block_m 64, S^T, dP^T and dQ are N=64 wgmmas reading both operands from shared memory
// (4 KB per 64x64x16 step); by our estimate (not measured) two warpgroups at the tensor cores'
// peak would read about 128 bytes per clock, what shared memory delivers, so those three products
// are likely bandwidth-bound below that peak.
struct HopperBwdTile {
  int block_m;
  int stages;      // Q/dO tiles in flight
  int dq_buffers;  // fp32 dQ tiles between the consumers and the writer warp
  bool dq_alternate = false;  // dQ by one warpgroup per step, in turns (sm90::BwdTraits::kDqAlternate)
};

// Measured and not kept: the forward's CTA pairs (HopperFwdTile::pair_kv) on the backward's Q and
// dO, two CTAs on adjacent key tiles of one head each loading half of every Q and dO tile into
// both (default mode, no mask, static stride). A step reads 40 KB of Q and dO for 13 MFLOP where
// a forward key tile reads 64 KB for 8: B/A 0.99-1.005 at d=128 2k-16k, 1.00-1.01 at d=64 (H200,
// bench/results/h200_session27_2026-12-04.txt, call 5).
// Nor a stream-K tail (default mode, no mask): the anchors' 2048 key tiles at d=128 (4096 at d=64)
// are 15.5 (31.03) waves on 132 SMs, and the CTAs took whole waves and then the rest in equal spans
// of query steps, the two units of a cut key tile adding their fp32 dK, dV through a merge slot
// with a ticket (no waiting). Static spans: B/A 0.984-1.012 at d=64 and 128, 2k-16k; spans drawn
// from the counter after the whole tiles: 0.990-1.006 (H200, bench/results/
// h200_session28_2026-12-04.txt, calls 1-2), as in the forward past two waves: the SMs that the
// partial wave leaves idle let the others run faster.
// The deterministic mode may take other tiles than the default (d=128 above).
constexpr HopperBwdTile hopper_bwd_tile(int head_dim, bool deterministic) {
  if (head_dim <= 64) return {128, 2, 1, true};
  if (head_dim <= 128) return deterministic ? HopperBwdTile{80, 2, 1} : HopperBwdTile{64, 2, 2, true};
  return {64, 1, 0};  // d=256: src/cuda/sm90/bwd_wide_kernel.cuh, dQ by reductions (no buffers)
}

}  // namespace flashattn::cuda
