#pragma once
// The device actor: a detached actor (its own thread) owning one replica.
// For each shard it runs forward and backward in micro-batches, reports
// `computed` to the reducer *before* entering the collective (so the reducer
// sees who is late), sums gradients and sample counts with the other members,
// applies the optimizer, and reports `step_done`. Nothing on this path waits
// for the reducer: see Note [Work flows through the loader].
//
// Handles, from the loader in order: begin_generation_msg, shard_msg (one or
// more consecutive steps),
// evaluate_msg, snapshot_msg, finish_msg; from the reducer: suspend_atom,
// state_atom, inject_msg; from the engine: params_request.
//
// Note [Cutting a step short]
// A cut must reach a device in the middle of its step, but an actor reads its
// mailbox only between messages. The reducer therefore stores the step number
// in the member's device_control, which the device reads between
// micro-batches (across processes, the node actor will do the store when a cut
// message arrives). The reducer learns who is late from the members that wait
// for them (late_msg). A cut device stops before its next micro-batch, joins
// the collective with the samples it has, and reports the untouched indices
// (shard_cut_msg); the loader hands them out again later in the epoch.

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "train/fault_plan.hpp"
#include "actors/messages.hpp"
#include "train/step_runner.hpp"
#include "train/straggler.hpp"
#include "comms/collective.hpp"
#include "data/dataset.hpp"
#include "tensors/lr_schedule.hpp"
#include "tensors/replica.hpp"
#include "tensors/rng.hpp"

namespace dpactor {

struct device_setup {
  int id = 0;        // device number: "cpu:<id>", stable across generations
  std::string name;  // "cpu:0", for messages and events
  std::unique_ptr<replica> model;
  std::shared_ptr<const dataset> train;
  std::shared_ptr<const dataset> test;
  lr_schedule schedule;
  collective_options collective;
  bool verify_replicas = false;
  // When a member waiting in a step's collective reports the late ones:
  // late_factor x the median compute time after the step started, but not
  // sooner than late_floor_s.
  double late_factor = 2.0;
  double late_floor_s = 0.001;
  std::shared_ptr<device_control> control;
  std::vector<fault_spec> faults;  // this device's injected faults
  std::uint64_t fault_seed = 1;
  bucket_limits buckets;  // on backends that overlap (See Note [Gradient buckets])
};

// Tells the reducer who is late in the current step's collective.
struct late_reporter final : late_observer {
  void on_late(std::span<const int> missing_ranks) override;
  caf::stateful_actor<struct device_state>* self = nullptr;
  std::int64_t step = 0;
};

struct device_state {
  std::shared_ptr<device_setup> setup;
  std::shared_ptr<collective_group> group;
  std::unique_ptr<collective> comm;
  caf::actor reducer;  // from the generation's begin message
  std::int64_t generation = -1;
  std::int32_t rank = -1;
  std::int64_t last_step = -1;  // last step whose update this replica applied
  std::vector<std::uint32_t> eval_rows;
  std::optional<step_runner> runner;
  late_reporter late;
  std::vector<step_record> records;  // of the shard message in progress
  static inline const char* name = "device";
};

caf::behavior device_actor(caf::stateful_actor<device_state>* self, std::shared_ptr<device_setup> setup);

}  // namespace dpactor
