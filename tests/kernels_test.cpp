// CPU kernels against plain references: GEMM in every transpose, fused
// bias+activation forward and backward, losses, initialisation, layouts.
// Outputs are poisoned before each run so unwritten elements show.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tensors/activation.hpp"
#include <dpactor/flat_layout.hpp>
#include "tensors/gemm.hpp"
#include "tensors/loss.hpp"
#include "tensors/mlp.hpp"
#include "tensors/replica.hpp"
#include "tensors/rng.hpp"
#include "tests/reference_mlp.hpp"

namespace dpactor {
namespace {

constexpr float poison = std::numeric_limits<float>::quiet_NaN();

std::vector<float> random_vector(std::size_t n, std::uint64_t seed, double lo = -2.0, double hi = 2.0) {
  rng gen(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(gen.uniform(lo, hi));
  return v;
}

void expect_close(float got, double want, double tol, const std::string& what) {
  ASSERT_FALSE(std::isnan(got)) << what << ": not written";
  EXPECT_LE(std::abs(got - want), tol * (1.0 + std::abs(want))) << what << ": got " << got << ", want " << want;
}

TEST(Gemm, MatchesNaiveProductForEveryTranspose) {
  const int m = 13, n = 7, k = 29;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const auto a = random_vector(static_cast<std::size_t>(m * k), 1);
      const auto b = random_vector(static_cast<std::size_t>(k * n), 2);
      std::vector<float> c(static_cast<std::size_t>(m * n), 0.5f);
      const std::vector<float> c0 = c;
      gemm(ta, tb, m, n, k, 1.5f, a.data(), ta ? m : k, b.data(), tb ? k : n, 2.0f, c.data(), n);
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          double acc = 0;
          for (int p = 0; p < k; ++p) acc += static_cast<double>(ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
          expect_close(c[i * n + j], 1.5 * acc + 2.0 * c0[i * n + j], 1e-5, "C(" + std::to_string(i) + "," + std::to_string(j) + ")");
        }
    }
  }
}

class ActivationKernels : public ::testing::TestWithParam<activation> {};

TEST_P(ActivationKernels, ForwardAndBackwardMatchTheScalarDefinitions) {
  const activation act = GetParam();
  const std::size_t rows = 9, cols = 37;  // odd sizes: no vector-width luck
  const auto x = random_vector(rows * cols, 5, -4.0, 4.0);
  const auto bias = random_vector(cols, 6);
  const auto dy = random_vector(rows * cols, 7);
  std::vector<float> z = x, a(rows * cols, poison);
  float* a_ptr = activation_backward_needs_input(act) ? a.data() : z.data();
  bias_activation_forward(act, rows, cols, bias.data(), z.data(), a_ptr);
  std::vector<float> grad = dy, db(cols, 0.25f);
  bias_activation_backward(act, rows, cols, activation_backward_needs_input(act) ? z.data() : a_ptr, grad.data(), db.data());
  std::vector<double> db_ref(cols, 0.25);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) {
      const double pre = static_cast<double>(x[r * cols + c]) + bias[c];
      expect_close(a_ptr[r * cols + c], testing::reference_activation(act, pre), 2e-6, "forward");
      const double h = 1e-6;
      const double deriv = (testing::reference_activation(act, pre + h) - testing::reference_activation(act, pre - h)) / (2 * h);
      const double want = dy[r * cols + c] * deriv;
      expect_close(grad[r * cols + c], want, 2e-5, "backward");
      db_ref[c] += want;
    }
  for (std::size_t c = 0; c < cols; ++c) expect_close(db[c], db_ref[c], 1e-5, "bias grad");
}

INSTANTIATE_TEST_SUITE_P(All, ActivationKernels,
                         ::testing::Values(activation::identity, activation::relu, activation::gelu, activation::tanh,
                                           activation::sigmoid),
                         [](const auto& info) { return std::string(activation_name(info.param)); });

TEST(Loss, CrossEntropyIsStableAndMatchesReference) {
  const std::size_t rows = 4, classes = 5;
  auto logits = random_vector(rows * classes, 8, -3.0, 3.0);
  logits[0] = 1000.0f;  // would overflow a naive softmax
  const std::vector<std::int32_t> labels{0, 4, 2, 1};
  std::vector<float> grad(rows * classes, poison);
  const loss_stats s = softmax_cross_entropy(rows, classes, logits.data(), labels.data(), grad.data());
  double want = 0;
  std::int64_t correct = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    double max = -1e300, sum = 0;
    std::size_t best = 0;
    for (std::size_t c = 0; c < classes; ++c)
      if (logits[r * classes + c] > max) {
        max = logits[r * classes + c];
        best = c;
      }
    for (std::size_t c = 0; c < classes; ++c) sum += std::exp(logits[r * classes + c] - max);
    want += std::log(sum) + max - logits[r * classes + static_cast<std::size_t>(labels[r])];
    correct += best == static_cast<std::size_t>(labels[r]);
    for (std::size_t c = 0; c < classes; ++c) {
      const double p = std::exp(logits[r * classes + c] - max) / sum;
      expect_close(grad[r * classes + c], p - (c == static_cast<std::size_t>(labels[r]) ? 1.0 : 0.0), 1e-6, "dlogits");
    }
  }
  EXPECT_NEAR(s.loss_sum, want, 1e-6 * want);
  EXPECT_EQ(s.correct, correct);
  EXPECT_TRUE(std::isfinite(s.loss_sum));
}

TEST(Loss, MseAgainstOneHotMatchesTorchMeanReduction) {
  const std::vector<float> out{0.5f, -1.0f, 2.0f, 0.0f, 0.25f, 1.0f};
  const std::vector<std::int32_t> labels{2, 0};
  std::vector<float> grad(6, poison);
  const loss_stats s = mse_one_hot(2, 3, out.data(), labels.data(), grad.data());
  // torch: mean over 2 * 3 elements of (y - t)^2; we return the sum over samples of per-sample means.
  const double per_element = (0.25 + 1.0 + 1.0 + 1.0 + 0.0625 + 1.0) / 6.0;
  EXPECT_NEAR(s.loss_sum / 2.0, per_element, 1e-7);
  EXPECT_NEAR(grad[0], 2.0 * 0.5 / 3.0, 1e-7);
  EXPECT_NEAR(grad[3], 2.0 * -1.0 / 3.0, 1e-7);
  EXPECT_EQ(s.correct, 1);
}

TEST(Init, DrawsLikeTorchLinearDefaultAndIsSeeded) {
  const mlp_spec spec{{784, 256, 10}, activation::relu, loss_kind::cross_entropy};
  const flat_layout layout = mlp_layout(spec);
  aligned_buffer<float> a(layout.size()), b(layout.size()), c(layout.size());
  init_mlp_parameters(spec, a.span(), 42);
  init_mlp_parameters(spec, b.span(), 42);
  init_mlp_parameters(spec, c.span(), 43);
  EXPECT_EQ(checksum_floats(a.span()), checksum_floats(b.span())) << "same seed, same weights";
  EXPECT_NE(checksum_floats(a.span()), checksum_floats(c.span()));
  for (std::size_t l = 0; l < 2; ++l) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(spec.sizes[l]));
    for (std::size_t t : {2 * l, 2 * l + 1}) {
      const auto& spec_t = layout.tensors()[t];
      double sum = 0, sq = 0;
      for (std::size_t i = spec_t.offset; i < spec_t.offset + spec_t.numel(); ++i) {
        ASSERT_LE(std::abs(a[i]), bound) << spec_t.name;
        sum += a[i];
        sq += static_cast<double>(a[i]) * a[i];
      }
      if (spec_t.numel() > 1000) {
        const double count = static_cast<double>(spec_t.numel());
        EXPECT_NEAR(sum / count, 0.0, 0.05 * bound) << spec_t.name;
        EXPECT_NEAR(sq / count, bound * bound / 3.0, 0.05 * bound * bound) << spec_t.name << ": variance of U(-b, b)";
      }
    }
  }
}

TEST(FlatLayout, AlignsTensorsAndNamesThemLikeNnSequential) {
  const mlp_spec spec{{784, 256, 128, 10}, activation::relu, loss_kind::cross_entropy};
  const flat_layout layout = mlp_layout(spec);
  ASSERT_EQ(layout.tensors().size(), 6u);
  EXPECT_EQ(layout.tensors()[0].name, "0.weight");
  EXPECT_EQ(layout.tensors()[0].shape, (std::vector<std::int64_t>{256, 784}));
  EXPECT_EQ(layout.tensors()[5].name, "4.bias");
  EXPECT_EQ(layout.numel(), 235146u);
  for (const auto& t : layout.tensors()) EXPECT_EQ(t.offset % 16, 0u) << t.name << " starts on a cache line";
  const state_layout state = make_state_layout(spec, optimizer_config{});
  EXPECT_EQ(state.layout.tensors().size(), 12u);
  EXPECT_EQ(state.layout.tensors()[6].name, "0.weight.momentum_buffer");
  EXPECT_EQ(state.layout.tensors()[6].offset, state.parameter_size) << "slot sections mirror the parameter section";
}

TEST(Rng, IsDeterministicAndRestorable) {
  rng a(7), b(7);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next(), b.next());
  const auto saved = a.state();
  const auto x = a.next();
  a.set_state(saved);
  EXPECT_EQ(a.next(), x);
  rng e0(7, 0), e1(7, 1);
  EXPECT_NE(e0.next(), e1.next()) << "streams differ";
  for (int i = 0; i < 1000; ++i) EXPECT_LT(a.below(10), 10u);
}

}  // namespace
}  // namespace dpactor
