#pragma once
// The device actor: a detached actor (its own thread) owning one replica.
// For each step of a shard message its step runner (train/step_runner.hpp)
// runs forward and backward in micro-batches, then the step's collectives and
// this member's part of the optimizer step. The device reports to the reducer
// only what the collective cannot carry: the untouched indices of a cut
// shard (shard_cut_msg), who it waits for past its deadline (late_msg), and,
// from the first member, the records of the message's steps once they are
// done (steps_done_msg, See Note [One step report]). Nothing on this path
// waits for the reducer: see Note [Work flows through the loader].
//
// Its interface is device_actor (actors/protocol.hpp): from the loader, in
// order, begin_generation_msg, shard_msg (one or more consecutive steps),
// evaluate_msg, snapshot_msg, finish_msg; from the reducer suspend_atom and
// state_atom (requests), inject_msg and params_request.
//
// Note [Cutting a step short]
// A cut must reach a device in the middle of its step, but an actor reads its
// mailbox only between messages. The reducer therefore stores the step number
// in the member's device_control, which the device reads between
// micro-batches. That memory is in the reducer's process only: across
// processes there are no cuts (a coordinator's run plans none, See
// coordinator_role::steer). The reducer learns who is late from the members that wait
// for them (late_msg). A cut device stops before its next micro-batch, joins
// the collective with the samples it has, and reports the untouched indices
// (shard_cut_msg); the loader hands them out again later in the epoch.

#include <array>
#include <atomic>
#include <exception>
#include <thread>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include <dpactor/events.hpp>
#include "train/fault_plan.hpp"
#include "actors/protocol.hpp"
#include "train/step_runner.hpp"
#include "train/straggler.hpp"
#include "comms/collective.hpp"
#include "data/dataset.hpp"
#include "train/latest_parameters.hpp"
#include "train/logical_workers.hpp"
#include "tensors/lr_schedule.hpp"
#include "tensors/replica.hpp"
#include "tensors/rng.hpp"

namespace dpactor {

struct device_setup {
  int id = 0;        // device number: "cpu:<id>", stable across generations
  std::string name;  // "cpu:0", for messages and events
  std::unique_ptr<replica> model;
  // Round modes: runs the logical workers' rounds, a slice each (See Note
  // [Logical workers]); null in every_step.
  std::shared_ptr<logical_worker_runner> workers;
  // every_step: what the gradients travel as (sync.codec; See Note [Bf16
  // steps]).
  sync_codec step_codec = sync_codec::fp32;
  // sync.codec = "powersgd" (See Note [PowerSGD steps]); null otherwise.
  std::shared_ptr<const powersgd_setup> powersgd;
  std::shared_ptr<const dataset> train;
  std::shared_ptr<const dataset> test;
  lr_schedule schedule;
  collective_options collective;
  bool verify_replicas = false;
  nonfinite_policy on_nonfinite = nonfinite_policy::stop;  // See Note [Non-finite steps]
  // When a member waiting in a step's collective reports the late ones:
  // late_factor x the median compute time after the step started, but not
  // sooner than late_floor_s.
  double late_factor = 2.0;
  double late_floor_s = 0.001;
  std::shared_ptr<device_control> control;
  std::vector<fault_spec> faults;  // this device's injected faults
  std::uint64_t fault_seed = 1;
  bucket_limits buckets;  // on backends that overlap (See Note [Gradient buckets])
  // train.record_trained: told what this device trained in every step it applied.
  std::function<void(const trained_event&)> on_trained;
  // service.snapshot_every_s: rank 0 publishes its parameters here (See
  // train/latest_parameters.hpp). Null: off.
  std::shared_ptr<latest_parameters> latest;
  // Or, in another process than the reducer, sends it to the reducer and
  // waits for its answer before the step's exchange (See Note [A remote
  // device's record arrives before its gradients]).
  bool trained_to_reducer = false;
  // A device in another process than the reducer gets tickets without the
  // group object (group_ticket.local): it makes its part of the group from
  // the ticket and the group's size (a worker's Gloo group, actors/worker.cpp).
  std::function<std::shared_ptr<collective_group>(const group_ticket& ticket, int size)> remote_group;
  // See Note [Overlapped delayed rounds]: where the next round computes
  // while a round's exchange runs; empty where rounds do not overlap.
  std::array<std::unique_ptr<replica>, 2> shadows;
};

// Tells the reducer who is late in the current step's collective.
struct late_reporter final : late_observer {
  void on_late(std::span<const int> missing_ranks) override;
  device_actor::stateful_pointer<struct device_state> self = nullptr;
  std::int64_t step = 0;
};

// A late_observer for an exchange on another thread than the actor's.
struct async_late_reporter final : late_observer {
  void on_late(std::span<const int> missing_ranks) override;
  reducer_actor reducer;
  std::int64_t generation = 0;
  std::int64_t step = 0;
  std::int32_t rank = 0;
};

// What a step computed and the record it still has to make once its
// exchange is done (See Note [Overlapped delayed rounds]).
struct computed_step {
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  step_runner::computed c;
  std::size_t returned = 0;
  std::uint64_t carried = 0;  // the state's checksum carried into the step
  std::int64_t counter = 0;   // the optimizer steps before it
  step_runner* runner = nullptr;
  bool recorded = false;      // its trained record went out before the exchange
};

// A round's exchange running on a thread of its own while the next round
// computes (See Note [Overlapped delayed rounds]). Joined before it is
// destroyed.
struct exchange_in_flight {
  computed_step step;
  replica* next = nullptr;  // where the next round computes: the preview
  async_late_reporter late;
  std::vector<float> header;       // the reduced header, once done
  std::exception_ptr error;
  std::thread thread;
  ~exchange_in_flight() {
    if (thread.joinable()) thread.join();
  }
};

struct device_state {
  std::shared_ptr<device_setup> setup;
  std::vector<float> latest_scratch;  // a parameter copy on its way to setup->latest
  std::shared_ptr<collective_group> group;
  std::unique_ptr<collective> comm;
  reducer_actor reducer;  // from the generation's begin message
  std::int64_t generation = -1;
  std::int32_t rank = -1;
  std::int64_t last_step = -1;  // last step whose update this replica applied
  std::vector<std::uint32_t> eval_rows;
  std::optional<step_runner> runner;
  // See Note [Overlapped delayed rounds]: a second runner, so that one
  // computes while the other's exchange runs, and that exchange.
  std::optional<step_runner> second_runner;
  std::unique_ptr<exchange_in_flight> in_flight;
  std::optional<std::int64_t> failed_step;  // the step whose exchange threw, when not the current one
  late_reporter late;
  std::vector<step_record> records;  // of the shard message in progress
  // A step of this generation was not finite and train.on_nonfinite is
  // "stop": no more steps until the next generation (See Note [Non-finite steps]).
  bool halted = false;
  static inline const char* name = "device";
};

device_actor::behavior_type device_behavior(device_actor::stateful_pointer<device_state> self,
                                            std::shared_ptr<device_setup> setup);

}  // namespace dpactor
