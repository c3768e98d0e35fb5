#pragma once
// What the engine and its actors share for one run: the event callback and
// the promise of the run's outcome. The reducer fulfils the promise exactly
// once; Engine::wait() reads it. No CAF here.

#include <exception>
#include <functional>
#include <future>
#include <mutex>

#include "train/events.hpp"

namespace dpactor {

using event_callback = std::function<void(const event&)>;

class run_control {
 public:
  explicit run_control(event_callback callback) : callback_(std::move(callback)) {}

  // Calls the callback; an exception it throws is logged and dropped.
  void emit(const event& e) noexcept;
  void finish(run_summary summary);
  void fail(std::exception_ptr error);
  bool done() const;
  std::future<run_summary> outcome() { return promise_.get_future(); }

 private:
  event_callback callback_;
  mutable std::mutex mutex_;
  bool done_ = false;
  std::promise<run_summary> promise_;
};

}  // namespace dpactor
