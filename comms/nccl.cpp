#include "comms/nccl.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "comms/driver_group.hpp"
#include "comms/nccl_rendezvous.hpp"
#include "cuda/check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/resources.hpp"
#include <dpactor/error.hpp>

namespace dpactor {
namespace {

// Longest wait for a communicator's set-up, or for a call to be enqueued,
// before it counts as failed (the endpoint then aborts the group).
constexpr auto settle_deadline = std::chrono::seconds(120);

std::string cuda_text(cudaError_t e) { return cudaGetErrorString(e); }

// ncclGroupStart, and the ncclGroupEnd that must follow it also when a call
// in the group throws; end()'s own failure counts like any other.
class nccl_group {
 public:
  nccl_group() { NCCL_CHECK(ncclGroupStart()); }
  ~nccl_group() {
    if (!ended_) ncclGroupEnd();
  }
  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;
  void end() {
    ended_ = true;
    NCCL_CHECK(ncclGroupEnd());
  }

 private:
  bool ended_ = false;
};

// One rank's communicator. Every use of comm_ holds mutex_: abort() comes
// from the reducer's thread and ncclCommAbort frees the communicator. All
// NCCL calls are non-blocking, so the lock is held only briefly.
class nccl_driver final : public collective_driver {
 public:
  nccl_driver(int rank, int size, int device, const ncclUniqueId& id) : device_(device) {
    try {
      CUDA_CHECK(cudaSetDevice(device));
      CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&produced_, cudaEventDisableTiming));
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;  // set-up and calls return at once; poll ncclCommGetAsyncError
      NCCL_CHECK(ncclCommInitRankConfig(&comm_, size, id, rank, &config));
    } catch (...) {
      release();
      throw;
    }
  }

  ~nccl_driver() override {
    // A generation's communicator ends with it; abort also frees it.
    abort();
    release();
  }

  void all_reduce_sum(float* data, std::size_t n) override {
    staged_call(data, n, [&](float* buf) {
      NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, comm_, stream_));
    });
  }

  // A gradient bucket: device memory the replica's stream is still writing.
  // The communication stream waits for that stream's work so far, on the GPU;
  // the host does not wait (See Note [Gradient buckets]).
  void all_reduce_sum_after(float* data, std::size_t n, void* after) override {
    std::lock_guard lock(mutex_);
    device_scope on_device(device_);
    ready();
    if (after != nullptr) {
      CUDA_CHECK(cudaEventRecord(produced_, static_cast<cudaStream_t>(after)));
      CUDA_CHECK(cudaStreamWaitEvent(stream_, produced_, 0));
    }
    NCCL_CHECK(ncclAllReduce(data, data, n, ncclFloat, ncclSum, comm_, stream_));
    settle();
    record_done();
  }

  void broadcast(float* data, std::size_t n, int root) override {
    staged_call(data, n, [&](float* buf) {
      NCCL_CHECK(ncclBroadcast(buf, buf, n, ncclFloat, root, comm_, stream_));
    });
  }

  void all_gather_chunks(std::span<const std::span<float>> buffers,
                         std::span<const std::pair<std::size_t, std::size_t>> chunks) override {
    std::lock_guard lock(mutex_);
    device_scope on_device(device_);
    ready();
    staged_ = nullptr;
    const std::size_t ranks = buffers.empty() ? 0 : chunks.size() / buffers.size();
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      const std::span<float> b = buffers[i];
      nccl_group group;
      for (std::size_t k = 0; k < ranks; ++k) {
        const auto [begin, end] = chunks[i * ranks + k];
        if (end > begin)
          NCCL_CHECK(ncclBroadcast(b.data() + begin, b.data() + begin, end - begin, ncclFloat, static_cast<int>(k),
                                   comm_, stream_));
      }
      group.end();
      settle();
    }
    record_done();
  }

  // See Note [The tree on a device]: the parts this rank does not hold are
  // broadcast into scratch memory, in one group, and the whole root is
  // evaluated on this rank's stream. Own parts are replica memory its
  // stream has finished (replica::gradients(), add_gradients()).
  void reduce_tree(std::span<const int> roots, std::span<float* const> own, std::span<const tree_step> steps,
                   float* out, std::size_t n) override {
    std::lock_guard lock(mutex_);
    device_scope on_device(device_);
    ready();
    staged_ = nullptr;
    if (n == 0) {  // every rank's n: nothing to move
      record_done();
      return;
    }
    const std::size_t parts = roots.size();
    const std::size_t foreign = static_cast<std::size_t>(std::count(own.begin(), own.end(), nullptr));
    if (tree_scratch_.size() < foreign * n) tree_scratch_ = device_buffer<float>(foreign * n);
    // The table the kernel reads: the parts' pointers, then the steps.
    const std::size_t table_bytes = parts * sizeof(float*) + steps.size() * sizeof(tree_step);
    if (tree_table_host_.size() < table_bytes) {
      tree_table_host_ = pinned_buffer<unsigned char>(table_bytes);
      tree_table_ = device_buffer<unsigned char>(table_bytes);
    }
    auto* pointers = reinterpret_cast<float**>(tree_table_host_.data());
    nccl_group group;
    for (std::size_t i = 0, f = 0; i < parts; ++i) {
      pointers[i] = own[i] != nullptr ? own[i] : tree_scratch_.data() + f++ * n;
      NCCL_CHECK(ncclBroadcast(pointers[i], pointers[i], n, ncclFloat, roots[i], comm_, stream_));
    }
    group.end();
    settle();
    std::memcpy(tree_table_host_.data() + parts * sizeof(float*), steps.data(), steps.size() * sizeof(tree_step));
    CUDA_CHECK(cudaMemcpyAsync(tree_table_.data(), tree_table_host_.data(), table_bytes, cudaMemcpyHostToDevice, stream_));
    cuda::run_tree_program(reinterpret_cast<const tree_step*>(tree_table_.data() + parts * sizeof(float*)),
                           steps.size(), reinterpret_cast<const float* const*>(tree_table_.data()), n, out, stream_);
    record_done();
  }

  state poll(std::string& error) override {
    std::lock_guard lock(mutex_);
    if (aborted_) {
      if (!done_before_abort_) {
        error = "aborted";
        return state::failed;
      }
      unstage();  // the work was complete when the communicator was aborted
      return state::done;
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
    unstage();
    return state::done;
  }

  // Work whose completion event had fired before the abort stands: aborting
  // a group right after the last member finished a call must not undo that
  // call for the others. Later completions cannot be trusted (an aborted
  // kernel also ends), so the event is queried before ncclCommAbort.
  void abort() noexcept override {
    if (aborted_.exchange(true)) return;
    std::lock_guard lock(mutex_);
    ncclResult_t async = ncclInternalError;
    if (comm_ != nullptr) ncclCommGetAsyncError(comm_, &async);
    done_before_abort_ = recorded_ && async == ncclSuccess && cudaEventQuery(done_) == cudaSuccess;
    cudaGetLastError();
    if (comm_ != nullptr) ncclCommAbort(comm_);  // frees the communicator
    comm_ = nullptr;
  }

 private:
  // One call on `data`, which may be host memory (See stage_in): `call`
  // enqueues the collective on the buffer it is given.
  template <class Call>
  void staged_call(float* data, std::size_t n, Call call) {
    std::lock_guard lock(mutex_);
    device_scope on_device(device_);
    float* buf = stage_in(data, n);
    call(buf);
    settle();
    stage_out(n);
  }

  // A non-blocking communicator may return from a call before the work is on
  // the stream: wait (with a deadline, abortably) until it is. Also waits for
  // the communicator's set-up.
  void settle() {
    const auto deadline = std::chrono::steady_clock::now() + settle_deadline;
    for (;;) {
      if (aborted_ || comm_ == nullptr) throw error(error_kind::internal, "NCCL communicator aborted");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async == ncclSuccess) return;
      if (async != ncclInProgress) throw error(error_kind::internal, std::string("NCCL: ") + ncclGetErrorString(async));
      if (std::chrono::steady_clock::now() > deadline) throw error(error_kind::internal, "NCCL call did not settle in time");
      std::this_thread::yield();
    }
  }

  void ready() {
    if (!initialised_) {
      settle();
      initialised_ = true;
    }
  }

  // Host buffers (the small step header) go through pinned host memory and
  // device scratch memory: a copy to pageable memory would block.
  float* stage_in(float* data, std::size_t n) {
    ready();
    cudaPointerAttributes attr{};
    const bool host = cudaPointerGetAttributes(&attr, data) != cudaSuccess || attr.type == cudaMemoryTypeHost ||
                      attr.type == cudaMemoryTypeUnregistered;
    cudaGetLastError();
    staged_ = nullptr;
    if (!host) return data;
    if (scratch_size_ < n) {
      if (device_scratch_ != nullptr) cudaFree(device_scratch_);
      if (host_scratch_ != nullptr) cudaFreeHost(host_scratch_);
      CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_scratch_), n * sizeof(float)));
      CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_scratch_), n * sizeof(float)));
      scratch_size_ = n;
    }
    std::memcpy(host_scratch_, data, n * sizeof(float));
    CUDA_CHECK(cudaMemcpyAsync(device_scratch_, host_scratch_, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    staged_ = data;
    staged_size_ = n;
    return device_scratch_;
  }

  // A host buffer's result is in pinned memory once the work is done.
  void unstage() {
    if (staged_ == nullptr) return;
    std::memcpy(staged_, host_scratch_, staged_size_ * sizeof(float));
    staged_ = nullptr;
  }

  void stage_out(std::size_t n) {
    if (staged_ != nullptr)
      CUDA_CHECK(cudaMemcpyAsync(host_scratch_, device_scratch_, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    record_done();
  }

  void record_done() {
    CUDA_CHECK(cudaEventRecord(done_, stream_));
    recorded_ = true;
  }

  void release() noexcept {
    tree_scratch_ = {};
    tree_table_host_ = {};
    tree_table_ = {};
    if (device_scratch_ != nullptr) cudaFree(device_scratch_);
    if (host_scratch_ != nullptr) cudaFreeHost(host_scratch_);
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (produced_ != nullptr) cudaEventDestroy(produced_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    device_scratch_ = host_scratch_ = nullptr;
    done_ = produced_ = nullptr;
    stream_ = nullptr;
  }

  // The communicator's device is current during a call (the calling thread
  // may have another one current).
  class device_scope {
   public:
    explicit device_scope(int device) {
      cudaGetDevice(&previous_);
      CUDA_CHECK(cudaSetDevice(device));
    }
    ~device_scope() { cudaSetDevice(previous_); }
    device_scope(const device_scope&) = delete;
    device_scope& operator=(const device_scope&) = delete;

   private:
    int previous_ = 0;
  };

  int device_;
  std::mutex mutex_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  cudaEvent_t produced_ = nullptr;  // recorded on a replica's stream: its bucket is ready
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};
  bool done_before_abort_ = false;
  bool recorded_ = false;  // done_ has been recorded
  bool initialised_ = false;
  float* staged_ = nullptr;  // the host buffer of the call in flight, if any
  std::size_t staged_size_ = 0;
  float* device_scratch_ = nullptr;
  float* host_scratch_ = nullptr;
  std::size_t scratch_size_ = 0;
  // reduce_tree's: the parts received, and the kernel's table (pinned, then
  // on the device). A call's table is read before the next call starts:
  // the endpoint waits for each call to finish.
  device_buffer<float> tree_scratch_;
  pinned_buffer<unsigned char> tree_table_host_;
  device_buffer<unsigned char> tree_table_;
};

ncclUniqueId new_unique_id() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) throw error(error_kind::internal, std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
  return id;
}

}  // namespace

std::shared_ptr<collective_group> make_nccl_group(std::vector<int> devices) {
  const ncclUniqueId id = new_unique_id();
  const int size = static_cast<int>(devices.size());
  return make_driver_group(size, [devices = std::move(devices), id](int rank, int n, const std::atomic<bool>&)
                                     -> std::unique_ptr<collective_driver> {
    return std::make_unique<nccl_driver>(rank, n, devices.at(static_cast<std::size_t>(rank)), id);
  });
}

// See Note [NCCL's unique id through the store].
std::shared_ptr<collective_group> make_nccl_group(std::shared_ptr<rendezvous_store> store, int size,
                                                  std::function<int(int rank)> device_of, nccl_group_options options) {
  if (!store) throw std::invalid_argument("nccl group: no rendezvous store");
  return make_driver_group(size, [store = std::move(store), device_of = std::move(device_of), options](
                                     int rank, int n, const std::atomic<bool>& aborted) -> std::unique_ptr<collective_driver> {
    const std::vector<char> bytes = share_unique_id(
        *store, options.prefix, rank, sizeof(ncclUniqueId),
        [] {
          const ncclUniqueId id = new_unique_id();
          const char* raw = reinterpret_cast<const char*>(&id);
          return std::vector<char>(raw, raw + sizeof id);
        },
        aborted, std::chrono::steady_clock::now() + options.rendezvous_timeout);
    ncclUniqueId id;
    std::memcpy(&id, bytes.data(), sizeof id);
    return std::make_unique<nccl_driver>(rank, n, device_of(rank), id);
  }, /*spans_processes=*/true);
}

}  // namespace dpactor
