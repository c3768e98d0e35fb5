#include "actors/backend.hpp"

#include <algorithm>
#include <thread>

#include "actors/protocol.hpp"
#include "comms/local.hpp"
#include "tensors/cpu_replica.hpp"
#include <dpactor/error.hpp>
#if DPACTOR_HAS_CUDA
#include "comms/nccl.hpp"
#include "comms/same_device.hpp"
#include "cuda/cuda_replica.hpp"
#include "cuda/resources.hpp"
#endif
#if DPACTOR_HAS_GLOO
#include "comms/gloo.hpp"
#endif

namespace dpactor {

int usable_gpus(std::string& note) {
#if DPACTOR_HAS_CUDA
  return visible_cuda_devices(&note);
#else
  note = "this build of dpactor has no CUDA support";
  return 0;
#endif
}

torch_model_options torch_options(const job_config& config, const replica_shape& shape) {
  torch_model_options o;
  o.path = config.module.path;
  o.input_shape = config.module.input_shape;
  o.features = shape.features;
  o.loss = config.model.loss;
  o.max_batch = shape.micro_batch;
  o.threads = shape.threads;
  return o;
}

std::unique_ptr<replica> make_replica(const job_config& config, const replica_shape& shape, int id,
                                      const torch_model_factory& torch_factory) {
  const std::size_t micro_batch = shape.micro_batch;
  if (torch_factory) {
    if (!config.cluster.gpus.empty())
      throw config_error("a torch model runs on CPU replicas only in this version (Debian's libtorch is CPU-only): "
                         "use --cpus");
    return std::make_unique<cpu_replica>(torch_factory(torch_options(config, shape)), config.optimizer);
  }
  if (config.cluster.gpus.empty()) return std::make_unique<cpu_replica>(config.model, config.optimizer, micro_batch);
#if DPACTOR_HAS_CUDA
  cuda_replica_options options;
  options.device = config.cluster.gpus.at(static_cast<std::size_t>(id));
  options.tf32 = config.precision.matmul == matmul_precision::tf32;
  switch (config.cluster.gpu_data) {
    case gpu_data_placement::automatic: options.data = cuda_data_placement::automatic; break;
    case gpu_data_placement::resident: options.data = cuda_data_placement::resident; break;
    case gpu_data_placement::streamed: options.data = cuda_data_placement::streamed; break;
  }
  return std::make_unique<cuda_replica>(config.model, config.optimizer, micro_batch, options);
#else
  (void)id;
  throw config_error("cluster.gpus is set but this build of dpactor has no CUDA support");
#endif
}

std::shared_ptr<collective_group> make_group([[maybe_unused]] const job_config& config, const std::vector<int>& ids) {
#if DPACTOR_HAS_CUDA
  if (!config.cluster.gpus.empty()) {
    std::vector<int> devices;
    for (const int id : ids) devices.push_back(config.cluster.gpus.at(static_cast<std::size_t>(id)));
    // NCCL refuses two ranks on one GPU: replicas sharing one go through it
    // directly (validate_job_config allows sharing only by every replica).
    if (devices.size() > 1 && std::all_of(devices.begin(), devices.end(), [&](int d) { return d == devices[0]; }))
      return make_same_device_group(static_cast<int>(devices.size()), devices[0]);
    return make_nccl_group(std::move(devices));
  }
#endif
  local_group_options options;
  options.oversubscribed = ids.size() > std::max(1u, std::thread::hardware_concurrency());
  return make_local_group(static_cast<int>(ids.size()), options);
}

void check_gpus_across_processes(const std::vector<int>& gpus, const std::string& who) {
  for (std::size_t i = 0; i < gpus.size(); ++i)
    if (std::count(gpus.begin(), gpus.begin() + static_cast<std::ptrdiff_t>(i), gpus[i]) > 0)
      throw config_error(who + " lists GPU " + std::to_string(gpus[i]) +
                         " twice: across processes every GPU rank is NCCL's, and NCCL refuses two ranks on one GPU "
                         "(replicas share a GPU in one process only, --gpus 0,0 without --coordinator or --join)");
}

group_maker in_process_groups(const job_config& config,
                              std::function<std::shared_ptr<collective_group>(int members)> custom) {
  if (custom)
    return [custom = std::move(custom)](const std::vector<int>& ids, std::int64_t generation) {
      return group_ticket{"custom", generation, "", custom(static_cast<int>(ids.size()))};
    };
  return [config](const std::vector<int>& ids, std::int64_t generation) {
    return group_ticket{"local", generation, "", make_group(config, ids)};
  };
}

group_maker cluster_groups(std::vector<int> gpus, cluster_link link) {
  return [gpus = std::move(gpus), link = std::move(link)](const std::vector<int>& ids, std::int64_t generation) {
    group_ticket ticket{gpus.empty() ? "gloo" : "nccl", generation, "g" + std::to_string(generation), nullptr};
    // Two generations back are over everywhere: their keys can go.
    if (generation >= 2) link.store->erase_prefix("g" + std::to_string(generation - 2) + "/");
    // Only the coordinator's own ranks ask: their ids index its cluster.gpus.
    ticket.local = group_from_ticket(ticket, link, static_cast<int>(ids.size()), [&gpus, ids](int rank) {
      return gpus.at(static_cast<std::size_t>(ids.at(static_cast<std::size_t>(rank))));
    });
    return ticket;
  };
}

std::shared_ptr<collective_group> group_from_ticket(const group_ticket& ticket, const cluster_link& link, int size,
                                                    [[maybe_unused]] const std::function<int(int rank)>& gpu_of) {
  if (ticket.backend == "nccl") {
#if DPACTOR_HAS_CUDA
    nccl_group_options o;
    o.prefix = ticket.rendezvous_id;
    o.rendezvous_timeout = link.rendezvous_timeout;
    return make_nccl_group(link.store, size, gpu_of, o);
#else
    throw config_error("cluster.gpus is set but this build of dpactor has no CUDA support");
#endif
  }
  if (ticket.backend == "gloo") {
#if DPACTOR_HAS_GLOO
    gloo_group_options o;
    o.prefix = ticket.rendezvous_id;
    o.address = link.address;
    o.shared_memory = link.shared_memory;
    o.rendezvous_timeout = link.rendezvous_timeout;
    return make_gloo_group(link.store, size, o);
#else
    throw config_error("this build of dpactor has no Gloo backend, which ranks in several processes need "
                       "(apt-get install libgloo-dev, then build again)");
#endif
  }
  throw std::logic_error("a generation's ticket names the backend '" + ticket.backend +
                         "', which does not reach across processes");
}

std::chrono::milliseconds rendezvous_timeout(const job_config& config) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(config.cluster.rendezvous_timeout_s * 1000.0));
}

std::string device_name(const job_config& config, int id) {
  return (config.cluster.gpus.empty() ? "cpu:" : "gpu:") + std::to_string(id);
}

}  // namespace dpactor
