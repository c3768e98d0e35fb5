#pragma once
// A process's multi-node role from the environment its launcher set, for
// `dpactor` started without --coordinator or --join under torchrun,
// Kubeflow's PyTorchJob or SLURM (docs/distributed.md, "Launchers"). Pure:
// the environment comes in as a lookup function, so tests need no processes.
//
// Note [Roles from the launcher]
// One command line runs on every rank; the environment decides, first match
// wins:
// - DPACTOR_COORDINATOR=HOST:PORT: a worker joining there (a coordinator is
//   started by hand);
// - MASTER_ADDR and MASTER_PORT with WORLD_SIZE > 1 (torchrun, Kubeflow):
//   RANK 0 (or GROUP_RANK 0 when RANK is missing) coordinates, listening on
//   MASTER_ADDR, and waits for the WORLD_SIZE - 1 other ranks; the others
//   join it. Under torchrun's static rendezvous its agent holds a store on
//   MASTER_PORT of rank 0's machine (TORCHELASTIC_USE_AGENT_STORE=True), so
//   dpactor takes the port after it;
// - SLURM_PROCID with SLURM_NTASKS > 1: task 0 coordinates on the first host
//   of SLURM_JOB_NODELIST, the others join it, on MASTER_PORT or 29500.
// DPACTOR_PORT, when set, is the coordinator's port in every case. A world
// of one process is no multi-node job: no role.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>

namespace dpactor {

struct launcher_role {
  bool coordinator = false;  // else a worker
  std::string host;          // coordinator: the address to listen on; worker: where to join
  std::uint16_t port = 0;
  int workers = 0;           // coordinator: how many worker processes to wait for
  int local_processes = 1;   // LOCAL_WORLD_SIZE: processes on this machine (torchrun --nproc-per-node)
  std::string source;        // the variables it came from, for the log
};

using environment_lookup = std::function<std::optional<std::string>(const std::string& name)>;

// The role, or nullopt when the environment names none. Throws config_error
// naming the variable and its value when one is malformed.
std::optional<launcher_role> role_from_environment(const environment_lookup& env);

// "host:port" split; throws std::invalid_argument naming `what` and the text.
std::pair<std::string, std::uint16_t> split_host_port(const std::string& text, const std::string& what);

// The first host of a SLURM node list: "node[03-05,9],gpu1" -> "node03".
// Throws config_error for an empty or malformed list.
std::string first_slurm_host(const std::string& nodelist);

// The process's own environment.
environment_lookup process_environment();

}  // namespace dpactor
