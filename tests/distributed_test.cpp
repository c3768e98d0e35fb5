// Multi-node training with real processes on 127.0.0.1 (See Note
// [Coordinator and workers]): the bytes a coordinator and its workers train
// equal one process's with as many replicas, every sample once by the
// devices' own records; a worker joins during training; a restarted
// coordinator takes its workers back. Faults across processes are in
// distributed_fault_test, who may join a job in distributed_admission_test.

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "tensors/json.hpp"
#include "tests/cluster_support.hpp"

namespace dpactor {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::cluster;
using testing::cnn_config;
using testing::mlp_config;

TEST(Distributed, ACoordinatorAndAWorkerTrainTheBytesOfOneFourReplicaProcessEverySampleOnce) {
  cluster job;
  ASSERT_TRUE(job.start_coordinator({"--cpus", "2", "--wait-devices", "4", "--set", "train.record_trained=true",
                                     "--metrics", (job / "m.jsonl").string(), "--epochs", "1", "--checkpoint-dir",
                                     (job / "ck").string()}));
  auto worker = job.start_worker("w1", 2);
  const auto w = worker->wait(120s);
  const auto c = job.coordinator().wait(120s);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  ASSERT_EQ(w.exit_code, 0) << w.output;
  EXPECT_NE(c.output.find("generation 0: 4 members (cpu:0, cpu:1, w1/cpu:0, w1/cpu:1)"), std::string::npos) << c.output;
  EXPECT_EQ(c.output.find("generation 1"), std::string::npos) << "no member may have been lost: " << c.output;
  EXPECT_NE(w.output.find("the run is over"), std::string::npos) << w.output;
  // Every sample of the epoch once, by the devices' own account, the
  // worker's included.
  testing::trained_evidence evidence;
  evidence.record_metrics(job / "m.jsonl");
  EXPECT_EQ(evidence.check(60000, 1), "");
  for (const char* device : {"cpu:0", "w1/cpu:1"})
    EXPECT_TRUE(evidence.first_step_of(device).has_value()) << device << " reported nothing it trained";
  // See Note [A remote device's record arrives before its gradients]: the
  // coordinator has a worker's record of a step before the step commits, so
  // in the metrics it comes before every step record at or after its step.
  {
    std::ifstream metrics(job / "m.jsonl");
    std::string line;
    std::int64_t committed = 0, worker_records = 0;  // the last step record's step (1-based)
    while (std::getline(metrics, line)) {
      const auto j = nlohmann::json::parse(line);
      const std::string kind = j.value("event", "");
      if (kind == "step") committed = j.at("step").get<std::int64_t>();
      if (kind == "trained" && j.at("device").get<std::string>().starts_with("w1/")) {
        ++worker_records;
        ASSERT_GT(j.at("step").get<std::int64_t>(), committed)
            << "a worker's record came after the step record of step " << committed << ": " << line;
      }
    }
    EXPECT_EQ(worker_records, 2 * 469);
  }

  // The same job in one process with four replicas: the same bytes
  // (train.reproducible, on by default).
  const auto s = job.run("one", {"--model", mlp_config, "--gpus", "0", "--cpus", "4", "--epochs", "1",
                                 "--checkpoint-dir", (job / "single").string()});
  ASSERT_EQ(s.exit_code, 0) << s.output;
  testing::expect_same_state(job / "ck" / "step-00000469", job / "single" / "step-00000469",
                             "the processes and the single process");
}

// A coordinator and a worker with one replica each, on `model`, for 40
// steps of one epoch plus `extra`, against one process with two replicas:
// the same bytes. Both runs are left in job / "ck" and job / "single".
void expect_two_processes_train_one_process_bytes(cluster& job, const std::string& model,
                                                  const std::vector<std::string>& extra) {
  std::vector<std::string> common = {"--epochs", "1", "--set", "train.max_steps=40", "--set", "train.eval_every=0"};
  common.insert(common.end(), extra.begin(), extra.end());
  std::vector<std::string> args = {"--cpus", "1", "--wait-devices", "2", "--checkpoint-dir", (job / "ck").string()};
  args.insert(args.end(), common.begin(), common.end());
  testing::coordinator_options options;
  options.model = model;
  ASSERT_TRUE(job.start_coordinator(args, options));
  auto worker = job.start_worker("w1", 1);
  const auto w = worker->wait(120s);
  const auto c = job.coordinator().wait(120s);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  ASSERT_EQ(w.exit_code, 0) << w.output;
  EXPECT_NE(c.output.find("generation 0: 2 members (cpu:0, w1/cpu:0)"), std::string::npos) << c.output;

  std::vector<std::string> single = {"--model", model, "--gpus", "0", "--cpus", "2", "--checkpoint-dir",
                                     (job / "single").string()};
  single.insert(single.end(), common.begin(), common.end());
  const auto s = job.run("one", single);
  ASSERT_EQ(s.exit_code, 0) << s.output;
  testing::expect_same_state(job / "ck" / "step-00000040", job / "single" / "step-00000040",
                             "the processes and the single process");
}

// The libtorch replica across processes: a coordinator and a worker with one
// CNN replica each (configs/cnn.cfg; the worker loads the coordinator's
// model.path) train the bytes of one process with two.
TEST(Distributed, TorchReplicasInTwoProcessesTrainTheBytesOfOneProcessWithTwo) {
  std::string why;
  if (!testing::torch_available(why)) GTEST_SKIP() << why;
  cluster job;
  expect_two_processes_train_one_process_bytes(job, cnn_config, {});
}

// Over Gloo's TCP (no shared memory between the two processes): the step
// is one call, its parts sent with the header from the second step on (Note
// [One call a step], Note [Parts sent with the header]); the bytes are one
// process's with two replicas.
TEST(Distributed, OverTcpTwoProcessesTrainTheBytesOfOneProcessWithTwo) {
  cluster job;
  expect_two_processes_train_one_process_bytes(job, mlp_config, {"--set", "cluster.shared_memory=false"});
}

// Fast mode over Gloo's TCP: the header and the gradients' all-reduce in one
// call, the gradients sent with the header from the second step on; every
// member applies the same sum, so the replicas stay equal
// (train.verify_replicas, on in these tests, ends the run otherwise). A
// thousand steps: long enough for waits that look up the connection while
// the peer's next message is under way (mutant 122).
TEST(Distributed, FastModeOverTcpKeepsTheReplicasOfTwoProcessesEqual) {
  cluster job;
  ASSERT_TRUE(job.start_coordinator({"--cpus", "1", "--wait-devices", "2", "--epochs", "3", "--set", "train.max_steps=1000",
                                     "--set", "train.eval_every=0", "--set", "train.reproducible=false", "--set",
                                     "cluster.shared_memory=false", "--set", "cluster.blas_threads=1"}));
  auto worker = job.start_worker("w1", 1);
  const auto w = worker->wait(120s);
  const auto c = job.coordinator().wait(120s);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  ASSERT_EQ(w.exit_code, 0) << w.output;
  EXPECT_NE(c.output.find("generation 0: 2 members (cpu:0, w1/cpu:0)"), std::string::npos) << c.output;
}

// every_step with its gradients in bf16 (Note [Bf16 steps]) across
// processes: the leaves travel over Gloo in two bytes a value, and the
// bytes are one process's with as many replicas.
TEST(Distributed, Bf16StepsInTwoProcessesTrainTheBytesOfOneProcessWithTwo) {
  cluster job;
  expect_two_processes_train_one_process_bytes(job, mlp_config, {"--set", "sync.codec=\"bf16\""});
  if (HasFatalFailure()) return;
  // The comparison can tell bf16 from fp32.
  std::vector<std::string> fp32 = {"--model", mlp_config, "--gpus", "0", "--cpus", "2", "--epochs", "1", "--set",
                                   "train.max_steps=40", "--set", "train.eval_every=0", "--checkpoint-dir",
                                   (job / "fp32").string()};
  ASSERT_EQ(job.run("fp32", fp32).exit_code, 0);
  EXPECT_NE(testing::read_text(job / "fp32" / "step-00000040" / "model.safetensors"),
            testing::read_text(job / "single" / "step-00000040" / "model.safetensors"));
}

// The share of the step `device` was given, from the metrics file's step
// records of generation `generation` (members in rank order, from its
// membership record).
std::vector<double> shares_of(const fs::path& metrics, const std::string& device, std::int64_t generation) {
  std::ifstream in(metrics);
  std::string line;
  std::optional<std::size_t> rank;
  std::vector<double> out;
  while (std::getline(in, line)) {
    const auto j = json::parse(line);
    const std::string kind = j.value("event", "");
    if (kind == "membership" && j.at("generation") == generation) {
      const auto members = j.at("members").get<std::vector<std::string>>();
      for (std::size_t r = 0; r < members.size(); ++r)
        if (members[r] == device) rank = r;
    }
    if (kind == "step" && j.at("generation") == generation && rank && *rank < j.at("shares").size())
      out.push_back(j.at("shares")[*rank]);
  }
  return out;
}

// A coordinator with one replica of `model` trains `epochs` epochs (and
// `extra`, more of its arguments); a worker "late" joins once the first
// generation has formed. What every join gives: both exit 0, generation 1
// names the joiner, every sample of every epoch is trained once by the
// devices' own records, and the joiner carries the members' state into its
// first step (the broadcast) and every one after (identical updates), by its
// own checksums. `output` is the coordinator's.
void expect_a_clean_join(cluster& job, const std::string& model, int epochs, const std::vector<std::string>& extra,
                         std::string& output) {
  std::vector<std::string> args = {"--cpus", "1", "--epochs", std::to_string(epochs), "--set",
                                   "train.record_trained=true", "--metrics", (job / "m.jsonl").string()};
  args.insert(args.end(), extra.begin(), extra.end());
  testing::coordinator_options o;
  o.model = model;
  ASSERT_TRUE(job.start_coordinator(args, o));
  ASSERT_TRUE(job.coordinator_says("generation 0: 1 members"));
  auto late = job.start_worker("late", 1);
  const auto w = late->wait(120s);
  const auto c = job.coordinator().wait(120s);
  output = c.output;
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(w.exit_code, 0) << w.output;
  EXPECT_TRUE(std::regex_search(c.output, std::regex("generation 1 from step [0-9]+: 2 members \\(cpu:0, late/cpu:0\\); "
                                                     "late/cpu:0 joined")))
      << c.output;

  testing::trained_evidence evidence;
  evidence.record_metrics(job / "m.jsonl");
  EXPECT_EQ(evidence.check(60000, epochs), "");
  const auto first = evidence.first_step_of("late/cpu:0");
  ASSERT_TRUE(first.has_value()) << "the joiner trained nothing: " << c.output;
  EXPECT_EQ(evidence.members_of(*first).size(), 2U);
  EXPECT_EQ(evidence.members_of(*first + 1).size(), 2U);
  EXPECT_EQ(evidence.replicas_agree(), "");
}

TEST(Distributed, AWorkerJoinsDuringTrainingIdenticalFromItsFirstStepEverySampleOnceItsShareByItsSpeed) {
  cluster job;
  std::string output;
  // Device 1, the first to join, computes 3x slower than it could.
  expect_a_clean_join(job, mlp_config, 3, {"--set", "train.log_every=1", "--inject", "slow:1:3"}, output);
  if (HasFatalFailure()) return;
  // Shard sizes follow throughput: the 3x slower joiner ends up with about a
  // quarter of each step, far from an even half.
  auto shares = shares_of(job / "m.jsonl", "late/cpu:0", 1);
  ASSERT_GT(shares.size(), 20U) << output;
  shares.erase(shares.begin(), shares.begin() + static_cast<std::ptrdiff_t>(shares.size() / 2));
  std::sort(shares.begin(), shares.end());
  EXPECT_LT(shares[shares.size() / 2], 0.4) << "median share of the slow joiner over its second half";
}

// PowerSGD in fast mode across processes (Note [PowerSGD steps]): each
// member keeps its own residual and basis, the factors are all-reduced over
// Gloo, so a joiner with a fresh basis applies the members' bytes from its
// first step on, and every sample is trained once.
TEST(Distributed, PowerSgdInFastModeAWorkerJoinsIdenticalFromItsFirstStepEverySampleOnce) {
  cluster job;
  std::string output;
  expect_a_clean_join(job, mlp_config, 1,
                      {"--set", "train.reproducible=false", "--set", "sync.codec=\"powersgd\"", "--set",
                       "sync.powersgd_start_step=0", "--set", "train.verify_replicas=true"},
                      output);
}

// A torch worker loads the module from the coordinator's model.path, with
// its file's initial weights, and takes the members' state in the broadcast.
TEST(Distributed, ATorchWorkerJoinsDuringTrainingIdenticalFromItsFirstStepEverySampleOnce) {
  std::string why;
  if (!testing::torch_available(why)) GTEST_SKIP() << why;
  cluster job;
  std::string output;
  expect_a_clean_join(job, cnn_config, 1, {}, output);
}

TEST(Distributed, ARestartedCoordinatorResumesLatestTakesItsWorkersBackAndEndsWithTheBytesOfAnUninterruptedRun) {
  cluster job;
  const fs::path ck = job / "ck";
  const std::vector<std::string> job_args = {"--cpus", "1", "--wait-devices", "2", "--set", "train.max_steps=1200",
                                             "--set", "train.checkpoint_every=100", "--checkpoint-dir", ck.string()};
  testing::coordinator_options first;
  first.dir = "c1";
  ASSERT_TRUE(job.start_coordinator(job_args, first));
  const std::string port = job.port();
  auto worker = job.start_worker("W", 1, {"--rejoin-timeout", "60"});
  ASSERT_TRUE(testing::eventually([&] { return fs::exists(ck / "step-00000300" / "trainer.json"); }, 120s))
      << job.coordinator().output_so_far();
  job.coordinator().signal(SIGKILL);
  job.coordinator().wait(30s);
  // The same address, the same checkpoint directory.
  std::vector<std::string> resume = job_args;
  resume.insert(resume.end(), {"--resume", "latest"});
  testing::coordinator_options second;
  second.port = port;
  second.dir = "c2";
  ASSERT_TRUE(job.start_coordinator(resume, second));
  ASSERT_EQ(job.port(), port);
  const auto [c, w] = job.finish(*worker);
  ASSERT_EQ(c.exit_code, 0) << c.output << "\n--- the worker's output:\n" << w.output;
  EXPECT_EQ(w.exit_code, 0) << w.output;
  EXPECT_NE(w.output.find("lost the coordinator"), std::string::npos) << w.output;
  EXPECT_NE(w.output.find("joining again as a new member"), std::string::npos) << w.output;
  EXPECT_TRUE(std::regex_search(c.output, std::regex("resuming from \\S*step-0000[01][0-9]00 at step [1-9][0-9]*00,")))
      << c.output;
  EXPECT_NE(c.output.find("generation 0: 2 members (cpu:0, W/cpu:0)"), std::string::npos) << c.output;

  // Uninterrupted, in one process with two replicas: the same bytes.
  const auto s = job.run("one", {"--model", mlp_config, "--gpus", "0", "--cpus", "2", "--set", "train.max_steps=1200",
                                 "--checkpoint-dir", (job / "single").string()});
  ASSERT_EQ(s.exit_code, 0) << s.output;
  testing::expect_same_state(ck / "step-00001200", job / "single" / "step-00001200",
                             "the resumed run and the uninterrupted one");
}

}  // namespace
}  // namespace dpactor
