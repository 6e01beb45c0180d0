// merge_states on the CPU: out[t, h, :] = sum_i w_i o_parts[i, t, h, :] with the stable weights of
// core::MergeState (max first, so nothing overflows; an empty part weighs 0; all parts empty give
// out = 0 and lse = -inf). f16/bf16/f32 parts are combined in fp32, f64 parts in double.
#include <algorithm>
#include <vector>

#include "api/backends.h"
#include "core/numeric.h"
#include "core/softmax_state.h"
#include "cpu/backward_io.h"  // load_acc, store_as
#include "cpu/parallel.h"

namespace flashattn::cpu {
namespace {

// (token, head) rows per task: enough work to amortize the hand-out, small enough to balance.
constexpr int64_t kRowsPerTask = 64;

template <class T, class Acc>
void merge_typed(const core::MergeParams& p) {
  const T* o_parts = static_cast<const T*>(p.o_parts);
  const Acc* lse_parts = static_cast<const Acc*>(p.lse_parts);
  T* out = static_cast<T*>(p.out);
  Acc* lse = static_cast<Acc*>(p.lse);
  const int64_t rows = p.tokens * p.heads, d = p.head_dim;
  const int64_t tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
  std::vector<std::vector<Acc>> acc(size_t(workers_for(tasks, p.num_threads)), std::vector<Acc>(size_t(d)));

  parallel_for(tasks, p.num_threads, [&](int64_t task, int worker) {
    Acc* o = acc[size_t(worker)].data();
    const int64_t r_end = std::min(rows, (task + 1) * kRowsPerTask);
    for (int64_t r = task * kRowsPerTask; r < r_end; ++r) {
      const int64_t t = r / p.heads, h = r % p.heads;
      // Offsets, not pointers: with no parts the part tensors may be empty with null data.
      const int64_t lse_row = t * p.lp_token + h * p.lp_head;
      core::MergeState<Acc> ms;
      for (int64_t i = 0; i < p.parts; ++i) ms.see(lse_parts[lse_row + i * p.lp_part]);
      std::fill(o, o + d, Acc(0));
      for (int64_t i = 0; i < p.parts; ++i) {
        const Acc w = ms.add_weight(lse_parts[lse_row + i * p.lp_part]);
        // An empty part may hold anything (its o is undefined); skipping it keeps 0 * NaN out.
        if (w == Acc(0)) continue;
        const T* oi = o_parts + i * p.op_part + t * p.op_token + h * p.op_head;
        for (int64_t x = 0; x < d; ++x) o[x] += w * load_acc<Acc>(oi + x);
      }
      const Acc scale = ms.out_scale();
      T* dst = out + t * p.o_token + h * p.o_head;
      for (int64_t x = 0; x < d; ++x) dst[x] = store_as<T>(o[x] * scale);
      if (lse) lse[t * p.l_token + h * p.l_head] = ms.lse();
    }
  });
}

}  // namespace

void merge_states(const core::MergeParams& p) {
  switch (p.dtype) {
    case DType::f16: merge_typed<core::half_t, float>(p); break;
    case DType::bf16: merge_typed<core::bfloat16_t, float>(p); break;
    case DType::f32: merge_typed<float, float>(p); break;
    case DType::f64: merge_typed<double, double>(p); break;
    default: throw Error(Status::internal, "merge_states: unexpected dtype");
  }
}

}  // namespace flashattn::cpu
