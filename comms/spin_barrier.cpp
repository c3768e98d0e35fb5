#include "comms/spin_barrier.hpp"

#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DPACTOR_CPU_RELAX() _mm_pause()
#else
#define DPACTOR_CPU_RELAX() std::this_thread::yield()
#endif

namespace dpactor {

spin_barrier::result spin_barrier::arrive_and_wait(clock::time_point deadline) {
  if (aborted()) return result::aborted;
  const std::uint64_t gen = generation_.load(std::memory_order_acquire);
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) == parties_ - 1) {
    arrived_.store(0, std::memory_order_relaxed);
    // seq_cst pairs with the sleeper's increment of sleepers_ followed by its
    // load of generation_: either it sees the new generation or we see it.
    generation_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard lock(mutex_);
      wake_.notify_all();
    }
    return result::passed;
  }
  const auto spin_until = clock::now() + spin_time_;
  for (int i = 0;; ++i) {
    if (generation_.load(std::memory_order_acquire) != gen) return result::passed;
    if (aborted()) return result::aborted;
    if (yield_) {
      if (clock::now() >= spin_until) break;
      std::this_thread::yield();
    } else {
      if ((i & 63) == 63 && clock::now() >= spin_until) break;
      DPACTOR_CPU_RELAX();
    }
  }
  std::unique_lock lock(mutex_);
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  result r = result::passed;
  while (generation_.load(std::memory_order_seq_cst) == gen) {
    if (aborted()) {
      r = result::aborted;
      break;
    }
    if (wake_.wait_until(lock, deadline) == std::cv_status::timeout &&
        generation_.load(std::memory_order_seq_cst) == gen) {
      r = aborted() ? result::aborted : result::timed_out;
      break;
    }
  }
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
  return r;
}

void spin_barrier::abort() {
  aborted_.store(true, std::memory_order_release);
  std::lock_guard lock(mutex_);
  wake_.notify_all();
}

}  // namespace dpactor
