#pragma once
// The typed interface of each actor: exactly what it reacts to and replies
// to, checked by the compiler at every send. Each message is declared with
// its receiver (actors/protocol.hpp lists where).

#include <cstdint>

#include <caf/all.hpp>

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
// A device to itself: the exchange of this step, if still running, is done now
// (See Note [Overlapped delayed rounds]).
using drain_atom = caf::atom_constant<caf::atom("drain")>;
// the stream's queue -> loader: the records it waited for are there.
using records_atom = caf::atom_constant<caf::atom("records")>;
// engine -> reducer -> loader: a checkpoint as soon as possible.
using checkpoint_atom = caf::atom_constant<caf::atom("ckptnow")>;
// The coordinator's store: a key was set; a held read ran out (Note [Held store reads]).
using store_changed_atom = caf::atom_constant<caf::atom("storeset")>;
using store_expire_atom = caf::atom_constant<caf::atom("storeexp")>;

struct generation_plan;
struct begin_generation_msg;
struct shard_msg;
struct evaluate_msg;
struct snapshot_msg;
struct finish_msg;
struct shard_cut_msg;
struct late_msg;
struct bytes_msg;
struct steps_done_msg;
struct evaluated_msg;
struct state_msg;
struct worker_states_msg;
struct move_states_msg;
struct replay_msg;
struct round_log_request;
struct round_log_msg;
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
struct leave_request;
struct members_request;
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
struct trained_event;  // dpactor/events.hpp

using device_actor = caf::typed_actor<
    caf::reacts_to<begin_generation_msg>, caf::reacts_to<shard_msg>, caf::reacts_to<evaluate_msg>,
    caf::reacts_to<snapshot_msg>, caf::reacts_to<finish_msg>, caf::replies_to<suspend_atom>::with<std::int64_t>,
    caf::replies_to<state_atom>::with<state_msg>, caf::reacts_to<inject_msg>, caf::reacts_to<params_request>,
    caf::reacts_to<drain_atom, std::int64_t>, caf::replies_to<move_states_msg>::with<worker_states_msg>,
    caf::replies_to<replay_msg>::with<std::string>>;

using loader_actor = caf::typed_actor<
    caf::reacts_to<generation_plan>, caf::reacts_to<committed_msg>, caf::reacts_to<eval_done_msg>,
    caf::reacts_to<rollback_msg>, caf::reacts_to<pause_msg>, caf::reacts_to<shares_msg>, caf::reacts_to<stop_atom>,
    caf::reacts_to<records_atom>, caf::reacts_to<checkpoint_atom>, caf::reacts_to<lr_msg>,
    caf::replies_to<ledger_atom>::with<ledger_snapshot_msg>, caf::replies_to<round_log_request>::with<round_log_msg>>;

using reducer_actor = caf::typed_actor<
    caf::reacts_to<start_atom>, caf::reacts_to<tick_atom>, caf::reacts_to<stop_atom>,
    // from devices
    caf::reacts_to<steps_done_msg>, caf::reacts_to<shard_cut_msg>, caf::reacts_to<late_msg>, caf::reacts_to<bytes_msg>,
    caf::reacts_to<evaluated_msg>, caf::reacts_to<state_msg>, caf::reacts_to<worker_states_msg>,
    caf::reacts_to<device_failed_msg>,
    caf::reacts_to<step_aborted_msg>, caf::replies_to<trained_event>::with<std::int64_t>,
    // from the loader
    caf::reacts_to<ledger_snapshot_msg>, caf::reacts_to<epoch_ledger_msg>, caf::reacts_to<work_done_msg>,
    caf::reacts_to<paused_msg>, caf::reacts_to<rollback_done_msg>, caf::reacts_to<idle_msg>,
    // from the engine
    caf::reacts_to<add_device_msg>, caf::reacts_to<remove_device_msg>, caf::reacts_to<leave_request>,
    caf::reacts_to<members_request>, caf::reacts_to<inject_msg>,
    caf::reacts_to<params_request>, caf::reacts_to<checkpoint_atom>, caf::reacts_to<lr_msg>,
    // from the coordinator actor
    caf::reacts_to<node_joined_msg>>;

using checkpoint_writer_actor = caf::typed_actor<caf::replies_to<write_checkpoint_msg>::with<checkpoint_written_msg>>;

}  // namespace dpactor
