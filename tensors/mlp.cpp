#include "tensors/mlp.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <string>

#include "tensors/gemm.hpp"
#include "tensors/rng.hpp"

namespace dpactor {

double mlp_spec::train_flops_per_sample() const noexcept {
  double flops = 0.0;
  for (std::size_t l = 0; l < layers(); ++l) {
    const double in = sizes[l], out = sizes[l + 1];
    flops += 2 * in * out + out;      // forward GEMM and bias
    flops += 2 * in * out + out;      // weight and bias gradients
    if (l > 0) flops += 2 * in * out; // input gradient (not needed for the data)
  }
  return flops;
}

flat_layout mlp_layout(const mlp_spec& spec) {
  flat_layout layout;
  for (std::size_t l = 0; l < spec.layers(); ++l) {
    const std::string prefix = std::to_string(2 * l);
    layout.add(prefix + ".weight", {spec.sizes[l + 1], spec.sizes[l]});
    layout.add(prefix + ".bias", {spec.sizes[l + 1]});
  }
  return layout;
}

void init_mlp_parameters(const mlp_spec& spec, std::span<float> params, std::uint64_t seed) {
  const flat_layout layout = mlp_layout(spec);
  assert(params.size() >= layout.size());
  rng gen(seed);
  for (std::size_t l = 0; l < spec.layers(); ++l) {
    // kaiming_uniform with a = sqrt(5): gain = sqrt(2 / (1 + 5)), bound =
    // gain * sqrt(3 / fan_in) = 1 / sqrt(fan_in); the bias bound is the same.
    const double bound = 1.0 / std::sqrt(static_cast<double>(spec.sizes[l]));
    for (std::size_t t : {2 * l, 2 * l + 1}) {
      const tensor_spec& spec_t = layout.tensors()[t];
      for (float& v : params.subspan(spec_t.offset, spec_t.numel())) v = static_cast<float>(gen.uniform(-bound, bound));
    }
  }
}

mlp::mlp(mlp_spec spec, std::size_t max_batch)
    : spec_(std::move(spec)), layout_(mlp_layout(spec_)), max_batch_(max_batch) {
  assert(spec_.sizes.size() >= 2 && max_batch_ > 0);
  int widest = 0;
  for (std::size_t l = 0; l < spec_.layers(); ++l) {
    const auto out = static_cast<std::size_t>(spec_.sizes[l + 1]);
    widest = std::max(widest, spec_.sizes[l + 1]);
    outputs_.emplace_back(max_batch_ * out);
    inputs_.emplace_back(activation_backward_needs_input(layer_activation(l)) ? max_batch_ * out : 0);
  }
  grad_a_ = aligned_buffer<float>(max_batch_ * static_cast<std::size_t>(widest));
  grad_b_ = aligned_buffer<float>(max_batch_ * static_cast<std::size_t>(widest));
}

activation mlp::layer_activation(std::size_t layer) const noexcept {
  return layer + 1 == spec_.layers() ? activation::identity : spec_.hidden_activation;
}

const float* mlp::forward(const float* params, const float* x, std::size_t n) {
  assert(n <= max_batch_);
  const float* in = x;
  for (std::size_t l = 0; l < spec_.layers(); ++l) {
    const int fan_in = spec_.sizes[l], fan_out = spec_.sizes[l + 1];
    const float* w = params + offset(2 * l);  // (out, in)
    const float* b = params + offset(2 * l + 1);
    float* a = outputs_[l].data();
    float* z = inputs_[l].empty() ? a : inputs_[l].data();
    // (n, in) x (in, out) -> (n, out): z = x W^T
    gemm(false, true, static_cast<int>(n), fan_out, fan_in, 1.0f, in, fan_in, w, fan_in, 0.0f, z, fan_out);
    bias_activation_forward(layer_activation(l), n, static_cast<std::size_t>(fan_out), b, z, a);
    in = a;
  }
  return in;
}

batch_stats mlp::forward_backward(const float* params, float* grads, const float* x, const std::int32_t* labels,
                                  std::size_t n, bool overwrite, layer_done_callback on_layer_done) {
  batch_stats stats;
  if (n == 0) return stats;
  const float beta = overwrite ? 0.0f : 1.0f;
  const float* logits = forward(params, x, n);
  const auto classes = static_cast<std::size_t>(spec_.outputs());
  float* d = grad_a_.data();  // dL/dz of the current layer, (n, out)
  float* d_next = grad_b_.data();
  const loss_stats ls = compute_loss(spec_.loss, n, classes, logits, labels, d);
  stats.loss_sum = ls.loss_sum;
  stats.correct = ls.correct;
  stats.samples = static_cast<std::int64_t>(n);

  for (std::size_t l = spec_.layers(); l-- > 0;) {
    const int fan_in = spec_.sizes[l], fan_out = spec_.sizes[l + 1];
    const activation act = layer_activation(l);
    const float* saved = activation_backward_needs_input(act) ? inputs_[l].data() : outputs_[l].data();
    // dL/da -> dL/dz in place; bias gradient += column sums.
    float* bias_grad = grads + offset(2 * l + 1);
    if (overwrite) std::fill_n(bias_grad, fan_out, 0.0f);
    bias_activation_backward(act, n, static_cast<std::size_t>(fan_out), saved, d, bias_grad);
    const float* in = l == 0 ? x : outputs_[l - 1].data();
    // (out, n) x (n, in) -> (out, in): dW += dZ^T X
    gemm(true, false, fan_out, fan_in, static_cast<int>(n), 1.0f, d, fan_out, in, fan_in, beta,
         grads + offset(2 * l), fan_in);
    if (on_layer_done.call != nullptr) on_layer_done.call(on_layer_done.context, l);
    if (l > 0) {
      // (n, out) x (out, in) -> (n, in): dL/da_{l-1} = dZ W
      gemm(false, false, static_cast<int>(n), fan_in, fan_out, 1.0f, d, fan_out, params + offset(2 * l),
           fan_in, 0.0f, d_next, fan_in);
      std::swap(d, d_next);
    }
  }
  return stats;
}

batch_stats mlp::evaluate(const float* params, const float* x, const std::int32_t* labels, std::size_t n) {
  batch_stats stats;
  if (n == 0) return stats;
  const float* out = forward(params, x, n);
  const loss_stats ls = compute_loss(spec_.loss, n, static_cast<std::size_t>(spec_.outputs()), out, labels, nullptr);
  return {ls.loss_sum, ls.correct, static_cast<std::int64_t>(n)};
}

void mlp::predict(const float* params, const float* x, std::size_t n, float* out) {
  if (n == 0) return;
  const float* logits = forward(params, x, n);
  std::copy_n(logits, n * static_cast<std::size_t>(spec_.outputs()), out);
}

}  // namespace dpactor
