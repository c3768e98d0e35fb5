#include "cuda/resources.hpp"

#include <string>
#include <thread>

namespace dpactor {

device_guard::device_guard(int device) {
  CUDA_CHECK(cudaGetDevice(&previous_));
  CUDA_CHECK(cudaSetDevice(device));
}

device_guard::~device_guard() { cudaSetDevice(previous_); }

cuda_stream::cuda_stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }

cuda_stream::~cuda_stream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

cuda_event::cuda_event() { CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }

cuda_event::~cuda_event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

void cuda_event::record(cudaStream_t stream) { CUDA_CHECK(cudaEventRecord(event_, stream)); }

bool cuda_event::done() const {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;
  CUDA_CHECK(status);
  return true;
}

bool wait_for_event(const cuda_event& event, std::chrono::steady_clock::time_point deadline,
                    const std::function<bool()>& interrupt) {
  while (!event.done()) {
    if (interrupt && interrupt()) return false;
    if (std::chrono::steady_clock::now() > deadline)
      throw cuda_error("GPU work did not complete before its deadline (the device may be hung)");
    std::this_thread::yield();
  }
  return true;
}

int visible_cuda_devices(std::string* why) noexcept {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (why != nullptr) *why = std::string("the CUDA runtime reports: ") + cudaGetErrorString(status);
    cudaGetLastError();  // clear it
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "no CUDA device found";
  return count;
}

}  // namespace dpactor
