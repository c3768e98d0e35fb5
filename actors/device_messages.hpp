#pragma once
// What a device actor receives: the start of each generation with its
// collective group, its work from the loader (one FIFO stream: See Note [Work
// flows through the loader]), and control from the reducer.

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "actors/actor_interfaces.hpp"
#include "actors/inspect_train_types.hpp"
#include "comms/collective.hpp"

namespace dpactor {

// ---- a generation: loader -> device ----------------------------------------

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

struct begin_generation_msg {
  std::int64_t generation = 0;
  reducer_actor reducer;
  std::int32_t rank = 0;
  std::int32_t size = 0;
  std::int32_t state_source = 0;
  group_ticket group;
  // Round modes: the member's node and each logical worker's; its process
  // holds its node's workers (See Note [Worker placement]). -1 and empty
  // otherwise.
  std::int32_t node = -1;
  std::vector<std::int32_t> worker_node;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, begin_generation_msg& x) {
  return f(caf::meta::type_name("begin_generation_msg"), x.generation, x.reducer, x.rank, x.size, x.state_source,
           x.group, x.node, x.worker_node);
}

// ---- work: loader -> device -------------------------------------------------

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

// The first member sends the replica's state (state_msg). In the round
// modes every member sends the states of the logical workers it ran in the
// step, and of `workers` besides (worker_states_msg): its node's that the
// step gave nobody, or all of its node's when the step is not the last it
// ran (See Note [A checkpoint's logical workers]).
struct snapshot_msg {
  std::int64_t generation = 0;
  std::int64_t step = 0;  // send the state after this step
  std::vector<std::uint32_t> workers;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, snapshot_msg& x) {
  return f(caf::meta::type_name("snapshot_msg"), x.generation, x.step, x.workers);
}

struct finish_msg {
  std::int64_t generation = 0;
  std::int64_t step = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, finish_msg& x) {
  return f(caf::meta::type_name("finish_msg"), x.generation, x.step);
}

// ---- control: reducer -> device --------------------------------------------

// A device fault injected at run time (Engine::inject).
struct inject_msg {
  std::string spec;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, inject_msg& x) {
  return f(caf::meta::type_name("inject_msg"), x.spec);
}

struct params_reply {
  std::int64_t step = 0;
  std::vector<float> values;  // the parameter section of the state
};

// Engine::snapshot(): the first member's parameters at its next step boundary.
struct params_request {
  std::shared_ptr<std::promise<params_reply>> reply;
};

}  // namespace dpactor

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(dpactor::params_request)
