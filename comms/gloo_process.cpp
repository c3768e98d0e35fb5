#include "comms/gloo_process.hpp"

#include <pthread.h>

#include <gloo/transport/tcp/device.h>

#include <ctime>
#include <map>
#include <mutex>

#include "comms/shm_segment.hpp"

namespace dpactor {

std::shared_ptr<gloo::transport::Device> gloo_tcp_device(const std::string& address) {
  static std::mutex mutex;
  static auto& devices = *new std::map<std::string, std::shared_ptr<gloo::transport::Device>>();
  std::lock_guard lock(mutex);
  auto& device = devices[address];
  if (!device) {
    gloo::transport::tcp::attr attr;
    attr.hostname = address;
    // The device's event-loop thread, started here, inherits this mask.
    const sigpipe_guard blocked;
    device = gloo::transport::tcp::CreateDevice(attr);
  }
  return device;
}

void sweep_shared_memory_once() {
  static std::once_flag swept;
  std::call_once(swept, sweep_stale_segments);
}

sigpipe_guard::sigpipe_guard() noexcept {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, &previous_);
  was_blocked_ = sigismember(&previous_, SIGPIPE) == 1;
}

sigpipe_guard::~sigpipe_guard() {
  if (was_blocked_) return;  // the thread's own choice: leave it as it was
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  // A SIGPIPE a write raised in this thread is pending on it: take it, or
  // unblocking would deliver it.
  const timespec none{0, 0};
  while (sigtimedwait(&pipe, nullptr, &none) == SIGPIPE) {
  }
  pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

}  // namespace dpactor
