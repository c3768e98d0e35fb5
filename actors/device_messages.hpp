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
#include "actors/float_wire.hpp"
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

// Note [Moving logical workers]
// Across processes a logical worker's state lives in its node's store (Note
// [Worker placement]); when a join gives a newcomer some of the workers,
// their states move with them, at the generation boundary. The reducer,
// before it sends the new generation's plan, asks one member of each node
// that gives workers away for their states after the last committed step
// (move_states_msg, answered with a worker_states_msg: the member settles
// its exchange in flight first), and the plan carries them to the loader,
// which hands each receiving node's members the states of its new workers
// in their begin_generation_msg (moved_workers). A member installs them in
// its process's store before it runs anything of the generation (in the
// same FIFO as its work), so no device of the node can run a moved worker
// from a state other than the one its old node ended with: the bytes are
// those of a run where the worker never moved. Installing is idempotent (a
// node's second member finds the state there, or a newer round of it). A
// node that is gone (killed, or its last device failed) cannot give its
// workers' states away: that still stops the run (docs/async.md). The
// states count in bytes_sent once per hop between processes.
struct moved_workers {
  std::int64_t step = -1;  // the states after this step: the generation's first is step + 1
  std::vector<std::uint32_t> workers;
  std::vector<float> states;  // worker after worker, in `workers` order
  // Fast mode: workers lost with their process, which restart from the
  // state `workers` gives them (their backup), or the first round's if it
  // gives none (See Note [Fast rounds across processes]).
  std::vector<std::uint32_t> restart;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, moved_workers& x) {
  std::vector<char> states;  // See Note [Floats cross the network as their bytes]
  return f(caf::meta::type_name("moved_workers"), x.step, x.workers, wire_out(states, x.states), states,
           wire_in(states, x.states), x.restart);
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
  // The states of the workers that moved to this member's node (See Note
  // [Moving logical workers]); none otherwise.
  moved_workers moved;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, begin_generation_msg& x) {
  return f(caf::meta::type_name("begin_generation_msg"), x.generation, x.reducer, x.rank, x.size, x.state_source,
           x.group, x.node, x.worker_node, x.moved);
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

// Run logical worker `worker`'s rounds `rounds` again, from its state after
// `from_step` (`state`; from_step = -1: the first round's state, which every
// process has), as a node that is gone ran them (See Note [Replaying a lost
// worker's rounds]). Answered with "" or why it could not.
struct replay_msg {
  std::int64_t generation = 0;  // the generation it is for
  std::uint32_t worker = 0;
  std::int64_t from_step = -1;
  std::vector<float> state;
  std::vector<step_shard> rounds;  // each with its whole step's `indices`
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replay_msg& x) {
  std::vector<char> state;  // See Note [Floats cross the network as their bytes]
  return f(caf::meta::type_name("replay_msg"), x.generation, x.worker, x.from_step, wire_out(state, x.state), state,
           wire_in(state, x.state), x.rounds);
}

// The states of `workers` after `step`, which move to another node (See Note
// [Moving logical workers]): answered with a worker_states_msg.
struct move_states_msg {
  std::int64_t generation = 0;  // the generation they move in
  std::int64_t step = 0;
  std::vector<std::uint32_t> workers;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, move_states_msg& x) {
  return f(caf::meta::type_name("move_states_msg"), x.generation, x.step, x.workers);
}

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
