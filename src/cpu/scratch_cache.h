// Scratch that outlives a call, for the CPU engine's passes (forward, backward, decode).
//
// A short problem takes microseconds, and allocating its tiles anew each call took longer: glibc
// maps large blocks fresh and unmaps them at free, so every call faulted its pages in again, and
// each unmapping in a process with other running threads interrupts them all to flush their TLBs.
// (Decode, bf16, 32 query heads on 8, d = 128, 16 cached keys, one thread: 129 us a call against
// 19 with the scratch kept; the f32 forward of 8 heads x 16 tokens, d = 64, on two threads: see
// forward.cpp.) A call takes the scratch last given back (or a new one; concurrent calls take
// different ones) and gives it back at the end. All caches together keep up to kKeptBytes: a
// cache gives up its own least recently used scratch to make room, and a scratch that still does
// not fit is freed. S is the pass's scratch type: default-constructible, with bytes() for the
// memory it holds; a call must re-fit what it takes to its own shapes and must not trust anything
// a previous call left in it.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace flashattn::cpu {

// What every cache shares: one lock and the bytes kept by all of them.
struct ScratchBudget {
  static constexpr size_t kKeptBytes = size_t(64) << 20;  // a space of ~1 MB for each of 64 threads
  std::mutex m;
  size_t bytes = 0;
  static ScratchBudget& instance() {
    static ScratchBudget* budget = new ScratchBudget;  // never destroyed: a call may run at exit
    return *budget;
  }
};

template <class S>
class ScratchCache {
 public:
  static ScratchCache& instance() {
    static ScratchCache* cache = new ScratchCache;  // never destroyed, as the budget
    return *cache;
  }
  std::unique_ptr<S> take() {
    ScratchBudget& budget = ScratchBudget::instance();
    std::lock_guard<std::mutex> lock(budget.m);
    if (kept_.empty()) return std::make_unique<S>();
    std::unique_ptr<S> s = std::move(kept_.back().first);
    budget.bytes -= kept_.back().second;
    kept_.pop_back();
    return s;
  }
  void give(std::unique_ptr<S> s) {
    const size_t n = s->bytes();
    std::vector<std::unique_ptr<S>> dropped;  // freed after the lock is released
    ScratchBudget& budget = ScratchBudget::instance();
    std::lock_guard<std::mutex> lock(budget.m);
    while (budget.bytes + n > ScratchBudget::kKeptBytes && !kept_.empty()) {
      budget.bytes -= kept_.front().second;
      dropped.push_back(std::move(kept_.front().first));
      kept_.erase(kept_.begin());
    }
    if (budget.bytes + n > ScratchBudget::kKeptBytes) {
      dropped.push_back(std::move(s));
      return;
    }
    kept_.emplace_back(std::move(s), n);
    budget.bytes += n;
  }

 private:
  std::vector<std::pair<std::unique_ptr<S>, size_t>> kept_;  // under the budget's lock
};

// Takes a scratch from S's cache for the scope and gives it back when the scope ends, also when a
// task throws (a scratch is only ever re-fitted, never trusted, so one left half-used is fine).
template <class S>
class KeptScratch {
 public:
  KeptScratch() : s_(ScratchCache<S>::instance().take()) {}
  ~KeptScratch() { ScratchCache<S>::instance().give(std::move(s_)); }
  KeptScratch(const KeptScratch&) = delete;
  KeptScratch& operator=(const KeptScratch&) = delete;
  S& operator*() const { return *s_; }
  S* operator->() const { return s_.get(); }

 private:
  std::unique_ptr<S> s_;
};

}  // namespace flashattn::cpu
