#include "actors/backend.hpp"

#include <algorithm>
#include <thread>

#include "comms/local.hpp"
#include "tensors/cpu_replica.hpp"
#include "tensors/error.hpp"
#if DPACTOR_HAS_CUDA
#include "comms/nccl.hpp"
#include "cuda/cuda_replica.hpp"
#endif

namespace dpactor {

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
    return make_nccl_group(std::move(devices));
  }
#endif
  local_group_options options;
  options.oversubscribed = ids.size() > std::max(1u, std::thread::hardware_concurrency());
  return make_local_group(static_cast<int>(ids.size()), options);
}

std::string device_name(const job_config& config, int id) {
  return (config.cluster.gpus.empty() ? "cpu:" : "gpu:") + std::to_string(id);
}

}  // namespace dpactor
