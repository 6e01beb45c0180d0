// Host side of the GPU decode: the variant table, the split heuristic, the workspace layout, and
// one run of a plan (status reset, then one kernel: attention with append and combine), queued on
// one stream with no host synchronization, so a run can be captured in a CUDA graph.
#include "cuda/decode/decode.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "cuda/common.cuh"

namespace flashattn::cuda {
namespace {

using elem_f16 = __half;
using elem_bf16 = __nv_bfloat16;

struct DecodeVariant {
  int head_dim;
  DType dtype;
  int arch;
  void (*run)(const DecodeLaunch&, cudaStream_t);
  int (*ctas_per_sm)(int);
};

#define FLASHATTN_DECODE(H, DT, A) \
  DecodeVariant{H, DType::DT, A, &run_decode<H, elem_##DT, A>, &decode_ctas_per_sm<H, elem_##DT, A>},
constexpr DecodeVariant kVariants[] = {
#include "flashattn_internal/decode_list.inc"
    DecodeVariant{0, DType::f32, 0, nullptr, nullptr}  // end marker (keeps the array non-empty)
};
#undef FLASHATTN_DECODE

// Can a binary built for `arch` run on a device of compute capability `cc`? (As the forward: sm_90a
// machine code on Hopper only; sm_80 SASS on sm8x, its PTX JIT-compiled on anything newer.)
bool runs_on(int arch, int cc) { return arch == 90 ? cc / 10 == 9 : cc >= 80; }

// The smallest compiled head dim >= the problem's (extra columns are zero-filled and never
// written), the device's own arch family first.
const DecodeVariant& select_variant(const core::DecodeParams& p, int cc) {
  const DecodeVariant* best = nullptr;
  for (const DecodeVariant& v : kVariants) {
    if (v.run == nullptr || v.dtype != p.dtype || v.head_dim < p.head_dim || !runs_on(v.arch, cc)) continue;
    if (best == nullptr || v.head_dim < best->head_dim || (v.head_dim == best->head_dim && v.arch > best->arch)) best = &v;
  }
  if (best == nullptr)
    throw Error(Status::unsupported, "decode: no GPU kernel for head_dim " + std::to_string(p.head_dim) + ", dtype " +
                                         dtype_name(p.dtype) + " on compute capability " + std::to_string(cc / 10) + "." +
                                         std::to_string(cc % 10) + " in this build (compiled: " + decode_variant_list() + ")");
  return *best;
}

int64_t align256(int64_t x) { return split_plan::ceil_div(x, 256) * 256; }

// Workspace offsets past the status words (splits > 1): arrival counters, partial lse, partial o.
struct WorkspaceLayout {
  int64_t arrivals_bytes, lse_bytes, o_bytes;
  explicit WorkspaceLayout(const core::DecodeParams& p, int32_t splits) {
    const int64_t rows = int64_t(splits) * p.batch * p.seqlen_new * p.heads_q;
    arrivals_bytes = align256(2 * p.batch * p.heads_kv * decode_row_tiles(p) * 4);  // done, then published
    // lse: [split, batch, heads_kv, row tile, rows per CTA] (decode_combine.cuh), o: [split, batch, token, head, d].
    lse_bytes = align256(int64_t(splits) * p.batch * p.heads_kv * decode_row_tiles(p) *
                         decode_rows_per_cta(p.heads_q / p.heads_kv * p.seqlen_new) * 4);
    o_bytes = align256(rows * p.head_dim * 4);
  }
};

}  // namespace

int64_t decode_workspace_bytes(const core::DecodeParams& p, int32_t splits) {
  if (splits <= 1) return kDecodeStatusBytes;
  const WorkspaceLayout w(p, splits);
  return kDecodeStatusBytes + w.arrivals_bytes + w.lse_bytes + w.o_bytes;
}

void plan_decode_on_device(const core::DecodeParams& p, DecodePlan& plan, int cc, int num_sms) {
  const DecodeVariant& v = select_variant(p, cc);
  const int64_t rows = p.heads_q / p.heads_kv * p.seqlen_new;
  plan.num_splits = choose_decode_splits(p, plan.max_cache_seqlen, num_sms, v.ctas_per_sm(decode_rows_per_cta(rows)));
  plan.workspace_bytes = decode_workspace_bytes(p, plan.num_splits);
}

void run_decode_plan(const core::DecodeParams& p, const DecodePlan& plan, void* workspace, int cc,
                     cudaStream_t stream) {
  const DecodeVariant& v = select_variant(p, cc);
  DecodeLaunch L;
  L.p = p;
  L.capacity = p.paged ? p.max_pages_per_seq * p.page_size : p.page_size;
  L.max_cache_seqlen = plan.max_cache_seqlen;
  L.splits = plan.num_splits;
  L.row_tiles = int32_t(decode_row_tiles(p));
  L.group = int32_t(p.heads_q / p.heads_kv);
  L.evict_first = decode_evict_first(p, plan.max_cache_seqlen, plan.num_splits);
  auto* base = static_cast<unsigned char*>(workspace);
  L.status = reinterpret_cast<uint32_t*>(base);
  int64_t reset_bytes = 2 * sizeof(uint32_t);
  if (L.splits > 1) {
    const WorkspaceLayout w(p, L.splits);
    L.arrivals = reinterpret_cast<uint32_t*>(base + kDecodeStatusBytes);
    L.part_lse = reinterpret_cast<float*>(base + kDecodeStatusBytes + w.arrivals_bytes);
    L.part_o = reinterpret_cast<float*>(base + kDecodeStatusBytes + w.arrivals_bytes + w.lse_bytes);
    reset_bytes = kDecodeStatusBytes + w.arrivals_bytes;
  }
  // One memset for the status and the counters (adjacent): the workspace arrives uninitialized
  // and a run must not depend on what the previous one left.
  check(cudaMemsetAsync(L.status, 0, size_t(reset_bytes), stream), "cudaMemsetAsync(decode status)");
  v.run(L, stream);
}

std::string decode_variant_list() {
  std::string s;
  for (const DecodeVariant& v : kVariants) {
    if (v.run == nullptr) continue;
    if (!s.empty()) s += ", ";
    s += "decode hdim" + std::to_string(v.head_dim) + " " + dtype_name(v.dtype) + " sm" + std::to_string(v.arch) +
         (v.arch == 90 ? "a" : "");
  }
  return s.empty() ? "none" : s;
}

}  // namespace flashattn::cuda
