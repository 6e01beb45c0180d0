// Ring attention (context parallelism) played out on one machine through the public API, shared by
// the CPU and GPU suites (tests/cpu/ring_attention_test.cpp, tests/gpu/ring_attention_test.cpp).
// The sequence is cut into equal chunks, one per rank, as the GPUs of a ring would hold it. Rank
// i's queries meet every key chunk in turn: `forward` on the pair, `merge_states` into the rank's
// running (out, lse), which starts empty (lse = -inf, weighing nothing); then `backward` on each
// pair with the rank's merged out and lse, which makes the pair's gradients its share of the full
// softmax's: dq summed over key chunks, dk and dv over query chunks. Causal alignment per pair: a
// key chunk before the query chunk is fully visible, the chunk itself is causal (equal lengths,
// so bottom-right alignment is the diagonal), a later one is skipped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "reference/reference.h"
#include "test_util.h"

namespace fa_test::ring {

inline flashattn::DType lse_dtype(flashattn::DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

struct Ring {
  int64_t batch, ranks, chunk, heads_q, heads_kv, d;
  int64_t seqlen() const { return ranks * chunk; }
  int64_t rows() const { return batch * chunk * heads_q; }  // query rows of one rank
};

// The whole problem's inputs, q, k, v and dout [batch, seqlen, heads, d], of normal values.
struct Inputs {
  HostTensor q, k, v, dout;
  Inputs(DType t, const Ring& r, uint32_t seed)
      : q(t, {r.batch, r.seqlen(), r.heads_q, r.d}),
        k(t, {r.batch, r.seqlen(), r.heads_kv, r.d}),
        v(t, {r.batch, r.seqlen(), r.heads_kv, r.d}),
        dout(t, {r.batch, r.seqlen(), r.heads_q, r.d}) {
    std::mt19937 rng(seed);
    for (HostTensor* x : {&q, &k, &v, &dout}) x->fill_normal(rng);
  }
};

// Tokens [start, start + len) of a [batch, seqlen, heads, d] view: the same strides, fewer tokens.
inline TensorView tokens(const TensorView& v, int64_t start, int64_t len) {
  TensorView s = v;
  s.shape[1] = len;
  s.data = static_cast<unsigned char*>(v.data) + start * v.stride[1] * flashattn::dtype_size(v.dtype);
  return s;
}

// Whether rank i's queries see key chunk j, and the options of that pair.
inline bool sees(bool causal, int64_t i, int64_t j) { return !causal || j <= i; }
inline flashattn::AttnOptions pair_options(flashattn::AttnOptions base, bool causal, int64_t i, int64_t j) {
  base.causal = causal && i == j;
  return base;
}

// The key chunk rank i receives at ring step `step` (its own first, then round the ring).
inline int64_t chunk_at(const Ring& r, int64_t i, int64_t step) { return (i - step + r.ranks) % r.ranks; }

// One rank's running state in merge_states' layouts: o [2, tokens, heads_q, d], lse [2, tokens,
// heads_q], tokens = batch * chunk. Part 0 is what is merged so far (empty at first), part 1 the
// pair just computed; the merge writes `merged`, which then becomes part 0 (merge_states may not
// write over its inputs).
struct State {
  HostTensor o, lse, merged, merged_lse;
  State(DType t, const Ring& r)
      : o(t, {2, r.batch * r.chunk, r.heads_q, r.d}),
        lse(lse_dtype(t), {2, r.batch * r.chunk, r.heads_q}),
        merged(t, {r.batch * r.chunk, r.heads_q, r.d}),
        merged_lse(lse_dtype(t), {r.batch * r.chunk, r.heads_q}) {
    for (int64_t i = 0; i < 2 * r.rows(); ++i) lse.set(i, -std::numeric_limits<double>::infinity());
    for (int64_t i = 0; i < 2 * r.rows() * r.d; ++i) o.set(i, 0.0);
  }
};

// Part `part` of a state's o (lse) buffer, on whatever device it lives, as forward's out [batch,
// chunk, heads_q, d] (lse [batch, heads_q, chunk], a strided view).
inline TensorView part_out(const TensorView& o, int part, const Ring& r) {
  TensorView v = o;
  v.data = static_cast<unsigned char*>(o.data) + part * r.rows() * r.d * flashattn::dtype_size(o.dtype);
  v.rank = 4;
  const int64_t shape[4] = {r.batch, r.chunk, r.heads_q, r.d};
  const int64_t stride[4] = {r.chunk * r.heads_q * r.d, r.heads_q * r.d, r.d, 1};
  for (int i = 0; i < 4; ++i) v.shape[i] = shape[i], v.stride[i] = stride[i];
  return v;
}
inline TensorView part_lse(const TensorView& lse, int part, const Ring& r) {
  TensorView v = lse;
  v.data = static_cast<unsigned char*>(lse.data) + part * r.rows() * flashattn::dtype_size(lse.dtype);
  v.rank = 3;
  const int64_t shape[3] = {r.batch, r.heads_q, r.chunk};
  const int64_t stride[3] = {r.chunk * r.heads_q, 1, r.heads_q};
  for (int i = 0; i < 3; ++i) v.shape[i] = shape[i], v.stride[i] = stride[i];
  return v;
}

// A state's buffers as views, on whatever device they live.
struct StateViews {
  TensorView o, lse, merged, merged_lse;
};

// The ring's forward over q, k, v [batch, seqlen, heads, d] (views on any device): rank i takes the
// key chunks in ring order, each pair's (out, lse) into part 1 of its state and merged into part 0.
// copy(dst, src, bytes) copies memory on the tensors' device.
template <class Copy>
void run_forward(const Ring& r, bool causal, flashattn::AttnOptions opts, const TensorView& q, const TensorView& k,
                 const TensorView& v, const std::vector<StateViews>& state, Copy&& copy) {
  for (int64_t i = 0; i < r.ranks; ++i)
    for (int64_t step = 0; step < r.ranks; ++step) {
      const int64_t j = chunk_at(r, i, step);
      if (!sees(causal, i, j)) continue;
      const StateViews& st = state[size_t(i)];
      flashattn::ForwardArgs a;
      a.q = tokens(q, i * r.chunk, r.chunk);
      a.k = tokens(k, j * r.chunk, r.chunk);
      a.v = tokens(v, j * r.chunk, r.chunk);
      a.out = part_out(st.o, 1, r);
      a.lse = part_lse(st.lse, 1, r);
      a.options = pair_options(opts, causal, i, j);
      flashattn::forward(a);
      flashattn::MergeArgs m;
      m.o_parts = st.o, m.lse_parts = st.lse, m.out = st.merged, m.lse = st.merged_lse, m.options = opts;
      flashattn::merge_states(m);
      copy(st.o.data, st.merged.data, size_t(r.rows() * r.d * flashattn::dtype_size(st.o.dtype)));
      copy(st.lse.data, st.merged_lse.data, size_t(r.rows() * flashattn::dtype_size(st.lse.dtype)));
    }
}

// The ring's backward: the arguments of every pair that has work (rank i's queries, key chunk j,
// the rank's merged out and lse), handed to pair(i, j, args), which sets dq, dk, dv, calls
// flashattn::backward and adds the chunks' gradients up.
template <class Pair>
void for_each_backward_pair(const Ring& r, bool causal, flashattn::AttnOptions opts, const TensorView& q,
                            const TensorView& k, const TensorView& v, const TensorView& dout,
                            const std::vector<StateViews>& state, Pair&& pair) {
  for (int64_t i = 0; i < r.ranks; ++i)
    for (int64_t j = 0; j < r.ranks; ++j) {
      if (!sees(causal, i, j)) continue;
      flashattn::BackwardArgs a;
      a.dout = tokens(dout, i * r.chunk, r.chunk);
      a.q = tokens(q, i * r.chunk, r.chunk);
      a.k = tokens(k, j * r.chunk, r.chunk);
      a.v = tokens(v, j * r.chunk, r.chunk);
      a.out = part_out(state[size_t(i)].o, 0, r);
      a.lse = part_lse(state[size_t(i)].lse, 0, r);
      a.options = pair_options(opts, causal, i, j);
      pair(i, j, a);
    }
}

// Rank i's out and lse (the values of part_out / part_lse of part 0) put where the full problem
// has them: out [batch, seqlen, heads_q, d], lse [batch, heads_q, seqlen].
inline void gather(const Ring& r, int64_t i, const std::vector<double>& o, const std::vector<double>& l,
                   std::vector<double>& out, std::vector<double>& lse) {
  const int64_t s = r.seqlen();
  for (int64_t b = 0; b < r.batch; ++b)
    for (int64_t x = 0; x < r.chunk; ++x)
      for (int64_t h = 0; h < r.heads_q; ++h) {
        for (int64_t c = 0; c < r.d; ++c)
          out[size_t(((b * s + i * r.chunk + x) * r.heads_q + h) * r.d + c)] =
              o[size_t(((b * r.chunk + x) * r.heads_q + h) * r.d + c)];
        lse[size_t((b * r.heads_q + h) * s + i * r.chunk + x)] = l[size_t((b * r.heads_q + h) * r.chunk + x)];
      }
}

// Adds a chunk's gradient [batch, chunk, heads, d] into the full one's [batch, seqlen, heads, d]
// at token `start`.
inline void add_chunk(const Ring& r, std::vector<double>& into, const std::vector<double>& part, int64_t start,
                      int64_t heads) {
  for (int64_t b = 0; b < r.batch; ++b)
    for (int64_t y = 0; y < r.chunk; ++y)
      for (int64_t e = 0; e < heads * r.d; ++e)
        into[size_t(((b * r.seqlen() + start + y) * heads) * r.d + e)] +=
            part[size_t(((b * r.chunk + y) * heads) * r.d + e)];
}

// The full problem (host tensors): fp64 truth and the plain same-precision implementation that the
// accuracy rule compares with, outputs and gradients.
struct Full {
  flashattn::reference::Output ref, plain;
  flashattn::reference::Grads gref, gplain;
};
inline Full full_problem(const Ring& r, const Inputs& in, flashattn::AttnOptions opts) {
  const HostTensor &q = in.q, &k = in.k, &v = in.v, &dout = in.dout;
  namespace reference = flashattn::reference;
  const DType t = q.view.dtype;
  const int64_t s = r.seqlen();
  // The reference recomputes everything; out, lse and the gradients are there for validation only.
  HostTensor out(t, {r.batch, s, r.heads_q, r.d}), lse(lse_dtype(t), {r.batch, r.heads_q, s}),
      dq(t, {r.batch, s, r.heads_q, r.d}), dk(t, {r.batch, s, r.heads_kv, r.d}), dv(t, {r.batch, s, r.heads_kv, r.d});
  flashattn::ForwardArgs f;
  f.q = q.view, f.k = k.view, f.v = v.view, f.out = out.view, f.options = opts;
  flashattn::BackwardArgs b;
  b.dout = dout.view, b.q = q.view, b.k = k.view, b.v = v.view, b.out = out.view, b.lse = lse.view;
  b.dq = dq.view, b.dk = dk.view, b.dv = dv.view, b.options = opts;
  return {reference::forward(f, reference::Precision::f64), reference::forward(f, reference::Precision::same_as_input),
          reference::backward(b, reference::Precision::f64),
          reference::backward(b, reference::Precision::same_as_input)};
}

}  // namespace fa_test::ring
