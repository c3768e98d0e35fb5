#include "comms/spin_barrier.hpp"

#include <thread>


#include "comms/cpu_relax.hpp"

namespace dpactor {
namespace {
// After telling the observer who is late, a waiter yields rather than sleeps
// for this long: the late rank is usually cut and arrives within a
// millisecond, and a sleeper would add a wake-up (~0.1 ms) to the step.
constexpr auto after_late_spin = std::chrono::milliseconds(2);
// A draining waiter yields this long, then polls at this interval: parties
// leave a phase of memory copies within microseconds unless descheduled.
constexpr auto drain_yield_time = std::chrono::milliseconds(1);
constexpr auto drain_poll_interval = std::chrono::microseconds(100);
constexpr std::uint64_t count_mask = (std::uint64_t{1} << 32) - 1;
}  // namespace

spin_barrier::spin_barrier(int parties, std::chrono::microseconds spin_time, bool yield_while_spinning)
    : parties_(parties),
      arrivals_(std::make_unique<arrival_slot[]>(static_cast<std::size_t>(parties))),
      spin_time_(spin_time),
      yield_(yield_while_spinning) {}

void spin_barrier::missing(std::uint64_t gen, int self, std::vector<int>& out) const {
  for (int r = 0; r < parties_; ++r)
    if (r != self && arrivals_[static_cast<std::size_t>(r)].tag.load(std::memory_order_acquire) != arrival_tag(gen))
      out.push_back(r);
}

spin_barrier::arrival spin_barrier::arrive(int rank, std::uint64_t& gen) {
  std::uint64_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    gen = generation(s);
    // Stored before the arrival counts, and even into an aborted barrier: a
    // drain that sees this tag sees everything this party did before arriving.
    arrivals_[static_cast<std::size_t>(rank)].tag.store(arrival_tag(gen), std::memory_order_release);
    if ((s & aborted_bit) != 0) return arrival::aborted;
    const bool last = (s & count_mask) + 1 == static_cast<std::uint64_t>(parties_);
    const std::uint64_t next = last ? ((gen + 1) & generation_mask) << 32 : s + 1;
    // seq_cst pairs with a sleeper's increment of sleepers_ followed by its
    // load of state_: either it sees the new generation or we see it.
    if (state_.compare_exchange_weak(s, next, std::memory_order_seq_cst, std::memory_order_acquire))
      return last ? arrival::last : arrival::waiting;
  }
}

void spin_barrier::wake_sleepers() {
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard lock(mutex_);
    wake_.notify_all();
  }
}

spin_barrier::result spin_barrier::arrive_and_wait(int rank, clock::time_point deadline, late_observer* observer,
                                                   clock::time_point late_at) {
  std::uint64_t gen = 0;
  switch (arrive(rank, gen)) {
    case arrival::last: wake_sleepers(); return result::passed;
    case arrival::aborted: return result::aborted;
    case arrival::waiting: break;
  }
  return wait_for(rank, gen, deadline, observer, late_at);
}

spin_barrier::result spin_barrier::arrive_and_drain(int rank, clock::time_point deadline,
                                                    std::chrono::milliseconds drain_bound) {
  std::uint64_t gen = 0;
  result r = result::aborted;
  switch (arrive(rank, gen)) {
    case arrival::last: wake_sleepers(); return result::passed;
    case arrival::aborted: break;
    case arrival::waiting:
      r = wait_for(rank, gen, deadline, nullptr, {});
      if (r == result::passed) return r;
      break;
  }
  // The barrier is aborted and will not pass. Every party passed the barrier
  // that opened the phase, so each arrives here once it has left the phase.
  const auto start = clock::now();
  for (int k = 0; k < parties_; ++k) {
    while (arrivals_[static_cast<std::size_t>(k)].tag.load(std::memory_order_acquire) != arrival_tag(gen)) {
      const auto waited = clock::now() - start;
      if (waited >= drain_bound) return result::stuck;
      if (waited < drain_yield_time) std::this_thread::yield();
      else std::this_thread::sleep_for(drain_poll_interval);
    }
  }
  return r;
}

spin_barrier::result spin_barrier::wait_for(int rank, std::uint64_t gen, clock::time_point deadline,
                                            late_observer* observer, clock::time_point late_at) {
  // Tells the observer, once, who has not arrived by late_at.
  auto report_late = [&, reported = false]() mutable {
    if (reported || observer == nullptr || clock::now() < late_at) return;
    reported = true;
    std::vector<int> who;
    missing(gen, rank, who);
    // The barrier may have passed meanwhile: then nobody is late.
    if (!who.empty() && !passed(gen)) observer->on_late(who);
  };
  const auto spin_until = clock::now() + spin_time_;
  for (int i = 0;; ++i) {
    // One load: the last arrival may come between two, and then the abort.
    const std::uint64_t s = state_.load(std::memory_order_acquire);
    if (generation(s) != gen) return result::passed;
    if ((s & aborted_bit) != 0) return result::aborted;
    if (yield_) {
      if (clock::now() >= spin_until) break;
      std::this_thread::yield();
    } else {
      if ((i & 63) == 63 && clock::now() >= spin_until) break;
      cpu_relax();
    }
  }
  report_late();
  std::unique_lock lock(mutex_);
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  result r = result::passed;
  for (;;) {
    const std::uint64_t s = state_.load(std::memory_order_seq_cst);
    if (generation(s) != gen) break;
    if ((s & aborted_bit) != 0) {
      r = result::aborted;
      break;
    }
    const bool late_pending = observer != nullptr && late_at > clock::now();
    const auto until = late_pending ? std::min(deadline, late_at) : deadline;
    if (wake_.wait_until(lock, until) == std::cv_status::timeout && !passed(gen) && !aborted()) {
      if (late_pending && clock::now() < deadline) {
        lock.unlock();
        report_late();  // may send a message: not under the lock
        // The late rank is about to be cut and arrive: wait for it awake.
        const auto stop = std::min(deadline, clock::now() + after_late_spin);
        while (!passed(gen) && !aborted() && clock::now() < stop) std::this_thread::yield();
        lock.lock();
        continue;
      }
      if (clock::now() < deadline) continue;  // woken early
      // Past the deadline: abort, unless the last party arrives first (the
      // abort and the last arrival are ordered on state_).
      timed_out_.store(true, std::memory_order_release);
      std::uint64_t now_s = state_.load(std::memory_order_seq_cst);
      while (generation(now_s) == gen && (now_s & aborted_bit) == 0 &&
             !state_.compare_exchange_weak(now_s, now_s | aborted_bit, std::memory_order_seq_cst)) {
      }
      if (generation(now_s) != gen) {
        timed_out_.store(false, std::memory_order_release);
        break;
      }
      wake_.notify_all();
      r = result::timed_out;
      break;
    }
  }
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
  return r;
}

void spin_barrier::abort() {
  state_.fetch_or(aborted_bit, std::memory_order_seq_cst);
  std::lock_guard lock(mutex_);
  wake_.notify_all();
}

}  // namespace dpactor
