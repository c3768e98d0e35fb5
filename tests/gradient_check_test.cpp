// Analytic gradients of the MLP, for every activation and both losses,
// match central finite differences of a double-precision reference.

#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "tensors/mlp.hpp"
#include "tensors/rng.hpp"
#include "tests/reference_mlp.hpp"

namespace dpactor {
namespace {

class GradientCheck : public ::testing::TestWithParam<std::tuple<activation, loss_kind>> {};

TEST_P(GradientCheck, AnalyticMatchesCentralDifferences) {
  const auto [act, loss] = GetParam();
  const mlp_spec spec{{6, 7, 5, 4}, act, loss};
  const flat_layout layout = mlp_layout(spec);
  constexpr std::size_t n = 5;

  aligned_buffer<float> params(layout.size());
  init_mlp_parameters(spec, params.span(), 11);
  rng gen(3);
  std::vector<float> x(n * 6);
  for (float& v : x) v = static_cast<float>(gen.uniform(-2.0, 2.0));
  std::vector<std::int32_t> labels(n);
  for (auto& l : labels) l = static_cast<std::int32_t>(gen.below(4));

  aligned_buffer<float> grads(layout.size());
  mlp model(spec, n);
  const batch_stats stats = model.forward_backward(params.data(), grads.data(), x.data(), labels.data(), n);

  std::vector<double> p(params.data(), params.data() + params.size());
  const double loss_ref = testing::reference_loss_sum(spec, p, x.data(), labels.data(), n);
  EXPECT_NEAR(stats.loss_sum, loss_ref, 1e-5 * std::abs(loss_ref)) << "forward pass agrees with the reference";

  // Central differences in double on the reference, every parameter.
  constexpr double h = 1e-6;
  double diff_sq = 0.0, ref_sq = 0.0, ref_max = 0.0;
  std::vector<double> numeric(layout.size(), 0.0);
  for (const auto& t : layout.tensors()) {
    for (std::size_t i = t.offset; i < t.offset + t.numel(); ++i) {
      const double keep = p[i];
      p[i] = keep + h;
      const double up = testing::reference_loss_sum(spec, p, x.data(), labels.data(), n);
      p[i] = keep - h;
      const double down = testing::reference_loss_sum(spec, p, x.data(), labels.data(), n);
      p[i] = keep;
      numeric[i] = (up - down) / (2 * h);
      ref_max = std::max(ref_max, std::abs(numeric[i]));
    }
  }
  for (const auto& t : layout.tensors()) {
    for (std::size_t i = t.offset; i < t.offset + t.numel(); ++i) {
      const double d = static_cast<double>(grads[i]) - numeric[i];
      diff_sq += d * d;
      ref_sq += numeric[i] * numeric[i];
      // Element-wise relative error, with a floor for near-zero entries.
      const double scale = std::max(std::abs(numeric[i]), 1e-3 * ref_max);
      EXPECT_LE(std::abs(d) / scale, 1e-4) << t.name << "[" << i - t.offset << "]: analytic " << grads[i]
                                           << ", numeric " << numeric[i];
    }
  }
  const double relative = std::sqrt(diff_sq / ref_sq);
  EXPECT_LE(relative, 1e-4) << "norm-wise relative error " << relative;
  // Padding between tensors receives no gradient.
  for (std::size_t i = 0; i < layout.size(); ++i) {
    bool inside = false;
    for (const auto& t : layout.tensors()) inside |= i >= t.offset && i < t.offset + t.numel();
    if (!inside) {
      EXPECT_EQ(grads[i], 0.0f) << "padding at " << i;
    }
  }
}

TEST_P(GradientCheck, MicroBatchesSumToTheWholeBatch) {
  const auto [act, loss] = GetParam();
  const mlp_spec spec{{6, 7, 4}, act, loss};
  const flat_layout layout = mlp_layout(spec);
  aligned_buffer<float> params(layout.size()), whole(layout.size()), parts(layout.size());
  init_mlp_parameters(spec, params.span(), 5);
  rng gen(9);
  std::vector<float> x(8 * 6);
  for (float& v : x) v = static_cast<float>(gen.uniform(-1.0, 1.0));
  std::vector<std::int32_t> labels{0, 1, 2, 3, 3, 2, 1, 0};
  mlp model(spec, 8);
  model.forward_backward(params.data(), whole.data(), x.data(), labels.data(), 8);
  model.forward_backward(params.data(), parts.data(), x.data(), labels.data(), 3);
  model.forward_backward(params.data(), parts.data(), x.data() + 3 * 6, labels.data() + 3, 5);
  for (std::size_t i = 0; i < layout.size(); ++i) EXPECT_NEAR(parts[i], whole[i], 1e-5 * (1 + std::abs(whole[i])));
}

INSTANTIATE_TEST_SUITE_P(
    AllActivationsAndLosses, GradientCheck,
    ::testing::Combine(::testing::Values(activation::relu, activation::gelu, activation::tanh, activation::sigmoid),
                       ::testing::Values(loss_kind::cross_entropy, loss_kind::mse)),
    [](const auto& info) {
      return std::string(activation_name(std::get<0>(info.param))) + "_" + std::string(loss_name(std::get<1>(info.param)));
    });

}  // namespace
}  // namespace dpactor
