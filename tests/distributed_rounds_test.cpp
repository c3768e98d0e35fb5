// The round modes across processes (docs/async.md, "Across processes"):
// each process holds its own logical workers (Note [Worker placement]), a
// checkpoint gathers their states from every process (Note [A checkpoint's
// logical workers]), and a coordinator with a worker trains the bytes of one
// process with as many devices, every sample once by the devices' own
// records. A process that joins during training takes logical workers with
// their states (Note [Moving logical workers]), and a killed one's workers
// are run again from their backups on the others (Note [Replaying a lost
// worker's rounds]), to the same bytes.

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "tests/cluster_support.hpp"

namespace dpactor {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::cluster;
using testing::latest_in;
using testing::mlp_config;

// diloco, two logical workers (one a device: sync.workers = 0), H = 2, the
// int8 codec and the one-round delay; plus `extra`.
std::vector<std::string> diloco(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--set", "sync.mode=\"diloco\"", "--set", "sync.every=2", "--set", "sync.codec=\"int8\"",
                                "--set", "sync.delay=1", "--set", "train.eval_every=0"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// The megabytes the run's summary says the collectives sent (-1: none said).
double sent_mb(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex("sent ([0-9.]+) MB by the collectives"))) return -1.0;
  return std::stod(m[1].str());
}

// The exchanges that ran during the next round, by the summary (-1: none
// said).
long overlapped_exchanges(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex("([0-9]+) round exchanges ran during the next round"))) return -1;
  return std::stol(m[1].str());
}

// A coordinator and a worker with one device each train `common` into ck/;
// one process with two devices trains it into single/. Both runs' bytes
// sent, by their summaries, land in `sent` (processes, single), and their
// overlapped exchanges in `overlapped`.
void train_both(cluster& job, const std::vector<std::string>& common, const std::vector<std::string>& coordinator_only,
                std::pair<double, double>* sent = nullptr, std::pair<long, long>* overlapped = nullptr) {
  std::vector<std::string> args = {"--cpus", "1", "--wait-devices", "2", "--checkpoint-dir", (job / "ck").string()};
  args.insert(args.end(), common.begin(), common.end());
  args.insert(args.end(), coordinator_only.begin(), coordinator_only.end());
  ASSERT_TRUE(job.start_coordinator(args));
  auto worker = job.start_worker("w1", 1);
  const auto [c, w] = job.finish(*worker);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  ASSERT_EQ(w.exit_code, 0) << w.output;
  EXPECT_NE(c.output.find("generation 0: 2 members (cpu:0, w1/cpu:0)"), std::string::npos) << c.output;
  EXPECT_EQ(c.output.find("generation 1"), std::string::npos) << "no member may have been lost: " << c.output;
  std::vector<std::string> single = {"--model", mlp_config, "--gpus", "0", "--cpus", "2", "--checkpoint-dir",
                                     (job / "single").string()};
  single.insert(single.end(), common.begin(), common.end());
  const auto s = job.run("one", single);
  ASSERT_EQ(s.exit_code, 0) << s.output;
  if (sent) *sent = {sent_mb(c.output), sent_mb(s.output)};
  if (overlapped) *overlapped = {overlapped_exchanges(c.output), overlapped_exchanges(s.output)};
}

// Every round's exchange between the processes over shared memory; the
// checkpoints in the middle and at the end hold both processes' workers,
// and the middle one resumes in one process on three devices to the end's
// bytes.
TEST(DistributedRounds, ACoordinatorAndAWorkerTrainTheBytesOfOneProcessWithTwoDevices) {
  cluster job;
  std::pair<double, double> sent;
  std::pair<long, long> overlapped;
  train_both(job, diloco({"--epochs", "1", "--set", "train.max_steps=40", "--set", "train.checkpoint_every=15"}), {},
             &sent, &overlapped);
  if (HasFatalFailure()) return;
  // See Note [Overlapped delayed rounds]: a device overlaps at most 36 of
  // the 40 rounds (not the first, the two after a checkpoint nor the last),
  // so more than 36 counts the worker's device too (bytes_msg).
  EXPECT_GT(overlapped.first, 36) << "the worker process's overlapped exchanges are not counted";
  EXPECT_LE(overlapped.first, 2 * 36);
  EXPECT_GT(overlapped.second, 36);
  // The coordinator counts the worker's device too (bytes_msg): what one
  // process's two devices send (the int8 exchange's bytes are the same on
  // Gloo and the local backend: 21.7 MB each, measured); without the
  // worker's, half. The summary prints 0.1 MB steps.
  EXPECT_GT(sent.second, 0.0);
  EXPECT_NEAR(sent.first, sent.second, 0.1 + 0.01 * sent.second) << "MB sent: processes, one process";
  for (const char* step : {"step-00000015", "step-00000030", "step-00000040"})
    testing::expect_same_state(job / "ck" / step, job / "single" / step, std::string("the processes and the single process at ") + step);
  ASSERT_TRUE(fs::exists(job / "ck" / "step-00000015" / "workers.safetensors"));
  const auto resumed = job.run("resumed", {"--model", mlp_config, "--gpus", "0", "--cpus", "3", "--epochs", "1", "--set",
                                           "train.max_steps=40", "--set", "sync.mode=\"diloco\"", "--set", "sync.every=2",
                                           "--set", "sync.codec=\"int8\"", "--set", "sync.delay=1", "--set",
                                           "train.eval_every=0", "--set", "sync.workers=2", "--resume",
                                           (job / "ck" / "step-00000015").string(), "--checkpoint-dir",
                                           (job / "resumed").string()});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  testing::expect_same_state(job / "resumed" / "step-00000040", job / "single" / "step-00000040",
                             "the two-process checkpoint resumed in one process and the single process");
}

// Over Gloo's TCP, streaming DiLoCo (bf16, two fragments), a whole epoch:
// every sample once by the devices' own records, both processes' included.
TEST(DistributedRounds, StreamingOverTcpTrainsEverySampleOnceAndTheBytesOfOneProcess) {
  cluster job;
  const std::vector<std::string> common = {"--set", "sync.mode=\"diloco\"", "--set", "sync.every=4", "--set",
                                           "sync.fragments=2", "--set", "sync.codec=\"bf16\"", "--set",
                                           "train.eval_every=0", "--set", "cluster.shared_memory=false", "--epochs", "1"};
  train_both(job, common, {"--set", "train.record_trained=true", "--metrics", (job / "m.jsonl").string()});
  if (HasFatalFailure()) return;
  // The epoch is 235 steps with these settings (as one process counts them).
  testing::expect_same_state(job / "ck" / "step-00000235", job / "single" / "step-00000235",
                             "the processes and the single process");
  testing::trained_evidence evidence;
  evidence.record_metrics(job / "m.jsonl");
  EXPECT_EQ(evidence.check(60000, 1), "");
  EXPECT_TRUE(evidence.first_step_of("w1/cpu:0").has_value()) << "the worker reported nothing it trained";
}

// A coordinator and w1 and w2, one device each, train `common` into ck/
// (a checkpoint every 50 rounds, the devices' records into m.jsonl) while
// w1 kills itself with -9 after round 120 and a fourth process, late,
// joins once training has started; then one process with two devices
// trains `common` into quiet/. Checks the exit codes and that every sample
// of the epoch was trained once by the devices' own records, the
// newcomer's included. Returns the coordinator's output and the quiet
// run's.
std::pair<std::string, std::string> kill_and_join(cluster& job, const std::vector<std::string>& common) {
  std::vector<std::string> args = {"--cpus", "1", "--wait-devices", "3", "--checkpoint-dir", (job / "ck").string(),
                                   "--set", "train.checkpoint_every=50", "--inject", "kill:1@120",
                                   "--set", "train.record_trained=true", "--metrics", (job / "m.jsonl").string()};
  args.insert(args.end(), common.begin(), common.end());
  if (!job.start_coordinator(args)) {
    ADD_FAILURE() << "the coordinator did not start";
    return {};
  }
  auto w1 = job.start_worker("w1", 1);
  EXPECT_TRUE(job.coordinator_says("node w1 joined"));  // device 1
  auto w2 = job.start_worker("w2", 1);
  EXPECT_TRUE(job.coordinator_says("generation 0: 3 members"));
  auto late = job.start_worker("late", 1);
  const auto [c, one, two, l] = job.finish(*w1, *w2, *late);
  EXPECT_NE(one.exit_code, 0) << one.output;
  EXPECT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(two.exit_code, 0) << two.output;
  EXPECT_EQ(l.exit_code, 0) << l.output;
  testing::trained_evidence evidence;
  evidence.record_metrics(job / "m.jsonl");
  EXPECT_EQ(evidence.check(60000, 1), "");
  EXPECT_TRUE(evidence.first_step_of("late/cpu:0").has_value()) << "the newcomer trained nothing";
  std::vector<std::string> quiet = {"--model", mlp_config, "--gpus", "0", "--cpus", "2", "--checkpoint-dir",
                                    (job / "quiet").string()};
  quiet.insert(quiet.end(), common.begin(), common.end());
  const auto q = job.run("quiet", quiet);
  EXPECT_EQ(q.exit_code, 0) << q.output;
  return {c.output, q.output};
}

// A worker process killed with -9 (kill:1@120: w1's, right after round
// 120's exchange, with round 121 about to run on the others) takes its
// logical worker's state after round 120 with it; meanwhile a fourth
// process joins during training and takes a worker with its state (Note
// [Moving logical workers]). The lost worker's rounds since its newest
// backup (round 100's checkpoint) run again on a process that took part in
// them (Note [Replaying a lost worker's rounds]), and the run goes on:
// every sample of the epoch once by the devices' own records, the
// newcomer's included, and the model and optimizer bytes of one process
// with two devices where nothing happened.
TEST(DistributedRounds, AKilledProcessesWorkerIsRunAgainAndAJoinTakesOneWithItsStateToTheBytesOfOneProcess) {
  cluster job;
  const std::vector<std::string> common = diloco({"--epochs", "1", "--set", "sync.workers=4"});
  const auto [c, q] = kill_and_join(job, common);
  if (HasFailure()) return;
  EXPECT_NE(c.find("lost with its process, runs its steps 101 to 120 again"), std::string::npos) << c;
  std::smatch moved;
  ASSERT_TRUE(std::regex_search(c, moved, std::regex("logical workers ([0-9, ]+) move to another process with "
                                                     "their states \\(([0-9.]+) MB\\)")))
      << c;
  // A worker's state here: the inner SGD's momentum, the int8 residual and
  // the delay's progress, a float a parameter each (235,146), plus a few;
  // from the coordinator straight to the newcomer, or through it from a
  // worker process.
  const double mb = std::stod(moved[2].str()), state_mb = 3 * 235146 * 4 / 1e6;
  EXPECT_TRUE(std::abs(mb - state_mb) < 0.05 || std::abs(mb - 2 * state_mb) < 0.05) << c;
  const std::string last = latest_in(job / "quiet");
  testing::expect_same_state(job / "ck" / last, job / "quiet" / last, "the run with a kill and a join, a quiet one");
}

// Fast mode (train.reproducible = false, Note [Fast rounds across
// processes]): w1 killed with -9 after round 120, its worker restarts on
// another process from its newest backup (round 100's checkpoint) instead
// of being run again, while another process joins during training. Every
// sample of the epoch once by the devices' own records, the newcomer's
// included, and the accuracy of a quiet run within half a point.
TEST(DistributedRounds, InFastModeAKilledProcessesWorkerRestartsFromItsBackupAndAJoinTakesOneEverySampleOnce) {
  cluster job;
  const std::vector<std::string> common =
      diloco({"--epochs", "1", "--set", "sync.workers=4", "--set", "train.reproducible=false"});
  const auto [c, q] = kill_and_join(job, common);
  if (HasFailure()) return;
  EXPECT_NE(c.find("lost with its process, restarts from its state after step 100 (fast mode)"),
            std::string::npos)
      << c;
  EXPECT_NE(c.find("late/cpu:0"), std::string::npos) << c;
  std::smatch a, b;
  const std::regex accuracy("test accuracy ([0-9.]+)");
  ASSERT_TRUE(std::regex_search(c, a, accuracy)) << c;
  ASSERT_TRUE(std::regex_search(q, b, accuracy)) << q;
  EXPECT_NEAR(std::stod(a[1].str()), std::stod(b[1].str()), 0.005) << "the run with a kill and a join, a quiet one";
}

// SIGINT stops a run across processes with a checkpoint holding both
// processes' workers; a coordinator with another worker process resumes it
// (Note [A resume across processes]) to the end, with the model and
// optimizer bytes of one process that was never stopped.
TEST(DistributedRounds, SigintLeavesACheckpointThatACoordinatorWithAnotherWorkerResumesToTheBytesOfOneProcess) {
  cluster job;
  const std::vector<std::string> common = diloco({"--epochs", "1", "--set", "train.max_steps=200"});
  std::vector<std::string> args = {"--cpus", "1", "--wait-devices", "2", "--checkpoint-dir", (job / "ck").string(),
                                   "--set", "train.checkpoint_every=50"};
  args.insert(args.end(), common.begin(), common.end());
  ASSERT_TRUE(job.start_coordinator(args));
  auto worker = job.start_worker("w1", 1);
  ASSERT_TRUE(job.coordinator_says("checkpoint written"));
  job.coordinator().signal(SIGINT);
  const auto c = job.coordinator().wait(60s);
  const auto w = worker->wait(60s);
  ASSERT_EQ(c.exit_code, 130) << c.output;
  EXPECT_EQ(c.output.find("generation 1"), std::string::npos) << c.output;
  const std::string stopped = latest_in(job / "ck");
  ASSERT_TRUE(fs::exists(job / "ck" / stopped / "workers.safetensors")) << c.output;
  ASSERT_NE(stopped, "step-00000200") << "SIGINT came after the run's end: " << c.output;
  std::vector<std::string> again = {"--cpus", "1", "--wait-devices", "2", "--resume", (job / "ck").string(),
                                    "--checkpoint-dir", (job / "ck").string()};
  again.insert(again.end(), common.begin(), common.end());
  testing::coordinator_options resumed;
  resumed.dir = "resumed";
  ASSERT_TRUE(job.start_coordinator(again, resumed));
  auto other = job.start_worker("w2", 1);
  const auto [r, o] = job.finish(*other);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(o.exit_code, 0) << o.output;
  std::vector<std::string> quiet = {"--model", mlp_config, "--gpus", "0", "--cpus", "2", "--checkpoint-dir",
                                    (job / "quiet").string()};
  quiet.insert(quiet.end(), common.begin(), common.end());
  ASSERT_EQ(job.run("quiet", quiet).exit_code, 0);
  testing::expect_same_state(job / "ck" / "step-00000200", job / "quiet" / "step-00000200",
                             "the run stopped and resumed across processes, and one never stopped");
}

}  // namespace
}  // namespace dpactor
