// The arithmetic of one (query tile, key tile) step of the CPU backward, behind a table of
// function pointers so that the same source (backward_tile_impl.h) runs compiled for plain x86-64
// (backward_portable.cpp), for AVX2 + FMA (backward_avx2.cpp) or for AVX-512 (backward_avx512.cpp),
// picked per call by the engine's active SIMD level (simd.h).
//
// All tiles are dense, row-major, in accumulator precision T (float, or double for f64), padded to
// full size with zeros: a padded query row has lse = +inf (so P = 0) and a padded key is outside
// every row's visible range (block_range.h puts a partial last key tile in the masked set), so
// padding never reaches a gradient.
#pragma once

#include <cstdint>

namespace flashattn::cpu::bwd {

// G: the gradient accumulators' type. double for the SIMD products; float for the AMX products
// (bf16 problems only), which add into their fp32 tiles in place, as the GPU kernels accumulate.
template <class T, class G = double>
struct TileStep {
  int64_t bm = 0, bn = 0, d = 0;  // query rows, keys, head dim (all multiples of 8)
  // The dkdv step keeps scores as S [bm][bn] and reads
  const T* q = nullptr;     // [bm][d]
  const T* dout = nullptr;  // [bm][d]
  const T* kt = nullptr;    // [d][bn]
  const T* vt = nullptr;    // [d][bn]
  // the dq step keeps them as S^T [bn][bm] and reads
  const T* qt = nullptr;    // [d][bm]
  const T* dot = nullptr;   // [d][bm], dO^T
  const T* k = nullptr;     // [bn][d]
  const T* v = nullptr;     // [bn][d]
  // so that each task transposes its fixed tiles once and streams the others as plain rows.
  const T* lse = nullptr;         // [bm] the forward's lse, +inf for rows that contribute nothing
  const T* delta = nullptr;       // [bm] D = rowsum(dO o O)
  const int64_t* lo = nullptr;    // [bm] visible keys of each row are [lo, hi) (read when masked)
  const int64_t* hi = nullptr;
  int64_t n0 = 0;                 // index of the tile's first key
  bool masked = false;            // the tile needs the element-wise mask
  T score_mul = 0;                // no softcap: scale; softcap: scale / softcap
  T softcap = 0;                  // 0 = off

  T* p = nullptr;      // scratch, bm x bn in the step's layout: S, then P, then dS
  T* dp = nullptr;     // scratch: dP
  T* deriv = nullptr;  // scratch: 1 - tanh^2 (softcap only)
  uint16_t* pack = nullptr;  // scratch of the AMX products: 2 x tile x max(d, tile) bf16 values (x2 split)
  // The AMX steps (backward_amx.cpp) read Q, dO, K and V as bf16 rows [bm or bn][d] instead of the
  // float tiles, and the fixed tile's B operands as VNNI words, packed once per tile by
  // TileOps::key_tile (K^T [d/2][bn], V^T [d/2][bn], K [bn/2][d]) or TileOps::query_tile (Q^T and
  // dO^T [d/2][bm]). split: an fp16 problem, whose 16-bit buffers hold bf16 hi halves followed by
  // their lo halves (backward_amx.cpp Operands): the rows [2][tile][d], the words [2][tile * d / 2].
  bool split = false;
  const uint16_t* q16 = nullptr;
  const uint16_t* dout16 = nullptr;
  const uint16_t* k16 = nullptr;
  const uint16_t* v16 = nullptr;
  uint32_t* kt_words = nullptr;
  uint32_t* vt_words = nullptr;
  uint32_t* k_words = nullptr;
  uint32_t* qt_words = nullptr;
  uint32_t* dot_words = nullptr;
  // Gradient accumulators, unscaled (the caller multiplies by the softmax scale). Double even for
  // float math: each step adds one tile's float sums, so the rounding of a gradient stays that of
  // one tile's sum instead of growing with the sequence length. The AMX products' fp32 instead
  // carries about 2^-24 sqrt(steps) relative, far under the bf16 rounding of their results.
  G* dk = nullptr;  // [bn][d]
  G* dv = nullptr;  // [bn][d]
  G* dq = nullptr;  // [bm][d]
};

template <class T, class G = double>
struct TileOps {
  void (*dkdv)(const TileStep<T, G>&);  // dV += P^T dO, dK += dS^T Q
  void (*dq)(const TileStep<T, G>&);    // dQ += dS K
  void (*fused)(const TileStep<T, G>&);  // all three, in the key tile's view
  // The AMX products' only (null elsewhere), whose steps take bf16 rows: the packs of a key tile (run
  // once it is loaded, for the fused and dK/dV steps) and of a query tile (for the dQ steps).
  void (*key_tile)(const TileStep<T, G>&) = nullptr;
  void (*query_tile)(const TileStep<T, G>&) = nullptr;
};

TileOps<float> portable_ops_f32();
TileOps<double> portable_ops_f64();
TileOps<float> avx2_ops_f32();
TileOps<double> avx2_ops_f64();
TileOps<float> avx512_ops_f32();
TileOps<double> avx512_ops_f64();
// bf16 and fp16 problems on AMX (backward_amx.cpp): the products of bf16 operands on AMX tiles with
// fp32 results; bf16 Q, K, V and dO are bf16 values already, P and dS are rounded to bf16 (nearest
// even) for the products that take them, as on the GPU; fp16 ones go in as bf16 hi and lo halves
// (TileStep::split). d, bm and bn multiples of 32.
TileOps<float, float> amx_ops_f32();

}  // namespace flashattn::cpu::bwd
