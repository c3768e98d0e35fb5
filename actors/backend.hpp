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

namespace dpactor {

// The replica of device `id`: on GPU config.cluster.gpus[id], or a CPU one.
// Throws config_error for GPUs in a build without CUDA.
std::unique_ptr<replica> make_replica(const job_config& config, std::size_t micro_batch, int id);

// A generation's collective group for the members with these device ids:
// NCCL on GPUs, the in-process `local` backend on CPU replicas.
std::shared_ptr<collective_group> make_group(const job_config& config, const std::vector<int>& ids);

// "gpu:3" or "cpu:3".
std::string device_name(const job_config& config, int id);

}  // namespace dpactor
