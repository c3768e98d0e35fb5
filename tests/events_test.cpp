// Metrics records: one JSON object per event, members in a fixed order, NaN
// (an epoch that was not evaluated) written as null.

#include <gtest/gtest.h>

#include <limits>

#include "train/event_json.hpp"

namespace dpactor {
namespace {

TEST(Events, AnEpochWithoutEvaluationHasNullTestResults) {
  epoch_event e;
  e.epoch = 2;
  e.step = 30;
  e.test_loss = e.test_accuracy = std::numeric_limits<double>::quiet_NaN();
  e.samples = 1024;
  const std::string text = to_json(event{e}).dump();
  EXPECT_EQ(text.rfind("{\"event\":\"epoch\",\"epoch\":2,\"step\":30,", 0), 0u) << text;
  EXPECT_NE(text.find("\"test_loss\":null,\"test_accuracy\":null"), std::string::npos) << text;
  EXPECT_NE(text.find("\"samples\":1024"), std::string::npos) << text;
}

TEST(Events, AStepRecordListsSharesAndThroughputInRankOrder) {
  step_event e;
  e.step = 7;
  e.shares = {0.25, 0.75};
  e.throughput = {100.0, 300.0};
  const json j = to_json(event{e});
  EXPECT_EQ(j.at("event"), "step");
  EXPECT_EQ(j.at("shares").dump(), "[0.25,0.75]");
  EXPECT_EQ(j.at("throughput").dump(), "[100.0,300.0]");
}

TEST(Events, TheSummaryIsTheLastRecordsShape) {
  run_summary s;
  s.checkpoint = "checkpoints/step-00000010";
  s.stopped = true;
  const json j = to_json(s);
  EXPECT_EQ(j.begin().value(), "summary");
  EXPECT_EQ(j.at("checkpoint"), "checkpoints/step-00000010");
  EXPECT_EQ(j.at("stopped"), true);
}

}  // namespace
}  // namespace dpactor
