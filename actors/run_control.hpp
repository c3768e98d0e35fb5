#pragma once
// What the engine and its actors share for one run: the event callback and
// the promise of the run's outcome. The reducer fulfils the promise exactly
// once; Engine::wait() reads it. No CAF here.

#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <vector>

#include <dpactor/events.hpp>

namespace dpactor {

class run_control {
 public:
  explicit run_control(std::vector<event_callback> callbacks) : callbacks_(std::move(callbacks)) {}

  // Calls the callbacks in order; an exception one throws is logged and
  // dropped, and the others are still called.
  void emit(const event& e) noexcept;
  void finish(run_summary summary);
  void fail(std::exception_ptr error);
  bool done() const;
  std::future<run_summary> outcome() { return promise_.get_future(); }

 private:
  std::vector<event_callback> callbacks_;
  mutable std::mutex mutex_;
  bool done_ = false;
  std::promise<run_summary> promise_;
};

}  // namespace dpactor
