#include "actors/run_control.hpp"
#include "actors/log.hpp"


namespace dpactor {

void run_control::emit(const event& e) noexcept {
  for (const auto& callback : callbacks_) {
    try {
      callback(e);
    } catch (const std::exception& ex) {
      engine_log()->warn("event callback threw: {}", ex.what());
    } catch (...) {
      engine_log()->warn("event callback threw an unknown exception");
    }
  }
}

void run_control::finish(run_summary summary) {
  std::lock_guard lock(mutex_);
  if (done_) return;
  done_ = true;
  promise_.set_value(std::move(summary));
}

void run_control::fail(std::exception_ptr error) {
  std::lock_guard lock(mutex_);
  if (done_) return;
  done_ = true;
  promise_.set_exception(std::move(error));
}

bool run_control::done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

}  // namespace dpactor
