#pragma once
// The actors' protocols: each actor's typed interface
// (actors/actor_interfaces.hpp) and the messages, each declared with its
// receiver with its inspect right under it, in the order of a step; and one
// type ID block that registers exactly the types that may cross the network.
//
//   loader  -> device   begin_generation_msg, shard_msg, evaluate_msg, snapshot_msg, finish_msg
//                       (one FIFO stream: See Note [Work flows through the loader])
//                                                            actors/device_messages.hpp
//   reducer -> device   suspend_atom, state_atom, move_states_msg, replay_msg (requests), inject_msg,
//                       params_request
//   device  -> reducer  steps_done_msg (See Note [One step report]), shard_cut_msg, late_msg, bytes_msg,
//                       evaluated_msg, state_msg, worker_states_msg, device_failed_msg,
//                       step_aborted_msg (one-way),
//                       trained_event (from another process, train.record_trained)
//                                                            actors/reducer_messages.hpp
//   loader  -> reducer  ledger_snapshot_msg, epoch_ledger_msg, work_done_msg, paused_msg,
//                       rollback_done_msg, idle_msg
//   engine  -> reducer  start_atom, stop_atom, add_device_msg, remove_device_msg, inject_msg,
//                       params_request, checkpoint_atom, lr_msg (forwarded to the loader)
//   coordinator -> reducer  node_joined_msg (a worker's devices, during training)
//   reducer -> loader   generation_plan, committed_msg, eval_done_msg, rollback_msg, pause_msg,
//                       shares_msg, stop_atom, lr_msg; ledger_atom, round_log_request (requests)
//                                                            actors/loader_messages.hpp
//   stream queue -> loader  records_atom
//   reducer -> writer   write_checkpoint_msg (request, answered with checkpoint_written_msg)
//                                                            actors/writer_messages.hpp
//   async reducer <-> a device in another process  async_remote_round_msg,
//                       async_remote_contribution_msg, trained_event, inject_msg;
//                       its process's relay -> reducer: async_progress_msg
//                                                            actors/async_messages.hpp
//   worker <-> coordinator  hello_msg, join_msg, store_*_msg; abort_msg, run_over_msg
//                                                            actors/node_messages.hpp

#include <exception>

#include <caf/all.hpp>

#include "actors/actor_interfaces.hpp"
#include "actors/async_messages.hpp"
#include "actors/device_messages.hpp"
#include "actors/loader_messages.hpp"
#include "actors/node_messages.hpp"
#include "actors/reducer_messages.hpp"
#include "actors/writer_messages.hpp"

namespace dpactor {

// What an exception thrown by a handler becomes: the actor ends with an
// error that carries the exception's message, so that whoever monitors it
// learns why (CAF's default handler drops the message).
caf::error error_of(const std::exception_ptr& x);

// Registers the types of the block below with the actor system's config.
void register_message_types(caf::actor_system_config& config);

}  // namespace dpactor

// Every type that may cross the network: the messages of the headers above
// and the types inside them that CAF does not know.
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
  CAF_ADD_TYPE_ID(dpactor, (dpactor::worker_states_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::bytes_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::async_remote_round_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::async_remote_contribution_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::async_progress_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::moved_workers))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::move_states_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::replay_msg))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::round_log_request))
  CAF_ADD_TYPE_ID(dpactor, (dpactor::round_log_msg))
CAF_END_TYPE_ID_BLOCK(dpactor)
