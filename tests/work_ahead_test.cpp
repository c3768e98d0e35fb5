// Note [Work queued ahead across processes]: how many shard messages the
// loader keeps in flight, from the measured step time.

#include <gtest/gtest.h>

#include "train/work_ahead.hpp"

namespace dpactor {
namespace {

TEST(WorkAhead, InOneProcessThePrefetchIsTheQueue) {
  EXPECT_EQ(messages_ahead(2, 0.0, 0.150, 1), 2);
  EXPECT_EQ(messages_ahead(5, 0.0, 0.0001, 20), 5);
}

TEST(WorkAhead, AcrossProcessesFastStepsFillThePrefetch) {
  // 1 ms steps, 2 a message: 64 ms of work is 32 messages.
  EXPECT_EQ(messages_ahead(32, 0.064, 0.001, 2), 32);
  EXPECT_EQ(messages_ahead(32, 0.064, 0.0001, 20), 32);
}

TEST(WorkAhead, AcrossProcessesSlowStepsKeepTwoMessagesSoThatAChangeWaitsForLittle) {
  // 150 ms steps (65 processes on 2 cores): 2 messages of 1 step, not 32.
  EXPECT_EQ(messages_ahead(32, 0.064, 0.150, 1), 2);
  // 10 ms steps: 7 messages (64 ms of work).
  EXPECT_EQ(messages_ahead(32, 0.064, 0.010, 1), 7);
}

TEST(WorkAhead, AcrossProcessesTwoMessagesUntilAStepIsMeasured) {
  EXPECT_EQ(messages_ahead(32, 0.064, 0.0, 1), 2);
  EXPECT_EQ(messages_ahead(1, 0.064, 0.0, 1), 1) << "never more than the prefetch";
}

}  // namespace
}  // namespace dpactor
