#pragma once
// A torch module whose parameters and gradients are views of dpactor's flat
// buffers (See Note [Binding a module to flat buffers], bound_module.cpp):
// what the TorchScript plugin (torchscript_model.cpp) and the C++ module
// factory for embedders (module_model.hpp) share. Inside torch/ only: it
// includes libtorch (Note [The libtorch plugin], tensors/torch_model.hpp).

#include <torch/script.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tensors/torch_model.hpp"

namespace dpactor {

// A module that cannot be trained, with the reason (the file or module named).
struct open_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The first line of a libtorch error (its messages carry C++ stack traces).
std::string first_line(const std::string& what);

// What a module is to the binding, whatever made it.
struct module_parts {
  std::string name;  // for messages: the file, or "the C++ module"
  std::vector<std::pair<std::string, at::Tensor>> parameters;  // state_dict names and order
  std::vector<std::pair<std::string, at::Tensor>> buffers;     // See Note [Module buffers]
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::function<void(bool)> set_training;
  std::shared_ptr<void> owner;  // keeps the module alive
};

// The parts of a TorchScript module; `name` for messages.
module_parts script_parts(std::shared_ptr<torch::jit::Module> module, std::string name);

class bound_module final : public torch_model {
 public:
  // Checks the module against `options` (parameters, one sample's forward)
  // and lays its parameters out; throws open_error.
  bound_module(module_parts parts, const torch_model_options& options);

  std::size_t inputs() const noexcept override { return features_; }
  std::size_t outputs() const noexcept override { return classes_; }
  std::size_t max_batch() const noexcept override { return options_.max_batch; }
  const flat_layout& layout() const noexcept override { return layout_; }
  std::size_t buffer_begin() const noexcept override { return buffer_begin_; }
  void initial_parameters(std::span<float> out) const override;

  // libtorch's errors leave as std::runtime_error: no torch type crosses
  // the plugin's boundary (See Note [The libtorch plugin]).
  batch_stats forward_backward(const float* params, float* grads, const float* x, const std::int32_t* labels,
                               std::size_t n, bool overwrite, layer_done_callback on_layer_done) override;
  batch_stats evaluate(const float* params, const float* x, const std::int32_t* labels, std::size_t n) override;

 private:
  void describe();
  batch_stats train_step(const float* params, float* grads, const float* x, const std::int32_t* labels,
                         std::size_t n, bool overwrite, layer_done_callback on_layer_done);
  batch_stats evaluation(const float* params, const float* x, const std::int32_t* labels, std::size_t n);
  void use_threads();
  void bind(const float* params, float* grads);
  // See Note [Module buffers]: the step's buffers from the state into the
  // module, and the module's after a forward into the gradients.
  void load_buffers(const float* state);
  void store_buffers(float* grads) const;
  void set_training(bool on);
  at::Tensor forward(const float* x, std::size_t n);
  at::Tensor loss_of(const at::Tensor& out, const at::Tensor& target) const;

  module_parts parts_;
  torch_model_options options_;
  std::vector<at::Tensor> params_;  // the module's parameters, layout order
  std::vector<at::Tensor> buffers_;  // then its buffers (float32, or int64 counters kept as floats)
  std::size_t buffer_begin_ = 0;
  flat_layout layout_;
  std::vector<float> initial_;
  std::size_t features_ = 0, classes_ = 0;
  std::vector<std::int64_t> shape_;  // [n, input_shape...]
  const float* bound_params_ = nullptr;
  float* bound_grads_ = nullptr;
  bool training_ = true;
};

}  // namespace dpactor
