#include "comms/gloo_process.hpp"

#include <gloo/transport/tcp/device.h>

#include <csignal>
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
    device = gloo::transport::tcp::CreateDevice(attr);
  }
  return device;
}

void prepare_process_for_gloo() {
  static std::once_flag sigpipe;
  std::call_once(sigpipe, [] { std::signal(SIGPIPE, SIG_IGN); });
}

void sweep_shared_memory_once() {
  static std::once_flag swept;
  std::call_once(swept, sweep_stale_segments);
}

}  // namespace dpactor
