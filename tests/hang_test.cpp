// Hangs end: a stuck device is removed, a stall nobody can be blamed for ends
// the run with a checkpoint and an error naming each device and its phase,
// and a long step whose micro-batches move is no hang at all (See Note
// [Progress-based hang detection]), on both replica kinds.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <regex>
#include <string>
#include <vector>

#include <dpactor/engine.hpp>
#include <dpactor/error.hpp>
#include "tensors/finite_check.hpp"
#include "test_support.hpp"
#include "train/checkpoint.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;

struct outcome {
  std::string error;  // "" if the run ended normally
  run_summary summary;
  std::vector<membership_event> memberships;
  std::vector<step_event> steps;
};

outcome run_bounded(job_config c, const std::string& what) {
  outcome out;
  std::mutex m;
  Engine engine(std::move(c));
  engine.on_event([&](const event& e) {
    std::lock_guard lock(m);
    if (const auto* x = std::get_if<membership_event>(&e)) out.memberships.push_back(*x);
    if (const auto* x = std::get_if<step_event>(&e)) out.steps.push_back(*x);
  });
  engine.start();
  try {
    out.summary = testing::wait_or_exit(engine, 120s, what);
  } catch (const training_error& e) {
    out.error = e.what();
  }
  return out;
}

// Every test runs on both replica kinds (tests/test_support.hpp).
class Hangs : public testing::both_replicas {};

// 1024 samples at batch 64: 16 steps per epoch; a checkpoint every 2 steps.
job_config hang_job(int replicas, std::vector<std::string> faults, const std::filesystem::path& checkpoints) {
  job_config c = testing::small_job(testing::current_kind(), replicas, 64, 1024);
  c.train.epochs = 2;
  c.train.checkpoint_dir = checkpoints.string();
  c.train.checkpoint_every = 2;
  c.train.keep_checkpoints = 0;
  c.cluster.hang_timeout_s = 0.3;
  c.faults.inject = std::move(faults);
  return c;
}

// The newest checkpoint is that of `step` steps, loads with its checksums,
// and holds finite values.
void expect_checkpoint_of(const std::filesystem::path& dir, const job_config& c, std::int64_t steps) {
  const loaded_checkpoint ckpt = read_checkpoint(dir, make_state_layout(c.model, c.optimizer));
  EXPECT_EQ(ckpt.record.step, steps) << ckpt.directory;
  EXPECT_FALSE(first_nonfinite(ckpt.state).has_value() && *first_nonfinite(ckpt.state) < ckpt.state.size() - 2);
}

TEST_P(Hangs, ASingleDeviceStuckEndsTheRunWithACheckpointNamingItsPhase) {
  // Before: a hang with nobody else to blame started a new generation with the
  // same device, which hung again, forever.
  testing::scratch_dir dir;
  const job_config c = hang_job(1, {"hang:0@7"}, dir / "ckpt");
  const outcome o = run_bounded(c, "a single hung device");
  ASSERT_FALSE(o.error.empty()) << "the run ended as if nothing had happened";
  EXPECT_NE(o.error.find("cpu:0 in forward of step 7"), std::string::npos) << o.error;
  EXPECT_NE(o.error.find("no device to blame"), std::string::npos) << o.error;
  EXPECT_NE(o.error.find("checkpoint written to"), std::string::npos) << o.error;
  EXPECT_LE(o.memberships.size(), 2u) << "one retry at most, never a loop";
  expect_checkpoint_of(dir / "ckpt", c, 6);  // steps 1-6 committed; step 7 hung
}

TEST_P(Hangs, EveryDeviceStuckEndsTheRunNamingEachDevice) {
  testing::scratch_dir dir;
  const job_config c = hang_job(2, {"hang:0@5", "hang:1@5"}, dir / "ckpt");
  const outcome o = run_bounded(c, "every device hung");
  ASSERT_FALSE(o.error.empty());
  EXPECT_NE(o.error.find("cpu:0 in forward of step 5"), std::string::npos) << o.error;
  EXPECT_NE(o.error.find("cpu:1 in forward of step 5"), std::string::npos) << o.error;
  EXPECT_LE(o.memberships.size(), 2u);
  expect_checkpoint_of(dir / "ckpt", c, 4);
}

TEST_P(Hangs, OneStuckDeviceOfTwoIsRemovedAndTheRunGoesOn) {
  testing::scratch_dir dir;
  const job_config c = hang_job(2, {"hang:1@5"}, dir / "ckpt");
  const outcome o = run_bounded(c, "one hung device of two");
  EXPECT_EQ(o.error, "");
  const auto hung = std::find_if(o.memberships.begin(), o.memberships.end(), [](const membership_event& m) {
    return m.reason.find("cpu:1 hung") != std::string::npos && m.reason.find("in forward of step 5") != std::string::npos;
  });
  ASSERT_NE(hung, o.memberships.end()) << (o.memberships.empty() ? "" : o.memberships.back().reason);
  EXPECT_EQ(o.summary.steps, 32);
}

TEST_P(Hangs, ALongStepWhoseMicroBatchesMoveIsNoHang) {
  // Before: the timeout counted from the last commit, so a step longer than
  // the timeout was a hang, and the first step (the slowest) always was.
  // The step here is many micro-batches: the timeout is set to a third of
  // the measured step time, far above one micro-batch's.
  job_config c = testing::small_job(testing::current_kind(), 2, 8192, 8192 * 3);
  c.model = mlp_spec{{16, 512, 512, 4}, activation::relu, loss_kind::cross_entropy};
  c.train.micro_batch = 16;
  c.train.max_steps = 2;
  c.train.log_every = 1;
  c.cluster.hang_timeout_s = 600;
  const outcome measured = run_bounded(c, "the measuring run");
  ASSERT_EQ(measured.error, "");
  const double step_s = measured.summary.train_s / static_cast<double>(measured.summary.steps);
  c.train.max_steps = 3;
  c.cluster.hang_timeout_s = step_s / 3;
  const outcome o = run_bounded(c, "steps three times the hang timeout");
  EXPECT_EQ(o.error, "") << "hang timeout " << c.cluster.hang_timeout_s << " s, steps of about " << step_s << " s";
  EXPECT_EQ(o.memberships.size(), 1u) << o.memberships.back().reason;
  EXPECT_EQ(o.summary.steps, 3);
}

DPACTOR_ON_BOTH_REPLICAS(Hangs);

}  // namespace
}  // namespace dpactor
