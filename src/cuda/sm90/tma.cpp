#include "cuda/sm90/tma.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <mutex>

namespace flashattn::cuda::sm90 {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    else
      cudaGetLastError();
  });
  return fn;
}

// blocks: the columns as head_dim / 64 blocks of 64, a dimension of its own (encode_tma_sw128_blocks).
bool encode(CUtensorMap* map, const TmaTensor& t, int box_rows, bool blocks) {
  auto fn = encoder();
  if (fn == nullptr || t.elem_bytes != 2 || (blocks && t.head_dim % 64 != 0)) return false;
  // Dimensions must be at least 1 even where the kernel will load nothing from them.
  auto at_least_1 = [](int64_t x) { return cuuint64_t(x < 1 ? 1 : x); };
  const cuuint64_t eb = cuuint64_t(t.elem_bytes);
  // Strides of rows, heads and batch entries in bytes. A tensor map cannot describe a broadcast
  // dimension (stride 0 over more than one row, head or batch): such a tensor is refused, and the
  // caller takes a path that loads without TMA. (Encoding it with a stand-in stride, as once for
  // every stride 0, read other rows: wrong results on the Hopper path, found by the GPU fuzzer.) A
  // stride 0 of a dimension of size 1 is replaced by a legal one, since it is never stepped over.
  const int64_t extents[3] = {t.rows, t.heads, t.batch}, given[3] = {t.row_stride, t.head_stride, t.batch_stride};
  cuuint64_t outer[3];
  for (int i = 0; i < 3; ++i) {
    if (given[i] == 0 && extents[i] > 1) return false;
    outer[i] = cuuint64_t(given[i] > 0 ? given[i] : 8) * eb;
  }
  const cuuint64_t rows = at_least_1(t.rows), heads = at_least_1(t.heads), batch = at_least_1(t.batch);
  const cuuint32_t col_blocks = cuuint32_t(t.head_dim / 64);
  // 4-D: (columns, rows, heads, batch); 5-D: (64 columns, rows, column blocks 128 bytes apart,
  // heads, batch), the box taking every block so that they land one after another.
  cuuint64_t dims4[4] = {cuuint64_t(t.head_dim), rows, heads, batch};
  cuuint64_t dims5[5] = {64, rows, col_blocks, heads, batch};
  cuuint64_t strides4[3] = {outer[0], outer[1], outer[2]};
  cuuint64_t strides5[4] = {outer[0], 64 * eb, outer[1], outer[2]};
  cuuint32_t box4[4] = {64, cuuint32_t(box_rows), 1, 1};
  cuuint32_t box5[5] = {64, cuuint32_t(box_rows), col_blocks, 1, 1};
  cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  // f16 and bf16 alike move as 16-bit words: the copy engine does not interpret them.
  CUresult r = fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, blocks ? 5 : 4, const_cast<void*>(t.base),
                  blocks ? dims5 : dims4, blocks ? strides5 : strides4, blocks ? box5 : box4, elem_strides,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

}  // namespace

bool encode_tma_sw128(CUtensorMap* map, const TmaTensor& t, int box_rows) {
  return encode(map, t, box_rows, false);
}

bool encode_tma_sw128_blocks(CUtensorMap* map, const TmaTensor& t, int box_rows) {
  return encode(map, t, box_rows, true);
}

}  // namespace flashattn::cuda::sm90
