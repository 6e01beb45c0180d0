// The CPU backward: dq, dk, dv by recomputation, tiled as in the seed. Only lse (one number per
// row) is kept from the forward; every score tile is rebuilt from Q and K, so nothing N x N is ever
// stored and the extra memory is O(N): D and lse per row, plus fixed-size tiles
// per worker.
//
// Schedule, and why. A (query tile, key tile) step contributes to dQ of its rows and to dK, dV of
// its keys. Splitting the work over key tiles alone would make dQ a sum over tasks, which needs
// atomics or a reduction whose order depends on the schedule. Instead there are two passes, each
// the only writer of its outputs:
//   pass 1, tasks (batch, query head, query tile): computes D = rowsum(dO o O) and the lse to use
//           for its rows (kept for pass 2), then loops over its key tiles in order, dQ += dS K;
//   pass 2, tasks (batch, KV head, key tile): loops over the group's query heads and their query
//           tiles in order, dV += P^T dO and dK += dS^T Q (GQA sums land in one accumulator).
// Every sum is thus taken in a fixed order, so results are bitwise identical from run to run and
// for any thread count, with no atomics. The price is recomputing S, P, dP and dS twice: 14 matmul
// units per tile pair instead of 10 (1.4x the backward's nominal FLOPs).
// When the (batch, KV head) pairs alone keep every worker busy, one pass does it all: a task owns
// a pair, so both dK, dV of its key tiles and dQ of its query heads' rows (a double accumulator per
// worker), and runs each tile pair once, 10 units, summing in the same order as the two passes:
// the gradients are bitwise the same whichever schedule a thread count picks.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "api/backends.h"
#include "core/block_range.h"
#include "core/numeric.h"
#include "core/softmax_state.h"
#include "cpu/amx.h"
#include "cpu/backward_io.h"
#include "cpu/backward_tile.h"
#include "cpu/parallel.h"
#include "cpu/scratch_cache.h"
#include "cpu/simd.h"

namespace flashattn::cpu {
namespace {

// bf16 and fp16 problems at head dims that are multiples of 32 take the AMX products where the level
// is amx (the tiles' sizes, tile_for below, always are multiples of 32), with fp32 gradient
// accumulators.
bool amx_products(int64_t head_dim, DType dtype) {
  return (dtype == DType::bf16 || dtype == DType::f16) && head_dim % 32 == 0 && active_level() == KernelLevel::amx;
}

// The tile arithmetic of the engine's active SIMD level (simd.h: detected once, capped by
// FLASHATTN_CPU_KERNEL), or the AMX products when G is float (the caller checked amx_products).
// The AVX-512 build needs tiles of whole 16-float vectors, so head dims that are not a multiple of
// 16 (8 for double) take the AVX2 build there.
template <class Acc, class G>
bwd::TileOps<Acc, G> tile_ops(int64_t head_dim) {
  if constexpr (std::is_same_v<G, float>) {
#if defined(__x86_64__)
    return bwd::amx_ops_f32();
#else
    throw Error(Status::internal, "backward: the AMX products exist on x86-64 builds only");
#endif
  } else {
#if defined(__x86_64__)
    if (active_level() >= KernelLevel::avx512 && head_dim % (64 / int64_t(sizeof(Acc))) == 0) {
      if constexpr (std::is_same_v<Acc, float>) return bwd::avx512_ops_f32();
      else return bwd::avx512_ops_f64();
    }
    if (active_level() >= KernelLevel::avx2) {
      if constexpr (std::is_same_v<Acc, float>) return bwd::avx2_ops_f32();
      else return bwd::avx2_ops_f64();
    }
#endif
    if constexpr (std::is_same_v<Acc, float>) return bwd::portable_ops_f32();
    else return bwd::portable_ops_f64();
  }
}

// One sequence of the batch: where its rows start in the packed (varlen) tensors and how many.
struct Seq {
  int64_t q_tok0 = 0, sq = 0, k_tok0 = 0, sk = 0;
  int64_t q_row0 = 0;  // its first row in the [heads_q, total_q] row-statistics buffers
};

Seq seq_of(const core::AttnShape& p, int64_t b) {
  if (!p.varlen()) return {0, p.seqlen_q, 0, p.seqlen_k, b * p.seqlen_q};
  const int64_t q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_k[b];
  return {q0, p.cu_seqlens_q[b + 1] - q0, k0, p.cu_seqlens_k[b + 1] - k0, q0};
}

// Rows per query tile and keys per key tile: 128 at every head dim, or the longest sequence rounded
// up to 32 when that is shorter (a short problem would spend most of a 128 x 128 step on padding;
// whole 16-float vectors and 4-row blocks either way). Each step copies one pair of streamed tiles
// and adds its gradients into double accumulators, so larger tiles amortize those passes.
// Measured on a 2-core AMD EPYC with AVX-512 (1 MiB L2 per core) on 2026-12-05, fwd + bwd
// through the Python package, b=1, s=2048, non-causal / causal (bench/results/
// cpu_backward_2026-12-05.txt): d=256 (8 heads) tiles of 32 1059 / 524 ms, 64 839 / 419, 128
// 736 / 384; d=128 (16 heads) 64 about 850 / 440, 128 about 730 / 390; d=64 128 and 256 alike. At
// d=256 the working set (Q, dO, K, V tiles, S, dP, the softcap derivative, dK, dV in double and a
// dQ tile) is about 1.6 MiB, past that L2, and still the fastest there. The tile must not depend
// on the thread count: it sets the order of every sum, which the thread count may not change.
int64_t tile_for(const core::AttnShape& p) {
  int64_t longest = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const Seq s = seq_of(p, b);
    longest = std::max({longest, s.sq, s.sk});
  }
  return std::clamp<int64_t>((longest + 31) / 32 * 32, 32, 128);
}

struct Task {
  int64_t b, head, tile;
  int64_t steps;  // (query tile, key tile) steps it runs: its cost
};

// Heaviest tasks first (causal and windowed tiles differ in work): with dynamic hand-out, the last
// tasks to start are then short ones and the threads finish together. The order never changes a
// result, since each task is the only writer of its outputs.
void heaviest_first(std::vector<Task>& tasks) {
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.steps > b.steps; });
}

template <class Acc, class G>
struct Scratch {
  // Q, dO and K, V tiles: each pass keeps one pair transposed (see bwd::TileStep); the one-pass
  // schedule also keeps K row-major (k_rows) and dQ of its task's rows (acc_q, sized per task).
  // The AMX products use the 16-bit rows and packs below instead of the float operand tiles.
  std::vector<Acc> q, dout, k, v, p, dp, deriv, k_rows;
  std::vector<G> acc_k, acc_v, acc_q;
  std::vector<Acc> lse, delta;
  std::vector<int64_t> lo, hi;
  std::vector<uint16_t> pack;  // the AMX products' operands (bwd::TileStep::pack), when they run
  std::vector<uint16_t> q16, dout16, k16, v16;     // the AMX steps' Q, dO, K and V rows
  std::vector<uint16_t> q_rows, do_rows;           // a one-pass task's Q and dO rows, all its query tiles (AMX)
  std::vector<Acc> q_blocks, do_blocks;            // the same for the SIMD products, as [tile][d] tiles
  std::vector<uint32_t> kt_words, vt_words, k_words;  // the key tile's packs
  std::vector<uint32_t> qt_words, dot_words;          // the query tile's (two-pass dQ)

  // amx: the AMX products, which take 16-bit rows and their own packs, not the float Q, dO, K, V;
  // split: an fp16 problem on them, each of those buffers twice the size (bwd::TileStep::split).
  Scratch(int64_t tile, int64_t d, bool amx, bool split)
      : q(when(!amx, tile * d)), dout(when(!amx, tile * d)), k(when(!amx, tile * d)), v(when(!amx, tile * d)),
        p(size_t(tile * tile)), dp(size_t(tile * tile)), deriv(size_t(tile * tile)), k_rows(when(!amx, tile * d)),
        acc_k(size_t(tile * d)), acc_v(size_t(tile * d)), lse(size_t(tile)), delta(size_t(tile)), lo(size_t(tile)),
        hi(size_t(tile)), pack(amx16(amx, split, 2 * tile * std::max(tile, d))), q16(amx16(amx, split, tile * d)),
        dout16(amx16(amx, split, tile * d)), k16(amx16(amx, split, tile * d)), v16(amx16(amx, split, tile * d)),
        kt_words(amx16(amx, split, tile * d / 2)), vt_words(amx16(amx, split, tile * d / 2)),
        k_words(amx16(amx, split, tile * d / 2)), qt_words(amx16(amx, split, tile * d / 2)),
        dot_words(amx16(amx, split, tile * d / 2)) {}

  size_t bytes() const {
    size_t n = sizeof(*this);
    auto add = [&n](const auto&... vs) { ((n += vs.capacity() * sizeof(vs[0])), ...); };
    add(q, dout, k, v, p, dp, deriv, k_rows, acc_k, acc_v, acc_q, lse, delta, lo, hi, pack, q16, dout16, k16, v16,
        q_rows, do_rows, q_blocks, do_blocks, kt_words, vt_words, k_words, qt_words, dot_words);
    return n;
  }

 private:
  static size_t when(bool used, int64_t n) { return used ? size_t(n) : 0; }
  static size_t amx16(bool amx, bool split, int64_t n) { return when(amx, split ? 2 * n : n); }
};

// The workers' scratch of a call, kept for the next (scratch_cache.h): a backward over short
// sequences takes less time than allocating and zeroing it. Measured on a 2-core Sapphire Rapids
// VM (f32, 8 heads, d = 64, causal, two threads, the C++ API in a loop): 84 -> 59 us a call at 16
// tokens, 402 -> 186 at 64.
template <class Acc, class G>
struct BackwardScratch {
  std::tuple<int64_t, int64_t, bool, bool> shape{-1, -1, false, false};  // tile, d, amx, split
  std::vector<Scratch<Acc, G>> workers;

  // At least n workers' scratch of this shape (another shape's is dropped). Each task fills what
  // it reads of its scratch first, so what the last call left is never seen.
  void fit(size_t n, int64_t tile, int64_t d, bool amx, bool split) {
    if (shape != std::make_tuple(tile, d, amx, split)) {
      workers.clear();
      shape = {tile, d, amx, split};
    }
    while (workers.size() < n) workers.emplace_back(tile, d, amx, split);
  }
  size_t bytes() const {
    size_t n = sizeof(*this);
    for (const auto& w : workers) n += w.bytes();
    return n;
  }
};

// G: the gradient accumulators' type (bwd::TileStep): double, or float with the AMX products.
template <class T, class Acc, class G = double>
class Backward {
 public:
  explicit Backward(const core::BackwardParams& p)
      : p_(p), ops_(tile_ops<Acc, G>(p.head_dim)), tile_(tile_for(p)), d_(p.head_dim),
        lse_(size_t(p.heads_q * p.total_q)), delta_(size_t(p.heads_q * p.total_q)) {
    int64_t longest_q = 0;
    for (int64_t b = 0; b < p.batch; ++b) {
      const Seq s = seq_of(p, b);
      const core::MaskSpec mask = mask_of(s);
      longest_q = std::max(longest_q, s.sq);
      for (int64_t t = 0; t * tile_ < s.sq; ++t) {
        const core::TileRange r = core::tile_range(mask, t * tile_, std::min(s.sq, (t + 1) * tile_), tile_);
        for (int64_t h = 0; h < p.heads_q; ++h) row_tasks_.push_back({b, h, t, r.n_end - r.n_begin});
      }
      int64_t pair_steps = 0;  // tile pairs of one KV head of this sequence (the same for each)
      for (int64_t t = 0; t * tile_ < s.sk; ++t) {
        const auto [m_begin, m_end] = query_tiles_seeing(mask, t * tile_, std::min(s.sk, (t + 1) * tile_));
        pair_steps += (m_end - m_begin) * p.group();
        for (int64_t h = 0; h < p.heads_kv; ++h) key_tasks_.push_back({b, h, t, (m_end - m_begin) * p.group()});
      }
      if (s.sq > 0 || s.sk > 0)
        for (int64_t h = 0; h < p.heads_kv; ++h) pair_tasks_.push_back({b, h, 0, pair_steps});
    }
    heaviest_first(row_tasks_);
    heaviest_first(key_tasks_);
    heaviest_first(pair_tasks_);
    // One pass with a single worker, or when the pairs give every worker four tasks (the heaviest
    // first, so that they end together), and a task's dQ accumulator within kMaxDqBytes.
    const int64_t pairs = p.batch * p.heads_kv, workers = workers_for(pairs, p.num_threads);
    const int64_t dq_bytes = p.group() * ((longest_q + tile_ - 1) / tile_) * tile_ * d_ * int64_t(sizeof(G));
    one_pass_ = (workers == 1 || pairs >= 4 * workers) && dq_bytes <= kMaxDqBytes;
    const int64_t most =
        one_pass_ ? int64_t(pair_tasks_.size()) : std::max<int64_t>(row_tasks_.size(), key_tasks_.size());
    scratch_->fit(size_t(workers_for(most, p.num_threads)), tile_, d_, kAmx, kSplit);
    step_.bm = step_.bn = tile_;
    step_.d = d_;
    step_.split = kSplit;
    step_.score_mul = p.softcap > 0.f ? Acc(p.scale) / Acc(p.softcap) : Acc(p.scale);
    step_.softcap = Acc(p.softcap);
  }

  void run() {
    if (one_pass_) {
      parallel_for(int64_t(pair_tasks_.size()), p_.num_threads, [&](int64_t i, int worker) {
        pair_task(pair_tasks_[size_t(i)], scratch_->workers[size_t(worker)]);
      });
      return;
    }
    parallel_for(int64_t(row_tasks_.size()), p_.num_threads,
                 [&](int64_t i, int worker) { dq_task(row_tasks_[size_t(i)], scratch_->workers[size_t(worker)]); });
    parallel_for(int64_t(key_tasks_.size()), p_.num_threads,
                 [&](int64_t i, int worker) { dkdv_task(key_tasks_[size_t(i)], scratch_->workers[size_t(worker)]); });
  }

 private:
  core::MaskSpec mask_of(const Seq& s) const { return {s.sq, s.sk, p_.window_left, p_.window_right}; }

  // Query tiles [begin, end) holding the rows that may see a key of [c0, c1).
  std::pair<int64_t, int64_t> query_tiles_seeing(const core::MaskSpec& mask, int64_t c0, int64_t c1) const {
    int64_t first = 0, last = 0;
    mask.rows_seeing(c0, c1, &first, &last);
    return {first / tile_, (last + tile_ - 1) / tile_};
  }

  // A step over the worker's tiles, in the layout of the pass (see bwd::TileStep); the caller
  // fills in the key tile's position and mask flag.
  bwd::TileStep<Acc, G> step_for(Scratch<Acc, G>& w, bool dq_pass) const {
    bwd::TileStep<Acc, G> st = step_;
    if (dq_pass) {
      st.qt = w.q.data();
      st.dot = w.dout.data();
      st.k = w.k.data();
      st.v = w.v.data();
      st.dq = w.acc_k.data();
    } else {
      st.q = w.q.data();
      st.dout = w.dout.data();
      st.kt = w.k.data();
      st.vt = w.v.data();
      st.dk = w.acc_k.data();
      st.dv = w.acc_v.data();
    }
    st.lse = w.lse.data();
    st.delta = w.delta.data();
    st.lo = w.lo.data();
    st.hi = w.hi.data();
    st.p = w.p.data();
    st.dp = w.dp.data();
    st.deriv = w.deriv.data();
    st.pack = w.pack.data();
    st.q16 = w.q16.data();
    st.dout16 = w.dout16.data();
    st.k16 = w.k16.data();
    st.v16 = w.v16.data();
    st.kt_words = w.kt_words.data();
    st.vt_words = w.vt_words.data();
    st.k_words = w.k_words.data();
    st.qt_words = w.qt_words.data();
    st.dot_words = w.dot_words.data();
    return st;
  }

  // Rows [tok0, tok0 + rows) of head h of two tensors (Q and dO, or K and V) into dst_x and dst_y,
  // transposed when the task owns them and row-major when they stream (see bwd::TileStep). With
  // the AMX products they go as the 16-bit rows they are into dst_x16 and dst_y16 instead (the
  // steps and the tile hooks pack what they need from those).
  void load_pair(Acc* dst_x, uint16_t* dst_x16, const void* x, const core::Strides& xs, Acc* dst_y,
                 uint16_t* dst_y16, const void* y, const core::Strides& ys, int64_t b, int64_t tok0, int64_t rows,
                 int64_t h, bool transposed) const {
    if constexpr (kAmx) {
      copy_rows16(dst_x16, x, xs, b, tok0, rows, h);
      copy_rows16(dst_y16, y, ys, b, tok0, rows, h);
    } else if (transposed) {
      load_tile_transposed<T>(dst_x, tile_, x, xs, b, tok0, rows, h, d_);
      load_tile_transposed<T>(dst_y, tile_, y, ys, b, tok0, rows, h, d_);
    } else {
      load_tile<T>(dst_x, tile_, x, xs, b, tok0, rows, h, d_);
      load_tile<T>(dst_y, tile_, y, ys, b, tok0, rows, h, d_);
    }
  }

  // Rows [tok0, tok0 + rows) of head h of a 16-bit tensor into dst [tile][d]: bf16 rows as they
  // are; fp16 rows as their bf16 hi halves, with the lo halves in dst's second [tile][d] (kSplit).
  // The padding rows zero.
  void copy_rows16(uint16_t* dst, const void* src, const core::Strides& st, int64_t b, int64_t tok0, int64_t rows,
                   int64_t h) const {
    const auto* base = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < rows; ++i) {
      const uint16_t* row = base + st.offset(b, tok0 + i, h);
      if constexpr (kSplit) {
#if defined(__x86_64__)
        amx_kernels().split_f16(row, d_, dst + i * d_, dst + (tile_ + i) * d_);
#endif
      } else {
        std::memcpy(dst + i * d_, row, size_t(d_) * 2);
      }
    }
    std::fill(dst + rows * d_, dst + tile_ * d_, uint16_t(0));
    if constexpr (kSplit) std::fill(dst + (tile_ + rows) * d_, dst + 2 * tile_ * d_, uint16_t(0));
  }

  // Q and dO of query rows [r0, r0 + rows) of head h (owned by dq tasks), and each row's visible
  // key range.
  void load_query_tile(const Seq& s, int64_t b, int64_t h, int64_t r0, int64_t rows, bool transposed,
                       Scratch<Acc, G>& w) const {
    load_pair(w.q.data(), w.q16.data(), p_.q, p_.q_s, w.dout.data(), w.dout16.data(), p_.dout, p_.do_s, b,
              s.q_tok0 + r0, rows, h, transposed);
    row_ranges(s, r0, w);
  }

  // The visible key range of each row of the query tile at r0.
  void row_ranges(const Seq& s, int64_t r0, Scratch<Acc, G>& w) const {
    const core::MaskSpec mask = mask_of(s);
    for (int64_t i = 0; i < tile_; ++i) {
      w.lo[size_t(i)] = mask.lo(r0 + i);
      w.hi[size_t(i)] = mask.hi(r0 + i);
    }
  }

  // K and V of keys [c0, c0 + cols) of KV head hk (owned by dk/dv tasks).
  void load_key_tile(const Seq& s, int64_t b, int64_t hk, int64_t c0, int64_t cols, bool transposed,
                     Scratch<Acc, G>& w) const {
    load_pair(w.k.data(), w.k16.data(), p_.k, p_.k_s, w.v.data(), w.v16.data(), p_.v, p_.v_s, b, s.k_tok0 + c0,
              cols, hk, transposed);
  }

  // Pass 1: the row statistics of one query tile, then its dQ over the key tiles it sees.
  void dq_task(const Task& t, Scratch<Acc, G>& w) {
    const Seq s = seq_of(p_, t.b);
    const int64_t r0 = t.tile * tile_, rows = std::min(tile_, s.sq - r0), hk = t.head / p_.group();
    load_query_tile(s, t.b, t.head, r0, rows, true, w);
    for (int64_t i = 0; i < rows; ++i) row_statistics(s, t.b, t.head, r0 + i);
    tile_statistics(s, t.head, r0, rows, w);
    std::fill(w.acc_k.begin(), w.acc_k.end(), G(0));
    bwd::TileStep<Acc, G> st = step_for(w, true);
    if constexpr (kAmx) ops_.query_tile(st);
    const core::TileRange range = core::tile_range(mask_of(s), r0, r0 + rows, tile_);
    for (int64_t n = range.n_begin; n < range.n_end; ++n) {
      load_key_tile(s, t.b, hk, n * tile_, std::min(tile_, s.sk - n * tile_), false, w);
      st.n0 = n * tile_;
      st.masked = range.needs_mask(n);
      ops_.dq(st);
    }
    store_tile<T>(p_.dq, p_.dq_s, t.b, s.q_tok0 + r0, rows, t.head, d_, w.acc_k.data(), G(p_.scale));
  }

  // Pass 2: dK and dV of one key tile, summed over every query head of its group and every query
  // tile that sees it.
  void dkdv_task(const Task& t, Scratch<Acc, G>& w) {
    const Seq s = seq_of(p_, t.b);
    const int64_t c0 = t.tile * tile_, cols = std::min(tile_, s.sk - c0);
    const core::MaskSpec mask = mask_of(s);
    load_key_tile(s, t.b, t.head, c0, cols, true, w);
    std::fill(w.acc_k.begin(), w.acc_k.end(), G(0));
    std::fill(w.acc_v.begin(), w.acc_v.end(), G(0));
    bwd::TileStep<Acc, G> st = step_for(w, false);
    if constexpr (kAmx) ops_.key_tile(st);
    st.n0 = c0;
    const auto [m_begin, m_end] = query_tiles_seeing(mask, c0, c0 + cols);
    for (int64_t h = t.head * p_.group(); h < (t.head + 1) * p_.group(); ++h) {
      for (int64_t m = m_begin; m < m_end; ++m) {
        const int64_t r0 = m * tile_, rows = std::min(tile_, s.sq - r0);
        const core::TileRange range = core::tile_range(mask, r0, r0 + rows, tile_);
        if (t.tile < range.n_begin || t.tile >= range.n_end) continue;  // its rows all see nothing
        load_query_tile(s, t.b, h, r0, rows, false, w);
        tile_statistics(s, h, r0, rows, w);
        st.masked = range.needs_mask(t.tile);
        ops_.dkdv(st);
      }
    }
    store_tile<T>(p_.dk, p_.dk_s, t.b, s.k_tok0 + c0, cols, t.head, d_, w.acc_k.data(), G(p_.scale));
    store_tile<T>(p_.dv, p_.dv_s, t.b, s.k_tok0 + c0, cols, t.head, d_, w.acc_v.data(), G(1));
  }

  // The one-pass schedule's task: every gradient of one (batch, KV head) pair. The row statistics
  // of its query heads first, then per key tile (in order) each query head and tile that sees it:
  // dK, dV of the key tile and dQ of the query tile from one S, P, dP, dS.
  void pair_task(const Task& t, Scratch<Acc, G>& w) {
    const Seq s = seq_of(p_, t.b);
    const core::MaskSpec mask = mask_of(s);
    const int64_t q_tiles = (s.sq + tile_ - 1) / tile_, per_head = q_tiles * tile_ * d_;
    const int64_t h0 = t.head * p_.group();
    for (int64_t h = h0; h < h0 + p_.group(); ++h)
      for (int64_t r = 0; r < s.sq; ++r) row_statistics(s, t.b, h, r);
    w.acc_q.assign(size_t(p_.group() * per_head), G(0));
    bwd::TileStep<Acc, G> st = step_for(w, false);
    st.k = w.k_rows.data();
    // Q and dO of every query tile of the group in the steps' operand form, made once here instead
    // of at every step (each query tile meets every key tile it sees), within the dQ accumulator's
    // bound: the AMX steps' 16-bit rows (splitting fp16 rows into halves at each meeting took 15% of
    // an fp16 backward), or the SIMD steps' tiles of Acc (copied at every step, they took 7% of an
    // f32 backward, s = 2048, d = 128).
    const int64_t block = tile_ * d_ * (kAmx && kSplit ? 2 : 1);
    const int64_t elem_bytes = kAmx ? int64_t(sizeof(uint16_t)) : int64_t(sizeof(Acc));
    const bool tiles_once = 2 * p_.group() * q_tiles * block * elem_bytes <= kMaxDqBytes;
    if (tiles_once) {
      const size_t n = size_t(p_.group() * q_tiles * block);
      if constexpr (kAmx) {
        w.q_rows.resize(n);
        w.do_rows.resize(n);
      } else {
        w.q_blocks.resize(n);
        w.do_blocks.resize(n);
      }
      for (int64_t h = h0; h < h0 + p_.group(); ++h)
        for (int64_t m = 0; m < q_tiles; ++m) {
          const int64_t at = ((h - h0) * q_tiles + m) * block, r0 = m * tile_, rows = std::min(tile_, s.sq - r0);
          if constexpr (kAmx) {
            copy_rows16(w.q_rows.data() + at, p_.q, p_.q_s, t.b, s.q_tok0 + r0, rows, h);
            copy_rows16(w.do_rows.data() + at, p_.dout, p_.do_s, t.b, s.q_tok0 + r0, rows, h);
          } else {
            load_tile<T>(w.q_blocks.data() + at, tile_, p_.q, p_.q_s, t.b, s.q_tok0 + r0, rows, h, d_);
            load_tile<T>(w.do_blocks.data() + at, tile_, p_.dout, p_.do_s, t.b, s.q_tok0 + r0, rows, h, d_);
          }
        }
    }
    for (int64_t c0 = 0; c0 < s.sk; c0 += tile_) {
      const int64_t cols = std::min(tile_, s.sk - c0), n = c0 / tile_;
      load_key_tile(s, t.b, t.head, c0, cols, true, w);
      if constexpr (kAmx) ops_.key_tile(st);
      else load_tile<T>(w.k_rows.data(), tile_, p_.k, p_.k_s, t.b, s.k_tok0 + c0, cols, t.head, d_);
      std::fill(w.acc_k.begin(), w.acc_k.end(), G(0));
      std::fill(w.acc_v.begin(), w.acc_v.end(), G(0));
      st.n0 = c0;
      const auto [m_begin, m_end] = query_tiles_seeing(mask, c0, c0 + cols);
      for (int64_t h = h0; h < h0 + p_.group(); ++h)
        for (int64_t m = m_begin; m < m_end; ++m) {
          const int64_t r0 = m * tile_, rows = std::min(tile_, s.sq - r0);
          const core::TileRange range = core::tile_range(mask, r0, r0 + rows, tile_);
          if (n < range.n_begin || n >= range.n_end) continue;
          if (tiles_once) {
            const int64_t at = ((h - h0) * q_tiles + m) * block;
            if constexpr (kAmx) {
              st.q16 = w.q_rows.data() + at;
              st.dout16 = w.do_rows.data() + at;
            } else {
              st.q = w.q_blocks.data() + at;
              st.dout = w.do_blocks.data() + at;
            }
            row_ranges(s, r0, w);
          } else {
            load_query_tile(s, t.b, h, r0, rows, false, w);
          }
          tile_statistics(s, h, r0, rows, w);
          st.masked = range.needs_mask(n);
          st.dq = w.acc_q.data() + (h - h0) * per_head + r0 * d_;
          ops_.fused(st);
        }
      store_tile<T>(p_.dk, p_.dk_s, t.b, s.k_tok0 + c0, cols, t.head, d_, w.acc_k.data(), G(p_.scale));
      store_tile<T>(p_.dv, p_.dv_s, t.b, s.k_tok0 + c0, cols, t.head, d_, w.acc_v.data(), G(1));
    }
    for (int64_t h = h0; h < h0 + p_.group(); ++h)
      for (int64_t r0 = 0; r0 < s.sq; r0 += tile_)
        store_tile<T>(p_.dq, p_.dq_s, t.b, s.q_tok0 + r0, std::min(tile_, s.sq - r0), h, d_,
                      w.acc_q.data() + (h - h0) * per_head + r0 * d_, G(p_.scale));
  }

  // D = rowsum(dO o O) and the lse to use of one row, into the shared buffers. A row whose lse is
  // -inf saw no key: lse = +inf instead makes every P of it exp(-inf) = 0 and D = 0, so it
  // contributes nothing and its gradients are exactly zero (tile_statistics gives padding rows the
  // same).
  void row_statistics(const Seq& s, int64_t b, int64_t h, int64_t r) {
    const T* out = static_cast<const T*>(p_.out);
    const T* dout = static_cast<const T*>(p_.dout);
    const Acc given = static_cast<const Acc*>(p_.lse)[p_.lse_s.offset(b, s.q_tok0 + r, h)];
    constexpr Acc kInf = std::numeric_limits<Acc>::infinity();
    Acc l = kInf, delta = 0;
    if (given != -kInf) {
      const T* o = out + p_.o_s.offset(b, s.q_tok0 + r, h);
      const T* g = dout + p_.do_s.offset(b, s.q_tok0 + r, h);
      // Eight running sums (d is a multiple of 8), so that the products run in vectors: one chain
      // of dependent additions per row took a tenth of an f32 backward over 64 tokens.
      Acc part[8] = {};
      for (int64_t x = 0; x < d_; x += 8)
        for (int j = 0; j < 8; ++j) part[j] += load_acc<Acc>(g + x + j) * load_acc<Acc>(o + x + j);
      delta = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
      l = given;
    }
    lse_[size_t(h * p_.total_q + s.q_row0 + r)] = l;
    delta_[size_t(h * p_.total_q + s.q_row0 + r)] = delta;
  }

  // A query tile's lse and D from the shared buffers into w (padding rows: +inf and 0).
  void tile_statistics(const Seq& s, int64_t h, int64_t r0, int64_t rows, Scratch<Acc, G>& w) const {
    for (int64_t i = 0; i < tile_; ++i) {
      const bool real = i < rows;
      const size_t at = size_t(h * p_.total_q + s.q_row0 + r0 + i);
      w.lse[size_t(i)] = real ? lse_[at] : std::numeric_limits<Acc>::infinity();
      w.delta[size_t(i)] = real ? delta_[at] : Acc(0);
    }
  }

  static constexpr int64_t kMaxDqBytes = int64_t(64) << 20;
  static constexpr bool kAmx = std::is_same_v<G, float>;  // the AMX products (tile_ops)
  static constexpr bool kSplit = kAmx && std::is_same_v<T, core::half_t>;  // fp16 on them: hi and lo halves

  const core::BackwardParams& p_;
  const bwd::TileOps<Acc, G> ops_;
  const int64_t tile_, d_;
  std::vector<Acc> lse_, delta_;  // [heads_q][total_q]: each row's, written before any step reads it
  std::vector<Task> row_tasks_, key_tasks_;
  bool one_pass_ = false;
  std::vector<Task> pair_tasks_;  // the one-pass schedule's tasks: (batch, KV head)
  KeptScratch<BackwardScratch<Acc, G>> scratch_;
  bwd::TileStep<Acc, G> step_;  // the shape and score constants shared by every step
};

}  // namespace

void backward(const core::BackwardParams& p) {
  switch (p.dtype) {
    case DType::f16:
      if (amx_products(p.head_dim, p.dtype)) Backward<core::half_t, float, float>(p).run();
      else Backward<core::half_t, float>(p).run();
      break;
    case DType::bf16:
      if (amx_products(p.head_dim, p.dtype)) Backward<core::bfloat16_t, float, float>(p).run();
      else Backward<core::bfloat16_t, float>(p).run();
      break;
    case DType::f32: Backward<float, float>(p).run(); break;
    case DType::f64: Backward<double, double>(p).run(); break;
    default: throw Error(Status::internal, "backward: unexpected dtype");
  }
}

}  // namespace flashattn::cpu
