#pragma once
// What the actors of an async run send each other (See Note [Async rounds],
// actors/async_run.hpp): in one process shared buffers, never serialised;
// to and from a device in another process (See Note [Async rounds across
// processes]) the floats themselves, serialised.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/float_wire.hpp"
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

// A logical worker's round for a device in another process, reducer ->
// device (See Note [Async rounds across processes]): the round's global
// parameters and the worker's state at its start travel with it.
struct async_remote_round_msg {
  std::uint64_t device = 0;  // the device's number in the run, echoed back
  std::uint64_t worker = 0;
  std::int64_t worker_round = 0;
  std::int64_t base_round = 0;
  std::int64_t epoch = 0;    // the claim (async_claim)
  std::int64_t first = 0;
  std::vector<std::uint32_t> rows;
  double first_position = 0.0;
  std::vector<float> global;
  std::vector<float> state;  // the worker's, at the start of the round
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, async_remote_round_msg& x) {
  // See Note [Floats cross the network as their bytes].
  std::vector<char> global, state;
  return f(caf::meta::type_name("async_remote_round_msg"), x.device, x.worker, x.worker_round, x.base_round, x.epoch,
           x.first, x.rows, x.first_position, wire_out(global, x.global), wire_out(state, x.state), global, state,
           wire_in(global, x.global), wire_in(state, x.state));
}

// Its contribution, device -> reducer: with the worker's state after the
// round (which the reducer's store keeps; the device's process keeps none).
struct async_remote_contribution_msg {
  std::uint64_t device = 0;
  std::uint64_t worker = 0;
  std::int64_t worker_round = 0;
  std::int64_t base_round = 0;
  std::vector<float> values;  // empty on error
  std::vector<float> state;
  double loss_sum = 0.0;      // batch_stats
  std::int64_t correct = 0;
  std::int64_t samples = 0;
  double seconds = 0.0;
  std::string error;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, async_remote_contribution_msg& x) {
  std::vector<char> values, state;  // See Note [Floats cross the network as their bytes]
  return f(caf::meta::type_name("async_remote_contribution_msg"), x.device, x.worker, x.worker_round, x.base_round,
           wire_out(values, x.values), wire_out(state, x.state), values, state, wire_in(values, x.values),
           wire_in(state, x.state), x.loss_sum, x.correct, x.samples, x.seconds, x.error);
}

// A device in another process's progress, its process's relay -> reducer
// (See Note [Async rounds across processes]): sent when it changed.
struct async_progress_msg {
  std::uint64_t device = 0;
  std::int32_t phase = 0;  // device_phase
  std::int64_t step = -1;  // the worker's round
  bool warming = false;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, async_progress_msg& x) {
  return f(caf::meta::type_name("async_progress_msg"), x.device, x.phase, x.step, x.warming);
}

// A device's progress, which the reducer reads to find it hung (See Note
// [Async faults]), and the reducer's word that it was given up on (a hung
// fault then returns). In another process, the reducer and the device's
// number there, from its rounds, for its progress relay.
struct async_device_watch {
  device_progress progress;
  std::atomic<bool> released{false};
  std::mutex mutex;  // guards reducer and number
  caf::actor reducer;
  std::uint64_t number = 0;
};

// A progress relay's look at its device, relay -> itself.
struct async_relay_tick_msg {};

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
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dpactor::async_relay_tick_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dpactor::async_devices_msg)
