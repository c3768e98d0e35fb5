#pragma once
// A reusable barrier for the threads of one process: arriving threads spin
// briefly (a hand-off through a condition variable costs 66-105 us on the
// machines we measured, spinning about 1 us), then sleep until the last
// arrival, a deadline, or an abort.
//
// Each use of the barrier either passes for every party or fails for every
// party: the arrivals and the abort flag share one atomic word, so an abort
// and the last arrival are ordered, and once aborted the barrier never passes
// again. arrive_and_drain() closes a phase in which the parties touch each
// other's memory (See Note [Posted memory outlives an abort]).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "comms/collective.hpp"

namespace dpactor {

class spin_barrier {
 public:
  // stuck: arrive_and_drain() gave up waiting for a party to arrive.
  enum class result { passed, aborted, timed_out, stuck };
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
  // Past the deadline the waiter aborts the barrier and returns timed_out,
  // unless the barrier passed first (then passed, as for every party).
  result arrive_and_wait(int rank, clock::time_point deadline, late_observer* observer = nullptr,
                         clock::time_point late_at = {});

  // For the barrier that ends a phase every party entered by passing the
  // barrier before it. Passes as arrive_and_wait does; if instead the barrier
  // is aborted, or the deadline passes (which aborts it), it still waits
  // until every party has arrived, that is, has left the phase, for at most
  // `drain_bound`, and returns aborted or timed_out; stuck if the bound ran out.
  result arrive_and_drain(int rank, clock::time_point deadline, std::chrono::milliseconds drain_bound);

  // Wakes every waiter with result::aborted, now and for every later arrival.
  void abort();
  bool aborted() const noexcept { return (state_.load(std::memory_order_acquire) & aborted_bit) != 0; }
  // Whether the abort came from a waiter's deadline.
  bool timed_out() const noexcept { return timed_out_.load(std::memory_order_acquire); }

 private:
  // state_: bit 63 aborted, bits 32-62 the generation (uses so far, mod
  // 2^31), bits 0-31 the parties arrived at the current use. A waiter
  // compares generations for equality only; 2^31 uses cannot pass while one
  // waits.
  static constexpr std::uint64_t aborted_bit = std::uint64_t{1} << 63;
  static constexpr std::uint64_t generation_mask = (std::uint64_t{1} << 31) - 1;
  static std::uint64_t generation(std::uint64_t s) noexcept { return (s >> 32) & generation_mask; }
  // What a party stores in arrivals_ when it arrives at generation g.
  static std::uint64_t arrival_tag(std::uint64_t g) noexcept { return g + 1; }

  enum class arrival { last, waiting, aborted };
  arrival arrive(int rank, std::uint64_t& gen);
  void wake_sleepers();
  result wait_for(int rank, std::uint64_t gen, clock::time_point deadline, late_observer* observer,
                  clock::time_point late_at);
  bool passed(std::uint64_t gen) const noexcept {
    return generation(state_.load(std::memory_order_acquire)) != gen;
  }
  // Parties other than `self` that have not arrived at generation `gen`.
  void missing(std::uint64_t gen, int self, std::vector<int>& out) const;

  // One cache line per party: each stores its own at every arrival.
  struct alignas(64) arrival_slot {
    std::atomic<std::uint64_t> tag{0};  // arrival_tag of the generation it last arrived at
  };

  const int parties_;
  const std::unique_ptr<arrival_slot[]> arrivals_;
  const std::chrono::microseconds spin_time_;
  const bool yield_;
  alignas(64) std::atomic<std::uint64_t> state_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> timed_out_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
};

}  // namespace dpactor
