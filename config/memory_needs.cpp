#include "config/memory_needs.hpp"

#include <algorithm>
#include <cmath>

#include "tensors/optimizer.hpp"
#include "tensors/replica.hpp"

namespace dpactor {

memory_inputs memory_needs(const job_config& config, double module_parameters, int replicas, double data_bytes) {
  memory_inputs in;
  // The native MLP's state, counted from the widths without laying it out.
  double parameters = 0.0;
  if (module_parameters > 0.0) {
    parameters = module_parameters;
  } else {
    // Each layer's weight and bias, each tensor padded to its alignment.
    constexpr double padding = 64.0;
    for (std::size_t l = 0; l + 1 < config.model.sizes.size(); ++l)
      parameters += (static_cast<double>(config.model.sizes[l]) + 1.0) * static_cast<double>(config.model.sizes[l + 1]) +
                    2.0 * padding;
    for (const int w : config.model.sizes) in.widths.push_back(static_cast<double>(w));
  }
  in.parameters = parameters;
  in.state = parameters * (1.0 + static_cast<double>(optimizer_slot_names(config.optimizer).size())) +
             static_cast<double>(state_layout::tail_floats);
  in.micro_batch = static_cast<double>(config.train.micro_batch);
  if (config.train.reproducible) {
    const double slices = std::ceil(static_cast<double>(config.train.batch_size) / in.micro_batch);
    in.scratch_gradients = std::ceil(std::log2(std::max(1.0, slices))) + 1.0;
  }
  in.replicas = replicas;
  in.data_bytes = data_bytes;
  return in;
}

}  // namespace dpactor
