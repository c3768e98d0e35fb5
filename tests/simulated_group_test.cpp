// The stand-in collective of simulated members (Note [Simulated members]),
// without threads: a step completes for every member when the last one
// contributes, for nobody when the group is aborted first.

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "comms/simulated_group.hpp"

namespace dpactor {
namespace {

simulated_contribution part(std::int64_t samples, double compute_s) {
  return simulated_contribution{samples, static_cast<double>(samples) * 0.5, samples / 2, compute_s, 1};
}

TEST(SimulatedGroup, AStepCompletesForEveryMemberWhenTheLastContributesAndNotBefore) {
  simulated_group g(3);
  std::vector<std::vector<std::int64_t>> told(3);
  for (int r = 0; r < 3; ++r) g.join(r, [&told, r](std::int64_t step) { told[static_cast<std::size_t>(r)].push_back(step); });
  EXPECT_FALSE(g.contribute(4, 2, part(10, 0.3)));
  EXPECT_FALSE(g.contribute(4, 0, part(20, 0.1)));
  EXPECT_FALSE(g.take(4, 0).has_value());
  for (const auto& t : told) EXPECT_TRUE(t.empty());
  EXPECT_TRUE(g.contribute(4, 1, part(30, 0.2)));
  for (const auto& t : told) EXPECT_EQ(t, std::vector<std::int64_t>{4});

  const auto first = g.take(4, 0);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->samples, 60);
  EXPECT_DOUBLE_EQ(first->loss_sum, 30.0);
  EXPECT_EQ(first->correct, 30);
  EXPECT_EQ(first->member_samples, (std::vector<float>{20.0f, 30.0f, 10.0f}));
  EXPECT_EQ(first->compute_s, (std::vector<float>{0.1f, 0.2f, 0.3f}));
  EXPECT_EQ(first->member_returned, (std::vector<float>{1.0f, 1.0f, 1.0f}));
  // The others get the sums only (copying the parts to all would be quadratic).
  const auto second = g.take(4, 2);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->samples, 60);
  EXPECT_TRUE(second->member_samples.empty());
  ASSERT_TRUE(g.take(4, 1).has_value());
  // Every member took it: the group forgot the step.
  EXPECT_FALSE(g.take(4, 0).has_value());
}

TEST(SimulatedGroup, AnAbortBeforeTheLastContributionCompletesTheStepForNobody) {
  simulated_group g(2);
  int told = 0;
  for (int r = 0; r < 2; ++r) g.join(r, [&told](std::int64_t) { ++told; });
  EXPECT_FALSE(g.contribute(0, 0, part(8, 0.0)));
  g.abort();
  EXPECT_TRUE(g.aborted());
  EXPECT_FALSE(g.contribute(0, 1, part(8, 0.0)));
  EXPECT_EQ(told, 0);
  EXPECT_FALSE(g.take(0, 0).has_value());
  EXPECT_FALSE(g.take(0, 1).has_value());
}

TEST(SimulatedGroup, AStepCompletedBeforeAnAbortStaysCompleteForEveryMember) {
  simulated_group g(2);
  EXPECT_FALSE(g.contribute(7, 1, part(4, 0.0)));
  EXPECT_TRUE(g.contribute(7, 0, part(4, 0.0)));
  g.abort();
  // A member asked for its last applied step after the abort applies it.
  ASSERT_TRUE(g.take(7, 1).has_value());
  ASSERT_TRUE(g.take(7, 0).has_value());
}

TEST(SimulatedGroup, StepsCompleteIndependently) {
  simulated_group g(2);
  EXPECT_FALSE(g.contribute(1, 0, part(3, 0.0)));
  EXPECT_FALSE(g.contribute(2, 0, part(5, 0.0)));
  EXPECT_TRUE(g.contribute(2, 1, part(5, 0.0)));
  EXPECT_FALSE(g.take(1, 0).has_value());
  EXPECT_EQ(g.take(2, 0)->samples, 10);
}

TEST(SimulatedGroup, ASecondContributionOrARankOutOfRangeIsABug) {
  simulated_group g(2);
  EXPECT_FALSE(g.contribute(0, 0, part(1, 0.0)));
  EXPECT_THROW(g.contribute(0, 0, part(1, 0.0)), std::logic_error);
  EXPECT_THROW(g.contribute(0, 2, part(1, 0.0)), std::logic_error);
  EXPECT_THROW(g.contribute(0, -1, part(1, 0.0)), std::logic_error);
  EXPECT_THROW(g.endpoint(0), std::logic_error);
  EXPECT_THROW(simulated_group(0), std::logic_error);
}

}  // namespace
}  // namespace dpactor
