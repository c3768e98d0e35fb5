#pragma once
// What the actors of an async run send each other, in one process (See Note
// [Async rounds], actors/async_run.hpp): shared buffers, never serialised.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "tensors/compute_model.hpp"
#include "train/device_progress.hpp"
#include "train/async_claims.hpp"

namespace dpactor {

// A logical worker's round, reducer -> device (See Note [Async rounds]).
struct async_round_msg {
  std::size_t worker = 0;
  std::int64_t worker_round = 0;  // the worker's own round counter: its state's key in the store
  std::int64_t base_round = 0;    // the committed rounds the parameters have
  std::shared_ptr<const std::vector<float>> global;
  async_claim claim;
  double first_position = 0.0;    // on the inner schedule
};

// Its contribution, device -> reducer.
struct async_contribution_msg {
  std::size_t device = 0;
  std::size_t worker = 0;
  std::int64_t worker_round = 0;
  std::int64_t base_round = 0;
  async_claim claim;
  std::shared_ptr<const std::vector<float>> values;  // n_k (global_b - inner_k); null on error
  batch_stats stats;
  double seconds = 0.0;
  std::string error;
};

// A device's progress, which the reducer reads to find it hung (See Note
// [Async faults]), and the reducer's word that it was given up on (a hung
// fault then returns).
struct async_device_watch {
  device_progress progress;
  std::atomic<bool> released{false};
};

// A device of the run and its watch.
struct spawned_device {
  caf::actor actor;
  std::shared_ptr<async_device_watch> watch;
};

// The run's first devices, spawn_async_run -> the reducer.
struct async_devices_msg {
  std::shared_ptr<std::vector<spawned_device>> devices;
};

// The reducer's look at its devices' progress, reducer -> itself.
struct async_hang_tick_msg {};

// The open round's deadline, reducer -> itself.
struct async_deadline_msg {
  std::int64_t round = 0;
};

}  // namespace dpactor

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dpactor::async_round_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dpactor::async_contribution_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dpactor::async_deadline_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dpactor::async_hang_tick_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dpactor::async_devices_msg)
