// The optimizers follow PyTorch's update formulas. Reference trajectories
// are computed here in double precision straight from the formulas in
// torch.optim's documentation; the float implementation must agree to 1e-6
// relative over 20 steps.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tensors/lr_schedule.hpp"
#include "tensors/optimizer.hpp"
#include "tensors/rng.hpp"

namespace dpactor {
namespace {

constexpr std::size_t n = 257;
constexpr int steps = 20;

struct trajectory_case {
  std::string name;
  optimizer_config cfg;
};

// Gradient of step t, as sums over a batch of `count` samples.
std::vector<float> gradient_sums(int t, float count) {
  rng gen(100 + static_cast<std::uint64_t>(t));
  std::vector<float> g(n);
  for (float& v : g) v = static_cast<float>(gen.uniform(-1.0, 1.0)) * count;
  return g;
}

// torch.optim.SGD, documented algorithm, in double.
void reference_sgd(const optimizer_config& c, std::vector<double>& p, std::vector<double>& buf, const std::vector<double>& g,
                   double lr, int t) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    double gt = g[i];
    if (c.weight_decay != 0) gt += c.weight_decay * p[i];
    if (c.momentum != 0) {
      buf[i] = t == 0 ? gt : c.momentum * buf[i] + (1 - c.dampening) * gt;
      gt = c.nesterov ? gt + c.momentum * buf[i] : buf[i];
    }
    p[i] -= lr * gt;
  }
}

// torch.optim.AdamW, documented algorithm (amsgrad off), in double.
void reference_adamw(const optimizer_config& c, std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
                     const std::vector<double>& g, double lr, int t) {
  const double step = t + 1;
  for (std::size_t i = 0; i < p.size(); ++i) {
    p[i] -= lr * c.weight_decay * p[i];
    m[i] = c.beta1 * m[i] + (1 - c.beta1) * g[i];
    v[i] = c.beta2 * v[i] + (1 - c.beta2) * g[i] * g[i];
    const double m_hat = m[i] / (1 - std::pow(c.beta1, step));
    const double v_hat = v[i] / (1 - std::pow(c.beta2, step));
    p[i] -= lr * m_hat / (std::sqrt(v_hat) + c.eps);
  }
}

class OptimizerTrajectory : public ::testing::TestWithParam<trajectory_case> {};

TEST_P(OptimizerTrajectory, MatchesDoublePrecisionReferenceOver20Steps) {
  const optimizer_config& cfg = GetParam().cfg;
  const float count = 64.0f;  // samples in the global batch
  rng init(1);
  std::vector<float> params(n);
  for (float& v : params) v = static_cast<float>(init.uniform(-0.5, 0.5));
  std::vector<double> ref(params.begin(), params.end()), s0(n, 0.0), s1(n, 0.0);

  const auto slot_names = optimizer_slot_names(cfg);
  std::vector<std::vector<float>> slot_storage(slot_names.size(), std::vector<float>(n, 0.0f));
  std::vector<std::span<float>> slots;
  for (auto& s : slot_storage) slots.emplace_back(s);

  lr_schedule schedule;
  schedule.kind = schedule_kind::cosine;
  schedule.base_lr = cfg.lr;
  schedule.total_steps = steps;
  for (int t = 0; t < steps; ++t) {
    const std::vector<float> sums = gradient_sums(t, count);
    std::vector<double> mean(n);
    for (std::size_t i = 0; i < n; ++i) mean[i] = static_cast<double>(sums[i] * (1.0f / count));
    const double lr = schedule.at(t);
    optimizer_step(cfg, params, sums, slots, 1.0f / count, lr, t);
    if (cfg.kind == optimizer_kind::sgd)
      reference_sgd(cfg, ref, s0, mean, lr, t);
    else
      reference_adamw(cfg, ref, s0, s1, mean, lr, t);

    double diff = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      diff += (params[i] - ref[i]) * (params[i] - ref[i]);
      norm += ref[i] * ref[i];
    }
    ASSERT_LE(std::sqrt(diff / norm), 1e-6) << "step " << t + 1;
  }
}

optimizer_config sgd(double momentum, bool nesterov, double wd, double dampening = 0.0) {
  optimizer_config c;
  c.kind = optimizer_kind::sgd;
  c.lr = 0.1;
  c.momentum = momentum;
  c.nesterov = nesterov;
  c.weight_decay = wd;
  c.dampening = dampening;
  return c;
}

optimizer_config adamw(double wd) {
  optimizer_config c;
  c.kind = optimizer_kind::adamw;
  c.lr = 1e-2;
  c.weight_decay = wd;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    TorchFormulas, OptimizerTrajectory,
    ::testing::Values(trajectory_case{"sgd_plain", sgd(0.0, false, 0.0)},
                      trajectory_case{"sgd_momentum", sgd(0.9, false, 0.0)},
                      trajectory_case{"sgd_nesterov", sgd(0.9, true, 0.0)},
                      trajectory_case{"sgd_weight_decay", sgd(0.9, false, 5e-2)},
                      trajectory_case{"sgd_nesterov_weight_decay", sgd(0.8, true, 1e-2)},
                      trajectory_case{"sgd_dampening", sgd(0.9, false, 0.0, 0.3)},
                      trajectory_case{"adamw", adamw(0.0)}, trajectory_case{"adamw_weight_decay", adamw(0.05)}),
    [](const auto& info) { return info.param.name; });

TEST(OptimizerSlots, UsePyTorchStateNames) {
  EXPECT_EQ(optimizer_slot_names(sgd(0.9, false, 0)), std::vector<std::string>{"momentum_buffer"});
  EXPECT_TRUE(optimizer_slot_names(sgd(0.0, false, 0)).empty());
  EXPECT_EQ(optimizer_slot_names(adamw(0)), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
}

TEST(LrSchedule, FollowsTheDocumentedFormulas) {
  lr_schedule s;
  s.base_lr = 0.1;
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(1000), 0.1);

  s.kind = schedule_kind::step;
  s.step_size = 10;
  s.gamma = 0.5;
  EXPECT_DOUBLE_EQ(s.at(9), 0.1);
  EXPECT_DOUBLE_EQ(s.at(10), 0.05);
  EXPECT_DOUBLE_EQ(s.at(25), 0.025);

  s.kind = schedule_kind::cosine;
  s.total_steps = 100;
  s.min_lr = 0.01;
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_NEAR(s.at(50), 0.055, 1e-12);
  EXPECT_NEAR(s.at(100), 0.01, 1e-12);
  EXPECT_NEAR(s.at(150), 0.01, 1e-12) << "stays at min_lr after the horizon";

  s.warmup_steps = 10;
  EXPECT_NEAR(s.at(0), 0.01, 1e-12);
  EXPECT_NEAR(s.at(4), 0.05, 1e-12);
  EXPECT_NEAR(s.at(10), 0.1, 1e-12) << "cosine starts after warmup";
  EXPECT_NEAR(s.at(55), 0.055, 1e-12);
}

}  // namespace
}  // namespace dpactor
