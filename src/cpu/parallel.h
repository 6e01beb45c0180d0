// Work sharing for the CPU engine. Tasks are handed out dynamically, but every task writes only
// its own outputs, so results never depend on the schedule (the engine is deterministic).
#pragma once

#include <cstdint>
#include <functional>

namespace flashattn::cpu {

int default_threads();  // cores this process may run on

// Runs fn(task, worker) for task in [0, n) on up to `threads` threads (0 = default_threads()).
// worker is in [0, threads) and lets a task use per-worker scratch space. The calling thread works
// too. Exceptions thrown by fn are rethrown here (the first one).
void parallel_for(int64_t n, int threads, const std::function<void(int64_t task, int worker)>& fn);

// The number of workers parallel_for(n, threads, ...) will use.
int workers_for(int64_t n, int threads);

}  // namespace flashattn::cpu
