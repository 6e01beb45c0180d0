// The machinery of the argument fuzzer's cases (tests/fuzz/arg_fuzz.cpp builds the cases of each
// operation): a case's tensors and what was done to them, the mutations, and `conclude`, which
// allocates every buffer, runs the reference and the call (on the CPU, or on device copies of the
// buffers), and checks the API's promises.
#pragma once

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "fuzz_tensors.h"

namespace fa_fuzz {

extern bool g_on_gpu;  // this case's call gets device copies of its buffers (run_case)

// Writes x as element `off` of the view's buffer, in its dtype.
void store(TensorView& v, int64_t off, double x);

// One case: its tensors, the options the mutations may spoil, and what the mutations did.
struct Case {
  std::vector<Tensor> tensors;
  flashattn::AttnOptions* options = nullptr;
  int32_t* num_splits = nullptr;
  bool attention_options = true;  // merge_states reads only num_threads and stream
  int mutations = 0;
  std::string log;  // the mutations, for a failure's message

  Tensor& add(const char* name, Role role, TensorView& view, std::vector<int32_t> ints = {}) {
    tensors.push_back({});
    Tensor& t = tensors.back();
    t.name = name;
    t.role = role;
    t.view = &view;
    t.ints = std::move(ints);
    return t;
  }
  std::vector<Tensor*> present() {
    std::vector<Tensor*> r;
    for (Tensor& t : tensors)
      if (t.view->rank != 0) r.push_back(&t);
    return r;
  }
  void note(const std::string& what) {
    log += (log.empty() ? "" : "; ") + what;
    ++mutations;
  }
};

// What an operation gives `conclude`: `validate` (for views too large to allocate), `prepare` (sets
// contents that depend on other tensors: a backward's out and lse, the cache slots no sequence
// holds), `reference` (runs before the call: an append changes the cache), `call` (the engine),
// `check` (an accepted call's results) and `expected_inout` (what the bytes of a read-and-written
// tensor must be after an accepted call).
struct Run {
  std::function<void()> validate, prepare, reference, call;
  std::function<std::string()> check;
  std::function<void(Tensor&, std::vector<unsigned char>&)> expected_inout;
};

void gen_options(ByteSource& in, flashattn::AttnOptions& o);
// One mutation of the views, the index contents or the options (before the buffers exist).
void mutate_views(ByteSource& in, Case& c);
// How many mutations a case gets: none for half of them, else one to three.
int mutation_count(ByteSource& in);
// Allocates every buffer (or only validates, for views too large), applies the pointer mutations,
// runs the reference and the call, and returns what broke the API's promises ("" if nothing).
std::string conclude(ByteSource& in, Case& c, const std::string& op, const Run& run, std::mt19937& rng);

}  // namespace fa_fuzz
