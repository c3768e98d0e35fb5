#pragma once
// A reusable barrier for the threads of one process: arriving threads spin
// briefly (a hand-off through a condition variable costs 66-105 us on the
// machines we measured, spinning about 1 us), then sleep until the last
// arrival, a deadline, or an abort.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>

#include "comms/collective.hpp"
#include <memory>
#include <mutex>
#include <vector>

namespace dpactor {

class spin_barrier {
 public:
  enum class result { passed, aborted, timed_out };
  using clock = std::chrono::steady_clock;

  // How long an arriving thread spins before it sleeps by default: long
  // enough to cover the arrival skew of balanced replicas.
  static constexpr std::chrono::microseconds default_spin_time{200};

  // `yield_while_spinning`: for more threads than cores, spin by yielding the
  // core (sched_yield) so that a rank that has not arrived yet can run.
  explicit spin_barrier(int parties, std::chrono::microseconds spin_time = default_spin_time,
                        bool yield_while_spinning = false);

  // `rank` in [0, parties): lets a late waiter tell who is missing.
  // `observer` (may be null) is told once if the wait lasts past `late_at`.
  result arrive_and_wait(int rank, clock::time_point deadline, late_observer* observer = nullptr,
                         clock::time_point late_at = {});
  // Wakes every waiter with result::aborted, now and for every later arrival.
  void abort();
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }

 private:
  // Ranks other than `self` that have not arrived in generation `gen`.
  void missing(std::uint64_t gen, int self, std::vector<int>& out) const;

  const int parties_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> arrivals_;  // per rank: the generation it last arrived in, + 1
  const std::chrono::microseconds spin_time_;
  const bool yield_;
  std::atomic<int> arrived_{0};
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> aborted_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
};

}  // namespace dpactor
