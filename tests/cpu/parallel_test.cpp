// The CPU engine's work sharing (src/cpu/parallel.cpp): every task runs once with a worker id in
// range, from one caller, nested callers, concurrent callers and a forked child; errors surface.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cpu/parallel.h"

namespace fa_test {
namespace {

using flashattn::cpu::parallel_for;
using flashattn::cpu::workers_for;

// Runs n tasks on `threads` and checks each ran exactly once, with a worker id in range.
bool covers(int64_t n, int threads) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  const int workers = workers_for(n, threads);
  std::atomic<bool> ids_ok{true};
  parallel_for(n, threads, [&](int64_t task, int worker) {
    hits[size_t(task)].fetch_add(1);
    if (worker < 0 || worker >= workers) ids_ok = false;
  });
  for (auto& h : hits)
    if (h.load() != 1) return false;
  return ids_ok.load();
}

TEST(Parallel, EveryTaskOnceWithWorkerIdsInRange) {
  for (int threads : {0, 1, 2, 3, 8})
    for (int64_t n : {1, 2, 7, 1000}) EXPECT_TRUE(covers(n, threads)) << "threads " << threads << " n " << n;
}

TEST(Parallel, RepeatedCallsReuseThePool) {
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(covers(64, 0)) << "call " << i;
}

TEST(Parallel, NestedCallsComplete) {
  std::atomic<int64_t> inner{0};
  parallel_for(8, 4, [&](int64_t, int) { parallel_for(16, 4, [&](int64_t, int) { inner.fetch_add(1); }); });
  EXPECT_EQ(inner.load(), 8 * 16);
}

TEST(Parallel, ConcurrentCallersEachGetTheirTasks) {
  std::vector<std::thread> callers;
  std::atomic<int> ok{0};
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int i = 0; i < 50; ++i)
        if (!covers(97, 3)) return;
      ok.fetch_add(1);
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(ok.load(), 4);
}

TEST(Parallel, ErrorsAreRethrownAndThePoolStaysUsable) {
  EXPECT_THROW(parallel_for(100, 4,
                            [](int64_t task, int) {
                              if (task == 37) throw std::runtime_error("task 37");
                            }),
               std::runtime_error);
  EXPECT_TRUE(covers(100, 4));
}

TEST(Parallel, WorksInAForkedChild) {
  ASSERT_TRUE(covers(64, 0));  // the parent's pool exists before the fork
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(20);  // a child stuck waiting for the parent's (absent) threads dies instead of hanging
    _exit(covers(64, 0) && covers(1000, 4) ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

}  // namespace
}  // namespace fa_test
