// The run's metrics (issue 15, first part): /metrics parses as Prometheus
// text (HELP and TYPE for every family, _total counters, escaped labels)
// and says what the engine's events said, and /status is the same state as
// JSON. The HTTP server that serves them is in http_test.

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "service/metrics_board.hpp"
#include "tests/service_support.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;
using testing::a_board_after_a_fault;
using testing::parse_prometheus;

TEST(Metrics, TheTextParsesAndSaysWhatTheEventsSaid) {
  auto board = a_board_after_a_fault();
  const auto m = parse_prometheus(board->prometheus_text(metrics_board::clock::now() + 3s));
  EXPECT_EQ(m.at("dpactor_running"), 1.0);
  EXPECT_EQ(m.at("dpactor_steps_total"), 200.0);
  EXPECT_EQ(m.at("dpactor_cuts_total"), 3.0) << "cuts add up over step events";
  EXPECT_EQ(m.at("dpactor_membership_changes_total"), 2.0);
  EXPECT_EQ(m.at("dpactor_faults_total"), 1.0) << "a join is a membership change, not a fault";
  EXPECT_EQ(m.at("dpactor_recoveries_total"), 1.0);
  EXPECT_DOUBLE_EQ(m.at("dpactor_last_recovery_seconds"), 0.0125);
  EXPECT_EQ(m.at("dpactor_generation"), 2.0);
  EXPECT_EQ(m.at("dpactor_members"), 2.0);
  EXPECT_DOUBLE_EQ(m.at("dpactor_test_accuracy_ratio"), 0.84);
  EXPECT_DOUBLE_EQ(m.at("dpactor_device_share_ratio{device=\"cpu:2\"}"), 0.4);
  EXPECT_DOUBLE_EQ(m.at("dpactor_device_samples_per_second{device=\"cpu:0\"}"), 60000);
  EXPECT_EQ(m.at("dpactor_checkpoint_step"), 200.0);
  EXPECT_GE(m.at("dpactor_checkpoint_age_seconds"), 2.9);
  EXPECT_EQ(m.at("dpactor_requeued_samples_total"), 64.0);
}

TEST(Metrics, StatusIsTheSameStateAsJson) {
  auto board = a_board_after_a_fault();
  const json s = board->status(metrics_board::clock::now() + 3s);
  EXPECT_EQ(s.at("step"), 200);
  EXPECT_EQ(s.at("generation"), 2);
  EXPECT_EQ(s.at("faults"), 1);
  EXPECT_EQ(s.at("cuts"), 3);
  ASSERT_EQ(s.at("members").size(), 2u);
  EXPECT_EQ(s.at("members")[1].at("name"), "cpu:2");
  EXPECT_DOUBLE_EQ(s.at("members")[1].at("share").get<double>(), 0.4);
  EXPECT_DOUBLE_EQ(s.at("test_accuracy").get<double>(), 0.84);
  EXPECT_EQ(s.at("checkpoint").at("step"), 200);
  EXPECT_GE(s.at("checkpoint").at("age_s").get<double>(), 2.9);
}

// sync.mode = "async": each logical worker's account, from the last step
// event that carried one, on /metrics (labelled by worker) and /status.
TEST(Metrics, AnAsyncRunsWorkersAreOnMetricsAndStatus) {
  metrics_board board;
  board.on_event(membership_event{0, 0, {"cpu:0", "cpu:1"}, {1, 2}, "start"});
  step_event s;
  s.step = 40;
  s.workers = {{30, 2, 0.25, 16, 900.0}, {12, 5, 1.5, 5, 300.0}};
  board.on_event(s);
  step_event later;  // an event without accounts keeps the last ones
  later.step = 41;
  board.on_event(later);
  const auto m = parse_prometheus(board.prometheus_text());
  EXPECT_EQ(m.at("dpactor_worker_contributions_total{worker=\"0\"}"), 30.0);
  EXPECT_EQ(m.at("dpactor_worker_dropped_total{worker=\"1\"}"), 5.0);
  EXPECT_DOUBLE_EQ(m.at("dpactor_worker_mean_staleness_rounds{worker=\"1\"}"), 1.5);
  EXPECT_EQ(m.at("dpactor_worker_inner_steps{worker=\"1\"}"), 5.0);
  const json st = board.status();
  ASSERT_EQ(st.at("workers").size(), 2u);
  EXPECT_EQ(st.at("workers")[0].at("contributed"), 30);
  EXPECT_DOUBLE_EQ(st.at("workers")[1].at("samples_per_s").get<double>(), 300.0);
  // Not async: no worker families, an empty list.
  metrics_board plain;
  plain.on_event(s = step_event{});
  EXPECT_EQ(plain.prometheus_text().find("dpactor_worker_"), std::string::npos);
  EXPECT_TRUE(plain.status().at("workers").empty());
}

TEST(Metrics, LabelValuesAreEscaped) {
  metrics_board board;
  board.on_event(membership_event{0, 0, {"node \"a\"\\b\nc/cpu:0"}, {1}, "start"});
  step_event s;
  s.shares = {1.0};
  s.throughput = {1.0};
  board.on_event(s);
  const auto m = parse_prometheus(board.prometheus_text());
  EXPECT_EQ(m.count(R"(dpactor_device_share_ratio{device="node \"a\"\\b\nc/cpu:0"})"), 1u);
}

}  // namespace
}  // namespace dpactor
