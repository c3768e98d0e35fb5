#pragma once
// The coordinating role of an engine (run_options::coordinator, dpactor
// --coordinator; See Note [Coordinator and workers], actors/coordinator.hpp):
// what a run that coordinates workers adds to one that trains alone. It
// publishes the coordinator actor and waits for the workers, adds their
// devices to the members, steers the loader and the reducer for members in
// other processes, and tells the workers when the run is over.
//
// Built with the Gloo backend (coordinator_role.cpp); a build without it
// has coordinator_role_unavailable.cpp, which refuses with a config_error.

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include <dpactor/engine.hpp>
#include "actors/launch.hpp"
#include "actors/loader.hpp"
#include "actors/protocol.hpp"
#include "actors/reducer.hpp"
#include "config/job_config.hpp"

namespace dpactor {

class coordinator_role {
 public:
  // The actor system's config of a coordinating process: networking with
  // heartbeats and, where cluster.tls says so, mutual TLS. Throws
  // config_error (TLS files missing or not matching).
  static std::unique_ptr<caf::actor_system_config> system_config(const job_config& config,
                                                                 const coordinator_options& options);

  // Publishes the coordinator, tells options.on_listening, and waits until
  // the plan's replicas plus the joined devices reach options.wait_devices
  // (and options.wait_workers worker processes have joined). A worker whose
  // config (job_identity) or data (its fingerprint against this node's)
  // differs is refused, naming the first difference. Throws config_error
  // when it cannot listen there, and training_error when `stop` is set while
  // it waits.
  coordinator_role(caf::actor_system& system, const coordinator_options& options, const job_config& config,
                   const launch_plan& plan, const std::atomic<bool>& stop);
  ~coordinator_role();
  coordinator_role(const coordinator_role&) = delete;
  coordinator_role& operator=(const coordinator_role&) = delete;

  // The workers' devices joined before the start, ids after the local ones.
  const std::vector<member_handle>& members() const noexcept;
  // The published actor.
  caf::actor actor() const;

  // Members in other processes: the loader plans no stolen slices (a step's
  // slice board lives in one process's memory) and queues deeper; the
  // reducer makes each generation's group from a ticket, has the workers
  // abort their parts with its own, sends the workers' devices their fault
  // specs as they are admitted, and cuts no straggler.
  void steer(loader_setup& loader, reducer_setup& reducer, const launch_plan& plan) const;
  // Once the reducer runs: the workers' devices get their fault specs, and
  // joins during training go to the reducer.
  void attach(const reducer_actor& reducer, const launch_plan& plan);
  // sync.mode = "async" (See Note [Async rounds across processes]): the
  // workers' devices joined before the start go to the async reducer now
  // (node_joined_msg), and so do joins during training.
  void attach_async(const caf::actor& reducer);
  // The run is over: no worker joins any more, and each ends its devices and
  // exits (`error` empty: the run finished; else why it failed).
  void end_run(const std::string& error);

 private:
  struct state;
  std::unique_ptr<state> state_;
};

}  // namespace dpactor
