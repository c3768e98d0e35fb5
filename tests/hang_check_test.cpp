// Progress-based hang detection without threads or timing: the verdict is a
// function of each member's phase and time of last progress (See Note
// [Progress-based hang detection]).

#include <gtest/gtest.h>

#include <vector>

#include "train/hang_check.hpp"

namespace dpactor {
namespace {

using clock_type = device_progress::clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

const auto t0 = clock_type::time_point{} + seconds(1000);
const hang_limits limits{1.0, 60.0};

member_progress at(std::size_t rank, device_phase phase, clock_type::time_point since, bool warming = false) {
  return {rank, "cpu:" + std::to_string(rank), {phase, 11, since, warming}};
}

// sync.mode = "async": a device is judged alone, in its own work only.
TEST(HangCheck, AnAsyncDeviceIsHungAloneInItsOwnWorkPastItsLimit) {
  const auto one = [](device_phase p, bool warming = false) { return at(1, p, t0, warming).progress; };
  EXPECT_EQ(stalled_alone_s(one(device_phase::forward), t0 + milliseconds(900), limits), 0.0);
  EXPECT_DOUBLE_EQ(stalled_alone_s(one(device_phase::forward), t0 + milliseconds(1500), limits), 1.5);
  EXPECT_EQ(stalled_alone_s(one(device_phase::data), t0 + seconds(30), limits), 0.0)
      << "a device waiting for its next round is not hung";
  EXPECT_EQ(stalled_alone_s(one(device_phase::forward, true), t0 + seconds(30), limits), 0.0) << "its first round";
  EXPECT_DOUBLE_EQ(stalled_alone_s(one(device_phase::forward, true), t0 + seconds(61), limits), 61.0);
}

TEST(HangCheck, NoStallWhileAnyMemberProgresses) {
  // Rank 1 computes a long step in many micro-batches: each is progress.
  const std::vector<member_progress> m{at(0, device_phase::collective, t0), at(1, device_phase::forward, t0 + seconds(4))};
  const hang_verdict v = find_hang(m, t0 + milliseconds(4500), t0, limits, {});
  EXPECT_FALSE(v.stalled) << "a step longer than the timeout is not a hang while its micro-batches move";
}

TEST(HangCheck, BlamesTheMemberStuckInItsOwnWork) {
  const std::vector<member_progress> m{at(0, device_phase::collective, t0 + milliseconds(100)),
                                       at(1, device_phase::backward, t0), at(2, device_phase::collective, t0)};
  const hang_verdict v = find_hang(m, t0 + seconds(2), t0, limits, {});
  ASSERT_TRUE(v.stalled);
  EXPECT_TRUE(v.blameable);
  EXPECT_EQ(v.suspects, (std::vector<std::size_t>{1}));
  EXPECT_NE(v.where.find("cpu:1 in backward of step 12"), std::string::npos) << v.where;
  EXPECT_EQ(v.where.find("cpu:0"), std::string::npos) << "only the stuck member is named: " << v.where;
}

TEST(HangCheck, NoStallBeforeTheTimeout) {
  const std::vector<member_progress> m{at(0, device_phase::collective, t0), at(1, device_phase::forward, t0)};
  EXPECT_FALSE(find_hang(m, t0 + milliseconds(900), t0, limits, {}).stalled);
  EXPECT_TRUE(find_hang(m, t0 + milliseconds(1100), t0, limits, {}).stalled);
}

TEST(HangCheck, ACommitIsProgress) {
  const std::vector<member_progress> m{at(0, device_phase::forward, t0)};
  EXPECT_FALSE(find_hang(m, t0 + seconds(2), t0 + seconds(1) + milliseconds(500), limits, {}).stalled);
}

TEST(HangCheck, TheFirstStepGetsTheFirstStepBound) {
  // A wide model's first step: far longer than the timeout, short of the bound.
  std::vector<member_progress> m{at(0, device_phase::forward, t0, true), at(1, device_phase::forward, t0, true)};
  EXPECT_FALSE(find_hang(m, t0 + seconds(30), t0, limits, {}).stalled);
  const hang_verdict v = find_hang(m, t0 + seconds(61), t0, limits, {});
  EXPECT_TRUE(v.stalled) << "the bound is generous, not infinite";
  EXPECT_DOUBLE_EQ(v.allowed_s, 60.0);
  // After the first step, the timeout applies again.
  m = {at(0, device_phase::forward, t0), at(1, device_phase::forward, t0)};
  EXPECT_TRUE(find_hang(m, t0 + seconds(2), t0, limits, {}).stalled);
}

TEST(HangCheck, AnEvaluationsFirstBatchIsWarmUpToo) {
  const std::vector<member_progress> m{at(0, device_phase::evaluation, t0, true), at(1, device_phase::data, t0)};
  EXPECT_FALSE(find_hang(m, t0 + seconds(30), t0, limits, {}).stalled);
}

TEST(HangCheck, ASingleStuckDeviceCannotBeBlamed) {
  const std::vector<member_progress> m{at(0, device_phase::forward, t0)};
  const hang_verdict v = find_hang(m, t0 + seconds(2), t0, limits, {});
  ASSERT_TRUE(v.stalled);
  EXPECT_FALSE(v.blameable) << "removing the only device leaves nobody to train";
  EXPECT_TRUE(v.suspects.empty());
  EXPECT_NE(v.where.find("cpu:0 in forward of step 12"), std::string::npos) << v.where;
}

TEST(HangCheck, EveryDeviceStuckCannotBeBlamed) {
  const std::vector<member_progress> m{at(0, device_phase::optimizer, t0), at(1, device_phase::forward, t0)};
  const hang_verdict v = find_hang(m, t0 + seconds(2), t0, limits, {});
  ASSERT_TRUE(v.stalled);
  EXPECT_FALSE(v.blameable);
  EXPECT_NE(v.where.find("cpu:0 in optimizer"), std::string::npos) << v.where;
  EXPECT_NE(v.where.find("cpu:1 in forward"), std::string::npos) << v.where;
}

TEST(HangCheck, AllWaitingInTheCollectiveNamesThemAll) {
  // A collective that never completes (a network or NCCL hang): nobody's own work.
  const std::vector<member_progress> m{at(0, device_phase::collective, t0), at(1, device_phase::collective, t0)};
  const hang_verdict v = find_hang(m, t0 + seconds(2), t0, limits, {});
  ASSERT_TRUE(v.stalled);
  EXPECT_FALSE(v.blameable);
  EXPECT_NE(v.where.find("cpu:0 in collective"), std::string::npos) << v.where;
  EXPECT_NE(v.where.find("cpu:1 in collective"), std::string::npos) << v.where;
}

TEST(HangCheck, FallsBackOnTheLateReports) {
  // Rank 1 never got its shard (waiting for data), rank 0 reported it missing.
  const std::vector<member_progress> m{at(0, device_phase::collective, t0), at(1, device_phase::data, t0)};
  const std::vector<std::size_t> late{1};
  const hang_verdict v = find_hang(m, t0 + seconds(2), t0, limits, late);
  EXPECT_TRUE(v.blameable);
  EXPECT_EQ(v.suspects, (std::vector<std::size_t>{1}));
  EXPECT_NE(v.where.find("cpu:1 waiting for data"), std::string::npos) << v.where;
}

TEST(HangCheck, LateReportsOfGoneMembersAreIgnored) {
  const std::vector<member_progress> m{at(0, device_phase::collective, t0)};
  const std::vector<std::size_t> late{1};
  EXPECT_FALSE(find_hang(m, t0 + seconds(2), t0, limits, late).blameable);
}

TEST(HangTimeout, IsTheConfiguredOneOrTwentyMedianStepsAtLeastFiveSeconds) {
  EXPECT_DOUBLE_EQ(hang_timeout(0.3, 0.5), 0.3);
  EXPECT_DOUBLE_EQ(hang_timeout(0.0, 0.001), 5.0);
  EXPECT_DOUBLE_EQ(hang_timeout(0.0, 0.5), 10.0);
}

TEST(DeviceProgress, MarksArePhaseStepAndTime) {
  device_progress p;
  const auto before = clock_type::now();
  p.begin_warm_up(device_phase::data, 4);
  EXPECT_TRUE(p.read().warming);
  p.mark(device_phase::backward, 5);
  const auto s = p.read();
  EXPECT_EQ(s.phase, device_phase::backward);
  EXPECT_EQ(s.step, 5);
  EXPECT_GE(s.since, before);
  p.end_warm_up();
  EXPECT_FALSE(p.read().warming);
  EXPECT_EQ(phase_name(device_phase::collective), "collective");
}

TEST(HangCheck, NoStallIsPossibleWhileTheLastCommitIsWithinTheTimeoutWhateverTheMembersDo) {
  // The reducer's tick skips reading the members' progress on this answer:
  // it must never say "impossible" where find_hang would find a stall.
  EXPECT_FALSE(stall_possible(t0 + milliseconds(900), t0, limits));
  EXPECT_FALSE(stall_possible(t0 + milliseconds(1000), t0, limits));
  EXPECT_TRUE(stall_possible(t0 + milliseconds(1001), t0, limits));
  for (const auto after : {milliseconds(500), milliseconds(999), milliseconds(1000), milliseconds(1500), milliseconds(70000)}) {
    // Every member stuck in its own work since long before the commit.
    const std::vector<member_progress> m{at(0, device_phase::forward, t0 - seconds(100)),
                                         at(1, device_phase::backward, t0 - seconds(100))};
    if (find_hang(m, t0 + after, t0, limits, {}).stalled)
      EXPECT_TRUE(stall_possible(t0 + after, t0, limits)) << after.count() << " ms after the commit";
  }
}

}  // namespace
}  // namespace dpactor
