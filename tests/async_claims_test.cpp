// The data and the sum of asynchronous rounds (Note [Async claims], Note
// [Async merge]), without threads or a clock: every sample of an epoch in
// exactly one committed claim, a given-back claim trained later in its
// epoch, H_k from throughput, and the weighted sum's fixed order.

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <set>
#include <stdexcept>
#include <vector>

#include "data/sampler.hpp"
#include "train/async_claims.hpp"
#include "train/async_merge.hpp"
#include "train/async_replay.hpp"

namespace dpactor {
namespace {

TEST(AsyncClaims, ClaimsFollowTheEpochsOrderNeverSpanTwoEpochsAndCoverEverySampleOnce) {
  async_claims q(10, 42, true, 2);
  const std::vector<std::uint32_t> order0 = epoch_order(10, 42, 0, true);
  const std::vector<std::uint32_t> order1 = epoch_order(10, 42, 1, true);
  std::vector<std::uint32_t> got0, got1;
  std::vector<async_claim> claims;
  while (auto c = q.claim(4)) {
    EXPECT_LE(c->rows.size(), 4u);
    auto& got = c->epoch == 0 ? got0 : got1;
    EXPECT_EQ(c->first, static_cast<std::int64_t>(got.size()));
    got.insert(got.end(), c->rows.begin(), c->rows.end());
    claims.push_back(*c);
  }
  EXPECT_EQ(got0, order0);
  EXPECT_EQ(got1, order1);
  ASSERT_EQ(claims.size(), 6u);  // 4 + 4 + 2 a epoch
  EXPECT_EQ(claims[2].rows.size(), 2u);
  EXPECT_FALSE(q.epoch_done(0));
  for (std::size_t i = 0; i < 3; ++i) q.commit(claims[i]);
  EXPECT_TRUE(q.epoch_done(0));
  EXPECT_EQ(q.committed(0), 10);
  EXPECT_FALSE(q.all_done());
  for (std::size_t i = 3; i < 6; ++i) q.commit(claims[i]);
  EXPECT_TRUE(q.all_done());
}

TEST(AsyncClaims, AGivenBackClaimIsTrainedLaterInItsEpochBeforeAnythingNew) {
  async_claims q(12, 7, true, 2);
  const async_claim a = *q.claim(4);
  const async_claim b = *q.claim(4);
  q.commit(a);
  q.give_back(b);  // dropped as stale
  EXPECT_EQ(q.requeued(0), 4);
  // The next claims take b's samples first, cut to the size asked for, at
  // their place in the order.
  const async_claim c = *q.claim(3);
  EXPECT_EQ(c.epoch, 0);
  EXPECT_EQ(c.first, b.first);
  EXPECT_EQ(c.rows, std::vector<std::uint32_t>(b.rows.begin(), b.rows.begin() + 3));
  const async_claim d = *q.claim(3);
  EXPECT_EQ(d.first, b.first + 3);
  EXPECT_EQ(d.rows, std::vector<std::uint32_t>(b.rows.begin() + 3, b.rows.end()));
  const async_claim e = *q.claim(8);
  EXPECT_EQ(e.epoch, 0);
  EXPECT_EQ(e.first, 8);
  q.commit(c);
  q.commit(d);
  EXPECT_FALSE(q.epoch_done(0));
  q.commit(e);
  EXPECT_TRUE(q.epoch_done(0));
  EXPECT_EQ(q.requeued(0), 4);  // still known after the epoch ended
  // Every sample of epoch 0 once.
  std::multiset<std::uint32_t> trained;
  for (const auto* x : {&a, &c, &d, &e}) trained.insert(x->rows.begin(), x->rows.end());
  std::vector<std::uint32_t> all(12);
  std::iota(all.begin(), all.end(), 0u);
  EXPECT_EQ(std::vector<std::uint32_t>(trained.begin(), trained.end()), all);
}

TEST(AsyncClaims, ALaterEpochMayFinishFirstButAnEpochEndsOnlyWithItsOwnSamples) {
  async_claims q(4, 1, false, 2);
  const async_claim a = *q.claim(4);
  const async_claim b = *q.claim(4);
  EXPECT_EQ(b.epoch, 1);
  q.commit(b);
  EXPECT_FALSE(q.epoch_done(0));
  EXPECT_TRUE(q.epoch_done(1));
  EXPECT_FALSE(q.epoch_done(0));
  EXPECT_FALSE(q.all_done()) << "the last epoch is done, but not the one before it";
  EXPECT_FALSE(q.claim(1).has_value());
  q.give_back(a);
  const async_claim again = *q.claim(4);
  EXPECT_EQ(again.epoch, 0);
  q.commit(again);
  EXPECT_TRUE(q.all_done());
  EXPECT_THROW(q.commit(again), std::logic_error);
}

TEST(AsyncClaims, AWorkerClaimsInnerStepsInProportionToItsThroughput) {
  EXPECT_EQ(async_inner_steps(16, 0.0, 0.0), 16);     // not measured yet
  EXPECT_EQ(async_inner_steps(16, 300.0, 300.0), 16);
  EXPECT_EQ(async_inner_steps(16, 100.0, 300.0), 5);  // a third: 5.33 rounds to 5
  EXPECT_EQ(async_inner_steps(16, 1.0, 300.0), 1);    // at least one
  EXPECT_EQ(async_inner_steps(16, 600.0, 300.0), 16); // never more than H
}

TEST(AsyncMerge, TheWeightedSumAddsThePresentWorkersInTheTreeOrderWhateverTheirArrival) {
  const std::vector<float> v0{1.0f, 1e8f}, v1{2.0f, 1.0f}, v2{4.0f, -2e8f}, v3{8.0f, 1.0f};
  std::vector<float> out(2);
  // Workers 0, 2, 3 of 4, in two arrival orders: ((0) + (2 + 3)).
  const std::vector<async_leaf> a{{3, 1.0f, v3}, {0, 1.0f, v0}, {2, 0.5f, v2}};
  const std::vector<async_leaf> b{{2, 0.5f, v2}, {3, 1.0f, v3}, {0, 1.0f, v0}};
  async_weighted_sum(4, a, out);
  const std::vector<float> first = out;
  async_weighted_sum(4, b, out);
  EXPECT_EQ(out, first);
  EXPECT_EQ(out[0], 1.0f + (0.5f * 4.0f + 8.0f));
  // The tree's order, 1e8 + (-1e8 + 1) = 0, not a loop over the workers,
  // (1e8 - 1e8) + 1 = 1.
  EXPECT_EQ(out[1], 0.0f);
  // One leaf: itself times its factor; none: zeros.
  const std::vector<async_leaf> one{{1, 0.25f, v1}};
  async_weighted_sum(4, one, out);
  EXPECT_EQ(out, (std::vector<float>{0.5f, 0.25f}));
  async_weighted_sum(4, {}, out);
  EXPECT_EQ(out, (std::vector<float>{0.0f, 0.0f}));
  const std::vector<async_leaf> twice{{1, 1.0f, v1}, {1, 1.0f, v1}};
  EXPECT_THROW(async_weighted_sum(4, twice, out), std::logic_error);
}

TEST(AsyncMerge, AMergedContributionIsScaledByOneOverOnePlusItsStaleness) {
  const async_commit rule({1, 3, 0.05, 3.0, 32});
  const std::vector<async_contribution> arrived{{2, 5, 40}, {0, 7, 20}, {1, 4, 10}};
  const async_decision d = rule.decide(7, arrived, 3, 0.0);
  ASSERT_TRUE(d.commit);
  const std::vector<float> v0{1.0f}, v1{2.0f}, v2{3.0f};
  const std::vector<async_leaf> leaves = merged_leaves(d, [&](std::size_t k) {
    return std::span<const float>(k == 0 ? v0 : k == 1 ? v1 : v2);
  });
  ASSERT_EQ(leaves.size(), 3u);
  EXPECT_EQ(leaves[0].worker, 2u);
  EXPECT_EQ(leaves[0].factor, 1.0f / 3.0f);  // 2 rounds old
  EXPECT_EQ(leaves[0].values.data(), v2.data());
  EXPECT_EQ(leaves[1].factor, 1.0f);         // fresh
  EXPECT_EQ(leaves[2].factor, 0.25f);        // 3 rounds old
  std::vector<float> out(1);
  async_weighted_sum(3, leaves, out);
  EXPECT_EQ(out[0], 1.0f + (0.25f * 2.0f + 3.0f / 3.0f));
}

TEST(AsyncMerge, TheOuterRateFollowsTheRoundsSamplesUnlessTheUserSetIt) {
  EXPECT_EQ(async_outer_rate(0.7, false, 2048, 2048), 0.7);
  EXPECT_EQ(async_outer_rate(0.7, false, 1024, 2048), 0.35);
  EXPECT_EQ(async_outer_rate(0.7, false, 4096, 2048), 0.7);  // never above the plan's
  EXPECT_EQ(async_outer_rate(0.7, true, 1024, 2048), 0.7);   // sync.outer_lr as set
}

TEST(AsyncClaims, AClaimAtARecordedPlaceIsThoseOfTheEpochsOrder) {
  async_claims q(10, 42, true, 2);
  const std::vector<std::uint32_t> order1 = epoch_order(10, 42, 1, true);
  const async_claim c = q.claim_at(1, 3, 4);
  EXPECT_EQ(c.epoch, 1);
  EXPECT_EQ(c.first, 3);
  EXPECT_EQ(c.rows, std::vector<std::uint32_t>(order1.begin() + 3, order1.begin() + 7));
  EXPECT_THROW(q.claim_at(1, 8, 4), std::out_of_range);
  EXPECT_THROW(q.claim_at(2, 0, 1), std::out_of_range);
}

round_contribution contribution(std::int64_t worker, std::int64_t worker_round, std::int64_t base) {
  return {worker, worker_round, base, 0, worker * 100 + worker_round * 10, 10};
}

// See Note [Async replay]: each worker's recorded rounds in its order, each
// from its recorded base, and the decisions in the run's order.
TEST(AsyncReplayPlan, AWorkersRoundsComeInItsOrderAndTheDecisionsInTheRunsOrder) {
  std::vector<round_decision_event> d(3);
  d[0].round = 0;
  d[0].committed = true;
  d[0].merged = {contribution(1, 0, 0)};
  d[1].round = 1;  // a drop: round 1 stays open
  d[1].dropped = {contribution(0, 0, 0)};
  d[2].round = 1;
  d[2].committed = true;
  d[2].merged = {contribution(1, 1, 1), contribution(0, 1, 1)};
  async_replay r(d, 2);
  EXPECT_EQ(r.decisions(), 3u);
  ASSERT_NE(r.next_round(0), nullptr);
  EXPECT_EQ(r.next_round(0)->worker_round, 0);
  EXPECT_EQ(r.oldest_base(), 0);
  r.handed_out(0);
  r.handed_out(1);
  EXPECT_EQ(r.next_round(0)->worker_round, 1);
  EXPECT_EQ(r.next_round(0)->base_round, 1);
  EXPECT_EQ(r.oldest_base(), 1) << "round 0's weights are needed no more";
  r.handed_out(0);
  r.handed_out(1);
  EXPECT_EQ(r.next_round(0), nullptr);
  EXPECT_EQ(r.oldest_base(), std::numeric_limits<std::int64_t>::max());
  EXPECT_THROW(r.handed_out(0), std::logic_error);
  for (std::size_t i = 0; i < 3; ++i) {
    ASSERT_NE(r.next_decision(), nullptr);
    EXPECT_EQ(r.next_decision()->round, d[i].round);
    r.applied();
  }
  EXPECT_EQ(r.next_decision(), nullptr);
}

TEST(AsyncReplayPlan, ARecordWhoseDecisionsDoNotFitIsRefusedSayingWhy) {
  const auto why = [](std::vector<round_decision_event> d, std::size_t workers) {
    try {
      async_replay r(std::move(d), workers);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  round_decision_event a;
  a.round = 0;
  a.committed = true;
  a.merged = {contribution(0, 0, 0)};
  EXPECT_EQ(why({a}, 1), "(accepted)");
  EXPECT_NE(why({a}, 0).find("logical worker 0 of a run with 0"), std::string::npos);
  round_decision_event gap = a;
  gap.round = 2;
  gap.merged = {contribution(0, 1, 1)};
  EXPECT_NE(why({a, gap}, 1).find("leave round 1 open"), std::string::npos) << why({a, gap}, 1);
  round_decision_event future = a;
  future.round = 1;
  future.merged = {contribution(0, 1, 2)};
  EXPECT_NE(why({a, future}, 1).find("from round 2"), std::string::npos) << why({a, future}, 1);
  round_decision_event skip = a;
  skip.round = 1;
  skip.merged = {contribution(0, 2, 1)};
  EXPECT_NE(why({a, skip}, 1).find("round 1 is missing"), std::string::npos) << why({a, skip}, 1);
  round_decision_event empty = a;
  empty.merged.clear();
  EXPECT_NE(why({empty}, 1).find("commits nothing"), std::string::npos);
}

}  // namespace
}  // namespace dpactor
