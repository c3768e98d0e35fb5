#pragma once
// A collective group whose ranks talk through an asynchronous driver: the
// `nccl` backend (comms/nccl.hpp) and the fake communicator of the tests.
//
// Note [Never block on a GPU collective]
// A driver only enqueues work and reports on it. The endpoint polls it with
// the call's deadline, and on a timeout or an asynchronous error aborts the
// whole group; abort() from any thread (the reducer's) aborts every driver,
// which makes the pending and every later call fail at once. No thread ever
// waits on the GPU without a deadline.

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comms/collective.hpp"
#include "comms/tree_program.hpp"

namespace dpactor {

class collective_driver {
 public:
  enum class state { done, pending, failed };
  virtual ~collective_driver() = default;
  // Each call enqueues and returns; poll() tells when the work is done.
  virtual void all_reduce_sum(float* data, std::size_t n) = 0;
  // all_reduce_sum of device memory, ordered after the work enqueued so far
  // on `after` (a cudaStream_t for NCCL; null: ready now).
  virtual void all_reduce_sum_after(float* data, std::size_t n, void* after) = 0;
  virtual void broadcast(float* data, std::size_t n, int root) = 0;
  // For each buffer b, copies chunk k, chunks[b * ranks + k], from rank k to
  // every rank.
  virtual void all_gather_chunks(std::span<const std::span<float>> buffers,
                                 std::span<const std::pair<std::size_t, std::size_t>> chunks) = 0;
  // See Note [The tree on a device]: the reproducible step's tree over the
  // memory the driver moves (device memory for NCCL). Part i of `steps`'
  // numbering is held by rank roots[i], where own[i] points to it (null on
  // the other ranks, and where n is 0); every rank receives the parts it
  // does not hold and evaluates `steps` over all n elements into `out`,
  // which may be one of its own parts.
  virtual void reduce_tree(std::span<const int> roots, std::span<float* const> own, std::span<const tree_step> steps,
                           float* out, std::size_t n) = 0;
  // Whether the communicator's set-up and everything enqueued have finished;
  // `failed` with `error` set on an asynchronous error.
  virtual state poll(std::string& error) = 0;
  // Thread-safe; pending and later work fails. On return, no work of this
  // driver touches the memory it was given (See Note [Posted memory outlives
  // an abort]).
  virtual void abort() noexcept = 0;
};

// Creates rank r's driver; called on the thread that will use the endpoint.
// A factory that waits (for the other ranks, in a rendezvous) stops waiting
// once `aborted` is set: the group was aborted meanwhile.
using driver_factory =
    std::function<std::unique_ptr<collective_driver>(int rank, int size, const std::atomic<bool>& aborted)>;

// `spans_processes`: its ranks may live in several processes (See
// collective_group::spans_processes).
std::shared_ptr<collective_group> make_driver_group(int ranks, driver_factory factory, bool spans_processes = false);

}  // namespace dpactor
