// sync.mode = "async" on the engine (Note [Async rounds]): with nothing
// asynchronous in it (every worker in every round, nothing late) it is
// diloco, to the bytes; with a slowed worker and with contributions dropped
// as stale, every sample of every epoch is committed once; what it does not
// take yet is refused before anything runs.

#include <gtest/gtest.h>

#include <dpactor/engine.hpp>
#include <dpactor/error.hpp>
#include "config/config_file.hpp"
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

job_config async_job(std::int64_t replicas) {
  job_config c = testing::small_job(replicas, 64, 1024);  // 4 rounds of H = 4 an epoch, no short one
  c.train.epochs = 3;
  c.sync.mode = sync_mode::async;
  c.sync.every = 4;
  return c;
}

struct async_result {
  run_summary summary;
  std::vector<epoch_event> epochs;
  std::vector<step_event> steps;
};

async_result train(const job_config& config) {
  Engine engine(config);
  async_result r;
  engine.on_event([&](const event& e) {
    if (const auto* ep = std::get_if<epoch_event>(&e)) r.epochs.push_back(*ep);
    if (const auto* s = std::get_if<step_event>(&e)) r.steps.push_back(*s);
  });
  engine.start();
  r.summary = testing::wait_or_exit(engine, std::chrono::seconds(60), "the async run");
  return r;
}

// With a quorum of every worker and a deadline no round reaches, every
// round merges every worker's fresh contribution: DiLoCo's round. The
// claims are then diloco's shares (worker 0 first, each H x B / K samples
// of the order), the positions on the inner schedule its, and the sum its
// summation tree over worker index: the same test loss, to the last bit.
TEST(AsyncRounds, WithEveryWorkerInEveryRoundItIsDilocoToTheBytes) {
  for (const std::int64_t k : {1, 2}) {
    job_config diloco = async_job(k);
    diloco.sync.mode = sync_mode::diloco;
    job_config async = async_job(k);
    async.sync.quorum = k;
    async.sync.grace_ms = 3600000.0;
    const async_result a = train(async);
    const async_result d = train(diloco);
    // The same model after every epoch: the same test predictions. (The
    // loss sums agree to rounding only: diloco's devices each evaluate a
    // part of the test set, and their sums add in another order than the
    // async reducer's one pass.)
    EXPECT_EQ(a.summary.test_accuracy, d.summary.test_accuracy) << k << " workers";
    EXPECT_NEAR(a.summary.test_loss, d.summary.test_loss, 1e-12 * d.summary.test_loss) << k << " workers";
    EXPECT_EQ(a.summary.steps, d.summary.steps);
    EXPECT_EQ(a.summary.samples, 3 * 1024);
    ASSERT_EQ(a.epochs.size(), 3u);
    ASSERT_EQ(d.epochs.size(), 3u);
    // Each worker's account: in every round, never stale, never dropped.
    ASSERT_FALSE(a.steps.empty());
    ASSERT_EQ(a.steps.back().workers.size(), static_cast<std::size_t>(k));
    for (const worker_account& w : a.steps.back().workers) {
      EXPECT_EQ(w.contributed, a.summary.steps);
      EXPECT_EQ(w.dropped, 0);
      EXPECT_EQ(w.mean_staleness, 0.0);
      EXPECT_EQ(w.inner_steps, 4);
    }
    for (std::size_t e = 0; e < 3; ++e) {
      EXPECT_EQ(a.epochs[e].test_accuracy, d.epochs[e].test_accuracy) << "epoch " << e;
      EXPECT_NEAR(a.epochs[e].test_loss, d.epochs[e].test_loss, 1e-12 * d.epochs[e].test_loss) << "epoch " << e;
    }
  }
}

// A quorum of one and no staleness allowed: a round commits with the first
// contribution, and the others that started from it are all stale by the
// time they arrive: dropped, their samples trained later in the epoch. Every
// epoch still ends with each of its samples committed once.
TEST(AsyncRounds, ContributionsDroppedAsStaleAreTrainedLaterAndEveryEpochCommitsEachSampleOnce) {
  job_config c = async_job(4);
  c.sync.quorum = 1;
  c.sync.max_staleness = 0;
  c.faults.inject = {"slow:3:3"};
  const async_result r = train(c);
  ASSERT_EQ(r.epochs.size(), 3u);
  std::int64_t requeued = 0;
  for (const epoch_event& e : r.epochs) {
    EXPECT_EQ(e.samples, 1024);
    requeued += e.requeued;
  }
  EXPECT_GT(requeued, 0) << "nothing was dropped: the test tests nothing";
  EXPECT_EQ(r.summary.requeued, requeued);
  // The workers' accounts: what merged was fresh (no staleness allowed),
  // every round merged one or more, and the drops are there.
  ASSERT_FALSE(r.steps.empty());
  std::int64_t contributed = 0, dropped = 0;
  for (const worker_account& w : r.steps.back().workers) {
    contributed += w.contributed;
    dropped += w.dropped;
    EXPECT_EQ(w.mean_staleness, 0.0);
  }
  EXPECT_GE(contributed, r.summary.steps);
  EXPECT_GT(dropped, 0);
  EXPECT_EQ(r.summary.samples, 3 * 1024);
  EXPECT_EQ(r.summary.epochs, 3);
  EXPECT_FALSE(r.steps.empty());
  EXPECT_GT(r.summary.test_accuracy, 0.5) << "it learns (4 classes)";
}

// One worker slowed 10x, with straggler.policy balancing: it claims fewer
// inner steps (its share in the step events), and the run still trains each
// sample of each epoch once.
TEST(AsyncRounds, ASlowedWorkerClaimsFewerInnerStepsAndEverySampleIsCommittedOnce) {
  job_config c = async_job(4);
  c.train.epochs = 4;
  c.train.log_every = 1;
  c.sync.every = 8;
  c.straggler.policy = straggler_policy::balance;
  c.faults.inject = {"slow:1:10"};
  const async_result r = train(c);
  ASSERT_EQ(r.epochs.size(), 4u);
  for (const epoch_event& e : r.epochs) EXPECT_EQ(e.samples, 1024);
  EXPECT_EQ(r.summary.samples, 4 * 1024);
  ASSERT_FALSE(r.steps.empty());
  const step_event& last = r.steps.back();
  ASSERT_EQ(last.shares.size(), 4u);
  for (const std::size_t k : {0, 2, 3}) EXPECT_LT(last.shares[1], last.shares[k]) << "worker 1 runs on the slowed device";
}

std::string async_error(const std::vector<std::string>& sets) {
  const std::string text = testing::read_text(std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg");
  std::vector<std::string> all{"sync.mode=\"async\""};
  all.insert(all.end(), sets.begin(), sets.end());
  return testing::error_of<config_error>([&] { parse_job_config(text, "mlp.cfg", all); });
}

TEST(AsyncRounds, WhatThisVersionDoesNotTakeIsRefusedNamingIt) {
  const std::string ckpt = async_error({});  // configs/mlp.cfg writes checkpoints
  EXPECT_NE(ckpt.find("train.checkpoint_dir"), std::string::npos) << ckpt;
  EXPECT_EQ(async_error({"train.checkpoint_dir=\"\""}), testing::no_error);
  const std::string codec = async_error({"train.checkpoint_dir=\"\"", "sync.codec=\"int8\""});
  EXPECT_NE(codec.find("sync.codec = \"int8\""), std::string::npos) << codec;
  const std::string delay = async_error({"train.checkpoint_dir=\"\"", "sync.delay=1"});
  EXPECT_NE(delay.find("sync.delay"), std::string::npos) << delay;
  job_config c = async_job(2);
  c.faults.inject = {"fail:1@3"};
  const std::string fail = testing::error_of<config_error>([&] { Engine(c).start(); });
  EXPECT_NE(fail.find("fail:1@3"), std::string::npos) << fail;
  job_config coordinator = async_job(2);
  run_options options;
  options.coordinator = coordinator_options{};
  const std::string across = testing::error_of<config_error>([&] { Engine(coordinator, options).start(); });
  EXPECT_NE(across.find("one process"), std::string::npos) << across;
}

}  // namespace
}  // namespace dpactor
