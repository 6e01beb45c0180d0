// The forward's two products on AMX-BF16 tiles (kernels_amx.cpp), for bf16 and fp16 inputs on CPUs
// that have AMX (Intel Sapphire Rapids and later): a tile instruction multiplies a 16 x 32 bf16 tile
// by a 32 x 16 one into 16 x 16 fp32, about 16 times the FLOPs per cycle of AVX-512 FMA.
//
// The loop nest, the masks and the online softmax are the float engine's (attn_engine.h): the
// score tile S^T [keys][rows] and the output O~^T [d][rows] stay fp32 in the same layouts, so the
// AVX-512 softmax runs on them unchanged. Only the operands change form:
//   Q   as QV [d/2][mpad] 32-bit words: word (r, i) holds query row i's bf16 pair (q[2r], q[2r+1]),
//       the "VNNI" layout a B tile wants (K = d, N = rows); the inputs as they are, unscaled;
//   K   as rows [keys][ldk] bf16: the A tile of S^T = K Q^T;
//   V   as V^T [d][ldv] bf16: the A tile of O~^T = V^T P^T;
//   P^T rounded to bf16 (nearest even) into PV [keys/2][mpad] words, pairs of consecutive keys:
//       the B tile of O~^T, written by the softmax itself. P's row sums l stay those of the fp32
//       P, as on the GPU.
// K and V^T hold keys up to a multiple of 32, the padding zero, so a last partial key tile reads
// finite values; P^T is zero past nk.
//
// fp16 has 11 significant bits to bf16's 8, so an fp16 operand enters as two bf16 operands of the
// same form, hi = bf16(x) and lo = bf16(x - hi), whose sum is x exactly (amx_simd.h split_bf16),
// and a product A B as the three tile products A_hi B_hi + A_hi B_lo + A_lo B_hi. The one left out,
// A_lo B_lo, is under 2^-16 of |A||B| term by term, 32 times below fp16's own rounding. P is split
// the same way (16 significant bits, against the 11 an fp16 P would keep on the GPU). Every
// function below takes the lo operands beside the hi ones; null lo operands mean bf16 inputs and
// one product.
//
// Each task brackets its products with begin() and end(): the tile configuration is per thread and
// other code in the thread (PyTorch's own AMX kernels, say) may change it between our calls, or
// count on its own staying loaded across them (end() restores it).
#pragma once

#include <cstdint>

namespace flashattn::cpu {

// The vpermw indices that turn _mm512_cvtne2ps_pbh(odd, even) (even's 16 bf16 values in the low
// half, odd's in the high half) into 16 VNNI words (even[c], odd[c]).
alignas(64) inline constexpr uint16_t kAmxPairInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                                21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                                11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

// A thread's tile configuration as ldtilecfg / sttilecfg move it.
struct alignas(64) AmxSavedState {
  uint8_t bytes[64];
};

struct AmxKernels {
  void (*begin)(AmxSavedState* saved);      // save the thread's tile configuration, load ours
  void (*end)(const AmxSavedState* saved);  // restore the saved one (or release the tiles)
  // n fp16 values (n a multiple of 16) -> their bf16 halves hi[0..n), lo[0..n) (split_bf16).
  void (*split_f16)(const uint16_t* x, int64_t n, uint16_t* hi, uint16_t* lo);
  // The first `cols` (16 or 32) of 32 query rows staged [32][d] bf16 (zero past the tile's rows)
  // -> columns i0..i0 + cols of QV.
  void (*pack_q)(const uint16_t* staged, int64_t d, uint32_t* qv, int64_t mpad, int64_t i0, int64_t cols);
  // 32 rows staged [32][d] bf16 (keys j0..j0 + 31 of V) -> columns j0..j0 + 31 of V^T [d][ldv]
  // (j0 even).
  void (*pack_vt)(const uint16_t* staged, int64_t d, uint16_t* vt, int64_t ldv, int64_t j0);
  // ST[j][i] = sum_x K[j][x] Q_i[x] for j < nk rounded up to 16, i < rows (a multiple of 16);
  // K rows ldk elements apart (k_lo likewise); QV and ST rows mpad apart.
  void (*scores)(const uint16_t* k, const uint16_t* k_lo, int64_t ldk, int64_t nk, const uint32_t* qv,
                 const uint32_t* qv_lo, int64_t d, int64_t rows, int64_t mpad, float* st);
  // The online-softmax step of TileKernels::softmax over ST (rows are lanes), with P~ going out as
  // bf16 pairs of keys into PV [(nk rounded up to 32) / 2][mpad] words (and its lo halves into
  // pv_lo), zero past nk, instead of back into ST. Its exp2 is accurate to 2.9e-6 relative, not
  // to the float kernels' fp32 ulp.
  void (*softmax)(const float* st, int64_t nk, int64_t rows, int64_t mpad, float c, float* m, float* l, float* f,
                  uint32_t* pv, uint32_t* pv_lo);
  // OT[x][i] = f[i] * OT[x][i] + sum_{j < nk} V^T[x][j] P~[j][i] for x < d, i < rows, P~ from PV;
  // V^T rows ldv apart (vt_lo likewise), its columns readable up to nk rounded up to 32; OT rows
  // mpad apart.
  void (*accumulate)(const uint16_t* vt, const uint16_t* vt_lo, int64_t ldv, int64_t nk, const uint32_t* pv,
                     const uint32_t* pv_lo, int64_t rows, int64_t mpad, int64_t d, const float* f, float* ot);
  // Rows i < rows (a multiple of 16) of O~^T [d][mpad] times scale[i], rounded to nearest even to
  // bf16 (fp32 subnormals become 0) or, with f16, to fp16 into the row out[i]; a null out[i] is not
  // written.
  void (*finish)(const float* ot, int64_t mpad, int64_t rows, int64_t d, const float* scale, bool f16,
                 void* const* out);
};

// The AMX kernels; only called where active_level() is KernelLevel::amx.
const AmxKernels& amx_kernels();

// Whether the OS lets this process use the AMX tile registers: Linux hands them out on request
// (arch_prctl ARCH_REQ_XCOMP_PERM, once per process). False elsewhere.
bool request_amx_permission();

}  // namespace flashattn::cpu
