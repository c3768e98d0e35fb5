#include "comms/nccl.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "comms/driver_group.hpp"

namespace dpactor {
namespace {

// Longest wait for a communicator's set-up before the group is aborted.
constexpr auto init_deadline = std::chrono::seconds(120);

std::string cuda_text(cudaError_t e) { return cudaGetErrorString(e); }

class nccl_driver final : public collective_driver {
 public:
  nccl_driver(int rank, int size, int device, const ncclUniqueId& id) : device_(device) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // set-up and calls return at once; poll ncclCommGetAsyncError
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      throw std::runtime_error(std::string("ncclCommInitRankConfig failed: ") + ncclGetErrorString(r));
  }

  ~nccl_driver() override {
    // A generation's communicator ends with it; abort also frees it.
    abort();
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  void all_reduce_sum(float* data, std::size_t n) override {
    float* buf = stage_in(data, n);
    enqueue(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce");
    stage_out(data, n);
  }

  void broadcast(float* data, std::size_t n, int root) override {
    float* buf = stage_in(data, n);
    enqueue(ncclBroadcast(buf, buf, n, ncclFloat, root, comm_, stream_), "ncclBroadcast");
    stage_out(data, n);
  }

  void all_gather_chunks(std::span<const std::span<float>> buffers,
                         std::span<const std::pair<std::size_t, std::size_t>> chunks) override {
    ready();
    for (const auto& b : buffers) {
      enqueue(ncclGroupStart(), "ncclGroupStart");
      for (std::size_t k = 0; k < chunks.size(); ++k) {
        const auto [begin, end] = chunks[k];
        if (end > begin)
          enqueue(ncclBroadcast(b.data() + begin, b.data() + begin, end - begin, ncclFloat, static_cast<int>(k), comm_,
                                stream_),
                  "ncclBroadcast");
      }
      enqueue(ncclGroupEnd(), "ncclGroupEnd");
    }
    check_cuda(cudaEventRecord(done_, stream_), "cudaEventRecord");
  }

  state poll(std::string& error) override {
    if (aborted_) {
      error = "aborted";
      return state::failed;
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async == ncclInProgress) return state::pending;
    if (async != ncclSuccess) {
      error = std::string("NCCL: ") + ncclGetErrorString(async) + " (set NCCL_DEBUG=WARN for details)";
      return state::failed;
    }
    const cudaError_t e = cudaEventQuery(done_);
    if (e == cudaErrorNotReady) return state::pending;
    if (e != cudaSuccess) {
      error = "CUDA: " + cuda_text(e);
      return state::failed;
    }
    return state::done;
  }

  void abort() noexcept override {
    if (aborted_.exchange(true) || comm_ == nullptr) return;
    ncclCommAbort(comm_);  // callable from any thread; frees the communicator
  }

 private:
  static void check_cuda(cudaError_t e, const char* call) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(call) + " failed: " + cuda_text(e));
  }

  // Waits, with a deadline and abortably, until the non-blocking set-up is done.
  void ready() {
    if (initialised_) return;
    const auto deadline = std::chrono::steady_clock::now() + init_deadline;
    for (;;) {
      if (aborted_) throw std::runtime_error("NCCL communicator aborted during set-up");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async == ncclSuccess) break;
      if (async != ncclInProgress)
        throw std::runtime_error(std::string("NCCL communicator set-up failed: ") + ncclGetErrorString(async));
      if (std::chrono::steady_clock::now() > deadline) {
        abort();
        throw std::runtime_error("NCCL communicator set-up did not finish in time");
      }
      std::this_thread::yield();
    }
    initialised_ = true;
  }

  void enqueue(ncclResult_t r, const char* call) {
    if (r != ncclSuccess && r != ncclInProgress)
      throw std::runtime_error(std::string(call) + " failed: " + ncclGetErrorString(r));
  }

  // Host buffers (the small step header) go through device scratch memory.
  float* stage_in(float* data, std::size_t n) {
    ready();
    cudaPointerAttributes attr{};
    host_ = cudaPointerGetAttributes(&attr, data) != cudaSuccess || attr.type == cudaMemoryTypeHost ||
            attr.type == cudaMemoryTypeUnregistered;
    cudaGetLastError();
    if (!host_) return data;
    if (scratch_size_ < n) {
      if (scratch_ != nullptr) cudaFree(scratch_);
      check_cuda(cudaMalloc(reinterpret_cast<void**>(&scratch_), n * sizeof(float)), "cudaMalloc");
      scratch_size_ = n;
    }
    check_cuda(cudaMemcpyAsync(scratch_, data, n * sizeof(float), cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    return scratch_;
  }

  void stage_out(float* data, std::size_t n) {
    if (host_)
      check_cuda(cudaMemcpyAsync(data, scratch_, n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    check_cuda(cudaEventRecord(done_, stream_), "cudaEventRecord");
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};
  bool initialised_ = false;
  bool host_ = false;
  float* scratch_ = nullptr;
  std::size_t scratch_size_ = 0;
};

}  // namespace

std::shared_ptr<collective_group> make_nccl_group(std::vector<int> devices) {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) throw std::runtime_error(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
  const int size = static_cast<int>(devices.size());
  return make_driver_group(size, [devices = std::move(devices), id](int rank, int n) -> std::unique_ptr<collective_driver> {
    return std::make_unique<nccl_driver>(rank, n, devices.at(static_cast<std::size_t>(rank)), id);
  });
}

}  // namespace dpactor
