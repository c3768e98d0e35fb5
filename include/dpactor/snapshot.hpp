#pragma once
// A model's parameters at one step boundary (public API): what
// Engine::snapshot and Engine::latest_snapshot return, and predictions from
// them.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <dpactor/flat_layout.hpp>

namespace dpactor {

struct job_config;

// Parameters of the model at one step boundary, laid out as in a
// checkpoint's model.safetensors.
struct parameter_snapshot {
  std::int64_t step = 0;  // optimizer steps done when it was taken: its version
  flat_layout layout;
  std::vector<float> values;
  std::span<const float> tensor(const std::string& name) const;
};

// The model's outputs (scores, one row of model.outputs() per input row) for
// `inputs`, rows of model.inputs() features each, under `parameters`: what
// the native MLP of `config.model` computes in evaluation. Safe from any
// thread. Throws an error of code invalid_argument when `inputs` is not a
// whole number of rows or `parameters` is not laid out for `config.model`,
// config_error for a model.kind other than "mlp" (a torch model predicts in
// the host's own libtorch, from the same tensors).
std::vector<float> predict(const job_config& config, const parameter_snapshot& parameters,
                           std::span<const float> inputs);

}  // namespace dpactor
