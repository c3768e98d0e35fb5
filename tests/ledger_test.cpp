// The epoch ledger and the sampler: exactly-once bookkeeping of sample indices.

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "data/epoch_ledger.hpp"
#include "data/sampler.hpp"

namespace dpactor {
namespace {

TEST(Sampler, OrderIsASeededPermutationPerEpoch) {
  const auto a = epoch_order(1000, 42, 0, true), b = epoch_order(1000, 42, 0, true);
  const auto c = epoch_order(1000, 42, 1, true), fixed = epoch_order(10, 42, 3, false);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c) << "each epoch has its own order";
  EXPECT_EQ(std::set<std::uint32_t>(a.begin(), a.end()).size(), 1000u);
  EXPECT_EQ(fixed, (std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(Ledger, HandsOutEveryIndexOnceAndVerifies) {
  epoch_ledger ledger(100, 7, true);
  ledger.start_epoch(0);
  std::vector<std::uint32_t> got;
  while (ledger.waiting() > 0) {
    std::vector<std::uint32_t> batch;
    ledger.take(32, batch);  // the last batch is partial: 100 = 3 * 32 + 4
    ledger.commit(batch);
    got.insert(got.end(), batch.begin(), batch.end());
  }
  EXPECT_EQ(got.size(), 100u);
  EXPECT_TRUE(ledger.epoch_complete());
  EXPECT_NO_THROW(ledger.verify_complete());
  EXPECT_EQ(got, epoch_order(100, 7, 0, true)) << "in the sampler's order";
}

TEST(Ledger, RequeuedIndicesComeFirstAndCountOnce) {
  epoch_ledger ledger(10, 1, false);
  ledger.start_epoch(0);
  std::vector<std::uint32_t> a;
  ledger.take(4, a);  // 0 1 2 3
  ledger.requeue(std::vector<std::uint32_t>{2, 3});
  ledger.commit(std::vector<std::uint32_t>{0, 1});
  std::vector<std::uint32_t> b;
  ledger.take(3, b);
  EXPECT_EQ(b, (std::vector<std::uint32_t>{2, 3, 4}));
  EXPECT_EQ(ledger.requeued_total(), 2u);
  ledger.commit(b);
  std::vector<std::uint32_t> rest;
  ledger.take(100, rest);
  ledger.commit(rest);
  EXPECT_NO_THROW(ledger.verify_complete());
}

TEST(Ledger, DoubleCommitIsAnError) {
  epoch_ledger ledger(4, 1, false);
  ledger.start_epoch(0);
  std::vector<std::uint32_t> a;
  ledger.take(2, a);
  ledger.commit(a);
  EXPECT_THROW(ledger.commit(std::vector<std::uint32_t>{0}), ledger_error);
  EXPECT_THROW(ledger.commit(std::vector<std::uint32_t>{3}), ledger_error) << "never handed out";
  EXPECT_THROW(ledger.requeue(std::vector<std::uint32_t>{3}), ledger_error);
}

TEST(Ledger, AnIncompleteEpochFailsVerificationNamingAnIndex) {
  epoch_ledger ledger(5, 1, false);
  ledger.start_epoch(0);
  std::vector<std::uint32_t> a;
  ledger.take(4, a);
  ledger.commit(a);
  try {
    ledger.verify_complete();
    FAIL();
  } catch (const ledger_error& e) {
    EXPECT_NE(std::string(e.what()).find("index 4 was never trained"), std::string::npos) << e.what();
  }
}

TEST(Ledger, PositionRestoresInFlightIndicesInOrder) {
  epoch_ledger ledger(20, 3, true);
  ledger.start_epoch(2);
  std::vector<std::uint32_t> s0, s1, s2;
  ledger.take(6, s0);
  ledger.take(6, s1);
  ledger.take(6, s2);
  ledger.commit(s0);
  std::vector<std::uint32_t> in_flight = s1;
  in_flight.insert(in_flight.end(), s2.begin(), s2.end());
  const ledger_position pos = ledger.position(in_flight);

  epoch_ledger resumed(20, 3, true);
  resumed.restore(pos);
  EXPECT_EQ(resumed.epoch(), 2);
  EXPECT_EQ(resumed.committed(), 6u);
  std::vector<std::uint32_t> r1, r2, r3;
  resumed.take(6, r1);
  resumed.take(6, r2);
  resumed.take(6, r3);
  EXPECT_EQ(r1, s1);
  EXPECT_EQ(r2, s2);
  std::vector<std::uint32_t> s3;
  ledger.take(6, s3);
  EXPECT_EQ(r3, s3) << "then the same fresh indices as the original";
  resumed.commit(r1);
  resumed.commit(r2);
  resumed.commit(r3);
  EXPECT_NO_THROW(resumed.verify_complete());
}

TEST(Ledger, RestoreRejectsInvalidPositions) {
  epoch_ledger ledger(10, 1, false);
  EXPECT_THROW(ledger.restore({0, 11, {}, {}, {}}), ledger_error);
  EXPECT_THROW(ledger.restore({0, 5, {7}, {}, {}}), ledger_error) << "7 is still in order[5:]";
  EXPECT_THROW(ledger.restore({0, 5, {2, 2}, {}, {}}), ledger_error);
}

}  // namespace
}  // namespace dpactor
