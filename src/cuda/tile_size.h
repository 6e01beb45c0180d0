// One table: (path, target arch, head dim) -> tile shape, warps, pipeline stages, with the reason
// for each entry. The portable path (mma.sync) is compiled separately per target arch, so each
// arch gets tiles that fit its shared memory: 99 KB per block on sm86/sm89 (the sm80 build runs
// there too, so its entries must fit 99 KB), 227 KB on sm90.
//
// Terms: block_m = 16 * warps * m_tiles query rows per CTA; each warp owns 16 * m_tiles rows and
// reads every K/V tile from shared memory once per step, so m_tiles = 2 halves shared-memory
// traffic per FLOP at the price of registers (O: m_tiles*head_dim/2 fp32 per thread, S:
// m_tiles*block_n/2). q_in_regs keeps the Q fragments in registers (m_tiles*head_dim/4 per
// thread) for the whole K/V loop; otherwise they are re-read from shared memory each k-step, which
// costs less than spilling.
#pragma once

namespace flashattn::cuda {

struct PortableFwdTile {
  int block_n;
  int warps;
  int m_tiles;
  int stages;  // K/V tiles in flight (cp.async ring)
  bool q_in_regs;
  constexpr int block_m() const { return 16 * warps * m_tiles; }
};

// Measured with ptxas -v (CUDA 13.0, sm_90a): two m-tiles per warp (FlashAttention-2's choice)
// ran out of registers in our kernel at every head dim >= 32 (255 registers plus spills), so every
// entry uses one m-tile and 8 warps (block_m 128) unless shared memory forbids.
template <int kArch>
constexpr PortableFwdTile portable_fwd_tile(int head_dim) {
  if constexpr (kArch >= 90) {
    // H100/H200: 227 KB of shared memory, so two stages everywhere; registers decide the rest.
    switch (head_dim) {
      case 32:  return {128, 8, 1, 2, true};   // O 16 + S 64 + Q 8 regs
      case 64:  return {128, 8, 1, 2, true};   // O 32 + S 64 + Q 16: 240 regs, no spill
      case 96:  return {64, 8, 1, 2, true};    // O 48 + S 32 + Q 24: 201 regs
      case 128: return {64, 8, 1, 2, true};    // O 64 + S 32 + Q 32: 224 regs
      case 192: return {64, 8, 1, 2, false};   // O 96 + S 32; Q re-read from smem (in registers it spills)
      default:  return {32, 8, 1, 2, false};   // 256: O 128 + S 16; smem Q 64 + 2x2x16 KB K/V = 128 KB
    }
  } else {
    // sm80 build: fit 99 KB per block (sm86/sm89) so one binary serves all of Ampere and Ada.
    switch (head_dim) {
      case 32:  return {128, 8, 1, 2, true};   // smem Q 8 + K/V 2x2x8 KB = 40 KB
      case 64:  return {128, 8, 1, 2, true};   // 16 + 2x2x16 = 80 KB
      case 96:  return {64, 8, 1, 2, true};    // 24 + 2x2x12 = 72 KB
      case 128: return {64, 8, 1, 2, true};    // 32 + 2x2x16 = 96 KB
      case 192: return {32, 8, 1, 2, false};   // 48 + 2x2x12 = 96 KB
      default:  return {32, 4, 1, 2, false};   // 256: block_m 64: 32 + 2x2x16 = 96 KB (block_m 128 needs 128)
    }
  }
}

}  // namespace flashattn::cuda
