#include "comms/gloo_wait_alarm.hpp"

#include <gloo/transport/unbound_buffer.h>

namespace dpactor {

wait_alarm::~wait_alarm() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void wait_alarm::arm(clock::time_point at, gloo::transport::UnboundBuffer* buffer, kind k) {
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  bool wake = false;
  {
    std::lock_guard lock(mutex_);
    at_ = at;
    buffer_ = buffer;
    kind_ = k;
    fired_ = false;
    wake = at < sleeping_until_;
  }
  if (wake) changed_.notify_all();
}

bool wait_alarm::fired() {
  std::lock_guard lock(mutex_);
  return fired_;
}

void wait_alarm::disarm() {
  std::lock_guard lock(mutex_);
  buffer_ = nullptr;
}

void wait_alarm::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    if (buffer_ == nullptr) {
      sleeping_until_ = clock::time_point::max();
      changed_.wait(lock);
      continue;
    }
    if (clock::now() < at_) {
      sleeping_until_ = at_;
      changed_.wait_until(lock, at_);
      continue;
    }
    fired_ = true;
    if (kind_ == kind::recv) buffer_->abortWaitRecv();
    else buffer_->abortWaitSend();
    buffer_ = nullptr;
  }
}

}  // namespace dpactor
