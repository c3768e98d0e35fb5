#pragma once
// What a device is doing, and since when: written by the device's thread at
// every phase change and micro-batch, read by the reducer's hang check
// (train/hang_check.hpp). See Note [Progress-based hang detection].

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace dpactor {

// The phases of a step, and the two a device spends between steps.
enum class device_phase : std::uint8_t {
  data,        // waiting for its next shard (from the loader), or between steps
  forward,
  backward,
  collective,  // in a collective: waiting for the others, or exchanging
  optimizer,
  evaluation,
};

std::string_view phase_name(device_phase p) noexcept;

// Whether time in `p` without progress is the device's own doing: a device in
// a collective or waiting for data is waiting for someone else.
constexpr bool is_own_work(device_phase p) noexcept {
  return p != device_phase::data && p != device_phase::collective;
}

class device_progress {
 public:
  using clock = std::chrono::steady_clock;

  struct snapshot {
    device_phase phase = device_phase::data;
    std::int64_t step = -1;   // of the phase (the evaluation's step for an evaluation)
    clock::time_point since;  // the last sign of progress
    bool warming = false;     // in the first step of its generation or of an evaluation
  };

  device_progress() { mark(device_phase::data, -1); }

  // A generation or an evaluation begins: until its first step (or batch)
  // is done, the device is warming up and gets the first-step bound.
  void begin_warm_up(device_phase p, std::int64_t step) noexcept {
    warming_.store(true, std::memory_order_relaxed);
    mark(p, step);
  }
  void end_warm_up() noexcept { warming_.store(false, std::memory_order_relaxed); }
  // A sign of progress: a phase change, or a micro-batch done in the same phase.
  void mark(device_phase p, std::int64_t step) noexcept {
    step_.store(step, std::memory_order_relaxed);
    phase_.store(static_cast<std::uint8_t>(p), std::memory_order_relaxed);
    since_ns_.store(clock::now().time_since_epoch().count(), std::memory_order_release);
  }

  // The fields are read one by one: a snapshot taken during a mark may mix
  // the old and the new phase, which only moves the verdict by one tick.
  snapshot read() const noexcept {
    snapshot s;
    s.since = clock::time_point(clock::duration(since_ns_.load(std::memory_order_acquire)));
    s.phase = static_cast<device_phase>(phase_.load(std::memory_order_relaxed));
    s.step = step_.load(std::memory_order_relaxed);
    s.warming = warming_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  std::atomic<clock::rep> since_ns_{0};
  std::atomic<std::int64_t> step_{-1};
  std::atomic<std::uint8_t> phase_{0};
  std::atomic<bool> warming_{false};
};

}  // namespace dpactor
