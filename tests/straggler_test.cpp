// Straggler bookkeeping: splitting a batch by weight, medians, throughput.

#include <gtest/gtest.h>

#include <numeric>

#include "train/straggler.hpp"

namespace dpactor {
namespace {

std::size_t sum(const std::vector<std::size_t>& v) { return std::accumulate(v.begin(), v.end(), std::size_t{0}); }

TEST(SplitByWeight, EqualWeightsGiveTheEvenSplit) {
  const std::vector<double> w(3, 1.0);
  EXPECT_EQ(split_by_weight(64, w), (std::vector<std::size_t>{22, 21, 21}));
  EXPECT_EQ(split_by_weight(2, w), (std::vector<std::size_t>{1, 1, 0}));
  EXPECT_EQ(split_by_weight(0, w), (std::vector<std::size_t>{0, 0, 0}));
}

TEST(SplitByWeight, LeftoversRotateWithTheFirstMember) {
  const std::vector<double> w(2, 1.0);
  EXPECT_EQ(split_by_weight(1, w, 0), (std::vector<std::size_t>{1, 0}));
  EXPECT_EQ(split_by_weight(1, w, 1), (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(split_by_weight(5, w, 1), (std::vector<std::size_t>{2, 3}));
}

TEST(SplitByWeight, FollowsTheWeightsAndSumsToTheTotal) {
  const std::vector<double> w{0.75, 0.25};
  EXPECT_EQ(split_by_weight(128, w), (std::vector<std::size_t>{96, 32}));
  for (std::size_t total : {1u, 7u, 100u, 129u, 1000u}) {
    const auto split = split_by_weight(total, std::vector<double>{0.5, 0.3, 0.2});
    EXPECT_EQ(sum(split), total);
  }
}

TEST(SplitByWeight, EveryMemberKeepsOneSampleToStayMeasured) {
  const auto split = split_by_weight(100, std::vector<double>{1.0, 0.0, 1e-9});
  EXPECT_GE(split[1], 1u);
  EXPECT_GE(split[2], 1u);
  EXPECT_EQ(sum(split), 100u);
}

TEST(RollingMedian, KeepsTheLastValues) {
  rolling_median m(3);
  EXPECT_EQ(m.median(), 0.0);
  for (double v : {5.0, 1.0, 3.0}) m.push(v);
  EXPECT_EQ(m.median(), 3.0);
  m.push(100.0);  // drops 5
  m.push(100.0);  // drops 1
  EXPECT_EQ(m.median(), 100.0);
}

TEST(ThroughputTracker, SharesFollowMeasuredThroughput) {
  throughput_tracker t(1.0, 2);
  EXPECT_EQ(t.shares(), (std::vector<double>{1.0, 1.0})) << "equal before any measurement";
  t.record(0, 300, 1.0);
  t.record(1, 100, 1.0);
  const auto shares = t.shares();
  EXPECT_DOUBLE_EQ(shares[0], 0.75);
  EXPECT_DOUBLE_EQ(shares[1], 0.25);
}

TEST(ThroughputTracker, ACutShardCountsWithWhatItComputed) {
  throughput_tracker t(0.5, 2);
  t.record(0, 64, 0.001);
  t.record(1, 10, 0.050);  // cut after 10 samples
  EXPECT_DOUBLE_EQ(t.throughput(1), 200.0);
}

}  // namespace
}  // namespace dpactor
