#include "comms/spin_barrier.hpp"

#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DPACTOR_CPU_RELAX() _mm_pause()
#else
#define DPACTOR_CPU_RELAX() std::this_thread::yield()
#endif

namespace dpactor {
namespace {
// After telling the observer who is late, a waiter yields rather than sleeps
// for this long: the late rank is usually cut and arrives within a
// millisecond, and a sleeper would add a wake-up (~0.1 ms) to the step.
constexpr auto after_late_spin = std::chrono::milliseconds(2);
}  // namespace

spin_barrier::spin_barrier(int parties, std::chrono::microseconds spin_time, bool yield_while_spinning)
    : parties_(parties),
      arrivals_(std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(parties))),
      spin_time_(spin_time),
      yield_(yield_while_spinning) {
  for (int r = 0; r < parties; ++r) arrivals_[static_cast<std::size_t>(r)].store(0, std::memory_order_relaxed);
}

void spin_barrier::missing(std::uint64_t gen, int self, std::vector<int>& out) const {
  for (int r = 0; r < parties_; ++r)
    if (r != self && arrivals_[static_cast<std::size_t>(r)].load(std::memory_order_acquire) != gen + 1) out.push_back(r);
}

spin_barrier::result spin_barrier::arrive_and_wait(int rank, clock::time_point deadline, late_observer* observer,
                                                   clock::time_point late_at) {
  if (aborted()) return result::aborted;
  const std::uint64_t gen = generation_.load(std::memory_order_acquire);
  arrivals_[static_cast<std::size_t>(rank)].store(gen + 1, std::memory_order_release);
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
  // Tells the observer, once, who has not arrived by late_at.
  auto report_late = [&, reported = false]() mutable {
    if (reported || observer == nullptr || clock::now() < late_at) return;
    reported = true;
    std::vector<int> who;
    missing(gen, rank, who);
    // The barrier may have passed meanwhile: then nobody is late.
    if (!who.empty() && generation_.load(std::memory_order_acquire) == gen) observer->on_late(who);
  };
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
  report_late();
  std::unique_lock lock(mutex_);
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  result r = result::passed;
  while (generation_.load(std::memory_order_seq_cst) == gen) {
    if (aborted()) {
      r = result::aborted;
      break;
    }
    const bool late_pending = observer != nullptr && late_at > clock::now();
    const auto until = late_pending ? std::min(deadline, late_at) : deadline;
    if (wake_.wait_until(lock, until) == std::cv_status::timeout && generation_.load(std::memory_order_seq_cst) == gen) {
      if (late_pending && clock::now() < deadline) {
        lock.unlock();
        report_late();  // may send a message: not under the lock
        // The late rank is about to be cut and arrive: wait for it awake.
        const auto stop = std::min(deadline, clock::now() + after_late_spin);
        while (generation_.load(std::memory_order_acquire) == gen && !aborted() && clock::now() < stop)
          std::this_thread::yield();
        lock.lock();
        continue;
      }
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
