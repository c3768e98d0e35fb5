#pragma once
// The coordinator's published actor (dpactor --coordinator): the one address
// workers know. It hands a joining worker the job's config, admits its
// devices, and serves the rendezvous store of the Gloo groups. What a
// coordinating engine does around it is actors/coordinator_role.hpp.
//
// Note [Coordinator and workers]
// One process coordinates: it runs the reducer, the loader with the ledger,
// the checkpoint writer and this actor, and may train on its own devices. A
// worker (dpactor --join, actors/worker.hpp) asks for the config (hello_msg),
// loads its own copy of the data, spawns its device actors holding the job's
// initial state, and offers them (join_msg). Admitted devices are members
// like local ones: the loader sends them shards (indices only; they read
// their own data), they report to the reducer, and the state of each new
// generation reaches them by the broadcast every generation opens with.
// Gradients travel over Gloo (comms/gloo.hpp): every generation's ticket
// names a store prefix, the coordinator's ranks use the store directly, a
// worker's through this actor. Across processes a member blocked in a
// collective reads no messages: the reducer's abort reaches a worker's groups
// through its node actor (abort_msg), and any rank's abort reaches the others
// through Gloo's sockets. Joins before training starts count towards
// --wait-devices; a join during training goes to the reducer
// (node_joined_msg), which admits its devices at the next step boundary as it
// admits Engine::add_device's: the generation they join opens with the
// state's broadcast. A join after the run is over is refused.

#include <functional>
#include <memory>
#include <string>

#include <caf/all.hpp>

#include "actors/protocol.hpp"
#include "comms/rendezvous_store.hpp"

namespace dpactor {

struct coordinator_setup {
  std::string version;      // a worker of another version is refused
  std::string config_text;  // the effective config, sent to workers (job_msg)
  std::shared_ptr<rendezvous_store> store;
  // Decides a join, on the coordinator actor's thread: the refusal, or ""
  // when the devices are admitted.
  std::function<std::string(const join_msg&)> on_join;
};

caf::behavior coordinator_behavior(caf::event_based_actor* self, coordinator_setup setup);

// Why a worker's devices cannot join the job: "" when they are of the job's
// kind (GPUs for a GPU job, else CPU replicas).
std::string kind_difference(bool gpu_job, const join_msg& msg);

}  // namespace dpactor
