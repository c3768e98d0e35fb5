#pragma once
// RAII for CUDA resources: the current device, streams, events, device and
// pinned host buffers. Every wait on the GPU is a poll with a deadline
// (wait_for_event), so that the device actor's thread never blocks for good
// and honours cuts and aborts.

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <span>

#include "cuda/check.hpp"

namespace dpactor {

// Makes `device` current for the lifetime of the guard.
class device_guard {
 public:
  explicit device_guard(int device);
  ~device_guard();
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int previous_ = 0;
};

class cuda_stream {
 public:
  cuda_stream();  // non-blocking with respect to the legacy default stream
  ~cuda_stream();
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
  cudaStream_t get() const noexcept { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class cuda_event {
 public:
  cuda_event();  // timing disabled: cheaper to record and query
  ~cuda_event();
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
  cudaEvent_t get() const noexcept { return event_; }
  void record(cudaStream_t stream);
  bool done() const;  // cudaEventQuery; throws on an error

 private:
  cudaEvent_t event_ = nullptr;
};

// Polls `event` until it completes, `deadline` passes (throws cuda_error), or
// `interrupt` returns true (returns false). Yields between polls.
bool wait_for_event(const cuda_event& event, std::chrono::steady_clock::time_point deadline,
                    const std::function<bool()>& interrupt = {});

enum class memory_kind { device, pinned_host };

// An allocation of n elements of T in device memory or in pinned host memory
// (host memory the GPU copies from and to asynchronously). Move-only.
template <class T, memory_kind Kind>
class cuda_buffer {
 public:
  cuda_buffer() = default;
  explicit cuda_buffer(std::size_t n) : size_(n) {
    if (n == 0) return;
    if constexpr (Kind == memory_kind::device) CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(T)));
    else CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data_), n * sizeof(T)));
  }
  ~cuda_buffer() {
    if (data_ == nullptr) return;
    if constexpr (Kind == memory_kind::device) cudaFree(data_);
    else cudaFreeHost(data_);
  }
  cuda_buffer(cuda_buffer&& o) noexcept : data_(o.data_), size_(o.size_) { o.data_ = nullptr; o.size_ = 0; }
  cuda_buffer& operator=(cuda_buffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::span<T> span() const noexcept { return {data_, size_}; }
  // Host memory only: elements are read and written by the host.
  T& operator[](std::size_t i) const noexcept
    requires(Kind == memory_kind::pinned_host)
  {
    return data_[i];
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

template <class T>
using device_buffer = cuda_buffer<T, memory_kind::device>;
template <class T>
using pinned_buffer = cuda_buffer<T, memory_kind::pinned_host>;

// Visible CUDA devices. An error from the runtime (cudaGetDeviceCount fails
// on a machine without a GPU or driver) counts as none; `why` says why.
int visible_cuda_devices(std::string* why = nullptr) noexcept;

}  // namespace dpactor
