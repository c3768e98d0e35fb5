#pragma once
// An asynchronous collective backend for the tests: the driver-group logic
// that the `nccl` backend runs on (comms/driver_group.hpp), over the matched
// calls the `same_device` backend runs on (comms/matched_group.hpp), with a
// carrier that really sums, on the CPU, in rank order. Calls are only
// enqueued; one completes once every rank has enqueued it (the last to
// arrive carries it out), and the endpoints find out by polling, as with
// NCCL. Like NCCL it cannot tell who is missing: late lists are empty. It
// lets the CPU tests run the GPU path's step: gradient buckets started during
// backward, the header after them, bucket-wise all-gathers.

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "comms/collective.hpp"

namespace dpactor::testing {

// What every group of one backend did, for the tests to check.
struct emulated_log {
  std::mutex mutex;
  // Each completed call: 'r' (all-reduce, also a bucket's reduce-scatter),
  // 'b' (broadcast), 'g' (all-gather), 't' (a tree's parts moved and
  // evaluated), with its float count (all-gather: its buffer count).
  std::vector<std::pair<char, std::size_t>> calls;
  std::atomic<std::int64_t> groups{0};
};

// A backend for run_options::collective_backend; every group logs to `log`.
std::function<std::shared_ptr<collective_group>(int)> emulated_backend(std::shared_ptr<emulated_log> log);

}  // namespace dpactor::testing
