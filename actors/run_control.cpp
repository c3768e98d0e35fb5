#include "actors/run_control.hpp"

#include <spdlog/spdlog.h>

namespace dpactor {

void run_control::emit(const event& e) noexcept {
  if (!callback_) return;
  try {
    callback_(e);
  } catch (const std::exception& ex) {
    spdlog::warn("event callback threw: {}", ex.what());
  } catch (...) {
    spdlog::warn("event callback threw an unknown exception");
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
