// The abort storm through the engine: runs whose replicas fail, hang and get
// cut at random steps, so that generations are aborted at every moment of a
// step while device actors end and free their step runners (See Note [Posted
// memory outlives an abort]). Under AddressSanitizer (scripts/test runs 100
// of them) a freed buffer touched by a peer is a report; here each run must
// also finish with every sample of its epochs trained. On both replica kinds.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <mutex>
#include <random>
#include <string>

#include <dpactor/engine.hpp>
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

int runs(int fallback) {
  if (const char* v = std::getenv("DPACTOR_FAULT_STORM_RUNS")) return std::max(1, std::atoi(v));
  return fallback;
}

// 960 samples at global batch 96 (10 steps an epoch), micro-batches of 4
// rows so that a cut stops a shard part-way; one device fails, another hangs,
// a third is slow or jittery so that it gets cut (or, in reproducible mode,
// its slices get stolen).
job_config stormy_job(std::mt19937_64& gen, std::string& faults_text) {
  const int replicas = std::uniform_int_distribution<int>(3, 5)(gen);
  job_config c = testing::small_job(testing::current_kind(), replicas, 96, 960);
  c.train.epochs = 2;
  c.train.micro_batch = 4;
  c.straggler.policy = straggler_policy::balance_cut;
  // Half the runs cut late replicas (their samples go to later steps); the
  // other half are reproducible, where idle replicas steal unstarted slices.
  c.train.reproducible = std::uniform_int_distribution<int>(0, 1)(gen) == 0;
  c.cluster.hang_timeout_s = 0.3;
  // A hang in a device's first step would otherwise wait out the first-step
  // bound (300 s; See Note [Progress-based hang detection]).
  c.cluster.first_step_timeout_s = 3;
  std::vector<int> devices(static_cast<std::size_t>(replicas));
  std::iota(devices.begin(), devices.end(), 0);
  std::shuffle(devices.begin(), devices.end(), gen);
  auto step = [&] { return std::uniform_int_distribution<int>(1, 20)(gen); };
  c.faults.inject = {"fail:" + std::to_string(devices[0]) + "@" + std::to_string(step()),
                     "hang:" + std::to_string(devices[1]) + "@" + std::to_string(step())};
  if (std::uniform_int_distribution<int>(0, 1)(gen) == 0)
    c.faults.inject.push_back("slow:" + std::to_string(devices[2]) + ":4@" + std::to_string(step()));
  else
    c.faults.inject.push_back("jitter:" + std::to_string(devices[2]) + ":0.5:5");
  c.faults.seed = static_cast<std::int64_t>(gen() % 1000);
  for (const auto& f : c.faults.inject) faults_text += f + " ";
  return c;
}

// On both replica kinds (tests/test_support.hpp).
class FaultStorm : public testing::both_replicas {};

TEST_P(FaultStorm, RunsThatFailHangAndGetCutAtRandomStepsFinishWithEverySample) {
  std::mt19937_64 gen(20261203);
  const int n = runs(5);
  for (int i = 0; i < n; ++i) {
    std::string faults;
    job_config c = stormy_job(gen, faults);
    const std::int64_t rows = c.data.synthetic_train;
    SCOPED_TRACE("run " + std::to_string(i) + ": " + std::to_string(c.cluster.cpus) + " replicas, " + faults +
                 (c.train.reproducible ? "reproducible" : "cuts"));
    std::mutex m;
    std::vector<epoch_event> epochs;
    int removed = 0;
    Engine engine(std::move(c));
    engine.on_event([&](const event& e) {
      std::lock_guard lock(m);
      if (const auto* x = std::get_if<epoch_event>(&e)) epochs.push_back(*x);
      if (const auto* x = std::get_if<membership_event>(&e))
        if (x->reason.find("failed") != std::string::npos || x->reason.find("hung") != std::string::npos) ++removed;
    });
    engine.start();
    const run_summary s = engine.wait();
    ASSERT_EQ(epochs.size(), 2u);
    for (const auto& e : epochs) EXPECT_EQ(e.samples, rows) << "epoch " << e.epoch;
    EXPECT_GE(removed, 1) << "no generation was aborted";
    EXPECT_GT(s.test_accuracy, 0.4);
  }
}

DPACTOR_ON_BOTH_REPLICAS(FaultStorm);

}  // namespace
}  // namespace dpactor
