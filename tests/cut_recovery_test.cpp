// Cuts and stragglers through the whole engine (DESIGN.md, "Stragglers",
// "Exactly once"): every straggler policy, with a slow and a jittery replica,
// in both modes, trains every sample once and learns; cut indices are
// trained later in the same epoch, also across a resume, and the steps that
// cuts add stay inside their epoch's share of the learning-rate schedule.
// Each test runs on both replica kinds (the torch one skips, saying why,
// where the plugin is not built). Faults and elasticity:
// tests/fault_recovery_test.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>

#include <dpactor/engine.hpp>
#include "tests/recorded_run.hpp"

namespace dpactor {
namespace {

using testing::expect_exactly_once;
using testing::faulty_job;
using testing::recorded_run;
using testing::run_recorded;

class Faults : public testing::both_replicas {};
class Schedule : public testing::both_replicas {};

// Every straggler policy, with a slow and a jittery replica, in both modes:
// every sample trained once by the devices' account, and the model learns.
class StragglerPolicies
    : public ::testing::TestWithParam<std::tuple<straggler_policy, std::string, bool, testing::replica_kind>> {
 protected:
  void SetUp() override { DPACTOR_SKIP_WITHOUT(std::get<3>(GetParam())); }
};

TEST_P(StragglerPolicies, TrainEverySampleOnceAndLearn) {
  const auto [policy, fault, reproducible, replicas] = GetParam();
  job_config c = faulty_job(2, {fault}, replicas);
  c.straggler.policy = policy;
  c.train.reproducible = reproducible;
  c.train.micro_batch = 8;  // 8 slices a step: something to steal or cut
  const recorded_run r = run_recorded(c);
  expect_exactly_once(r);
  EXPECT_GT(r.summary.test_accuracy, 0.5);
}

std::string policy_case_name(const ::testing::TestParamInfo<StragglerPolicies::ParamType>& info) {
  static const char* const names[] = {"none", "balance", "cut", "balance_cut"};
  const std::string& fault = std::get<1>(info.param);
  return std::string(names[static_cast<int>(std::get<0>(info.param))]) + "_" + fault.substr(0, fault.find(':')) + "_" +
         (std::get<2>(info.param) ? "reproducible" : "fast") + "_" + testing::kind_name(std::get<3>(info.param));
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, StragglerPolicies,
                         ::testing::Combine(::testing::Values(straggler_policy::none, straggler_policy::balance,
                                                              straggler_policy::cut, straggler_policy::balance_cut),
                                            ::testing::Values(std::string("slow:1:3"), std::string("jitter:1:0.5:3")),
                                            ::testing::Bool(),
                                            ::testing::Values(testing::replica_kind::mlp, testing::replica_kind::torch)),
                         policy_case_name);

TEST_P(Faults, CutIndicesAreTrainedLaterInTheSameEpoch) {
  // cpu:1 is delayed 200 ms on every step: far past any deadline, so it is cut
  // every time and its indices go to later steps of the same epoch.
  job_config c = faulty_job(2, {"jitter:1:1.0:200"});
  c.straggler.policy = straggler_policy::cut;
  // 1.1 x the median compute time, and 200 ms late: past the deadline
  // however slow a loaded machine makes the step, with time for the cut to
  // reach the member (the delay ends at the cut, so a cut step stays short).
  // At 30 ms and 1.5 a 2-core machine running four tests at once often cut
  // nobody.
  c.straggler.deadline_factor = 1.1;
  c.train.reproducible = false;  // cuts defer samples only then; reproducible runs steal instead
  c.train.epochs = 1;
  const recorded_run r = run_recorded(c);
  ASSERT_EQ(r.epochs.size(), 1u);
  EXPECT_EQ(r.epochs[0].samples, 1024) << "nothing dropped";
  EXPECT_EQ(r.summary.samples, 1024) << "cut steps count what their members trained, not their batch";
  EXPECT_GT(r.epochs[0].requeued, 0);
  EXPECT_GT(r.summary.cuts, 0);
  EXPECT_GT(r.summary.steps, 16) << "re-queued indices made extra steps";
  expect_exactly_once(r, 1);
}

TEST_P(Faults, AResumeAfterCutsTrainsEverySampleOnceAcrossBothRuns) {
  // cpu:1 is cut every step, so when the first run stops at step 20, in its
  // first epoch, cut indices are waiting in the ledger: the checkpoint must
  // carry them, and the resumed run train them, once.
  testing::scratch_dir dir;
  job_config c = faulty_job(2, {"jitter:1:1.0:200"});
  c.straggler.policy = straggler_policy::cut;
  // 1.1 x the median compute time, and 200 ms late: past the deadline
  // however slow a loaded machine makes the step, with time for the cut to
  // reach the member (the delay ends at the cut, so a cut step stays short).
  // At 30 ms and 1.5 a 2-core machine running four tests at once often cut
  // nobody.
  c.straggler.deadline_factor = 1.1;
  c.train.reproducible = false;
  c.train.epochs = 2;
  c.train.checkpoint_dir = (dir / "ckpt").string();
  auto trained = std::make_shared<testing::trained_evidence>();
  job_config first = c;
  first.train.max_steps = 20;
  const recorded_run a = run_recorded(first, {}, trained);
  ASSERT_EQ(a.summary.steps, 20);
  ASSERT_GT(a.summary.cuts, 0) << "nothing was cut before the checkpoint: the test proves nothing";
  ASSERT_TRUE(a.epochs.empty()) << "the first run was meant to stop inside its first epoch";
  const recorded_run b = run_recorded(c, testing::resume_from(dir / "ckpt"), trained);
  ASSERT_EQ(b.epochs.size(), 2u);
  EXPECT_EQ(trained->check(1024, 2), "") << "the devices' account over both runs";
}

// See Note [Schedule position]: 2 epochs of 16 steps under a cosine schedule
// down to min_lr, with every step reported.
job_config scheduled_job(std::vector<std::string> faults) {
  job_config c = faulty_job(2, std::move(faults));
  c.train.epochs = 2;
  c.train.log_every = 1;
  c.schedule.kind = schedule_kind::cosine;
  c.schedule.min_lr = 0.001;
  return c;
}

TEST_P(Schedule, WithoutCutsEveryStepRunsAtTheRateOfItsIndex) {
  for (const bool reproducible : {true, false}) {
    SCOPED_TRACE(reproducible ? "reproducible" : "fast");
    job_config c = scheduled_job({});
    c.train.reproducible = reproducible;
    c.straggler.policy = straggler_policy::none;
    const lr_schedule expected = make_lr_schedule(c, 32);
    const recorded_run r = run_recorded(c);
    ASSERT_EQ(r.steps.size(), 32u);
    for (const step_event& e : r.steps) EXPECT_EQ(e.lr, expected.at(e.step - 1)) << "step " << e.step;
  }
}

TEST_P(Schedule, StepsThatCutsAddStayInsideTheirEpochsShareOfTheSchedule) {
  // As in CutIndicesAreTrainedLaterInTheSameEpoch: cpu:1 is cut every step,
  // so each epoch takes more than its 16 steps.
  job_config c = scheduled_job({"jitter:1:1.0:200"});
  c.straggler.policy = straggler_policy::cut;
  // 1.1 x the median compute time, and 200 ms late: past the deadline
  // however slow a loaded machine makes the step, with time for the cut to
  // reach the member (the delay ends at the cut, so a cut step stays short).
  // At 30 ms and 1.5 a 2-core machine running four tests at once often cut
  // nobody.
  c.straggler.deadline_factor = 1.1;
  c.train.reproducible = false;
  const lr_schedule expected = make_lr_schedule(c, 32);
  const recorded_run r = run_recorded(c);
  ASSERT_GT(r.summary.steps, 32) << "no step was added: the test proves nothing";
  ASSERT_EQ(r.steps.size(), static_cast<std::size_t>(r.summary.steps));
  std::int64_t epoch = -1;
  for (const step_event& e : r.steps) {
    EXPECT_GT(e.lr, c.schedule.min_lr) << "step " << e.step << " of " << r.summary.steps
                                                 << " ran at min_lr, past the schedule's end";
    if (e.epoch != epoch) {
      epoch = e.epoch;
      EXPECT_EQ(e.lr, expected.at(16 * epoch)) << "an epoch's first step is at its nominal start";
    }
    EXPECT_GT(e.lr, expected.at(16 * (epoch + 1))) << "step " << e.step << " is at or past the next epoch's rate";
  }
  expect_exactly_once(r, 2);
}

DPACTOR_ON_BOTH_REPLICAS(Faults);
DPACTOR_ON_BOTH_REPLICAS(Schedule);

}  // namespace
}  // namespace dpactor
