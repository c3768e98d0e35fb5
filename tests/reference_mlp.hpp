#pragma once
// A plain double-precision reference of the MLP's loss, written with loops
// from the definitions (no BLAS, no fused kernels), for gradient checks.

#include <cmath>
#include <cstdint>
#include <vector>

#include <dpactor/flat_layout.hpp>
#include "tensors/mlp.hpp"

namespace dpactor::testing {

inline double reference_activation(activation act, double z) {
  switch (act) {
    case activation::identity: return z;
    case activation::relu: return z > 0 ? z : 0;
    case activation::gelu: return 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
    case activation::tanh: return std::tanh(z);
    case activation::sigmoid: return 1.0 / (1.0 + std::exp(-z));
  }
  return z;
}

// Sum over the n samples of each sample's loss (the quantity whose gradient
// mlp::forward_backward accumulates).
inline double reference_loss_sum(const mlp_spec& spec, const std::vector<double>& params, const float* x,
                                 const std::int32_t* labels, std::size_t n) {
  const flat_layout layout = mlp_layout(spec);
  double total = 0.0;
  for (std::size_t s = 0; s < n; ++s) {
    std::vector<double> a(x + s * static_cast<std::size_t>(spec.inputs()), x + (s + 1) * static_cast<std::size_t>(spec.inputs()));
    for (std::size_t l = 0; l < spec.layers(); ++l) {
      const auto in = static_cast<std::size_t>(spec.sizes[l]), out = static_cast<std::size_t>(spec.sizes[l + 1]);
      const std::size_t w = layout.tensors()[2 * l].offset, b = layout.tensors()[2 * l + 1].offset;
      std::vector<double> z(out);
      for (std::size_t o = 0; o < out; ++o) {
        double acc = params[b + o];
        for (std::size_t i = 0; i < in; ++i) acc += params[w + o * in + i] * a[i];
        z[o] = l + 1 == spec.layers() ? acc : reference_activation(spec.hidden_activation, acc);
      }
      a = std::move(z);
    }
    const auto label = static_cast<std::size_t>(labels[s]);
    if (spec.loss == loss_kind::cross_entropy) {
      double max = a[0];
      for (double v : a) max = std::max(max, v);
      double sum = 0;
      for (double v : a) sum += std::exp(v - max);
      total += std::log(sum) + max - a[label];
    } else {
      double sum = 0;
      for (std::size_t c = 0; c < a.size(); ++c) {
        const double d = a[c] - (c == label ? 1.0 : 0.0);
        sum += d * d;
      }
      total += sum / static_cast<double>(a.size());
    }
  }
  return total;
}

}  // namespace dpactor::testing
