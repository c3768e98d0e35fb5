// Faults across processes on 127.0.0.1 (See Note [Coordinator and
// workers], Note [A worker never trains alone]): a killed worker, one killed
// during the Gloo rendezvous and a frozen one are left out of the next
// generation and the run finishes; below cluster.min_devices every process
// stops after a checkpoint; a worker that loses its coordinator, or wakes up
// removed, is fenced, or joins again with --rejoin-timeout. Heartbeats as
// issue 12 asks of tests where a test times them: 100 ms, silent peers
// dropped at 500 ms.

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/cluster_support.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;
using testing::cluster;
using testing::fast_heartbeats;

// `args` followed by the fast heartbeats.
std::vector<std::string> fast(std::vector<std::string> args) {
  args.insert(args.end(), fast_heartbeats.begin(), fast_heartbeats.end());
  return args;
}

// Faults across processes on both replica kinds: the MLP job
// (configs/mlp.cfg) and the CNN (configs/cnn.cfg) on the libtorch replica.
class DistributedFaults : public testing::both_replicas {};

TEST_P(DistributedFaults, AKilledWorkerIsLeftOutOfTheNextGenerationAndTheRunFinishes) {
  cluster job;
  testing::coordinator_options o;
  if (testing::current_kind() == testing::replica_kind::torch) o.model = testing::cnn_config;
  ASSERT_TRUE(job.start_coordinator({"--cpus", "1", "--wait-devices", "3", "--set", "train.max_steps=600", "--set",
                                     "train.eval_every=0"},
                                    o));
  auto a = job.start_worker("A", 1);
  auto b = job.start_worker("B", 1);
  ASSERT_TRUE(job.coordinator_says("generation 0"));
  std::this_thread::sleep_for(1500ms);  // well into training
  b->signal(SIGKILL);
  const auto [c, wa] = job.finish(*a);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(wa.exit_code, 0) << "the surviving worker must finish normally: " << wa.output;
  // B is out; the reasons name it (its connection closed), possibly after a
  // survivor's failed collective or the hang check, whichever came first.
  EXPECT_TRUE(std::regex_search(c.output, std::regex("generation 1 from step [0-9]+: 2 members \\(cpu:0, A/cpu:0\\);[^\\n]*B/cpu:0")))
      << c.output;
  EXPECT_NE(c.output.find("recovered: step"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("(600 steps"), std::string::npos) << "the run must train all its steps: " << c.output;
}

// See Note [A remote device's record arrives before its gradients]: a
// worker killed right after a step's exchange (kill:2@30: its gradients of
// step 30 reached the others, its report did not leave) leaves the
// coordinator its record of that step, so the devices' own account holds
// every sample of the epoch once, the rolled-back steps' records void.
TEST(Distributed, AWorkerKilledRightAfterAnExchangeLeavesItsRecordOfTheStepEverySampleOnce) {
  cluster job;
  const auto metrics = job / "m.jsonl";
  ASSERT_TRUE(job.start_coordinator({"--cpus", "1", "--wait-devices", "3", "--batch-size", "512", "--epochs", "1",
                                     "--set", "train.eval_every=0", "--set", "train.record_trained=true", "--metrics",
                                     metrics.string(), "--inject", "kill:2@30"}));
  auto a = job.start_worker("A", 1);
  auto b = job.start_worker("B", 1);
  const auto c = job.coordinator().wait(180s);
  const auto wa = a->wait(60s), wb = b->wait(60s);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  // The worker whose device was numbered 2 is gone (killed), the other finished.
  EXPECT_TRUE((wa.exit_code == 0) != (wb.exit_code == 0)) << wa.output << "\n" << wb.output;
  EXPECT_TRUE(std::regex_search(c.output, std::regex("generation 1 from step (30|31): 2 members"))) << c.output;
  testing::trained_evidence evidence;
  evidence.record_metrics(metrics);
  EXPECT_EQ(evidence.check(60000, 1), "");
}

TEST(Distributed, AWorkerKilledDuringTheRendezvousIsLeftOutAndTheGenerationReformsWhenItsConnectionDrops) {
  cluster job;
  ASSERT_TRUE(job.start_coordinator(fast({"--cpus", "1", "--wait-devices", "3", "--set", "train.max_steps=300"})));
  auto a = job.start_worker("A", 1, fast_heartbeats);
  ASSERT_TRUE(job.coordinator_says("node A joined"));
  auto b = job.start_worker("B", 1, fast_heartbeats);
  // B is frozen the moment it is admitted: the first generation forms with
  // it, and the others wait for it in the Gloo rendezvous; then it dies.
  ASSERT_TRUE(job.coordinator_says("node B joined"));
  b->signal(SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(200ms);
  b->signal(SIGKILL);
  ASSERT_TRUE(job.coordinator_says("generation 1", 30s));
  const auto reformed_after = std::chrono::steady_clock::now() - stopped;
  std::printf("[ measured ] the generation re-formed %.0f ms after the worker froze in the rendezvous\n",
              std::chrono::duration<double, std::milli>(reformed_after).count());
  const auto [c, wa] = job.finish(*a);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(wa.exit_code, 0) << wa.output;
  EXPECT_NE(c.output.find("generation 0: 3 members (cpu:0, A/cpu:0, B/cpu:0)"), std::string::npos) << c.output;
  // Re-formed because B's connection was lost (the coordinator aborted the
  // rendezvous), not because the survivors' rendezvous timed out (10 s): the
  // reason names B's lost link and no timeout, and it came before half of
  // that timeout had passed. (Measured 234-257 ms, about 57 ms after the
  // kill: docs/PERFORMANCE.md.)
  std::smatch line;
  ASSERT_TRUE(std::regex_search(c.output, line, std::regex("generation 1 from step 1: [^\\n]*"))) << c.output;
  EXPECT_TRUE(std::regex_search(line.str(), std::regex("^generation 1 from step 1: 2 members \\(cpu:0, A/cpu:0\\);[^\\n]*"
                                                       "B/cpu:0 exited: exit_reason\\(remote_link_unreachable\\)")))
      << line.str();
  EXPECT_EQ(line.str().find("timed out"), std::string::npos) << line.str();
  EXPECT_NE(c.output.find("(300 steps"), std::string::npos) << c.output;
  EXPECT_LT(reformed_after, 5s) << c.output;
}

TEST(Distributed, BelowMinDevicesEveryProcessStopsWithAClearErrorAfterACheckpoint) {
  cluster job;
  ASSERT_TRUE(job.start_coordinator({"--cpus", "1", "--wait-devices", "3", "--set", "cluster.min_devices=3", "--set",
                                     "train.max_steps=3000", "--checkpoint-dir", (job / "ck").string()}));
  auto a = job.start_worker("A", 1);
  auto b = job.start_worker("B", 1);
  ASSERT_TRUE(job.coordinator_says("generation 0"));
  std::this_thread::sleep_for(1s);
  b->signal(SIGKILL);
  const auto [c, wa] = job.finish(*a);
  EXPECT_EQ(c.exit_code, 5) << c.output;
  EXPECT_NE(c.output.find("2 devices left, fewer than cluster.min_devices = 3"), std::string::npos) << c.output;
  EXPECT_TRUE(std::regex_search(c.output, std::regex("checkpoint written: \\S*step-0*[1-9][0-9]*"))) << c.output;
  EXPECT_EQ(wa.exit_code, 5) << "the surviving worker stops with the run's error: " << wa.output;
  EXPECT_NE(wa.output.find("the coordinator's run failed: training stopped after step"), std::string::npos) << wa.output;
}

TEST(Distributed, AWorkerThatLosesItsCoordinatorIsFencedWithItsOwnExitCode) {
  cluster job;
  ASSERT_TRUE(job.start_coordinator({"--cpus", "1", "--wait-devices", "2", "--set", "train.epochs=20"}));
  auto worker = job.start_worker("W", 1);
  ASSERT_TRUE(job.coordinator_says("generation 0"));
  std::this_thread::sleep_for(1s);
  job.coordinator().signal(SIGKILL);
  const auto started = std::chrono::steady_clock::now();
  const auto w = worker->wait(30s);
  EXPECT_EQ(w.exit_code, 6) << w.output;
  EXPECT_NE(w.output.find("fenced: lost the coordinator"), std::string::npos) << w.output;
  // A killed coordinator closes its sockets: the worker knows at once, long
  // before a connection timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s);
}

TEST(Distributed, AFrozenWorkerIsRemovedAtTheConnectionTimeoutAndFindsItselfFencedWhenItWakes) {
  cluster job;
  ASSERT_TRUE(job.start_coordinator(fast({"--cpus", "1", "--wait-devices", "3", "--set", "train.max_steps=800"})));
  auto a = job.start_worker("A", 1, fast_heartbeats);
  auto b = job.start_worker("B", 1, fast_heartbeats);
  ASSERT_TRUE(job.coordinator_says("generation 0"));
  std::this_thread::sleep_for(1s);
  b->signal(SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  ASSERT_TRUE(job.coordinator_says("generation 1", 30s));
  const auto removed_after = std::chrono::steady_clock::now() - stopped;
  std::printf("[ measured ] the frozen worker was removed %.0f ms after SIGSTOP\n",
              std::chrono::duration<double, std::milli>(removed_after).count());
  // Removed at the connection timeout (500 ms): its link is reported
  // unreachable. The other ways a frozen worker goes, the hang check (5 s at
  // the least) and the collective timeout, would say "hung" or "timed out".
  {
    std::smatch line;
    const std::string so_far = job.coordinator().output_so_far();
    ASSERT_TRUE(std::regex_search(so_far, line, std::regex("generation 1 from step [^\\n]*"))) << so_far;
    EXPECT_NE(line.str().find("B/cpu:0 exited: exit_reason(remote_link_unreachable)"), std::string::npos) << line.str();
    EXPECT_EQ(line.str().find("hung"), std::string::npos) << line.str();
    EXPECT_EQ(line.str().find("timed out"), std::string::npos) << line.str();
  }
  b->signal(SIGCONT);
  const auto wb = b->wait(30s);
  EXPECT_EQ(wb.exit_code, 6) << "a worker that wakes up removed must find itself fenced: " << wb.output;
  const auto [c, wa] = job.finish(*a);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(wa.exit_code, 0) << wa.output;
  EXPECT_NE(c.output.find("2 members (cpu:0, A/cpu:0)"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("(800 steps"), std::string::npos) << c.output;
}

TEST(Distributed, AFrozenWorkerWithRejoinTimeoutJoinsAgainWhenItWakesAndTheRunFinishes) {
  cluster job;
  ASSERT_TRUE(job.start_coordinator(fast({"--cpus", "1", "--wait-devices", "2", "--set", "train.max_steps=1500"})));
  auto b = job.start_worker("B", 1, fast({"--rejoin-timeout", "30"}));
  ASSERT_TRUE(job.coordinator_says("generation 0"));
  std::this_thread::sleep_for(1s);
  b->signal(SIGSTOP);
  ASSERT_TRUE(job.coordinator_says("generation 1", 30s));
  b->signal(SIGCONT);
  const auto wb = b->wait(120s);
  const auto c = job.coordinator().wait(120s);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(wb.exit_code, 0) << "the worker joins again and finishes with the run: " << wb.output;
  EXPECT_NE(wb.output.find("joining again as a new member"), std::string::npos) << wb.output;
  EXPECT_TRUE(std::regex_search(c.output, std::regex("generation 2 from step [0-9]+: 2 members \\(cpu:0, B/cpu:0\\); "
                                                     "B/cpu:0 joined")))
      << c.output;
  EXPECT_NE(c.output.find("(1500 steps"), std::string::npos) << c.output;
}

DPACTOR_ON_BOTH_REPLICAS(DistributedFaults);

}  // namespace
}  // namespace dpactor
