// The naive reference: standard attention that builds S and P, for tests and `--verify` only (it
// is a separate library, never linked into a production path). It implements the documented
// semantics directly (its own mask formula, its own softmax), sharing no code with the engines
// beyond validation, so that an engine bug cannot hide in a shared helper.
//
// Inputs are host tensors of any supported dtype, read as stored. Results are dense and in the
// logical order of the corresponding tensor: out like q ([batch, seqlen_q, heads_q, d] or
// [total_q, heads_q, d]), lse like the API's lse ([batch, heads_q, seqlen_q] or [heads_q, total_q]),
// dq/dk/dv like q/k/v.
#pragma once

#include <vector>

#include "flashattn/flashattn.hpp"

namespace flashattn::reference {

enum class Precision {
  f64,         // every step in double: the ground truth
  same_as_input  // a plain implementation in the input's precision: S, P and O rounded to the input
                 // dtype after each step, fp32 accumulation (fp64 for f64 inputs) rounded after every
                 // add (what the accuracy rule compares with)
};

struct Output {
  std::vector<double> out, lse;
};

struct Grads {
  std::vector<double> dq, dk, dv;
};

Output forward(const ForwardArgs& a, Precision precision = Precision::f64);
// dq, dk, dv of sum(dout * out) with out the standard attention of q, k, v (it ignores a.out and
// a.lse and recomputes everything in double).
Grads backward(const BackwardArgs& a, Precision precision = Precision::f64);
// Decode against the cache as it is before the call (k_new/v_new are read from their tensors, the
// cache is never written).
Output decode(const DecodeArgs& a, Precision precision = Precision::f64);

// Reads element `offset` (in elements) of a host buffer of dtype t.
double load(const void* data, DType t, int64_t offset);

}  // namespace flashattn::reference
