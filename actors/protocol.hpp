#pragma once
// The actors' protocols in one place: every message with its inspect right
// under it, the typed interface of each actor (exactly what it reacts to and
// replies to, checked by the compiler at every send), and one type ID block
// that registers exactly the types that may cross the network. Requests that
// carry promises are in-process only: they are whitelisted as unsafe message
// types, have no inspect, and are not in the block.
//
//   reducer -> loader   generation_plan, committed_msg, eval_done_msg, rollback_msg, pause_msg,
//                       shares_msg, stop_atom; ledger_atom (request)
//   reducer -> device   suspend_atom, state_atom (requests), inject_msg, params_request
//   loader  -> device   begin_generation_msg, shard_msg, evaluate_msg, snapshot_msg, finish_msg
//                       (one FIFO stream: See Note [Work flows through the loader])
//   loader  -> reducer  ledger_snapshot_msg, epoch_ledger_msg, work_done_msg, paused_msg,
//                       rollback_done_msg, idle_msg
//   stream queue -> loader  records_atom
//   device  -> reducer  steps_done_msg (See Note [One step report]), shard_cut_msg, late_msg,
//                       evaluated_msg, state_msg, device_failed_msg, step_aborted_msg (one-way),
//                       trained_event (from another process, train.record_trained)
//   engine  -> reducer  start_atom, stop_atom, add_device_msg, remove_device_msg, inject_msg,
//                       params_request, checkpoint_atom, lr_msg (forwarded to the loader)
//   coordinator -> reducer  node_joined_msg (a worker's devices, during training)
//   reducer -> writer   write_checkpoint_msg (request, answered with checkpoint_written_msg)

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "comms/collective.hpp"
#include "data/epoch_ledger.hpp"
#include "train/events.hpp"
#include "train/step_record.hpp"
#include "train/step_shard.hpp"

namespace dpactor {

using stop_atom = caf::atom_constant<caf::atom("stop")>;
using start_atom = caf::atom_constant<caf::atom("start")>;
// reducer -> device: stop and report the last step applied (request).
using suspend_atom = caf::atom_constant<caf::atom("suspend")>;
// reducer -> device: the replica's state (request, answered with state_msg).
using state_atom = caf::atom_constant<caf::atom("state")>;
// reducer -> loader: the ledger position as it stands (request).
using ledger_atom = caf::atom_constant<caf::atom("ledger")>;
// reducer -> itself: periodic hang check.
using tick_atom = caf::atom_constant<caf::atom("tick")>;
// the stream's queue -> loader: the records it waited for are there.
using records_atom = caf::atom_constant<caf::atom("records")>;
// engine -> reducer -> loader: a checkpoint as soon as possible.
using checkpoint_atom = caf::atom_constant<caf::atom("ckptnow")>;

struct generation_plan;
struct begin_generation_msg;
struct shard_msg;
struct evaluate_msg;
struct snapshot_msg;
struct finish_msg;
struct shard_cut_msg;
struct late_msg;
struct steps_done_msg;
struct evaluated_msg;
struct state_msg;
struct device_failed_msg;
struct step_aborted_msg;
struct committed_msg;
struct rollback_msg;
struct eval_done_msg;
struct pause_msg;
struct paused_msg;
struct shares_msg;
struct inject_msg;
struct add_device_msg;
struct node_joined_msg;
struct remove_device_msg;
struct ledger_snapshot_msg;
struct epoch_ledger_msg;
struct work_done_msg;
struct rollback_done_msg;
struct idle_msg;
struct lr_msg;
struct write_checkpoint_msg;
struct checkpoint_written_msg;
struct params_request;

// ---- the actors' interfaces ---------------------------------------------

using device_actor = caf::typed_actor<
    caf::reacts_to<begin_generation_msg>, caf::reacts_to<shard_msg>, caf::reacts_to<evaluate_msg>,
    caf::reacts_to<snapshot_msg>, caf::reacts_to<finish_msg>, caf::replies_to<suspend_atom>::with<std::int64_t>,
    caf::replies_to<state_atom>::with<state_msg>, caf::reacts_to<inject_msg>, caf::reacts_to<params_request>>;

using loader_actor = caf::typed_actor<
    caf::reacts_to<generation_plan>, caf::reacts_to<committed_msg>, caf::reacts_to<eval_done_msg>,
    caf::reacts_to<rollback_msg>, caf::reacts_to<pause_msg>, caf::reacts_to<shares_msg>, caf::reacts_to<stop_atom>,
    caf::reacts_to<records_atom>, caf::reacts_to<checkpoint_atom>, caf::reacts_to<lr_msg>,
    caf::replies_to<ledger_atom>::with<ledger_snapshot_msg>>;

using reducer_actor = caf::typed_actor<
    caf::reacts_to<start_atom>, caf::reacts_to<tick_atom>, caf::reacts_to<stop_atom>,
    // from devices
    caf::reacts_to<steps_done_msg>, caf::reacts_to<shard_cut_msg>, caf::reacts_to<late_msg>,
    caf::reacts_to<evaluated_msg>, caf::reacts_to<state_msg>, caf::reacts_to<device_failed_msg>,
    caf::reacts_to<step_aborted_msg>, caf::reacts_to<trained_event>,
    // from the loader
    caf::reacts_to<ledger_snapshot_msg>, caf::reacts_to<epoch_ledger_msg>, caf::reacts_to<work_done_msg>,
    caf::reacts_to<paused_msg>, caf::reacts_to<rollback_done_msg>, caf::reacts_to<idle_msg>,
    // from the engine
    caf::reacts_to<add_device_msg>, caf::reacts_to<remove_device_msg>, caf::reacts_to<inject_msg>,
    caf::reacts_to<params_request>, caf::reacts_to<checkpoint_atom>, caf::reacts_to<lr_msg>,
    // from the coordinator actor
    caf::reacts_to<node_joined_msg>>;

using checkpoint_writer_actor = caf::typed_actor<caf::replies_to<write_checkpoint_msg>::with<checkpoint_written_msg>>;

// ---- generations ----------------------------------------------------------

// A generation's collective group. Across processes only the descriptor fields
// travel (the backend and, for NCCL or Gloo, the rendezvous id); in-process the
// group object rides along.
struct group_ticket {
  std::string backend = "local";
  std::int64_t generation = 0;
  std::string rendezvous_id;
  std::shared_ptr<collective_group> local;  // in-process only, not serialised
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, group_ticket& x) {
  return f(caf::meta::type_name("group_ticket"), x.backend, x.generation, x.rendezvous_id);
}

struct generation_plan {
  std::int64_t generation = 0;
  reducer_actor reducer;              // where members and the loader report
  std::vector<device_actor> members;  // rank = position
  std::int32_t state_source = 0;      // rank whose state every member adopts
  group_ticket group;
  // A state snapshot the new generation's first member must send right after
  // adopting the state (the final checkpoint's, lost with a member); -2: none.
  std::int64_t snapshot_step = -2;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generation_plan& x) {
  return f(caf::meta::type_name("generation_plan"), x.generation, x.reducer, x.members, x.state_source, x.group,
           x.snapshot_step);
}

struct begin_generation_msg {
  std::int64_t generation = 0;
  reducer_actor reducer;
  std::int32_t rank = 0;
  std::int32_t size = 0;
  std::int32_t state_source = 0;
  group_ticket group;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, begin_generation_msg& x) {
  return f(caf::meta::type_name("begin_generation_msg"), x.generation, x.reducer, x.rank, x.size, x.state_source,
           x.group);
}

// ---- work: loader -> device -------------------------------------------------

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_shard& x) {
  return f(caf::meta::type_name("step_shard"), x.step, x.epoch, x.indices, x.slice_rows, x.first_slice, x.last_slice,
           x.schedule_position, x.lr_override);
}

// Consecutive steps for one member, in one message: at small step times the
// loader batches steps so that messages stay rare (train.steps_per_message).
struct shard_msg {
  std::int64_t generation = 0;
  std::vector<step_shard> steps;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_msg& x) {
  return f(caf::meta::type_name("shard_msg"), x.generation, x.steps);
}

struct evaluate_msg {
  std::int64_t generation = 0;
  std::int64_t epoch = 0;
  std::int64_t step = 0;  // evaluates the parameters after this step
  std::uint32_t begin = 0;
  std::uint32_t end = 0;  // test rows [begin, end)
  bool epoch_end = false; // the epoch's evaluation (else the final one of a run stopped mid-epoch)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, evaluate_msg& x) {
  return f(caf::meta::type_name("evaluate_msg"), x.generation, x.epoch, x.step, x.begin, x.end, x.epoch_end);
}

struct snapshot_msg {
  std::int64_t generation = 0;
  std::int64_t step = 0;  // send the state after this step
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, snapshot_msg& x) {
  return f(caf::meta::type_name("snapshot_msg"), x.generation, x.step);
}

struct finish_msg {
  std::int64_t generation = 0;
  std::int64_t step = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, finish_msg& x) {
  return f(caf::meta::type_name("finish_msg"), x.generation, x.step);
}

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
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_record& x) {
  return f(caf::meta::type_name("step_record"), x.step, x.epoch, x.loss_sum, x.correct, x.samples, x.checksum,
           x.counter, x.compute_s, x.member_samples, x.member_returned, x.lr, x.nonfinite, x.applied);
}

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
  return f(caf::meta::type_name("state_msg"), x.step, x.state);
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
  return f(caf::meta::type_name("device_failed_msg"), x.generation, x.step, x.rank, x.what, x.last_step, x.state);
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

// ---- steering: reducer -> loader --------------------------------------------

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_returned& x) {
  return f(caf::meta::type_name("step_returned"), x.step, x.indices);
}

// Every step up to `through` is committed; cut indices go back to the ledger.
struct committed_msg {
  std::int64_t generation = 0;
  std::int64_t through = -1;
  std::vector<step_returned> returned;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, committed_msg& x) {
  return f(caf::meta::type_name("committed_msg"), x.generation, x.through, x.returned);
}

// After a failure: steps up to `through` are in the state source's
// parameters (commit them, minus their returned indices); later steps are not
// (hand their indices out again).
struct rollback_msg {
  std::int64_t generation = 0;
  committed_msg commit;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollback_msg& x) {
  return f(caf::meta::type_name("rollback_msg"), x.generation, x.commit);
}

// The reducer has every member's result of an evaluation.
struct eval_done_msg {
  std::int64_t step = 0;
  bool epoch_end = false;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, eval_done_msg& x) {
  return f(caf::meta::type_name("eval_done_msg"), x.step, x.epoch_end);
}

// Stop issuing steps after `after` (a graceful membership change follows).
struct pause_msg {
  std::int64_t generation = 0;
  std::int64_t after = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pause_msg& x) {
  return f(caf::meta::type_name("pause_msg"), x.generation, x.after);
}

struct shares_msg {
  std::int64_t generation = 0;
  std::vector<double> weights;  // rank order, summing to 1
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shares_msg& x) {
  return f(caf::meta::type_name("shares_msg"), x.generation, x.weights);
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

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ledger_position& x) {
  return f(caf::meta::type_name("ledger_position"), x.epoch, x.cursor, x.front, x.stream.active, x.stream.committed,
           x.stream.trained_above);
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

// A learning rate in place of the schedule's from the next step issued on
// (0: the schedule's again).
struct lr_msg {
  double lr = 0.0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, lr_msg& x) {
  return f(caf::meta::type_name("lr_msg"), x.lr);
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

// The loader applied a rollback: this many indices go out again.
struct rollback_done_msg {
  std::int64_t requeued = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollback_done_msg& x) {
  return f(caf::meta::type_name("rollback_done_msg"), x.requeued);
}

// ---- control: engine -> reducer -> devices ----------------------------------

// A device fault injected at run time (Engine::inject).
struct inject_msg {
  std::string spec;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, inject_msg& x) {
  return f(caf::meta::type_name("inject_msg"), x.spec);
}

struct remove_device_msg {
  std::string name;
  std::string reason;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, remove_device_msg& x) {
  return f(caf::meta::type_name("remove_device_msg"), x.name, x.reason);
}

// ---- checkpoints: reducer -> writer -----------------------------------------

struct write_checkpoint_msg {
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  bool final = false;
  std::vector<float> state;
  ledger_position position;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, write_checkpoint_msg& x) {
  return f(caf::meta::type_name("write_checkpoint_msg"), x.step, x.epoch, x.final, x.state, x.position);
}

struct checkpoint_written_msg {
  std::int64_t step = 0;
  std::string path;
  std::string error;  // empty on success
  std::int64_t committed_sequence = -1;  // stream mode: the position's committed sequence number
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, checkpoint_written_msg& x) {
  return f(caf::meta::type_name("checkpoint_written_msg"), x.step, x.path, x.error, x.committed_sequence);
}

// A device in another process reports what it trained to the reducer, which
// publishes it as the event (train.record_trained): after the device's
// earlier reports, before its later ones.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, trained_event& x) {
  return f(caf::meta::type_name("trained_event"), x.device, x.step, x.epoch, x.samples, x.digest, x.carried);
}

// ---- across nodes: worker <-> coordinator (actors/coordinator.hpp) ----------
// worker -> coordinator (request, answered with job_msg): the job it joins.
struct hello_msg {
  std::string version;  // dpactor_version of the worker
  std::string node;     // its name, for messages
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, hello_msg& x) {
  return f(caf::meta::type_name("hello_msg"), x.version, x.node);
}
struct job_msg {
  std::string config;  // the coordinator's effective config, TOML (dump_job_config)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, job_msg& x) {
  return f(caf::meta::type_name("job_msg"), x.config);
}
// worker -> coordinator (request, answered with joined_msg): its devices,
// ready, holding the job's initial state.
struct join_msg {
  std::string version;
  std::string node;
  std::string job_identity;      // the config its devices train (config/job_identity.hpp)
  std::string data_fingerprint;  // of its copy of the data
  std::vector<device_actor> devices;
  std::vector<std::string> names;  // "node/cpu:0", one per device
  std::vector<std::int32_t> gpus;  // per device: its CUDA device, -1 for a CPU replica
  caf::actor node_actor;           // for run_over_msg and abort_msg
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, join_msg& x) {
  return f(caf::meta::type_name("join_msg"), x.version, x.node, x.job_identity, x.data_fingerprint, x.devices,
           x.names, x.gpus, x.node_actor);
}
struct joined_msg {
  std::string refusal;  // empty: admitted
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, joined_msg& x) {
  return f(caf::meta::type_name("joined_msg"), x.refusal);
}
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
// The rendezvous store the coordinator serves (See Note [Rendezvous store]).
struct store_set_msg {
  std::string key;
  std::vector<char> value;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_set_msg& x) {
  return f(caf::meta::type_name("store_set_msg"), x.key, x.value);
}
// Answered with store_value_msg at once, found or not: the asking rank polls.
struct store_get_msg {
  std::string key;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_get_msg& x) {
  return f(caf::meta::type_name("store_get_msg"), x.key);
}
struct store_value_msg {
  bool found = false;
  std::vector<char> value;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_value_msg& x) {
  return f(caf::meta::type_name("store_value_msg"), x.found, x.value);
}
// coordinator -> worker node: abort the collective groups of a generation
// (its members are blocked in a call and read no messages).
struct abort_msg {
  std::int64_t generation = 0;
  std::string why;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, abort_msg& x) {
  return f(caf::meta::type_name("abort_msg"), x.generation, x.why);
}
// coordinator -> worker node: the run is over; the node ends its devices and
// exits (an empty error: the run finished).
struct run_over_msg {
  std::string error;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, run_over_msg& x) {
  return f(caf::meta::type_name("run_over_msg"), x.error);
}

// ---- in-process only --------------------------------------------------------
// Requests from a user thread that is not an actor: the reply goes into a
// promise rather than a CAF response (a scoped_actor in a user thread keeps
// CAF 0.17's actor system from shutting down until that thread exits). They
// cannot be serialised and are not registered.

// Engine::add_device(): admits a CPU device; the promise gets its name.
struct add_device_msg {
  std::shared_ptr<std::promise<std::string>> reply;
};

struct params_reply {
  std::int64_t step = 0;
  std::vector<float> values;  // the parameter section of the state
};

// Engine::snapshot(): the first member's parameters at its next step boundary.
struct params_request {
  std::shared_ptr<std::promise<params_reply>> reply;
};

// What an exception thrown by a handler becomes: the actor ends with an
// error that carries the exception's message, so that whoever monitors it
// learns why (CAF's default handler drops the message).
caf::error error_of(const std::exception_ptr& x);

// Registers the types of the block below with the actor system's config.
void register_message_types(caf::actor_system_config& config);

}  // namespace dpactor

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dpactor::add_device_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dpactor::params_request)

// Every type that may cross the network: the messages above and the types
// inside them that CAF does not know.
CAF_BEGIN_TYPE_ID_BLOCK(dpactor, caf::first_custom_type_id)
  CAF_ADD_TYPE_ID(dpactor, (dpactor::group_ticket))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::generation_plan))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::begin_generation_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::step_shard))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::shard_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::evaluate_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::snapshot_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::finish_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::shard_cut_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::late_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::step_record))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::steps_done_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::evaluated_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::state_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::device_failed_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::step_aborted_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::step_returned))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::committed_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::rollback_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::eval_done_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::pause_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::shares_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::paused_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::ledger_position))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::ledger_snapshot_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::epoch_ledger_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::work_done_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::rollback_done_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::inject_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::remove_device_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::write_checkpoint_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::checkpoint_written_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::device_actor))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::loader_actor))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::reducer_actor))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::checkpoint_writer_actor))
  CAF_ADD_TYPE_ID(dpactor, (std::vector<dpactor::device_actor>))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::trained_event))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::hello_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::job_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::join_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::joined_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::store_set_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::store_get_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::store_value_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::abort_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::run_over_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::node_joined_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::idle_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::lr_msg))
CAF_END_TYPE_ID_BLOCK(dpactor)
