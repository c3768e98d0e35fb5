#pragma once
// Parameters for serving while training: the first member copies its
// parameters into a shared slot every so often, between two of its steps,
// and readers take the newest copy without asking anyone, so reading never
// waits for a step nor makes one wait (Engine::latest_snapshot).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <dpactor/snapshot.hpp>

namespace dpactor {

class latest_parameters {
 public:
  using clock = std::chrono::steady_clock;
  // `layout`: the parameters' (not the optimizer's); a copy every `every`.
  latest_parameters(flat_layout layout, std::chrono::milliseconds every);

  // Whether a copy is due (the last one is `every` old, or there is none).
  bool due(clock::time_point now = clock::now()) const noexcept;
  // Publishes the parameters after `step` optimizer steps (copies them).
  void publish(std::int64_t step, std::span<const float> parameters, clock::time_point now = clock::now());
  // The newest copy; null before the first.
  std::shared_ptr<const parameter_snapshot> get() const;
  std::size_t parameter_count() const noexcept { return layout_.size(); }

 private:
  const flat_layout layout_;
  const clock::duration every_;
  std::atomic<clock::rep> last_{0};  // time of the last copy, since the clock's epoch
  std::atomic<bool> any_{false};
  mutable std::mutex mutex_;
  std::shared_ptr<const parameter_snapshot> latest_;
};

}  // namespace dpactor
