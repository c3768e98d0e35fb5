// Multi-node mode with real processes on 127.0.0.1 (See Note [Coordinator
// and workers]): `dpactor --coordinator` and `dpactor --join` workers. The
// bytes a coordinator and a worker train equal one process's; a killed
// worker is replaced by the next generation; a worker joins during training;
// a worker that loses its coordinator is fenced. Each process runs in its
// own directory (cli_process logs to the working directory).

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "test_support.hpp"

namespace dpactor {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::cli_process;
using testing::eventually;
using testing::scratch_dir;

const std::string mlp_cfg = std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg";
const std::string cnn_cfg = std::string(DPACTOR_SOURCE_DIR) + "/configs/cnn.cfg";

// Heartbeats as issue 12 asks of tests: 100 ms, silent peers dropped at 500 ms.
std::vector<std::string> job(std::vector<std::string> args) {
  std::vector<std::string> all = {"--gpus", "0", "--set", "train.verify_replicas=true"};
  all.insert(all.end(), args.begin(), args.end());
  return all;
}

// Starts a coordinator in `dir` on `listen_port` (0: any) and returns its
// port, read from its "listening on 127.0.0.1:PORT" line.
std::string start_coordinator(std::unique_ptr<cli_process>& p, const fs::path& dir, std::vector<std::string> args,
                              const std::string& listen_port = "0", const std::string& model = mlp_cfg) {
  std::vector<std::string> all = {"--coordinator", "--model", model, "--listen", "127.0.0.1:" + listen_port};
  const auto rest = job(std::move(args));
  all.insert(all.end(), rest.begin(), rest.end());
  p = std::make_unique<cli_process>(all, dir);
  return testing::listening_port(*p, "127.0.0.1", 30s);
}

std::unique_ptr<cli_process> start_worker(const fs::path& dir, const std::string& port, const std::string& node,
                                          int cpus, const std::vector<std::string>& extra = {}) {
  fs::create_directories(dir);
  std::vector<std::string> args = {"--join", "127.0.0.1:" + port, "--node", node, "--cpus", std::to_string(cpus)};
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<cli_process>(args, dir);
}

// The checkpoint the processes wrote holds the single process's bytes.
void expect_same_state(const fs::path& processes, const fs::path& single) {
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const auto a = testing::tensor_bytes(processes / file);
    const auto b = testing::tensor_bytes(single / file);
    ASSERT_FALSE(a.empty()) << processes / file;
    EXPECT_TRUE(a == b) << file << " differs between the processes and the single process";
  }
}

// What the devices say they trained (train.record_trained), every device's
// as the coordinator's metrics file has them: the evidence of exactly-once
// (tests/test_support.hpp, trained_evidence).
void read_evidence(const fs::path& metrics, testing::trained_evidence& evidence) {
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("event", "") != "trained") continue;
    evidence.record(trained_event{j.at("device"), j.at("step").get<std::int64_t>() - 1, j.at("epoch"), j.at("samples"),
                                  j.at("digest"), j.at("carried")});
  }
}

TEST(Distributed, ACoordinatorAndAWorkerTrainTheBytesOfOneFourReplicaProcessEverySampleOnce) {
  scratch_dir dir;
  const std::vector<std::string> common = {"--epochs", "1", "--checkpoint-dir", (dir.path() / "ck").string()};
  std::unique_ptr<cli_process> coordinator;
  std::vector<std::string> args = {"--cpus", "2", "--wait-devices", "4", "--set", "train.record_trained=true",
                                   "--metrics", (dir.path() / "m.jsonl").string()};
  args.insert(args.end(), common.begin(), common.end());
  fs::create_directories(dir.path() / "coordinator");
  const std::string port = start_coordinator(coordinator, dir.path() / "coordinator", args);
  ASSERT_FALSE(port.empty()) << coordinator->output_so_far();
  auto worker = start_worker(dir.path() / "worker", port, "w1", 2);
  const auto w = worker->wait(120s);
  const auto c = coordinator->wait(120s);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  ASSERT_EQ(w.exit_code, 0) << w.output;
  EXPECT_NE(c.output.find("generation 0: 4 members (cpu:0, cpu:1, w1/cpu:0, w1/cpu:1)"), std::string::npos) << c.output;
  EXPECT_EQ(c.output.find("generation 1"), std::string::npos) << "no member may have been lost: " << c.output;
  EXPECT_NE(w.output.find("the run is over"), std::string::npos) << w.output;
  // Every sample of the epoch once, by the devices' own account, the
  // worker's included.
  testing::trained_evidence evidence;
  read_evidence(dir.path() / "m.jsonl", evidence);
  EXPECT_EQ(evidence.check(60000, 1), "");
  for (const char* device : {"cpu:0", "w1/cpu:1"})
    EXPECT_TRUE(evidence.first_step_of(device).has_value()) << device << " reported nothing it trained";

  // The same job in one process with four replicas: the same bytes
  // (train.reproducible, on by default).
  const std::vector<std::string> single = {"--model", mlp_cfg, "--gpus", "0", "--cpus", "4", "--epochs", "1",
                                           "--checkpoint-dir", (dir.path() / "single").string()};
  fs::create_directories(dir.path() / "one");
  const auto s = testing::run_cli(single, dir.path() / "one");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  expect_same_state(dir.path() / "ck" / "step-00000469", dir.path() / "single" / "step-00000469");
}

// The libtorch replica across processes: a coordinator and a worker with one
// CNN replica each (configs/cnn.cfg; the worker loads the coordinator's
// model.path) train the bytes of one process with two.
TEST(Distributed, TorchReplicasInTwoProcessesTrainTheBytesOfOneProcessWithTwo) {
  std::string why;
  if (!testing::torch_available(why)) GTEST_SKIP() << why;
  scratch_dir dir;
  const std::vector<std::string> common = {"--epochs", "1", "--set", "train.max_steps=40", "--set",
                                           "train.eval_every=0"};
  std::unique_ptr<cli_process> coordinator;
  std::vector<std::string> args = {"--cpus", "1", "--wait-devices", "2", "--checkpoint-dir",
                                   (dir.path() / "ck").string()};
  args.insert(args.end(), common.begin(), common.end());
  fs::create_directories(dir.path() / "coordinator");
  const std::string port = start_coordinator(coordinator, dir.path() / "coordinator", args, "0", cnn_cfg);
  ASSERT_FALSE(port.empty()) << coordinator->output_so_far();
  auto worker = start_worker(dir.path() / "worker", port, "w1", 1);
  const auto w = worker->wait(120s);
  const auto c = coordinator->wait(120s);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  ASSERT_EQ(w.exit_code, 0) << w.output;
  EXPECT_NE(c.output.find("generation 0: 2 members (cpu:0, w1/cpu:0)"), std::string::npos) << c.output;

  std::vector<std::string> single = {"--model", cnn_cfg, "--gpus", "0", "--cpus", "2", "--checkpoint-dir",
                                     (dir.path() / "single").string()};
  single.insert(single.end(), common.begin(), common.end());
  fs::create_directories(dir.path() / "one");
  const auto s = testing::run_cli(single, dir.path() / "one");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  expect_same_state(dir.path() / "ck" / "step-00000040", dir.path() / "single" / "step-00000040");
}

// Faults across processes on both replica kinds: the MLP job
// (configs/mlp.cfg) and the CNN (configs/cnn.cfg) on the libtorch replica.
class DistributedFaults : public testing::both_replicas {};

std::string kind_cfg() { return testing::current_kind() == testing::replica_kind::torch ? cnn_cfg : mlp_cfg; }

TEST_P(DistributedFaults, AKilledWorkerIsLeftOutOfTheNextGenerationAndTheRunFinishes) {
  scratch_dir dir;
  std::unique_ptr<cli_process> coordinator;
  fs::create_directories(dir.path() / "coordinator");
  const std::string port = start_coordinator(coordinator, dir.path() / "coordinator",
                                             {"--cpus", "1", "--wait-devices", "3", "--set", "train.max_steps=600",
                                              "--set", "train.eval_every=0"},
                                             "0", kind_cfg());
  ASSERT_FALSE(port.empty()) << coordinator->output_so_far();
  auto a = start_worker(dir.path() / "a", port, "A", 1);
  auto b = start_worker(dir.path() / "b", port, "B", 1);
  ASSERT_TRUE(eventually([&] { return coordinator->output_so_far().find("generation 0") != std::string::npos; }, 60s))
      << coordinator->output_so_far();
  std::this_thread::sleep_for(1500ms);  // well into training
  b->signal(SIGKILL);
  const auto c = coordinator->wait(120s);
  const auto wa = a->wait(60s);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(wa.exit_code, 0) << "the surviving worker must finish normally: " << wa.output;
  // B is out; the reasons name it (its connection closed), possibly after a
  // survivor's failed collective or the hang check, whichever came first.
  EXPECT_TRUE(std::regex_search(c.output, std::regex("generation 1 from step [0-9]+: 2 members \\(cpu:0, A/cpu:0\\);[^\\n]*B/cpu:0")))
      << c.output;
  EXPECT_NE(c.output.find("recovered: step"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("(600 steps"), std::string::npos) << "the run must train all its steps: " << c.output;
}

TEST(Distributed, AWorkerKilledDuringTheRendezvousIsLeftOutAndTheGenerationReformsWithinTheConnectionTimeoutAndASecond) {
  scratch_dir dir;
  const std::vector<std::string> fast = {"--set", "cluster.heartbeat_ms=100", "--set", "cluster.connection_timeout_ms=500"};
  std::unique_ptr<cli_process> coordinator;
  fs::create_directories(dir.path() / "coordinator");
  std::vector<std::string> args = {"--cpus", "1", "--wait-devices", "3", "--set", "train.max_steps=300"};
  args.insert(args.end(), fast.begin(), fast.end());
  const std::string port = start_coordinator(coordinator, dir.path() / "coordinator", args);
  ASSERT_FALSE(port.empty()) << coordinator->output_so_far();
  auto a = start_worker(dir.path() / "a", port, "A", 1, fast);
  ASSERT_TRUE(eventually([&] { return coordinator->output_so_far().find("node A joined") != std::string::npos; }, 60s))
      << coordinator->output_so_far();
  auto b = start_worker(dir.path() / "b", port, "B", 1, fast);
  // B is frozen the moment it is admitted: the first generation forms with
  // it, and the others wait for it in the Gloo rendezvous; then it dies.
  ASSERT_TRUE(eventually([&] { return coordinator->output_so_far().find("node B joined") != std::string::npos; }, 60s))
      << coordinator->output_so_far();
  b->signal(SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(200ms);
  b->signal(SIGKILL);
  ASSERT_TRUE(eventually([&] { return coordinator->output_so_far().find("generation 1") != std::string::npos; }, 30s))
      << coordinator->output_so_far();
  const auto reformed_after = std::chrono::steady_clock::now() - stopped;
  std::printf("the generation re-formed %.0f ms after the worker froze in the rendezvous\n",
              std::chrono::duration<double, std::milli>(reformed_after).count());
  const auto c = coordinator->wait(120s);
  const auto wa = a->wait(60s);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(wa.exit_code, 0) << wa.output;
  EXPECT_NE(c.output.find("generation 0: 3 members (cpu:0, A/cpu:0, B/cpu:0)"), std::string::npos) << c.output;
  EXPECT_TRUE(std::regex_search(c.output, std::regex("generation 1 from step 1: 2 members \\(cpu:0, A/cpu:0\\);[^\\n]*B/cpu:0")))
      << c.output;
  EXPECT_NE(c.output.find("(300 steps"), std::string::npos) << c.output;
  // Issue 12: no wait beyond the connection timeout (500 ms) plus a second.
  EXPECT_LT(reformed_after, 1500ms) << c.output;
}

TEST(Distributed, BelowMinDevicesEveryProcessStopsWithAClearErrorAfterACheckpoint) {
  scratch_dir dir;
  std::unique_ptr<cli_process> coordinator;
  fs::create_directories(dir.path() / "coordinator");
  const std::string port = start_coordinator(
      coordinator, dir.path() / "coordinator",
      {"--cpus", "1", "--wait-devices", "3", "--set", "cluster.min_devices=3", "--set", "train.max_steps=3000",
       "--checkpoint-dir", (dir.path() / "ck").string()});
  ASSERT_FALSE(port.empty()) << coordinator->output_so_far();
  auto a = start_worker(dir.path() / "a", port, "A", 1);
  auto b = start_worker(dir.path() / "b", port, "B", 1);
  ASSERT_TRUE(eventually([&] { return coordinator->output_so_far().find("generation 0") != std::string::npos; }, 60s))
      << coordinator->output_so_far();
  std::this_thread::sleep_for(1s);
  b->signal(SIGKILL);
  const auto c = coordinator->wait(120s);
  const auto wa = a->wait(60s);
  EXPECT_EQ(c.exit_code, 5) << c.output;
  EXPECT_NE(c.output.find("2 devices left, fewer than cluster.min_devices = 3"), std::string::npos) << c.output;
  EXPECT_TRUE(std::regex_search(c.output, std::regex("checkpoint written: \\S*step-0*[1-9][0-9]*"))) << c.output;
  EXPECT_EQ(wa.exit_code, 5) << "the surviving worker stops with the run's error: " << wa.output;
  EXPECT_NE(wa.output.find("the coordinator's run failed: training stopped after step"), std::string::npos) << wa.output;
}

TEST(Distributed, AWorkerThatLosesItsCoordinatorIsFencedWithItsOwnExitCode) {
  scratch_dir dir;
  std::unique_ptr<cli_process> coordinator;
  fs::create_directories(dir.path() / "coordinator");
  const std::string port = start_coordinator(coordinator, dir.path() / "coordinator",
                                             {"--cpus", "1", "--wait-devices", "2", "--set", "train.epochs=20"});
  ASSERT_FALSE(port.empty()) << coordinator->output_so_far();
  auto worker = start_worker(dir.path() / "w", port, "W", 1);
  ASSERT_TRUE(eventually([&] { return coordinator->output_so_far().find("generation 0") != std::string::npos; }, 60s))
      << coordinator->output_so_far();
  std::this_thread::sleep_for(1s);
  coordinator->signal(SIGKILL);
  const auto started = std::chrono::steady_clock::now();
  const auto w = worker->wait(30s);
  EXPECT_EQ(w.exit_code, 6) << w.output;
  EXPECT_NE(w.output.find("fenced: lost the coordinator"), std::string::npos) << w.output;
  // A killed coordinator closes its sockets: the worker knows at once, long
  // before a connection timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s);
}

TEST(Distributed, AFrozenWorkerIsRemovedAtTheConnectionTimeoutAndFindsItselfFencedWhenItWakes) {
  scratch_dir dir;
  // Heartbeats every 100 ms, a silent peer dropped at 500 ms (issue 12's test settings).
  const std::vector<std::string> fast = {"--set", "cluster.heartbeat_ms=100", "--set", "cluster.connection_timeout_ms=500"};
  std::unique_ptr<cli_process> coordinator;
  fs::create_directories(dir.path() / "coordinator");
  std::vector<std::string> args = {"--cpus", "1", "--wait-devices", "3", "--set", "train.max_steps=800"};
  args.insert(args.end(), fast.begin(), fast.end());
  const std::string port = start_coordinator(coordinator, dir.path() / "coordinator", args);
  ASSERT_FALSE(port.empty()) << coordinator->output_so_far();
  auto a = start_worker(dir.path() / "a", port, "A", 1, fast);
  auto b = start_worker(dir.path() / "b", port, "B", 1, fast);
  ASSERT_TRUE(eventually([&] { return coordinator->output_so_far().find("generation 0") != std::string::npos; }, 60s))
      << coordinator->output_so_far();
  std::this_thread::sleep_for(1s);
  b->signal(SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  ASSERT_TRUE(eventually([&] { return coordinator->output_so_far().find("generation 1") != std::string::npos; }, 30s))
      << coordinator->output_so_far();
  const auto removed_after = std::chrono::steady_clock::now() - stopped;
  std::printf("the frozen worker was removed %.0f ms after SIGSTOP\n",
              std::chrono::duration<double, std::milli>(removed_after).count());
  // The connection timeout plus one heartbeat, with a second for a loaded machine.
  EXPECT_LT(removed_after, 1600ms) << coordinator->output_so_far();
  b->signal(SIGCONT);
  const auto wb = b->wait(30s);
  EXPECT_EQ(wb.exit_code, 6) << "a worker that wakes up removed must find itself fenced: " << wb.output;
  const auto c = coordinator->wait(120s);
  const auto wa = a->wait(60s);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(wa.exit_code, 0) << wa.output;
  EXPECT_NE(c.output.find("2 members (cpu:0, A/cpu:0)"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("(800 steps"), std::string::npos) << c.output;
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
    const auto j = nlohmann::json::parse(line);
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
void expect_a_clean_join(const fs::path& dir, const std::string& model, int epochs,
                         const std::vector<std::string>& extra, std::string& output) {
  std::unique_ptr<cli_process> coordinator;
  fs::create_directories(dir / "coordinator");
  std::vector<std::string> args = {"--cpus", "1", "--epochs", std::to_string(epochs), "--set",
                                   "train.record_trained=true", "--metrics", (dir / "m.jsonl").string()};
  args.insert(args.end(), extra.begin(), extra.end());
  const std::string port = start_coordinator(coordinator, dir / "coordinator", args, "0", model);
  ASSERT_FALSE(port.empty()) << coordinator->output_so_far();
  ASSERT_TRUE(eventually([&] { return coordinator->output_so_far().find("generation 0: 1 members") != std::string::npos; }, 60s))
      << coordinator->output_so_far();
  auto late = start_worker(dir / "late", port, "late", 1);
  const auto w = late->wait(120s);
  const auto c = coordinator->wait(120s);
  output = c.output;
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(w.exit_code, 0) << w.output;
  EXPECT_TRUE(std::regex_search(c.output, std::regex("generation 1 from step [0-9]+: 2 members \\(cpu:0, late/cpu:0\\); "
                                                     "late/cpu:0 joined")))
      << c.output;

  testing::trained_evidence evidence;
  read_evidence(dir / "m.jsonl", evidence);
  EXPECT_EQ(evidence.check(60000, epochs), "");
  const auto first = evidence.first_step_of("late/cpu:0");
  ASSERT_TRUE(first.has_value()) << "the joiner trained nothing: " << c.output;
  EXPECT_EQ(evidence.members_of(*first).size(), 2U);
  EXPECT_EQ(evidence.members_of(*first + 1).size(), 2U);
  EXPECT_EQ(evidence.replicas_agree(), "");
}

TEST(Distributed, AWorkerJoinsDuringTrainingIdenticalFromItsFirstStepEverySampleOnceItsShareByItsSpeed) {
  scratch_dir dir;
  std::string output;
  // Device 1, the first to join, computes 3x slower than it could.
  expect_a_clean_join(dir.path(), mlp_cfg, 3, {"--set", "train.log_every=1", "--inject", "slow:1:3"}, output);
  if (HasFatalFailure()) return;
  // Shard sizes follow throughput: the 3x slower joiner ends up with about a
  // quarter of each step, far from an even half.
  auto shares = shares_of(dir.path() / "m.jsonl", "late/cpu:0", 1);
  ASSERT_GT(shares.size(), 20U) << output;
  shares.erase(shares.begin(), shares.begin() + static_cast<std::ptrdiff_t>(shares.size() / 2));
  std::sort(shares.begin(), shares.end());
  EXPECT_LT(shares[shares.size() / 2], 0.4) << "median share of the slow joiner over its second half";
}

// A torch worker loads the module from the coordinator's model.path, with
// its file's initial weights, and takes the members' state in the broadcast.
TEST(Distributed, ATorchWorkerJoinsDuringTrainingIdenticalFromItsFirstStepEverySampleOnce) {
  std::string why;
  if (!testing::torch_available(why)) GTEST_SKIP() << why;
  scratch_dir dir;
  std::string output;
  expect_a_clean_join(dir.path(), cnn_cfg, 1, {}, output);
}

TEST(Distributed, AFrozenWorkerWithRejoinTimeoutJoinsAgainWhenItWakesAndTheRunFinishes) {
  scratch_dir dir;
  const std::vector<std::string> fast = {"--set", "cluster.heartbeat_ms=100", "--set", "cluster.connection_timeout_ms=500"};
  std::unique_ptr<cli_process> coordinator;
  fs::create_directories(dir.path() / "coordinator");
  std::vector<std::string> args = {"--cpus", "1", "--wait-devices", "2", "--set", "train.max_steps=1500"};
  args.insert(args.end(), fast.begin(), fast.end());
  const std::string port = start_coordinator(coordinator, dir.path() / "coordinator", args);
  ASSERT_FALSE(port.empty()) << coordinator->output_so_far();
  std::vector<std::string> rejoin = fast;
  rejoin.insert(rejoin.end(), {"--rejoin-timeout", "30"});
  auto b = start_worker(dir.path() / "b", port, "B", 1, rejoin);
  ASSERT_TRUE(eventually([&] { return coordinator->output_so_far().find("generation 0") != std::string::npos; }, 60s))
      << coordinator->output_so_far();
  std::this_thread::sleep_for(1s);
  b->signal(SIGSTOP);
  ASSERT_TRUE(eventually([&] { return coordinator->output_so_far().find("generation 1") != std::string::npos; }, 30s))
      << coordinator->output_so_far();
  b->signal(SIGCONT);
  const auto wb = b->wait(120s);
  const auto c = coordinator->wait(120s);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(wb.exit_code, 0) << "the worker joins again and finishes with the run: " << wb.output;
  EXPECT_NE(wb.output.find("joining again as a new member"), std::string::npos) << wb.output;
  EXPECT_TRUE(std::regex_search(c.output, std::regex("generation 2 from step [0-9]+: 2 members \\(cpu:0, B/cpu:0\\); "
                                                     "B/cpu:0 joined")))
      << c.output;
  EXPECT_NE(c.output.find("(1500 steps"), std::string::npos) << c.output;
}

TEST(Distributed, ARestartedCoordinatorResumesLatestTakesItsWorkersBackAndEndsWithTheBytesOfAnUninterruptedRun) {
  scratch_dir dir;
  const fs::path ck = dir.path() / "ck";
  const std::vector<std::string> job_args = {"--cpus", "1", "--wait-devices", "2", "--set", "train.max_steps=1200",
                                             "--set", "train.checkpoint_every=100", "--checkpoint-dir", ck.string()};
  std::unique_ptr<cli_process> first;
  fs::create_directories(dir.path() / "c1");
  const std::string port = start_coordinator(first, dir.path() / "c1", job_args);
  ASSERT_FALSE(port.empty()) << first->output_so_far();
  auto worker = start_worker(dir.path() / "w", port, "W", 1, {"--rejoin-timeout", "60"});
  ASSERT_TRUE(eventually([&] { return fs::exists(ck / "step-00000300" / "trainer.json"); }, 120s))
      << first->output_so_far();
  first->signal(SIGKILL);
  first->wait(30s);
  // The same address, the same checkpoint directory.
  std::unique_ptr<cli_process> second;
  fs::create_directories(dir.path() / "c2");
  std::vector<std::string> resume = job_args;
  resume.insert(resume.end(), {"--resume", "latest"});
  ASSERT_EQ(start_coordinator(second, dir.path() / "c2", resume, port), port) << second->output_so_far();
  const auto c = second->wait(120s);
  const auto w = worker->wait(60s);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(w.exit_code, 0) << w.output;
  EXPECT_NE(w.output.find("lost the coordinator"), std::string::npos) << w.output;
  EXPECT_NE(w.output.find("joining again as a new member"), std::string::npos) << w.output;
  EXPECT_TRUE(std::regex_search(c.output, std::regex("resuming from \\S*step-0000[01][0-9]00 at step [1-9][0-9]*00,")))
      << c.output;
  EXPECT_NE(c.output.find("generation 0: 2 members (cpu:0, W/cpu:0)"), std::string::npos) << c.output;

  // Uninterrupted, in one process with two replicas: the same bytes.
  const std::vector<std::string> single = {"--model", mlp_cfg, "--gpus", "0", "--cpus", "2", "--set",
                                           "train.max_steps=1200", "--checkpoint-dir", (dir.path() / "single").string()};
  fs::create_directories(dir.path() / "one");
  const auto s = testing::run_cli(single, dir.path() / "one");
  ASSERT_EQ(s.exit_code, 0) << s.output;
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const auto a = testing::tensor_bytes(ck / "step-00001200" / file);
    const auto b = testing::tensor_bytes(dir.path() / "single" / "step-00001200" / file);
    ASSERT_FALSE(a.empty()) << file;
    EXPECT_TRUE(a == b) << file << " differs between the resumed run and the uninterrupted one";
  }
}

TEST(Distributed, RolesComeFromTheLaunchersEnvironmentWithoutFlags) {
  scratch_dir dir;
  // What torchrun or Kubeflow set for rank 0 of a world of 3 (port 0: any
  // free one, read back from the output), and DPACTOR_COORDINATOR for the
  // others; every other launcher variable unset.
  const testing::environment_changes clean = {
      {"TORCHELASTIC_USE_AGENT_STORE", std::nullopt}, {"DPACTOR_PORT", std::nullopt}, {"GROUP_RANK", std::nullopt},
      {"SLURM_PROCID", std::nullopt}, {"LOCAL_WORLD_SIZE", std::nullopt}};
  testing::environment_changes rank0 = clean;
  rank0.insert(rank0.end(), {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "0"}, {"WORLD_SIZE", "3"}, {"RANK", "0"},
                             {"DPACTOR_COORDINATOR", std::nullopt}});
  const std::vector<std::string> same = {"--model", mlp_cfg, "--gpus", "0", "--cpus", "1", "--set", "train.max_steps=200"};
  fs::create_directories(dir.path() / "c");
  cli_process coordinator(same, dir.path() / "c", rank0);
  const std::string port = testing::listening_port(coordinator, "127.0.0.1", 30s);
  ASSERT_FALSE(port.empty()) << coordinator.output_so_far();
  EXPECT_NE(coordinator.output_so_far().find("waiting for 2 workers (from the environment: RANK=0, WORLD_SIZE=3"),
            std::string::npos) << coordinator.output_so_far();
  auto worker_env = [&] {
    testing::environment_changes e = clean;
    e.insert(e.end(), {{"DPACTOR_COORDINATOR", "127.0.0.1:" + port}, {"MASTER_ADDR", std::nullopt},
                       {"MASTER_PORT", std::nullopt}, {"WORLD_SIZE", std::nullopt}, {"RANK", std::nullopt}});
    return e;
  };
  fs::create_directories(dir.path() / "a");
  fs::create_directories(dir.path() / "b");
  cli_process a(same, dir.path() / "a", worker_env());
  ASSERT_TRUE(eventually([&] { return coordinator.output_so_far().find("node ") != std::string::npos; }, 60s))
      << coordinator.output_so_far();
  // Two devices are there, but the world has three processes: it waits.
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(coordinator.output_so_far().find("generation 0"), std::string::npos) << coordinator.output_so_far();
  cli_process b(same, dir.path() / "b", worker_env());
  const auto c = coordinator.wait(120s);
  const auto wa = a.wait(60s);
  const auto wb = b.wait(60s);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(wa.exit_code, 0) << wa.output;
  EXPECT_EQ(wb.exit_code, 0) << wb.output;
  EXPECT_NE(c.output.find("generation 0: 3 members"), std::string::npos) << c.output;
  EXPECT_NE(wa.output.find("joining 127.0.0.1:" + port + " (from the environment: DPACTOR_COORDINATOR="),
            std::string::npos) << wa.output;
}

TEST(Distributed, AWorkerWithAnotherConfigOrOtherDataIsRefusedNamingTheDifferenceAndChangesNothing) {
  scratch_dir dir;
  std::unique_ptr<cli_process> coordinator;
  fs::create_directories(dir.path() / "coordinator");
  const std::string port = start_coordinator(coordinator, dir.path() / "coordinator",
                                             {"--cpus", "1", "--wait-devices", "2", "--set", "train.max_steps=200"});
  ASSERT_FALSE(port.empty()) << coordinator->output_so_far();
  auto other_config = start_worker(dir.path() / "config", port, "lr", 1, {"--set", "optimizer.lr=0.5"});
  const auto wc = other_config->wait(60s);
  EXPECT_EQ(wc.exit_code, 7) << wc.output;
  EXPECT_NE(wc.output.find("refused this worker: its config differs: optimizer.lr = "), std::string::npos) << wc.output;
  EXPECT_NE(wc.output.find("(coordinator) against 0.5 (worker)"), std::string::npos) << wc.output;
  auto other_data = start_worker(dir.path() / "data", port, "synthetic", 1, {"--set", "data.format=synthetic"});
  const auto wd = other_data->wait(60s);
  EXPECT_EQ(wd.exit_code, 7) << wd.output;
  EXPECT_NE(wd.output.find("refused this worker: its data differs: the coordinator has train 60000 x 784"),
            std::string::npos) << wd.output;
  EXPECT_NE(wd.output.find("the worker has train 4096 x 784"), std::string::npos) << wd.output;
  // The job still waits for its second device, and trains with a good one.
  auto good = start_worker(dir.path() / "good", port, "good", 1);
  const auto g = good->wait(120s);
  const auto c = coordinator->wait(120s);
  EXPECT_EQ(g.exit_code, 0) << g.output;
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("refused node lr: its config differs"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("refused node synthetic: its data differs"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("generation 0: 2 members (cpu:0, good/cpu:0)"), std::string::npos) << c.output;
}

const std::string tls_dir = std::string(DPACTOR_SOURCE_DIR) + "/tests/data/tls/";

// cluster.tls.* for a process holding `name`.pem and .key, trusting `ca`.pem.
std::vector<std::string> tls_args(const std::string& name, const std::string& ca = "ca") {
  return {"--set", "cluster.tls.mode=on", "--set", "cluster.tls.ca=" + tls_dir + ca + ".pem",
          "--set", "cluster.tls.certificate=" + tls_dir + name + ".pem", "--set", "cluster.tls.key=" + tls_dir + name + ".key"};
}

// A TLS handshake with the coordinator on 127.0.0.1:`port` by a peer that
// trusts the test CA and presents `name`.pem (nothing when empty), then one
// read, on which a TLS 1.3 server's refusal of the client's certificate
// arrives. Returns whether the connection was still open after it.
bool tls_peer_handshake(const std::string& port, const std::string& name) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_load_verify_locations(ctx, (tls_dir + "ca.pem").c_str(), nullptr);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (!name.empty()) {
    SSL_CTX_use_certificate_chain_file(ctx, (tls_dir + name + ".pem").c_str());
    SSL_CTX_use_PrivateKey_file(ctx, (tls_dir + name + ".key").c_str(), SSL_FILETYPE_PEM);
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(std::stoi(port)));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  bool open = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    if (SSL_connect(ssl) == 1) {
      char byte = 0;
      open = SSL_read(ssl, &byte, 1) > 0;
    }
    SSL_free(ssl);
  }
  ::close(fd);
  SSL_CTX_free(ctx);
  return open;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Distributed, UnderMutualTlsOnlyPeersCertifiedByTheCaJoinAndEveryRefusalIsClearOnBothSides) {
  scratch_dir dir;
  std::unique_ptr<cli_process> coordinator;
  fs::create_directories(dir.path() / "coordinator");
  std::vector<std::string> args = {"--cpus", "1", "--wait-devices", "2", "--set", "train.max_steps=300"};
  const auto own = tls_args("coordinator");
  args.insert(args.end(), own.begin(), own.end());
  const std::string port = start_coordinator(coordinator, dir.path() / "coordinator", args);
  ASSERT_FALSE(port.empty()) << coordinator->output_so_far();

  // A worker of another CA: it refuses the coordinator, and says so; the
  // coordinator learns that the peer ended the handshake.
  auto rogue = start_worker(dir.path() / "rogue", port, "rogue", 1, tls_args("rogue", "rogue-ca"));
  const auto wr = rogue->wait(60s);
  EXPECT_EQ(wr.exit_code, 7) << wr.output;
  EXPECT_NE(wr.output.find("refused the TLS certificate of the coordinator at 127.0.0.1:" + port + ": unknown CA"),
            std::string::npos) << wr.output;
  // Peers that trust the coordinator but hold no certificate from its CA,
  // or none at all: the coordinator refuses them, naming the reason.
  EXPECT_FALSE(tls_peer_handshake(port, "rogue"));
  EXPECT_FALSE(tls_peer_handshake(port, ""));
  // A worker without TLS: the coordinator closes the connection, the worker
  // says it may need TLS.
  auto plain = start_worker(dir.path() / "plain", port, "plain", 1, {"--set", "cluster.tls.mode=off"});
  const auto wp = plain->wait(60s);
  EXPECT_EQ(wp.exit_code, 7) << wp.output;
  EXPECT_NE(wp.output.find("closed the connection during the handshake: it may require TLS"), std::string::npos) << wp.output;

  // None of them changed the job: it still waits for its second device,
  // and trains with a certified worker.
  EXPECT_EQ(coordinator->output_so_far().find("generation 0"), std::string::npos) << coordinator->output_so_far();
  auto good = start_worker(dir.path() / "good", port, "good", 1, tls_args("worker"));
  const auto g = good->wait(120s);
  const auto c = coordinator->wait(120s);
  EXPECT_EQ(g.exit_code, 0) << g.output;
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_NE(c.output.find("mutual TLS on the control plane"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("ended the handshake: unknown CA"), std::string::npos) << c.output;
  EXPECT_TRUE(std::regex_search(c.output, std::regex("refused a TLS peer at 127\\.0\\.0\\.1:[0-9]+: unknown CA \\(unable to "
                                                     "get local issuer certificate, certificate /CN=rogue worker\\)")))
      << c.output;
  EXPECT_TRUE(std::regex_search(c.output, std::regex("refused a TLS peer at 127\\.0\\.0\\.1:[0-9]+: certificate required")))
      << c.output;
  EXPECT_EQ(count(c.output, "refused a TLS peer"), 2U) << "only the two refusals: " << c.output;
  EXPECT_EQ(count(g.output, "TLS"), 0U) << "a certified worker sees no TLS error: " << g.output;
  EXPECT_NE(c.output.find("generation 0: 2 members (cpu:0, good/cpu:0)"), std::string::npos) << c.output;
  EXPECT_EQ(c.output.find("generation 1"), std::string::npos) << c.output;
}

TEST(Distributed, TlsWithoutItsFilesOrWithAKeyOfAnotherCertificateIsAConfigErrorBeforeAnythingListens) {
  scratch_dir dir;
  const auto r = testing::run_cli({"--coordinator", "--model", mlp_cfg, "--gpus", "0", "--cpus", "1", "--listen",
                                   "127.0.0.1:0", "--set", "cluster.tls.mode=on", "--set",
                                   "cluster.tls.ca=" + tls_dir + "ca.pem"},
                                  dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("cluster.tls.mode = \"on\", which needs cluster.tls.ca, cluster.tls.certificate and "
                          "cluster.tls.key; cluster.tls.certificate, cluster.tls.key not set"),
            std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("listening on"), std::string::npos) << r.output;
  auto mixed = tls_args("worker");
  mixed.back() = "cluster.tls.key=" + tls_dir + "coordinator.key";
  std::vector<std::string> w = {"--join", "127.0.0.1:1"};
  w.insert(w.end(), mixed.begin(), mixed.end());
  const auto wr = testing::run_cli(w, dir.path());
  EXPECT_EQ(wr.exit_code, 2) << wr.output;
  EXPECT_NE(wr.output.find("coordinator.key: does not belong to cluster.tls.certificate = " + tls_dir + "worker.pem"),
            std::string::npos) << wr.output;
  auto foreign = tls_args("rogue");  // the test CA did not sign it
  w = {"--join", "127.0.0.1:1"};
  w.insert(w.end(), foreign.begin(), foreign.end());
  const auto wf = testing::run_cli(w, dir.path());
  EXPECT_EQ(wf.exit_code, 2) << wf.output;
  EXPECT_NE(wf.output.find("rogue.pem: does not pass the check against cluster.tls.ca"), std::string::npos) << wf.output;
}

TEST(Distributed, AWorkerTakesNoModelAndAMalformedAddressIsAUsageError) {
  scratch_dir dir;
  const auto with_model = testing::run_cli({"--join", "127.0.0.1:1", "--model", mlp_cfg}, dir.path());
  EXPECT_EQ(with_model.exit_code, 2) << with_model.output;
  EXPECT_NE(with_model.output.find("takes the job's config from the coordinator"), std::string::npos) << with_model.output;
  const auto bad = testing::run_cli({"--join", "127.0.0.1"}, dir.path());
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--join '127.0.0.1' is not HOST:PORT"), std::string::npos) << bad.output;
  const auto listen = testing::run_cli({"--coordinator", "--model", mlp_cfg, "--listen", "127.0.0.1:99999"}, dir.path());
  EXPECT_EQ(listen.exit_code, 2) << listen.output;
  EXPECT_NE(listen.output.find("the port is not a number from 0 to 65535"), std::string::npos) << listen.output;
}

DPACTOR_ON_BOTH_REPLICAS(DistributedFaults);

}  // namespace
}  // namespace dpactor
