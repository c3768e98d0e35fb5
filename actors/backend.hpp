#pragma once
// The choice of backend, in one place: a device's replica (CPU, or CUDA when
// the build has it and the config names GPUs) paired with the collective its
// generation's group uses (the in-process `local` backend, or NCCL). Every
// `#if DPACTOR_HAS_CUDA` of the engine is in backend.cpp.

#include <memory>
#include <string>
#include <vector>

#include "comms/collective.hpp"
#include "config/job_config.hpp"
#include "tensors/replica.hpp"
#include "tensors/torch_model.hpp"

namespace dpactor {

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
// NCCL on GPUs, the in-process `local` backend on CPU replicas.
std::shared_ptr<collective_group> make_group(const job_config& config, const std::vector<int>& ids);

// "gpu:3" or "cpu:3".
std::string device_name(const job_config& config, int id);

}  // namespace dpactor
