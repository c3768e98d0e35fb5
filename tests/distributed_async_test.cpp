// sync.mode = "async" across processes (docs/async.md, "Across
// processes"; Note [Async rounds across processes]): a worker process's
// devices run the rounds the coordinator's reducer hands them, each with
// its logical worker's state, so a process killed with -9 loses only its
// rounds in flight and a process joins at any time. By the devices' own
// records, every sample of every epoch is in exactly one committed
// contribution, and the run's decisions replay in one process to its bytes.

#include <gtest/gtest.h>

#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/cluster_support.hpp"
#include "train/sample_digest.hpp"

namespace dpactor {
namespace {

namespace fs = std::filesystem;
using testing::cluster;
using testing::latest_in;
using testing::mlp_config;

// What a coordinator's metrics file says of the rounds: the devices' own
// records, the decisions and the membership changes.
struct async_account {
  std::vector<nlohmann::json> trained, decisions;
  std::vector<std::string> reasons;
};

async_account read_account(const fs::path& metrics) {
  async_account a;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    const std::string kind = j.value("event", "");
    if (kind == "trained") a.trained.push_back(j);
    else if (kind == "round_decision") a.decisions.push_back(j);
    else if (kind == "membership") a.reasons.push_back(j.value("reason", ""));
  }
  return a;
}

// Every sample of each of `epochs` epochs of `rows` in exactly one merged
// contribution, by the devices' own records of the rounds they trained
// (a lost round is run again under its number: only one run of it reaches
// a decision, and only one may count). "" or what is wrong.
std::string every_sample_once_by_the_devices(const async_account& a, std::int64_t rows, std::int64_t epochs) {
  std::set<std::pair<std::int64_t, std::int64_t>> merged;  // (worker, worker_round)
  for (const auto& d : a.decisions)
    for (const auto& m : d.at("merged"))
      if (!merged.insert({m.at("worker").get<std::int64_t>(), m.at("worker_round").get<std::int64_t>()}).second)
        return "a worker's round merged twice";
  std::set<std::pair<std::int64_t, std::int64_t>> counted;
  std::map<std::int64_t, std::pair<std::int64_t, std::uint64_t>> by_epoch;  // samples, digest
  for (const auto& t : a.trained) {
    const std::pair<std::int64_t, std::int64_t> round{t.at("worker").get<std::int64_t>(),
                                                      t.at("worker_round").get<std::int64_t>()};
    if (!merged.count(round)) continue;
    if (!counted.insert(round).second) return "a merged round reported twice by the devices";
    by_epoch[t.at("epoch").get<std::int64_t>()].first += t.at("samples").get<std::int64_t>();
    by_epoch[t.at("epoch").get<std::int64_t>()].second += t.at("digest").get<std::uint64_t>();
  }
  if (counted.size() != merged.size())
    return std::to_string(merged.size() - counted.size()) + " merged rounds no device reported";
  std::vector<std::uint32_t> every(static_cast<std::size_t>(rows));
  std::iota(every.begin(), every.end(), 0u);
  if (static_cast<std::int64_t>(by_epoch.size()) != epochs) return std::to_string(by_epoch.size()) + " epochs trained";
  for (const auto& [epoch, account] : by_epoch) {
    if (account.first != rows) return "epoch " + std::to_string(epoch) + ": " + std::to_string(account.first) + " samples";
    if (account.second != sample_digest(every)) return "epoch " + std::to_string(epoch) + ": a sample twice or missing";
  }
  return "";
}

std::size_t count_of(const std::vector<nlohmann::json>& decisions, const char* key) {
  std::size_t n = 0;
  for (const auto& d : decisions)
    if (d.contains(key)) n += d.at(key).size();
  return n;
}

bool trained_on(const async_account& a, const std::string& device) {
  for (const auto& t : a.trained)
    if (t.at("device") == device) return true;
  return false;
}

bool changed(const async_account& a, const std::string& reason) {
  for (const auto& r : a.reasons)
    if (r.find(reason) != std::string::npos) return true;
  return false;
}

// Four logical workers, H = 4, contributions at most one round old,
// `epochs` epochs; plus `extra`.
std::vector<std::string> async_job(int epochs, std::vector<std::string> extra) {
  std::vector<std::string> a = {"--set", "sync.mode=\"async\"", "--set", "sync.workers=4", "--set", "sync.every=4",
                                "--set", "sync.max_staleness=1", "--set", "train.eval_every=0", "--epochs",
                                std::to_string(epochs)};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// The coordinator trains on a device slowed 3x (its contributions go
// stale and some are dropped) with two worker processes; the first to
// join (device 1) kills itself (SIGKILL) at its first round from 19
// committed rounds, with a round in flight; the other's device hangs in
// its first round from 59 (its process still answers: its progress relay
// tells the reducer it stopped); w3 joins once training runs. Every sample of both
// epochs is then in one committed contribution by the devices' own
// records, the lost rounds went back and ran again, w3 trained; and the
// decisions, replayed in one process on two devices, give the run's bytes.
TEST(DistributedAsync, AKilledAHungAndAJoiningWorkerProcessLoseNoSampleTrainNoneTwiceAndReplayToTheRunsBytes) {
  cluster job;
  const std::vector<std::string> common = async_job(2, {});
  std::vector<std::string> args = {"--cpus", "1", "--wait-devices", "3", "--checkpoint-dir", (job / "ck").string(),
                                   "--set", "train.record_trained=true", "--metrics", (job / "m.jsonl").string(),
                                   "--inject", "slow:0:3", "--inject", "kill:1@20", "--inject", "hang:2@60"};
  args.insert(args.end(), common.begin(), common.end());
  ASSERT_TRUE(job.start_coordinator(args));
  auto w1 = job.start_worker("w1", 1);
  auto w2 = job.start_worker("w2", 1);
  ASSERT_TRUE(job.coordinator_says("async: 4 logical workers on 3 devices"));
  auto w3 = job.start_worker("w3", 1);
  const auto [c, r1, r2, r3] = job.finish(*w1, *w2, *w3);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  // Device 1 is the first worker process to join: w1 or w2.
  const bool first_w1 = r1.exit_code == 128 + SIGKILL;
  const std::string killed = first_w1 ? "w1" : "w2", other = first_w1 ? "w2" : "w1";
  EXPECT_EQ((first_w1 ? r1 : r2).exit_code, 128 + SIGKILL) << r1.output << r2.output;
  EXPECT_EQ((first_w1 ? r2 : r1).exit_code, 0) << r1.output << r2.output;
  EXPECT_EQ(r3.exit_code, 0) << r3.output;

  const async_account a = read_account(job / "m.jsonl");
  EXPECT_EQ(every_sample_once_by_the_devices(a, 60000, 2), "");
  EXPECT_TRUE(changed(a, killed + "/cpu:0 failed")) << "the killed process's device is a membership change";
  EXPECT_TRUE(changed(a, "w3/cpu:0 joined"));
  EXPECT_TRUE(trained_on(a, other + "/cpu:0")) << "a worker process's records did not reach the coordinator";
  EXPECT_TRUE(trained_on(a, "w3/cpu:0")) << "the process that joined trained nothing";
  EXPECT_TRUE(changed(a, other + "/cpu:0 hung")) << "the hung device in a live process was not given up on";
  EXPECT_EQ(count_of(a.decisions, "lost"), 2u) << "the killed and the hung device each lost their round in flight";
  EXPECT_GT(count_of(a.decisions, "dropped"), 0u) << "no contribution was past sync.max_staleness: the drops are untested";

  const auto replay = job.run("replay", [&] {
    std::vector<std::string> r = {"--model", mlp_config, "--gpus", "0", "--cpus", "2", "--set",
                                  "train.verify_replicas=true", "--replay-rounds", (job / "m.jsonl").string(),
                                  "--checkpoint-dir", (job / "replayed").string()};
    r.insert(r.end(), common.begin(), common.end());
    return r;
  }());
  ASSERT_EQ(replay.exit_code, 0) << replay.output;
  const std::string last = latest_in(job / "ck");
  EXPECT_EQ(latest_in(job / "replayed"), last);
  testing::expect_same_state(job / "ck" / last, job / "replayed" / last,
                             "the run across processes and its decisions replayed in one process");
}

// See Note [Async checkpoints]: SIGINT stops a coordinator and its worker
// with a checkpoint; a coordinator with another worker process resumes it
// (the workers' states are the coordinator's: none has to come back), and
// every sample of every epoch is in exactly one committed contribution
// across the two runs, by the devices' own records.
TEST(DistributedAsync, AStoppedRunResumesOnAnotherWorkerProcessWithEverySampleOnce) {
  cluster job;
  const std::vector<std::string> common =
      async_job(3, {"--cpus", "1", "--wait-devices", "2", "--checkpoint-dir", (job / "ck").string(), "--set",
                    "train.record_trained=true", "--set", "train.checkpoint_every=50"});
  std::vector<std::string> first = common;
  first.insert(first.end(), {"--metrics", (job / "first.jsonl").string()});
  ASSERT_TRUE(job.start_coordinator(first));
  auto w1 = job.start_worker("w1", 1);
  ASSERT_TRUE(job.coordinator_says("checkpoint written"));  // round 50, of about 470
  job.coordinator().signal(SIGINT);
  const auto [c1, r1] = job.finish(*w1);
  ASSERT_EQ(c1.exit_code, 130) << c1.output;
  EXPECT_EQ(r1.exit_code, 0) << r1.output;

  std::vector<std::string> second = common;
  second.insert(second.end(), {"--metrics", (job / "second.jsonl").string(), "--resume", (job / "ck").string()});
  ASSERT_TRUE(job.start_coordinator(second, {.dir = "resumed"}));
  auto w2 = job.start_worker("w2", 1);
  const auto [c2, r2] = job.finish(*w2);
  ASSERT_EQ(c2.exit_code, 0) << c2.output;
  EXPECT_EQ(r2.exit_code, 0) << r2.output;
  const async_account a = read_account(job / "first.jsonl"), b = read_account(job / "second.jsonl");
  EXPECT_TRUE(trained_on(b, "w2/cpu:0")) << "the resumed run's worker process trained nothing";
  // Each run's own rounds are merged once (their numbers start again at
  // the checkpoint's round): the two accounts are added per epoch.
  async_account both;
  for (const async_account* r : {&a, &b}) {
    for (nlohmann::json t : r->trained) {
      t["worker_round"] = t.at("worker_round").get<std::int64_t>() + (r == &b ? 1'000'000 : 0);
      both.trained.push_back(t);
    }
    for (nlohmann::json d : r->decisions) {
      for (auto& m : d.at("merged")) m["worker_round"] = m.at("worker_round").get<std::int64_t>() + (r == &b ? 1'000'000 : 0);
      both.decisions.push_back(d);
    }
  }
  EXPECT_EQ(every_sample_once_by_the_devices(both, 60000, 3), "");
}

}  // namespace
}  // namespace dpactor
