#pragma once
// What the reducer receives: the devices' reports of their steps, the
// loader's reports, and control from the engine and the coordinator actor.
// Requests from a user thread that is not an actor (add_device_msg, and
// params_request in actors/device_messages.hpp) carry a promise instead of
// taking a CAF response: a scoped_actor in a user thread keeps CAF 0.17's
// actor system from shutting down until that thread exits. They cannot be
// serialised and are not registered.

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "actors/actor_interfaces.hpp"
#include "actors/float_wire.hpp"
#include "actors/inspect_train_types.hpp"

namespace dpactor {

// ---- reports: device -> reducer ---------------------------------------------

// A member whose shard was cut short reports the untouched indices (See Note
// [Cutting a step short]); the step commits once they are in.
struct shard_cut_msg {
  std::int64_t generation = 0;
  std::int64_t step = 0;
  std::int32_t rank = 0;
  std::int64_t samples = 0;             // computed before the cut
  std::vector<std::uint32_t> returned;  // untouched, in shard order
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_cut_msg& x) {
  return f(caf::meta::type_name("shard_cut_msg"), x.generation, x.step, x.rank, x.samples, x.returned);
}

// A member has waited in a step's collective past its deadline for the
// members listed: the reducer may cut them, and suspects them if the step
// makes no progress for the hang timeout.
struct late_msg {
  std::int64_t generation = 0;
  std::int64_t step = 0;
  std::int32_t rank = 0;
  std::vector<std::int32_t> missing;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, late_msg& x) {
  return f(caf::meta::type_name("late_msg"), x.generation, x.step, x.rank, x.missing);
}

// Note [One step report]
// A step's statistics travel inside the collective: every member adds its
// sample count, loss and correct count, and its compute time in its own slot,
// to a small buffer all-reduced before the gradients. The first member then
// reports the steps of each shard message in one message (a step_record
// each, train/step_record.hpp); its report also proves that every member was
// alive through those steps, since the collective needs them all. Only with
// train.verify_replicas does every member report (its parameter checksums).
// Members do not tell the reducer when they finish computing: a member that
// waits in the collective past the deadline tells it who is late (late_msg),
// which is rare.
// The steps of one shard message, reported once they are done.
struct steps_done_msg {
  std::int64_t generation = 0;
  std::int32_t rank = 0;
  std::vector<step_record> steps;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, steps_done_msg& x) {
  return f(caf::meta::type_name("steps_done_msg"), x.generation, x.rank, x.steps);
}

// A device in another process than the reducer's: what its collectives
// sent so far and their largest call (See Note [Bytes sent]), after each
// shard message's steps. Only the first member reports the steps (See Note
// [One step report]), and the reducer's stand-in control of a remote device
// counts nothing, so this is how the summary counts every process. With
// them, its exchanges that ran during the next round (See Note [Overlapped
// delayed rounds]).
struct bytes_msg {
  std::uint64_t sent = 0;
  std::uint64_t largest_call = 0;
  std::int64_t overlapped = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, bytes_msg& x) {
  return f(caf::meta::type_name("bytes_msg"), x.sent, x.largest_call, x.overlapped);
}

struct evaluated_msg {
  std::int64_t generation = 0;
  std::int64_t epoch = 0;
  std::int64_t step = 0;
  bool epoch_end = false;
  std::int32_t rank = 0;
  double loss_sum = 0.0;
  std::int64_t correct = 0;
  std::int64_t samples = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, evaluated_msg& x) {
  return f(caf::meta::type_name("evaluated_msg"), x.generation, x.epoch, x.step, x.epoch_end, x.rank, x.loss_sum,
           x.correct, x.samples);
}

struct state_msg {
  std::int64_t step = 0;
  std::vector<float> state;  // See Note [Replica state buffer]
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, state_msg& x) {
  std::vector<char> state;  // See Note [Floats cross the network as their bytes]
  return f(caf::meta::type_name("state_msg"), x.step, wire_out(state, x.state), state, wire_in(state, x.state));
}

// Round modes: logical workers' states at the start of the round after
// `step`, worker after worker, each of state.size() / workers.size() floats
// (See Note [A checkpoint's logical workers]).
struct worker_states_msg {
  std::int64_t step = 0;
  std::vector<std::uint32_t> workers;
  std::vector<float> states;
  std::string error;  // not empty: the member could not read them, and why
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_states_msg& x) {
  std::vector<char> states;  // See Note [Floats cross the network as their bytes]
  return f(caf::meta::type_name("worker_states_msg"), x.step, x.workers, wire_out(states, x.states), states,
           wire_in(states, x.states), x.error);
}

struct device_failed_msg {
  std::int64_t generation = 0;
  std::int64_t step = 0;
  std::int32_t rank = 0;
  std::string what;
  std::int64_t last_step = -1;  // last step whose update the replica applied
  std::vector<float> state;     // its state after last_step (a checkpoint of last resort)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_failed_msg& x) {
  std::vector<char> state;  // See Note [Floats cross the network as their bytes]
  return f(caf::meta::type_name("device_failed_msg"), x.generation, x.step, x.rank, x.what, x.last_step,
           wire_out(state, x.state), state, wire_in(state, x.state));
}

// A member's collective call failed (aborted or timed out) in this step.
struct step_aborted_msg {
  std::int64_t generation = 0;
  std::int64_t step = 0;
  std::int32_t rank = 0;
  std::string what;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_aborted_msg& x) {
  return f(caf::meta::type_name("step_aborted_msg"), x.generation, x.step, x.rank, x.what);
}

// ---- the loader's reports -------------------------------------------------

struct paused_msg {
  std::int64_t generation = 0;
  std::int64_t last_step = -1;  // the last step issued before the pause
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, paused_msg& x) {
  return f(caf::meta::type_name("paused_msg"), x.generation, x.last_step);
}

struct ledger_snapshot_msg {
  std::int64_t step = 0;  // the ledger as it stands once this step is committed
  ledger_position position;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ledger_snapshot_msg& x) {
  return f(caf::meta::type_name("ledger_snapshot_msg"), x.step, x.position);
}

// Stream mode: every step issued is committed and the queue holds less than
// a batch (idle), or records came and steps go out again (not idle). An idle
// run waits for data, not for a hung device (See Note [Progress-based hang
// detection]).
struct idle_msg {
  std::int64_t generation = 0;
  bool idle = false;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, idle_msg& x) {
  return f(caf::meta::type_name("idle_msg"), x.generation, x.idle);
}

struct epoch_ledger_msg {
  std::int64_t epoch = 0;
  std::int64_t committed = 0;
  std::int64_t requeued = 0;
  bool evaluated = true;  // an evaluation of the test set follows
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, epoch_ledger_msg& x) {
  return f(caf::meta::type_name("epoch_ledger_msg"), x.epoch, x.committed, x.requeued, x.evaluated);
}

struct work_done_msg {
  std::int64_t last_step = -1;  // -1: no step was trained
  bool final_evaluation = false;
  bool snapshot = false;
  std::int64_t requeued = 0;    // indices handed out again in the whole run
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, work_done_msg& x) {
  return f(caf::meta::type_name("work_done_msg"), x.last_step, x.final_evaluation, x.snapshot, x.requeued);
}

// The loader applied a rollback: this many indices go out again, and this
// many samples are committed in the run (the rollback's steps included).
struct rollback_done_msg {
  std::int64_t requeued = 0;
  std::int64_t committed_samples = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollback_done_msg& x) {
  return f(caf::meta::type_name("rollback_done_msg"), x.requeued, x.committed_samples);
}

// ---- control: engine -> reducer, coordinator actor -> reducer ----------------

struct remove_device_msg {
  std::string name;
  std::string reason;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, remove_device_msg& x) {
  return f(caf::meta::type_name("remove_device_msg"), x.name, x.reason);
}

// Engine::add_device(): admits a CPU device; the promise gets its name.
struct add_device_msg {
  std::shared_ptr<std::promise<std::string>> reply;
};

// Engine::remove_device(): `name` leaves at the next step boundary if it is
// a member; the reply says whether it is, and names the members.
struct leave_reply {
  bool member = false;
  std::vector<std::string> members;
};
struct leave_request {
  std::shared_ptr<std::promise<leave_reply>> reply;
  std::string name;
};

// Engine::members(): the names of the current members, in rank order.
struct members_request {
  std::shared_ptr<std::promise<std::vector<std::string>>> reply;
};

// coordinator actor -> reducer: a worker admitted while training runs. Its
// devices, spawned in its process, join at the next step boundary as
// Engine::add_device's do (in-process, between two actors of the coordinator).
struct node_joined_msg {
  std::vector<device_actor> devices;
  std::vector<std::string> names;  // "node/cpu:0", one per device
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_joined_msg& x) {
  return f(caf::meta::type_name("node_joined_msg"), x.devices, x.names);
}

}  // namespace dpactor

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dpactor::add_device_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dpactor::leave_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dpactor::members_request)
