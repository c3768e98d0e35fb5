#pragma once
// What a job's replicas and data take, from its config (See Note [Memory
// before allocating], train/memory_estimate.hpp): the native MLP's layers
// from model.layers; a torch module's parameters from the module (its
// activations are libtorch's and not counted).

#include "config/job_config.hpp"
#include "train/memory_estimate.hpp"

namespace dpactor {

// `module_parameters`: a torch module's parameter floats (0: the native
// MLP's, from the config); `data_bytes`: the training and test sets.
memory_inputs memory_needs(const job_config& config, double module_parameters, int replicas, double data_bytes);

}  // namespace dpactor
