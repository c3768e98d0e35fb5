#pragma once
// The coordinator's published actor (dpactor --coordinator): the one address
// workers know. It hands a joining worker the job's config, admits its
// devices, and serves the rendezvous store of the Gloo groups.
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

}  // namespace dpactor

#include <atomic>
#include <mutex>

#include "actors/engine.hpp"
#include "actors/reducer.hpp"
#include "config/job_config.hpp"

namespace dpactor {

// The workers' node actors, for abort_msg and run_over_msg: those joined
// before the start, then those joined during training. Closed when the run
// is over; a join after that is refused. Thread-safe.
class worker_nodes {
 public:
  // False once closed.
  bool add(const caf::actor& node);
  std::vector<caf::actor> list() const;
  // Closes the list and returns it.
  std::vector<caf::actor> close();

 private:
  mutable std::mutex mutex_;
  std::vector<caf::actor> nodes_;
  bool closed_ = false;
};

// What a coordinating engine adds to its run.
struct coordinator_start {
  caf::actor actor;                         // published
  std::shared_ptr<rendezvous_store> store;  // the Gloo groups'
  std::vector<member_handle> members;       // the workers' devices, ids from first_id
  std::shared_ptr<worker_nodes> nodes;
  // Hands the run's reducer to the coordinator actor: joins during training
  // go to it (node_joined_msg); those taken before are sent now.
  std::function<void(const reducer_actor&)> attach_reducer;
};

// Publishes the coordinator, tells options.on_listening, and waits until
// local_devices plus the joined ones reach options.wait_devices. Throws
// config_error when it cannot listen there, and training_error when `stop`
// is set while it waits.
// A worker whose config (job_identity) or data (`fingerprint`, this node's)
// differs is refused with a message naming the first difference.
coordinator_start start_coordinator(caf::actor_system& system, const coordinator_options& options,
                                    const job_config& config, const std::string& fingerprint, int local_devices,
                                    int first_id, const std::atomic<bool>& stop);

// Why a worker's devices cannot join the job: "" when they are of the job's
// kind (GPUs for a GPU job, else CPU replicas).
std::string kind_difference(bool gpu_job, const join_msg& msg);

// The ticket of a generation of GPU ranks in several processes: an NCCL
// group under the prefix "g<generation>", its unique id through the store
// (See Note [NCCL's unique id through the store]); its in-process part serves
// the coordinator's own devices, rank r on gpus[ids[r]].
group_ticket nccl_ticket(const std::shared_ptr<rendezvous_store>& store, const std::vector<int>& gpus,
                         const std::vector<int>& ids, std::int64_t generation);

// The ticket of a generation whose ranks are in several processes: a Gloo
// group under the prefix "g<generation>" of the coordinator's store; its
// in-process part serves the coordinator's own devices.
group_ticket gloo_ticket(const std::shared_ptr<rendezvous_store>& store, const std::string& address,
                         bool shared_memory, int size,
                         std::int64_t generation);

}  // namespace dpactor
