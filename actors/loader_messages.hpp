#pragma once
// What the loader receives: each generation's plan, and the reducer's
// steering (what is committed, what rolls back, pauses, shares, the
// learning rate).

#include <cstdint>
#include <string>
#include <vector>

#include "actors/actor_interfaces.hpp"
#include "actors/device_messages.hpp"
#include "actors/inspect_train_types.hpp"

namespace dpactor {

struct generation_plan {
  std::int64_t generation = 0;
  reducer_actor reducer;              // where members and the loader report
  std::vector<device_actor> members;  // rank = position
  std::int32_t state_source = 0;      // rank whose state every member adopts
  group_ticket group;
  // A state snapshot the new generation's first member must send right after
  // adopting the state (the final checkpoint's, lost with a member); -2: none.
  std::int64_t snapshot_step = -2;
  // Round modes: the node of each member (rank order) and of each logical
  // worker, by the nodes' order of first appearance among the members (See
  // Note [Worker placement]); empty otherwise.
  std::vector<std::int32_t> member_node;
  std::vector<std::int32_t> worker_node;
  // The states of the workers that change nodes in this generation (See Note
  // [Moving logical workers]); the loader hands them to their new nodes'
  // members.
  moved_workers moved;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generation_plan& x) {
  return f(caf::meta::type_name("generation_plan"), x.generation, x.reducer, x.members, x.state_source, x.group,
           x.snapshot_step, x.member_node, x.worker_node, x.moved);
}

// ---- steering: reducer -> loader --------------------------------------------

// The shards of the committed steps [from, through], whole (See Note
// [Replaying a lost worker's rounds]): answered with a round_log_msg.
struct round_log_request {
  std::int64_t from = 0;
  std::int64_t through = -1;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, round_log_request& x) {
  return f(caf::meta::type_name("round_log_request"), x.from, x.through);
}

struct round_log_msg {
  std::vector<step_shard> rounds;  // in step order; a step the loader no longer has is missing
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, round_log_msg& x) {
  return f(caf::meta::type_name("round_log_msg"), x.rounds);
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

// A learning rate in place of the schedule's from the next step issued on
// (0: the schedule's again).
struct lr_msg {
  double lr = 0.0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, lr_msg& x) {
  return f(caf::meta::type_name("lr_msg"), x.lr);
}

}  // namespace dpactor
