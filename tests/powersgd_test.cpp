// PowerSGD's arithmetic (Note [PowerSGD steps]) without threads or
// collectives: which tensors travel as factors, the products against plain
// double loops, Gram-Schmidt, the first basis, and error feedback's
// identity (what is applied plus what the units keep is what they had).

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tensors/rng.hpp"
#include "train/powersgd.hpp"

namespace dpactor {
namespace {

// The default job's layout: a 784-256-128-10 MLP with SGD and momentum.
state_layout default_layout() {
  const mlp_spec spec{{784, 256, 128, 10}, activation::relu, loss_kind::cross_entropy};
  optimizer_config opt;
  opt.kind = optimizer_kind::sgd;
  opt.momentum = 0.9;
  return make_state_layout(spec, opt);
}

state_layout small_layout() {
  const mlp_spec spec{{16, 32, 4}, activation::relu, loss_kind::cross_entropy};
  return make_state_layout(spec, optimizer_config{});
}

std::vector<float> random_values(std::size_t n, std::uint64_t seed) {
  rng gen(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(gen.uniform(-1.0, 1.0));
  return v;
}

TEST(PowerSgdPlan, WeightMatricesTravelAsFactorsWhereTheySendHalfOrLessAndTheRestWhole) {
  const state_layout l = default_layout();
  const powersgd_plan plan(l, 4);
  ASSERT_EQ(plan.matrices().size(), 3u);  // 256 x 784, 128 x 256, 10 x 128
  EXPECT_EQ(plan.matrices()[0].rows, 256u);
  EXPECT_EQ(plan.matrices()[0].cols, 784u);
  EXPECT_EQ(plan.q_floats(), (784u + 256u + 128u) * 4u);
  // P of every matrix, then every value not in a matrix (biases, padding).
  std::size_t in_matrices = 0;
  for (const auto& m : plan.matrices()) in_matrices += m.rows * m.cols;
  EXPECT_EQ(plan.p_floats(), (256u + 128u + 10u) * 4u + (l.parameter_size - in_matrices));
  // The default job sends at least 8 times fewer floats a step than fp32.
  EXPECT_GE(static_cast<double>(l.parameter_size) / static_cast<double>(plan.p_floats() + plan.q_floats()), 8.0);
  // At rank 2 the 4 x 32 matrix would send 72 of its 128 values a step: whole.
  const powersgd_plan small(small_layout(), 2);
  ASSERT_EQ(small.matrices().size(), 1u);
  EXPECT_EQ(small.matrices()[0].rows, 32u);
  EXPECT_EQ(small.matrices()[0].cols, 16u);
}

TEST(PowerSgdPlan, TheProductsAreThoseOfPlainLoops) {
  const state_layout l = small_layout();
  const powersgd_plan plan(l, 2);
  const auto& x = plan.matrices()[0];
  const std::vector<float> m = random_values(l.parameter_size, 1), q = random_values(plan.q_floats(), 2);
  std::vector<float> p(plan.p_floats());
  plan.project(m, q, p);
  for (std::size_t i = 0; i < x.rows; ++i)
    for (std::size_t k = 0; k < 2; ++k) {
      double want = 0.0;
      for (std::size_t j = 0; j < x.cols; ++j) want += double(m[x.offset + i * x.cols + j]) * q[x.q_at + j * 2 + k];
      EXPECT_NEAR(p[x.p_at + i * 2 + k], want, 1e-4);
    }
  std::vector<float> back(plan.q_floats());
  plan.back_project(m, p, back);
  for (std::size_t j = 0; j < x.cols; ++j)
    for (std::size_t k = 0; k < 2; ++k) {
      double want = 0.0;
      for (std::size_t i = 0; i < x.rows; ++i) want += double(m[x.offset + i * x.cols + j]) * p[x.p_at + i * 2 + k];
      EXPECT_NEAR(back[x.q_at + j * 2 + k], want, 1e-3);
    }
  std::vector<float> out(l.parameter_size, 7.0f);
  plan.decompress(p, back, out);
  for (std::size_t i = 0; i < x.rows; ++i)
    for (std::size_t j = 0; j < x.cols; ++j) {
      double want = 0.0;
      for (std::size_t k = 0; k < 2; ++k) want += double(p[x.p_at + i * 2 + k]) * back[x.q_at + j * 2 + k];
      EXPECT_NEAR(out[x.offset + i * x.cols + j], want, 1e-3);
    }
  // Outside the matrix the sum travels as it is.
  for (std::size_t i = 0; i < l.parameter_size; ++i)
    if (i < x.offset || i >= x.offset + x.rows * x.cols) EXPECT_EQ(out[i], m[i]) << i;
}

TEST(PowerSgdPlan, GramSchmidtGivesOrthonormalColumnsAndAZeroColumnStaysZero) {
  const state_layout l = default_layout();
  const powersgd_plan plan(l, 4);
  std::vector<float> p = random_values(plan.p_floats(), 3);
  const auto& x = plan.matrices()[1];
  for (std::size_t i = 0; i < x.rows; ++i) p[x.p_at + i * 4 + 2] = 0.0f;  // column 2 of the second matrix
  plan.orthogonalize(p);
  for (const auto& m : plan.matrices())
    for (std::size_t a = 0; a < 4; ++a)
      for (std::size_t b = a; b < 4; ++b) {
        double dot = 0.0;
        for (std::size_t i = 0; i < m.rows; ++i) dot += double(p[m.p_at + i * 4 + a]) * p[m.p_at + i * 4 + b];
        const bool zero = &m == &x && (a == 2 || b == 2);
        EXPECT_NEAR(dot, zero ? 0.0 : a == b ? 1.0 : 0.0, 1e-5) << a << " " << b;
      }
  for (std::size_t i = 0; i < x.rows; ++i) EXPECT_EQ(p[x.p_at + i * 4 + 2], 0.0f);
}

TEST(PowerSgdPlan, TheFirstBasisIsOrthonormalAndAFunctionOfTheSeed) {
  const powersgd_plan plan(default_layout(), 4);
  const std::vector<float> q = plan.initial_basis(42);
  EXPECT_EQ(q, plan.initial_basis(42));
  EXPECT_NE(q, plan.initial_basis(43));
  for (const auto& m : plan.matrices())
    for (std::size_t a = 0; a < 4; ++a)
      for (std::size_t b = a; b < 4; ++b) {
        double dot = 0.0;
        for (std::size_t j = 0; j < m.cols; ++j) dot += double(q[m.q_at + j * 4 + a]) * q[m.q_at + j * 4 + b];
        EXPECT_NEAR(dot, a == b ? 1.0 : 0.0, 1e-5);
      }
}

// Error feedback: the applied P Q'^T plus the units' residuals is the sum of
// what the units had, on the matrices; elsewhere the sum is applied whole
// and the residuals are zero.
TEST(PowerSgdPlan, WhatIsAppliedPlusWhatTheUnitsKeepIsWhatTheyHad) {
  const state_layout l = small_layout();
  const powersgd_plan plan(l, 2);
  const std::size_t n = l.parameter_size;
  std::vector<std::vector<float>> units{random_values(n, 4), random_values(n, 5), random_values(n, 6)};
  std::vector<double> had(n, 0.0);
  for (const auto& u : units)
    for (std::size_t i = 0; i < n; ++i) had[i] += u[i];
  const std::vector<float> basis = plan.initial_basis(7);
  std::vector<float> p(plan.p_floats(), 0.0f), one(plan.p_floats());
  for (const auto& u : units) {
    plan.project(u, basis, one);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] += one[i];
  }
  plan.orthogonalize(p);
  std::vector<float> q(plan.q_floats(), 0.0f);
  std::vector<std::vector<float>> own(units.size(), std::vector<float>(plan.q_floats()));
  for (std::size_t u = 0; u < units.size(); ++u) {
    plan.back_project(units[u], p, own[u]);
    for (std::size_t i = 0; i < q.size(); ++i) q[i] += own[u][i];
  }
  std::vector<float> applied(n);
  plan.decompress(p, q, applied);
  for (std::size_t u = 0; u < units.size(); ++u) plan.keep_residual(units[u], p, own[u]);
  const auto& x = plan.matrices()[0];
  double residual_norm = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    double kept = 0.0;
    for (const auto& u : units) kept += u[i];
    EXPECT_NEAR(applied[i] + kept, had[i], 1e-4) << i;
    const bool in_matrix = i >= x.offset && i < x.offset + x.rows * x.cols;
    if (!in_matrix) EXPECT_EQ(kept, 0.0) << i;
    residual_norm += kept * kept;
  }
  EXPECT_GT(residual_norm, 1.0) << "rank 2 of a random 32 x 16 matrix leaves most of it behind";
}

}  // namespace
}  // namespace dpactor
