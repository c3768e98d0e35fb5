#include "actors/messages.hpp"

namespace dpactor {

void register_message_types(caf::actor_system_config& config) {
  config.add_message_type<std::vector<std::uint32_t>>("std::vector<uint32_t>")
      .add_message_type<std::vector<float>>("std::vector<float>")
      .add_message_type<group_ticket>("dpactor::group_ticket")
      .add_message_type<ledger_position>("dpactor::ledger_position")
      .add_message_type<generation_plan>("dpactor::generation_plan")
      .add_message_type<begin_generation_msg>("dpactor::begin_generation_msg")
      .add_message_type<step_shard>("dpactor::step_shard")
      .add_message_type<shard_msg>("dpactor::shard_msg")
      .add_message_type<evaluate_msg>("dpactor::evaluate_msg")
      .add_message_type<snapshot_msg>("dpactor::snapshot_msg")
      .add_message_type<finish_msg>("dpactor::finish_msg")
      .add_message_type<shard_cut_msg>("dpactor::shard_cut_msg")
      .add_message_type<late_msg>("dpactor::late_msg")
      .add_message_type<step_record>("dpactor::step_record")
      .add_message_type<steps_done_msg>("dpactor::steps_done_msg")
      .add_message_type<evaluated_msg>("dpactor::evaluated_msg")
      .add_message_type<state_msg>("dpactor::state_msg")
      .add_message_type<device_failed_msg>("dpactor::device_failed_msg")
      .add_message_type<step_aborted_msg>("dpactor::step_aborted_msg")
      .add_message_type<step_returned>("dpactor::step_returned")
      .add_message_type<committed_msg>("dpactor::committed_msg")
      .add_message_type<rollback_msg>("dpactor::rollback_msg")
      .add_message_type<eval_done_msg>("dpactor::eval_done_msg")
      .add_message_type<pause_msg>("dpactor::pause_msg")
      .add_message_type<paused_msg>("dpactor::paused_msg")
      .add_message_type<shares_msg>("dpactor::shares_msg")
      .add_message_type<inject_msg>("dpactor::inject_msg")
      .add_message_type<add_device_msg>("dpactor::add_device_msg")
      .add_message_type<remove_device_msg>("dpactor::remove_device_msg")
      .add_message_type<ledger_snapshot_msg>("dpactor::ledger_snapshot_msg")
      .add_message_type<epoch_ledger_msg>("dpactor::epoch_ledger_msg")
      .add_message_type<work_done_msg>("dpactor::work_done_msg")
      .add_message_type<rollback_done_msg>("dpactor::rollback_done_msg")
      .add_message_type<write_checkpoint_msg>("dpactor::write_checkpoint_msg")
      .add_message_type<checkpoint_written_msg>("dpactor::checkpoint_written_msg")
      .add_message_type<params_reply>("dpactor::params_reply")
      .add_message_type<params_request>("dpactor::params_request");
}

}  // namespace dpactor
