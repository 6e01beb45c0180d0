// The CPU engine's SIMD levels and the table of tile kernels each level provides.
//
// The tiled loop nest (src/cpu/attn_engine.h) is plain C++ compiled for the baseline ISA; it calls
// the few hot kernels below through one table per level, chosen at run time. The kernels work on
// tiles kept "query-minor": a query tile's rows are the vector lanes, so the online-softmax state of
// many rows is updated with one vector instruction and no horizontal reductions are needed.
//
//   K, V [nk][ld]   a key tile, packed (ld = padded head dim, see attn_engine.h)
//   QT  [d][mpad]   the query tile, transposed, pre-scaled (see attn_engine.h)
//   ST  [nk][mpad]  scores of nk keys against the tile (S transposed), then in place P~
//   OT  [d][mpad]   the unnormalized output o~, transposed
//   m, l, f [mpad]  running max (score units), running sum, and the last rescale factor per row
//
// mpad is the row count rounded up to `row_align`; padded rows are computed and ignored. Each
// kernel works on `rows` columns (a multiple of row_align) starting where its pointers point, so a
// key tile that only some rows can see is computed for those rows alone.
// The *_rows kernels are decoding's exception: for tiles of a few rows they put the head dimension
// in the lanes, with q and o~ row-major and the scores S[row][key], and take the key rows by pointer.
//
// Level selection: the best level the CPU supports (cpuid and xgetbv, once), capped by the
// environment variable FLASHATTN_CPU_KERNEL=portable|avx2|avx512|amx when it is set (read at each
// call, so tests can compare levels in one process). An unknown value is an error, not a silent
// fallback. The amx level is avx512 plus the AMX-BF16 products of the bf16 and fp16 forward and
// backward (amx.h, backward_amx.cpp): its float tables are avx512's.
#pragma once

#include <cstdint>

#include "flashattn/flashattn.hpp"

namespace flashattn::cpu {

enum class KernelLevel : int { portable = 0, avx2 = 1, avx512 = 2, amx = 3 };

// The most query rows (mpad) a tile kernel is handed.
inline constexpr int64_t kMaxTileRows = 384;
inline constexpr int64_t kMaxHeadDim = 256;  // the API's bound (validate.cpp)

template <class T>
struct TileKernels {
  KernelLevel level;
  int64_t row_align;  // mpad must be a multiple of this (the vector width)
  // ST[j][i] = sum_x K[j][x] * QT[x][i] for j < nk, i < rows; K rows are ldk apart, QT and ST
  // rows mpad apart.
  void (*scores)(const T* k, int64_t ldk, int64_t nk, const T* qt, int64_t d, int64_t rows, int64_t mpad, T* st);
  // x = cap * tanh(mul * x) for n values (softcap; mul = scale / cap turns q.k into the divided
  // score).
  void (*softcap)(T* x, int64_t n, T cap, T mul);
  // One online-softmax step over an (already masked) score tile: new max, rescale factor f, P~ in
  // place of the scores, l = f * l + rowsum(P~). The rules of core::SoftmaxState, with m kept in
  // score units and the exp2-domain exponent formed as (s - base) * c.
  void (*softmax)(T* st, int64_t nk, int64_t rows, int64_t mpad, T c, T* m, T* l, T* f);
  // OT[x][i] = f[i] * OT[x][i] + sum_j V[j][x] * PT[j][i] for i < rows; V rows are ldv apart, PT
  // and OT rows mpad apart.
  void (*accumulate)(const T* v, int64_t ldv, int64_t nk, const T* pt, int64_t rows, int64_t mpad, int64_t d,
                     const T* f, T* ot);
  // The same step for a few query rows with the head dim in the vector lanes (decoding;
  // kernel_impl.h): q and o row-major, rows d apart; the key rows k[j], v[j] anywhere, of type t
  // (T's own, or f16 / bf16, widened as they load); the score tile S row-major, [rows][ld] (ld a
  // multiple of row_align), so that its softmax runs with the keys in the lanes. softmax_rows reads
  // whole vectors: S past nk up to the next one must hold -inf.
  void (*scores_rows)(const void* const* k, DType t, int64_t nk, const T* q, int64_t d, int64_t rows, int64_t ld,
                      T* s);
  void (*softmax_rows)(T* s, int64_t nk, int64_t rows, int64_t ld, T c, T* m, T* l, T* f);
  void (*accumulate_rows)(const void* const* v, DType t, int64_t nk, const T* p, int64_t rows, int64_t ld, int64_t d,
                          const T* f, T* o);
  // dst[c][r] = src[r][c] for r < rows, c < cols (rows lds and ldd apart): query tiles into their
  // transposed form and o~ out of it, W x W blocks at a time through registers.
  void (*transpose)(const T* src, int64_t lds, T* dst, int64_t ldd, int64_t rows, int64_t cols);
  // dst[0, n) = src as float; src is f16 or bf16 (only used by the float tables).
  void (*widen)(const void* src, DType t, T* dst, int64_t n);
  // dst[0, n) = mul * src rounded to nearest even into f16 or bf16: the values of core::to_half and
  // core::to_bf16 (a NaN may keep other payload bits). n a multiple of 8; float tables only.
  void (*narrow)(const T* src, T mul, DType t, void* dst, int64_t n);
};

// Tables of each level; the SIMD ones exist only on x86-64 builds.
const TileKernels<float>& portable_kernels_f32();
const TileKernels<double>& portable_kernels_f64();
#if defined(__x86_64__)
const TileKernels<float>& avx2_kernels_f32();
const TileKernels<float>& avx512_kernels_f32();
#endif

KernelLevel detected_level();  // the best level this CPU supports
KernelLevel active_level();    // detected_level() capped by FLASHATTN_CPU_KERNEL
const char* level_name(KernelLevel level);

// The float kernels of the active level. f64 problems always run the portable double kernels:
// they exist for gradient checks, where exactness matters and speed does not.
const TileKernels<float>& float_kernels();
const TileKernels<double>& double_kernels();

}  // namespace flashattn::cpu
