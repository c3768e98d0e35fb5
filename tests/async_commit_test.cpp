// The commit rule of asynchronous rounds (Note [Async commit]), without
// threads or a clock: quorum, deadline, staleness bound and weights.

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "train/async_commit.hpp"

namespace dpactor {
namespace {

async_rule rule(std::size_t quorum, std::int64_t max_staleness) {
  async_rule r;
  r.quorum = quorum;
  r.max_staleness = max_staleness;
  r.grace_s = 0.5;
  r.mad_factor = 3.0;
  return r;
}

TEST(AsyncCommit, ARoundCommitsWhenTheQuorumOfFreshContributionsHasArrived) {
  const async_commit c(rule(3, 1));
  const std::vector<async_contribution> two{{0, 7, 32}, {2, 7, 32}};
  EXPECT_FALSE(c.decide(7, two, 4, 0.0).commit);
  const std::vector<async_contribution> three{{0, 7, 32}, {2, 7, 32}, {1, 7, 16}};
  const async_decision d = c.decide(7, three, 4, 0.0);
  ASSERT_TRUE(d.commit);
  ASSERT_EQ(d.merged.size(), 3u);
  EXPECT_EQ(d.merged[2].worker, 1u);
  EXPECT_EQ(d.merged[2].weight, 16.0);  // fresh: its samples
  EXPECT_EQ(d.samples, 80.0);
  // With fewer alive than the quorum, all of the alive ones commit it.
  EXPECT_TRUE(c.decide(7, two, 2, 0.0).commit);
  EXPECT_FALSE(c.decide(7, two, 3, 0.0).commit);
}

TEST(AsyncCommit, AStaleContributionWeighsItsSamplesOverOnePlusItsAgeAndPastTheBoundIsDropped) {
  const async_commit c(rule(1, 2));
  const std::vector<async_contribution> arrived{{0, 10, 30}, {1, 9, 30}, {2, 8, 30}, {3, 7, 30}};
  const async_decision d = c.decide(10, arrived, 4, 0.0);
  ASSERT_TRUE(d.commit);
  ASSERT_EQ(d.merged.size(), 3u);
  EXPECT_EQ(d.merged[0].staleness, 0);
  EXPECT_EQ(d.merged[0].weight, 30.0);
  EXPECT_EQ(d.merged[1].staleness, 1);
  EXPECT_EQ(d.merged[1].weight, 15.0);
  EXPECT_EQ(d.merged[2].staleness, 2);
  EXPECT_EQ(d.merged[2].weight, 10.0);
  EXPECT_EQ(d.samples, 90.0);  // the merged samples, not the weights
  ASSERT_EQ(d.dropped.size(), 1u);
  EXPECT_EQ(d.dropped[0].worker, 3u);
  EXPECT_EQ(d.dropped[0].samples, 30.0);
}

TEST(AsyncCommit, DropsAreReportedAndStaleContributionsCountNothingTowardTheQuorum) {
  const async_commit c(rule(2, 0));
  const std::vector<async_contribution> arrived{{0, 4, 8}, {1, 5, 8}};
  const async_decision d = c.decide(5, arrived, 2, 0.0);
  EXPECT_FALSE(d.commit);  // one fresh of two
  EXPECT_TRUE(d.merged.empty());
  EXPECT_EQ(d.samples, 0.0);
  ASSERT_EQ(d.dropped.size(), 1u);
  EXPECT_EQ(d.dropped[0].worker, 0u);
  // Past the deadline a round commits with what is fresh, never with nothing.
  EXPECT_TRUE(c.decide(5, arrived, 2, 10.0).commit);
  const std::vector<async_contribution> stale{{0, 4, 8}};
  EXPECT_FALSE(c.decide(5, stale, 2, 10.0).commit);
}

TEST(AsyncCommit, TheDeadlineIsTheMedianArrivalPlusKMadsAtLeastTheGraceWindow) {
  async_commit c(rule(4, 1));
  EXPECT_EQ(c.deadline_s(), 0.5);  // nothing known yet: the grace window
  for (const double s : {1.0, 2.0, 3.0, 4.0, 5.0}) c.record_arrival(s);
  EXPECT_DOUBLE_EQ(c.deadline_s(), 3.0 + 3.0 * 1.0);  // median 3, deviations 2 1 0 1 2: MAD 1
  const std::vector<async_contribution> one{{0, 3, 8}};
  EXPECT_FALSE(c.decide(3, one, 4, 5.9).commit);
  EXPECT_TRUE(c.decide(3, one, 4, 6.0).commit);
  // Fast, steady arrivals: the grace window is the floor.
  async_commit steady(rule(4, 1));
  for (int i = 0; i < 10; ++i) steady.record_arrival(0.1);
  EXPECT_EQ(steady.deadline_s(), 0.5);
  // Only the last `window` arrivals count.
  async_rule small = rule(4, 1);
  small.window = 3;
  async_commit recent(small);
  for (const double s : {100.0, 100.0, 100.0, 1.0, 1.0, 1.0}) recent.record_arrival(s);
  EXPECT_EQ(recent.deadline_s(), 1.0);
  // An even count: the mean of the two middle ones.
  async_commit even(rule(4, 1));
  for (const double s : {1.0, 2.0, 4.0, 5.0}) even.record_arrival(s);
  EXPECT_DOUBLE_EQ(even.deadline_s(), 3.0 + 3.0 * 1.5);  // deviations 2 1 1 2: MAD 1.5
}

TEST(AsyncCommit, ATwiceContributingWorkerOrAContributionFromTheFutureIsTheCallersError) {
  const async_commit c(rule(2, 1));
  const std::vector<async_contribution> twice{{0, 3, 8}, {0, 3, 8}};
  EXPECT_THROW(c.decide(3, twice, 2, 0.0), std::logic_error);
  const std::vector<async_contribution> future{{0, 4, 8}};
  EXPECT_THROW(c.decide(3, future, 2, 0.0), std::logic_error);
  EXPECT_THROW(async_commit(rule(0, 1)), std::invalid_argument);
}

}  // namespace
}  // namespace dpactor
