// The control plane at scale (issue 35), on simulated members (Note
// [Simulated members]): the engine's reducer, loader, membership and hang
// detection with a thousand members, through failures, a hang and joins.
// Exactly-once is checked by the members' own account (what each says it
// trained, summed per epoch by the test), never by the ledger's.

#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "actors/simulated_run.hpp"
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

using testing::trained_evidence;

struct recorded {
  simulated_run_result result;
  std::shared_ptr<trained_evidence> trained = std::make_shared<trained_evidence>();
  std::vector<membership_event> memberships;
  std::vector<recovery_event> recoveries;
};

// A job of `rows` samples at `batch`, `epochs` epochs, with the devices'
// account of what they trained.
job_config simulated_job(std::int64_t batch, std::int64_t epochs, bool reproducible, std::vector<std::string> faults) {
  job_config c;
  c.source = "simulated_job";
  c.train.batch_size = batch;
  c.train.micro_batch = 2;  // reproducible: a slice of 2 samples, so every member has some
  c.train.epochs = epochs;
  c.train.reproducible = reproducible;
  c.train.record_trained = true;
  c.train.checkpoint_dir = "";
  c.train.log_every = 1;
  c.straggler.policy = straggler_policy::none;
  c.cluster.min_devices = 1;
  c.faults.inject = std::move(faults);
  return c;
}

recorded run(const job_config& c, simulated_run_options o) {
  recorded r;
  std::mutex m;
  r.result = run_simulated(c, o, {[&](const event& e) {
                             r.trained->record(e);
                             std::lock_guard lock(m);
                             if (const auto* x = std::get_if<membership_event>(&e)) r.memberships.push_back(*x);
                             if (const auto* x = std::get_if<recovery_event>(&e)) r.recoveries.push_back(*x);
                           }});
  return r;
}

class ThousandMembers : public ::testing::TestWithParam<bool> {};

TEST_P(ThousandMembers, TrainEverySampleOnceThroughAFailureEveryThreeStepsAndAJoin) {
  // 24,000 samples at 2,000 a step: 12 steps an epoch, 24 in all; a member
  // fails at every third step, one joins at step 12.
  const std::vector<std::string> faults{"fail:10@3",  "fail:200@6",  "fail:333@9",  "fail:480@12", "join:cpu@12",
                                        "fail:600@15", "fail:750@18", "fail:999@21"};
  simulated_run_options o;
  o.members = 1000;
  o.train_rows = 24000;
  const recorded r = run(simulated_job(2000, 2, GetParam(), faults), o);

  EXPECT_EQ(r.trained->check(24000, 2), "");
  EXPECT_EQ(r.result.summary.samples, 48000);
  EXPECT_EQ(r.result.summary.epochs, 2);
  EXPECT_EQ(r.result.summary.steps, 24);
  std::string changes;
  for (const auto& m : r.memberships) changes += "\n  generation " + std::to_string(m.generation) + " from step " + std::to_string(m.step) + ": " + m.reason;
  EXPECT_EQ(r.recoveries.size(), 7u) << changes;
  ASSERT_FALSE(r.memberships.empty());
  const auto& last = r.memberships.back().members;
  EXPECT_EQ(last.size(), 1000u - 7u + 1u);
  for (const char* gone : {"sim:10", "sim:200", "sim:333", "sim:480", "sim:600", "sim:750", "sim:999"})
    EXPECT_EQ(std::count(last.begin(), last.end(), gone), 0) << gone;
  EXPECT_EQ(std::count(last.begin(), last.end(), "sim:1000"), 1) << "the member that joined";
}

INSTANTIATE_TEST_SUITE_P(SimulatedMembers, ThousandMembers, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Reproducible" : "Fast"; });

TEST(SimulatedMembers, AHungMemberAmongAHundredIsRemovedAndNoSampleIsLost) {
  job_config c = simulated_job(400, 2, true, {"hang:37@4"});
  c.cluster.hang_timeout_s = 0.5;
  simulated_run_options o;
  o.members = 100;
  o.train_rows = 4000;
  o.compute = std::chrono::microseconds(500);
  const recorded r = run(c, o);
  EXPECT_EQ(r.trained->check(4000, 2), "");
  ASSERT_EQ(r.memberships.size(), 2u);
  EXPECT_NE(r.memberships[1].reason.find("hung"), std::string::npos) << r.memberships[1].reason;
  EXPECT_EQ(r.memberships[1].step, 3) << "the generation after the hang starts again at the hung step";
  const auto& members = r.memberships[1].members;
  EXPECT_EQ(members.size(), 99u);
  EXPECT_EQ(std::count(members.begin(), members.end(), "sim:37"), 0);
}

TEST(SimulatedMembers, AJobItCannotSimulateIsRefusedNamingTheKey) {
  simulated_run_options o;
  o.members = 2;
  o.train_rows = 100;
  job_config with_checkpoints = simulated_job(10, 1, true, {});
  with_checkpoints.train.checkpoint_dir = "somewhere";
  try {
    run_simulated(with_checkpoints, o);
    FAIL() << "a job with checkpoints was simulated";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("train.checkpoint_dir"), std::string::npos) << e.what();
  }
  try {
    run_simulated(simulated_job(10, 1, true, {"nan:1@2"}), o);
    FAIL() << "a nan fault was simulated";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("nan:1@2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dpactor
