#pragma once
// The native multi-layer perceptron: Linear, act, Linear, act, ..., Linear.
// Parameters follow PyTorch's nn.Sequential naming: the k-th Linear is module
// 2k, so its tensors are "<2k>.weight" with shape [out, in] and "<2k>.bias".
// Activations are row-major (batch, features).

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <dpactor/model_spec.hpp>
#include "tensors/activation.hpp"
#include "tensors/aligned_buffer.hpp"
#include "tensors/compute_model.hpp"
#include <dpactor/flat_layout.hpp>
#include "tensors/loss.hpp"

namespace dpactor {

// The layout of parameters (and of gradients): per layer weight then bias.
flat_layout mlp_layout(const mlp_spec& spec);

// Draws parameters like PyTorch's nn.Linear.reset_parameters(): weights from
// kaiming_uniform(a=sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in)), and biases from
// U(-1/sqrt(in), 1/sqrt(in)), layer by layer, weight before bias.
// `params` is laid out by mlp_layout(spec).
void init_mlp_parameters(const mlp_spec& spec, std::span<float> params, std::uint64_t seed);

// Forward and backward passes over micro-batches of at most max_batch rows.
// Holds only workspaces; parameters and gradients are passed in, laid out by
// mlp_layout().
class mlp final : public compute_model {
 public:
  mlp(mlp_spec spec, std::size_t max_batch);

  const mlp_spec& spec() const noexcept { return spec_; }
  std::size_t inputs() const noexcept override { return static_cast<std::size_t>(spec_.inputs()); }
  std::size_t outputs() const noexcept override { return static_cast<std::size_t>(spec_.outputs()); }
  std::size_t max_batch() const noexcept override { return max_batch_; }
  const flat_layout& layout() const noexcept override { return layout_; }

  // `params` and `grads` point at buffers laid out by layout().
  // x(n, in), labels(n). Adds the gradient *sums* over the n samples to grads,
  // or with `overwrite` writes them (no zeroing pass needed before the first
  // micro-batch of a step; padding between tensors is left untouched).
  // `on_layer_done`, if set, hears each layer's index as soon as backward has
  // written that layer's gradients (last layer first).
  batch_stats forward_backward(const float* params, float* grads, const float* x, const std::int32_t* labels,
                               std::size_t n, bool overwrite = false, layer_done_callback on_layer_done = {}) override;
  // Loss sum and correct count, no gradients.
  batch_stats evaluate(const float* params, const float* x, const std::int32_t* labels, std::size_t n) override;
  // Writes the outputs (n, out) of the last layer (logits) to `out`.
  void predict(const float* params, const float* x, std::size_t n, float* out);

 private:
  // Runs the layers on x(n, in); returns the output block (n, out).
  const float* forward(const float* params, const float* x, std::size_t n);
  activation layer_activation(std::size_t layer) const noexcept;
  std::size_t offset(std::size_t tensor) const noexcept { return layout_.tensors()[tensor].offset; }

  mlp_spec spec_;
  flat_layout layout_;
  std::size_t max_batch_;
  std::vector<aligned_buffer<float>> outputs_;  // per layer: act(z), (max_batch, out)
  std::vector<aligned_buffer<float>> inputs_;   // per layer: z, kept only where backward needs it
  aligned_buffer<float> grad_a_, grad_b_;       // ping-pong dL/dz blocks (max_batch, widest)
};

}  // namespace dpactor
