#pragma once
// The native model's shape (public API): the [model] section of a job config
// (docs/config.md). The MLP itself is tensors/mlp.hpp.

#include <cstddef>
#include <vector>

namespace dpactor {

// Hidden layers' activation (model.activation), PyTorch's definitions.
enum class activation { identity, relu, gelu, tanh, sigmoid };
// model.loss: softmax cross-entropy, or mean squared error against one-hot targets.
enum class loss_kind { cross_entropy, mse };

struct mlp_spec {
  std::vector<int> sizes;  // input, hidden..., output; at least two entries
  activation hidden_activation = activation::relu;
  loss_kind loss = loss_kind::cross_entropy;

  int inputs() const noexcept { return sizes.front(); }
  int outputs() const noexcept { return sizes.back(); }
  std::size_t layers() const noexcept { return sizes.size() - 1; }
  // Floating-point operations of one training sample (forward, weight and bias
  // gradients, input gradients of every layer but the first); see docs/PERFORMANCE.md.
  double train_flops_per_sample() const noexcept;
};

}  // namespace dpactor
