#pragma once
// The choice of backend, in one place: which GPUs there are, a device's
// replica (CPU, or CUDA when the build has it and the config names GPUs),
// and the collective its generation's group uses: in one process the `local`
// backend on CPU replicas or NCCL on GPUs (or the embedder's own); across
// processes Gloo on CPU replicas or NCCL on GPUs, made from the ticket the
// coordinator's reducer hands out. Every `#if` on CUDA or Gloo that chooses
// a backend is in backend.cpp.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comms/collective.hpp"
#include "comms/rendezvous_store.hpp"
#include "config/job_config.hpp"
#include "tensors/replica.hpp"
#include "tensors/torch_model.hpp"

namespace dpactor {

struct group_ticket;  // actors/protocol.hpp

// How many CUDA devices this process can use. None in a build without CUDA,
// or when the CUDA runtime reports an error (as cudaGetDeviceCount does on a
// machine without a GPU); `note` then says why.
int usable_gpus(std::string& note);

// How a replica runs: rows per call, the data's features per sample, and
// threads per replica (a torch model's intra-op threads).
struct replica_shape {
  std::size_t micro_batch = 1;
  std::size_t features = 0;
  int threads = 1;
};

// The replica of device `id`: on GPU config.cluster.gpus[id], or a CPU one
// with the native MLP or, given `torch_factory` (model.kind = "torchscript",
// or the embedder's), a torch module made for this replica alone. Throws config_error for GPUs in a build
// without CUDA, and for a module that cannot be loaded.
std::unique_ptr<replica> make_replica(const job_config& config, const replica_shape& shape, int id,
                                      const torch_model_factory& torch_factory = {});

// The options a torch model of this config is opened with.
torch_model_options torch_options(const job_config& config, const replica_shape& shape);

// A generation's collective group for the members with these device ids:
// NCCL on GPUs (same_device for replicas that share one GPU), the
// in-process `local` backend on CPU replicas.
std::shared_ptr<collective_group> make_group(const job_config& config, const std::vector<int>& ids);

// Across processes every GPU rank is NCCL's, and NCCL refuses two ranks on
// one GPU: throws config_error naming `who` when `gpus` lists one twice.
void check_gpus_across_processes(const std::vector<int>& gpus, const std::string& who);

// How the reducer gets the group of each generation, for its members'
// device ids: the ticket its members get (See group_ticket).
using group_maker = std::function<group_ticket(const std::vector<int>& ids, std::int64_t generation)>;

// Every member in this process: make_group's groups, or `custom`'s when set
// (run_options::collective_backend).
group_maker in_process_groups(const job_config& config,
                              std::function<std::shared_ptr<collective_group>(int members)> custom);

// How this process's ranks reach the other processes' in a generation.
struct cluster_link {
  std::shared_ptr<rendezvous_store> store;  // the coordinator's, or a worker's view of it
  std::string address;                      // Gloo: where this process's ranks listen
  bool shared_memory = true;                // cluster.shared_memory
  std::chrono::milliseconds rendezvous_timeout{10'000};  // cluster.rendezvous_timeout_s
};

// Members in several processes (the coordinator's reducer): each
// generation's ticket names an NCCL group when the job trains on GPUs
// (`gpus`: the coordinator's cluster.gpus), else a Gloo group, under the
// store prefix "g<generation>" (the keys of two generations back are erased
// as it is made); its in-process part, ticket.local, serves the
// coordinator's own members, rank r on gpus[ids[r]]. Throws config_error in
// a build without the backend.
group_maker cluster_groups(std::vector<int> gpus, cluster_link link);

// This process's part of the group a ticket names, `size` ranks in all; on
// GPUs, this process's rank r runs on CUDA device gpu_of(r). The one place a
// group across processes is made, by the coordinator for its own members and
// by a worker for its.
std::shared_ptr<collective_group> group_from_ticket(const group_ticket& ticket, const cluster_link& link, int size,
                                                    const std::function<int(int rank)>& gpu_of);

// "gpu:3" or "cpu:3".
std::string device_name(const job_config& config, int id);

// cluster.rendezvous_timeout_s, for a cluster_link.
std::chrono::milliseconds rendezvous_timeout(const job_config& config);

}  // namespace dpactor
