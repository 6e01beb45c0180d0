#include "cpu/parallel.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace flashattn::cpu {

int default_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

int workers_for(int64_t n, int threads) {
  int t = threads > 0 ? threads : default_threads();
  return int(std::max<int64_t>(1, std::min<int64_t>(t, n)));
}

namespace {

// Set while this thread runs a pool job: a nested parallel_for must not wait for the pool it is
// part of.
thread_local bool t_in_job = false;

// Threads kept waiting between calls: starting a thread costs tens of microseconds, which a decode
// step on many cores would otherwise pay per worker per call. One job runs at a time; a call that
// finds the pool busy (another user thread, or a nested call from inside a job) starts its own
// threads instead, as does one that wants more workers than the pool has.
//
// Between jobs a thread spins for kSpin (spin_while) before it sleeps on the condition variable,
// and a caller waiting for its job's threads spins as long before it sleeps (OpenMP runtimes do
// the same): on a 2-core VM a sleeping thread took tens of microseconds to join a job once the
// caller had done a few microseconds of its own work between calls, which a decode step over a
// short cache paid on every call through Python (bench/results/cpu_decode_session43_2026-12-05.txt).
//
// A job wakes only the workers - 1 threads it wants and waits only for those that joined it, not
// for every thread of the pool: a short job (a decode step over a short cache takes one or two
// workers, decode.cpp) on a many-core machine would otherwise wait for the slowest of all the
// threads to wake. Threads join under the lock while the job is open, each taking the next worker
// id; the caller closes the job once its own share is done (its tasks are dealt out dynamically,
// so it finishes the job alone if no thread joins), and a thread that wakes later takes nothing.
class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
  }
  int size() const { return int(threads_.size()); }

  // Runs body(worker) for worker in [0, workers) with the caller as worker 0 (workers that no
  // thread joined in time are not run; parallel_for's tasks go to those that are); false (nothing
  // run) when the pool is busy.
  bool run(int workers, const std::function<void(int)>& body) {
    if (t_in_job) return false;
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lock(m_);
      body_ = &body;
      workers_ = workers;
      next_id_ = 1;
      generation_.fetch_add(1, std::memory_order_release);
    }
    for (int i = 1; i < workers; ++i) wake_.notify_one();
    t_in_job = true;
    body(0);
    t_in_job = false;
    std::unique_lock<std::mutex> lock(m_);
    body_ = nullptr;  // closed
    if (active_.load(std::memory_order_acquire) != 0) {
      lock.unlock();
      spin_while([this] { return active_.load(std::memory_order_acquire) != 0; });
      lock.lock();
    }
    done_.wait(lock, [this] { return active_.load(std::memory_order_acquire) == 0; });
    return true;
  }

 private:
  static constexpr std::chrono::microseconds kSpin{200};

  // Spins while busy() holds, for at most kSpin: pause instructions (which leave a core's other
  // hardware thread its resources), the clock read every 64 of them, a yield every 256. A
  // sched_yield per round instead cost the sanitized argument fuzzer (.ci/fuzz, a stream of small
  // calls) 35% of its time on that VM (224 s against 166 s asleep); this loop, 157 s.
  template <class Busy>
  static void spin_while(const Busy& busy) {
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (unsigned i = 1; busy(); ++i) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) return;
      if (i % 256 == 0) sched_yield();
    }
  }

  void loop() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      if (generation_.load(std::memory_order_relaxed) == seen) {
        lock.unlock();
        spin_while([&] { return generation_.load(std::memory_order_acquire) == seen; });
        lock.lock();
      }
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
      seen = generation_.load(std::memory_order_relaxed);
      if (body_ == nullptr || next_id_ >= workers_) continue;  // closed, or every worker taken
      const std::function<void(int)>* body = body_;
      const int id = next_id_++;
      active_.fetch_add(1, std::memory_order_relaxed);
      lock.unlock();
      t_in_job = true;
      (*body)(id);
      t_in_job = false;
      lock.lock();
      if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) done_.notify_one();
    }
  }

  std::mutex busy_;  // held by the caller of the running job
  std::mutex m_;     // guards everything below (the atomics are written under it, read while spinning)
  std::condition_variable wake_, done_;
  std::atomic<uint64_t> generation_{0};
  const std::function<void(int)>* body_ = nullptr;  // the open job, or null
  int workers_ = 0;
  int next_id_ = 1;
  std::atomic<int> active_{0};  // threads that joined the current job and are not done with it
  std::vector<std::thread> threads_;
};

// The process's pool, created on first use. It is never destroyed (threads blocked in a wait at
// exit are harmless; joining them from a static destructor is not), and a child process after
// fork(), which has none of the parent's threads, gets a new one.
Pool* pool() {
  static std::mutex m;
  static Pool* p = nullptr;
  static pid_t owner = 0;
  std::lock_guard<std::mutex> lock(m);
  if (p == nullptr || owner != getpid()) {
    p = new Pool(std::max(0, default_threads() - 1));
    owner = getpid();
  }
  return p;
}

}  // namespace

void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  int workers = workers_for(n, threads);
  if (workers == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  const std::function<void(int)> run = [&](int worker) {
    try {
      for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(n);
    }
  };
  Pool* p = pool();
  if (workers - 1 > p->size() || !p->run(workers, run)) {
    std::vector<std::thread> spawned;
    spawned.reserve(size_t(workers - 1));
    for (int w = 1; w < workers; ++w) spawned.emplace_back(run, w);
    run(0);
    for (auto& t : spawned) t.join();
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace flashattn::cpu
