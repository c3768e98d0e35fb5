// The engine against a plain reference computed here, not against itself:
// each step is params - lr_s x (sum of per-sample gradients / batch), with
// lr_s the schedule's rate at that step and the batch the sampler's next
// samples. Comparing runs of the engine with each other hides any error all
// of them share (a schedule one step off, a wrong divisor).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <filesystem>

#include <dpactor/engine.hpp>
#include "data/loading.hpp"
#include "data/sampler.hpp"
#include "tensors/gemm.hpp"
#include "tensors/mlp.hpp"
#include "tensors/safetensors.hpp"
#include "tests/recorded_run.hpp"
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

// Plain SGD over the sampler's epoch-0 order, one MLP over each whole step of
// up to 64 samples (the last one short), at the rate lr(step), each step's
// summed gradients divided by divisor(step, its samples). In the
// checkpoint's tensor order.
std::vector<float> plain_sgd(const job_config& c, int steps, const std::function<double(int)>& lr,
                             const std::function<double(int, std::size_t)>& divisor,
                             std::vector<batch_stats>* stats = nullptr) {
  set_blas_threads(1);
  const train_test_data data = load_data(c.data, c.model.inputs(), c.model.outputs());
  mlp model(c.model, 64);
  const auto order = epoch_order(data.train->rows, static_cast<std::uint64_t>(c.train.seed), 0, c.train.shuffle);
  std::vector<float> params(model.layout().size(), 0.0f), grads(model.layout().size());
  init_mlp_parameters(c.model, params, static_cast<std::uint64_t>(c.train.seed));
  std::vector<float> x(64 * static_cast<std::size_t>(c.model.inputs()));
  std::vector<std::int32_t> y(64);
  for (int step = 0; step < steps; ++step) {
    const std::size_t first = static_cast<std::size_t>(step) * 64;
    const std::size_t n = std::min<std::size_t>(64, order.size() - first);
    const std::span<const std::uint32_t> rows(order.data() + first, n);
    const batch_ref batch = data.train->batch(rows);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      std::copy_n(batch.features + rows[i] * batch.feature_count, batch.feature_count, x.data() + i * batch.feature_count);
      y[i] = batch.labels[rows[i]];
    }
    const batch_stats b = model.forward_backward(params.data(), grads.data(), x.data(), y.data(), n, /*overwrite=*/true);
    if (stats != nullptr) stats->push_back(b);
    const double rate = lr(step), d = divisor(step, n);
    for (std::size_t i = 0; i < params.size(); ++i) params[i] -= static_cast<float>(rate * grads[i] / d);
  }
  std::vector<float> out;
  for (const auto& t : model.layout().tensors())
    out.insert(out.end(), params.begin() + static_cast<std::ptrdiff_t>(t.offset),
               params.begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel()));
  return out;
}

std::vector<float> saved_parameters(const run_summary& s) {
  const auto file = load_safetensors(std::filesystem::path(s.checkpoint) / "model.safetensors");
  std::vector<float> out;
  for (const auto& t : file.tensors) out.insert(out.end(), t.values.begin(), t.values.end());
  return out;
}

TEST(ReferenceStep, FiveEngineStepsFollowPlainSgdAtTheSchedulesRates) {
  testing::scratch_dir dir;
  job_config c = testing::small_job(2, 64, 1024);  // 16 steps an epoch: the five are in epoch 0
  c.optimizer.momentum = 0.0;  // plain SGD: the reference is one line
  c.optimizer.lr = 0.2;
  c.schedule.kind = schedule_kind::step;  // the rate halves every step: an off-by-one shows
  c.schedule.step_size = 1;
  c.schedule.gamma = 0.5;
  c.train.max_steps = 5;
  c.train.epochs = 10;
  c.train.checkpoint_dir = (dir / "ckpt").string();
  c.train.log_every = 1;
  const testing::recorded_run run = testing::run_recorded(c);
  const run_summary& s = run.summary;
  const std::vector<step_event>& records = run.steps;
  ASSERT_EQ(s.steps, 5);

  // The reference at the rate of step s + shift.
  std::vector<batch_stats> stats;
  const auto reference = [&](int shift, std::vector<batch_stats>* out = nullptr) {
    return plain_sgd(c, 5, [shift](int step) { return 0.2 * std::pow(0.5, step + shift); },
                     [](int, std::size_t) { return 64.0; }, out);
  };
  const std::vector<float> engine_params = saved_parameters(s);
  EXPECT_LE(testing::relative_difference(engine_params, reference(0, &stats)), 1e-5);
  EXPECT_GT(testing::relative_difference(engine_params, reference(1)), 1e-3) << "the comparison can tell a schedule one step off";
  // Each step's record: the training loss and accuracy of that step's batch
  // before its update, and the rate it was applied at.
  ASSERT_EQ(records.size(), 5u);
  for (std::size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(records[i].step, static_cast<std::int64_t>(i + 1));
    EXPECT_NEAR(records[i].loss, stats[i].loss_sum / 64.0, 1e-5 * std::abs(stats[i].loss_sum / 64.0)) << "step " << i + 1;
    EXPECT_EQ(records[i].accuracy, static_cast<double>(stats[i].correct) / 64.0) << "step " << i + 1;
    EXPECT_DOUBLE_EQ(records[i].lr, 0.2 * std::pow(0.5, static_cast<double>(i))) << "step " << i + 1;
  }
}

// An epoch of 1,000 samples at batch 64 ends with a step of 40, split over
// 3 replicas (14, 13, 13): its gradient is the mean over those 40, as plain
// SGD over that short batch computes it, not the sum over 64.
TEST(ReferenceStep, AShortLastStepIsDividedByItsOwnSamples) {
  for (const bool reproducible : {true, false}) {
    SCOPED_TRACE(reproducible ? "reproducible" : "fast");
    testing::scratch_dir dir;
    job_config c = testing::small_job(3, 64, 1000);
    c.optimizer.momentum = 0.0;
    c.optimizer.lr = 0.2;
    c.train.reproducible = reproducible;
    c.train.micro_batch = 8;  // every replica works on the short step
    c.train.checkpoint_dir = (dir / "ckpt").string();
    Engine engine(c);
    engine.start();
    const run_summary s = engine.wait();
    ASSERT_EQ(s.steps, 16);
    const auto constant = [](int) { return 0.2; };
    const std::vector<float> engine_params = saved_parameters(s);
    EXPECT_LE(testing::relative_difference(
                  engine_params, plain_sgd(c, 16, constant, [](int, std::size_t n) { return static_cast<double>(n); })),
              1e-5);
    EXPECT_GT(testing::relative_difference(engine_params,
                                           plain_sgd(c, 16, constant, [](int, std::size_t) { return 64.0; })),
              1e-3)
        << "the comparison can tell a short step divided by the nominal batch";
  }
}

}  // namespace
}  // namespace dpactor
