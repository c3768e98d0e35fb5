// sync.mode = "async" on the engine (Note [Async rounds]): with nothing
// asynchronous in it (every worker in every round, nothing late) it is
// diloco, to the bytes; with a slowed worker and with contributions dropped
// as stale, every sample of every epoch is committed once; what it does not
// take yet is refused before anything runs.

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <set>

#include <caf/all.hpp>

#include <dpactor/engine.hpp>
#include <dpactor/error.hpp>
#include "actors/async_device.hpp"
#include "actors/async_messages.hpp"
#include "actors/protocol.hpp"
#include "config/config_file.hpp"
#include "tests/test_support.hpp"
#include "train/checkpoint.hpp"
#include "train/async_replay.hpp"
#include "train/event_json.hpp"
#include "train/sample_digest.hpp"

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
  std::vector<round_decision_event> decisions;
  std::vector<trained_event> trained;
  std::vector<membership_event> members;
};

async_result train(const job_config& config, const run_options& options = {}) {
  Engine engine(config, options);
  async_result r;
  std::mutex mutex;  // devices report what they trained from their own threads
  engine.on_event([&](const event& e) {
    const std::lock_guard lock(mutex);
    if (const auto* ep = std::get_if<epoch_event>(&e)) r.epochs.push_back(*ep);
    if (const auto* s = std::get_if<step_event>(&e)) r.steps.push_back(*s);
    if (const auto* d = std::get_if<round_decision_event>(&e)) r.decisions.push_back(*d);
    if (const auto* t = std::get_if<trained_event>(&e)) r.trained.push_back(*t);
    if (const auto* m = std::get_if<membership_event>(&e)) r.members.push_back(*m);
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
// epoch still ends with each of its samples committed once: by the ledger's
// count, and by the devices' own account (each device's trained_event of
// each round it ran, counted where a decision merged that round).
TEST(AsyncRounds, ContributionsDroppedAsStaleAreTrainedLaterAndEveryEpochCommitsEachSampleOnce) {
  job_config c = async_job(4);
  c.sync.quorum = 1;
  c.sync.max_staleness = 0;
  c.train.record_trained = true;
  c.faults.inject = {"slow:3:3"};
  const async_result r = train(c);
  std::set<std::pair<std::int64_t, std::int64_t>> merged, dropped_rounds;  // (worker, worker_round)
  for (const round_decision_event& d : r.decisions) {
    for (const auto& m : d.merged) merged.insert({m.worker, m.worker_round});
    for (const auto& m : d.dropped) dropped_rounds.insert({m.worker, m.worker_round});
  }
  std::vector<std::uint32_t> every(1024);
  std::iota(every.begin(), every.end(), 0u);
  std::map<std::int64_t, std::pair<std::int64_t, std::uint64_t>> by_epoch;  // samples, digest
  std::size_t reported_dropped = 0;
  for (const trained_event& t : r.trained) {
    ASSERT_GE(t.worker, 0) << "an async device names the worker and its round";
    if (dropped_rounds.count({t.worker, t.worker_round})) ++reported_dropped;
    if (!merged.count({t.worker, t.worker_round})) continue;
    by_epoch[t.epoch].first += t.samples;
    by_epoch[t.epoch].second += t.digest;
  }
  EXPECT_EQ(reported_dropped, dropped_rounds.size()) << "the devices reported the rounds that were dropped too";
  ASSERT_EQ(by_epoch.size(), 3u);
  for (const auto& [epoch, account] : by_epoch) {
    EXPECT_EQ(account.first, 1024) << "epoch " << epoch;
    EXPECT_EQ(account.second, sample_digest(every)) << "epoch " << epoch << ": a sample twice or missing";
  }
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

// Every sample of each of `epochs` epochs of 1024 in exactly one committed
// contribution, by the devices' own account: each trained_event of a round
// that a decision merged counts. "" or what is wrong.
// Several results: the runs of one job, each resumed from the one before.
std::string every_sample_once_by_the_devices(const std::vector<const async_result*>& runs, std::int64_t epochs) {
  std::map<std::int64_t, std::pair<std::int64_t, std::uint64_t>> by_epoch;  // samples, digest
  for (const async_result* r : runs) {
    std::set<std::pair<std::int64_t, std::int64_t>> merged;  // (worker, worker_round)
    for (const round_decision_event& d : r->decisions)
      for (const auto& m : d.merged)
        if (!merged.insert({m.worker, m.worker_round}).second) return "a worker's round merged twice";
    std::set<std::pair<std::int64_t, std::int64_t>> counted;
    for (const trained_event& t : r->trained) {
      if (!merged.count({t.worker, t.worker_round})) continue;
      // A lost round is run again under its number: only one run of it can
      // have reached a decision, and only one may count.
      if (!counted.insert({t.worker, t.worker_round}).second) return "a merged round reported twice by the devices";
      by_epoch[t.epoch].first += t.samples;
      by_epoch[t.epoch].second += t.digest;
    }
  }
  std::vector<std::uint32_t> every(1024);
  std::iota(every.begin(), every.end(), 0u);
  if (static_cast<std::int64_t>(by_epoch.size()) != epochs) return std::to_string(by_epoch.size()) + " epochs trained";
  for (const auto& [epoch, account] : by_epoch) {
    if (account.first != 1024) return "epoch " + std::to_string(epoch) + ": " + std::to_string(account.first) + " samples";
    if (account.second != sample_digest(every)) return "epoch " + std::to_string(epoch) + ": a sample twice or missing";
  }
  return "";
}

std::string every_sample_once_by_the_devices(const async_result& r, std::int64_t epochs) {
  return every_sample_once_by_the_devices(std::vector<const async_result*>{&r}, epochs);
}

bool changed(const async_result& r, const std::string& reason) {
  return std::any_of(r.members.begin(), r.members.end(),
                     [&](const membership_event& m) { return m.reason.find(reason) != std::string::npos; });
}

// See Note [Async faults]: a device fails with a round in flight, another
// leaves and a new one joins; the lost round's samples go back to its epoch
// and its worker runs it again elsewhere; each epoch still commits every
// sample once, by the devices' own account, and the joined device trains.
TEST(AsyncRounds, AFailedALeavingAndAJoiningDeviceLoseNoSampleAndTrainNoneTwice) {
  job_config c = async_job(4);
  c.train.record_trained = true;
  c.faults.inject = {"fail:1@3", "leave:2@5", "join:cpu@7"};
  const async_result r = train(c);
  EXPECT_EQ(every_sample_once_by_the_devices(r, 3), "");
  EXPECT_TRUE(changed(r, "cpu:1 failed")) << "the failure is a membership change";
  EXPECT_TRUE(changed(r, "cpu:2 left"));
  EXPECT_TRUE(changed(r, "cpu:4 joined"));
  ASSERT_FALSE(r.members.empty());
  EXPECT_EQ(r.members.back().members, (std::vector<std::string>{"cpu:0", "cpu:3", "cpu:4"}));
  std::int64_t lost = 0;
  for (const round_decision_event& d : r.decisions)
    for (const round_contribution& l : d.lost) {
      ++lost;
      EXPECT_FALSE(d.committed);
      // The worker ran that round again, and a decision took it.
      const bool decided = std::any_of(r.decisions.begin(), r.decisions.end(), [&](const round_decision_event& o) {
        const auto same = [&](const round_contribution& m) {
          return m.worker == l.worker && m.worker_round == l.worker_round;
        };
        return std::any_of(o.merged.begin(), o.merged.end(), same) || std::any_of(o.dropped.begin(), o.dropped.end(), same);
      });
      EXPECT_TRUE(decided) << "worker " << l.worker << "'s lost round " << l.worker_round << " never ran again";
    }
  EXPECT_EQ(lost, 1) << "cpu:1 failed with its round in flight";
  std::int64_t requeued = 0;
  for (const epoch_event& e : r.epochs) requeued += e.requeued;
  EXPECT_GT(requeued, 0) << "the lost claim went back";
  EXPECT_TRUE(std::any_of(r.trained.begin(), r.trained.end(), [](const trained_event& t) { return t.device == "cpu:4"; }))
      << "the device that joined trained nothing";
  EXPECT_EQ(r.summary.samples, 3 * 1024);
  EXPECT_EQ(r.summary.epochs, 3);
}

// The run stopped (Engine::stop) once `round` commits: the next rounds are
// in flight by then (the reducer hands them out before it reads the stop).
// With `one_more_trained`, once a device reports the first of those rounds
// trained instead: that worker's state after it is in the store, and the
// round is still undecided.
async_result train_until_stopped(const job_config& config, std::int64_t round, bool one_more_trained = false) {
  async_result r;
  Engine engine(config);
  std::mutex mutex;
  bool committed = false;
  engine.on_event([&](const event& e) {
    const std::lock_guard lock(mutex);
    if (const auto* d = std::get_if<round_decision_event>(&e)) {
      r.decisions.push_back(*d);
      if (d->committed && d->round == round) {
        committed = true;
        if (!one_more_trained) engine.stop();
      }
    }
    if (const auto* t = std::get_if<trained_event>(&e)) {
      r.trained.push_back(*t);
      if (committed && std::exchange(one_more_trained, false)) engine.stop();
    }
    if (const auto* ep = std::get_if<epoch_event>(&e)) r.epochs.push_back(*ep);
  });
  engine.start();
  r.summary = testing::wait_or_exit(engine, std::chrono::seconds(60), "the async run to stop");
  return r;
}

// See Note [Async checkpoints]: with every worker in every round (diloco's
// rounds), a run stopped with its workers' rounds in flight and resumed from
// its checkpoint ends with the bytes of the run never stopped: the
// checkpoint holds each worker's state from before its undecided round and
// gives that round's claim back, so the resumed run trains the round again
// from the same state on the same samples.
TEST(AsyncCheckpoints, WithEveryWorkerInEveryRoundAResumedRunEndsWithTheBytesOfTheRunNeverStopped) {
  testing::scratch_dir dir;
  job_config c = async_job(4);
  c.sync.quorum = 4;
  c.sync.grace_ms = 3600000.0;
  c.straggler.policy = straggler_policy::none;  // H inner steps for every worker, whatever its speed
  c.train.record_trained = true;
  c.train.checkpoint_dir = (dir / "whole").string();
  const async_result whole = train(c);
  ASSERT_EQ(whole.epochs.size(), 3u);
  c.train.checkpoint_dir = (dir / "stopped").string();
  const async_result stopped = train_until_stopped(c, 6, true);  // 4 rounds an epoch: in epoch 1
  ASSERT_TRUE(stopped.summary.stopped);
  ASSERT_EQ(stopped.epochs.size(), 1u);
  const trainer_record record = read_trainer_record(stopped.summary.checkpoint);
  ASSERT_EQ(record.step, 7);
  std::size_t undecided = 0;
  for (const async_epoch_position& e : record.position.async.open) undecided += e.returned.size() / 2;
  EXPECT_EQ(undecided, 4u) << "every worker had a round in flight at the stop";
  run_options options;
  options.resume_from = stopped.summary.checkpoint;
  const async_result resumed = train(c, options);
  ASSERT_EQ(resumed.epochs.size(), 2u);
  for (std::size_t e = 0; e < 2; ++e)
    EXPECT_EQ(resumed.epochs[e].test_loss, whole.epochs[e + 1].test_loss) << "epoch " << e + 1;
  // Epoch 1's training loss is over its rounds in each run; epoch 2 is all the resumed run's.
  EXPECT_EQ(resumed.epochs[1].train_loss, whole.epochs[2].train_loss);
  EXPECT_EQ(resumed.summary.test_loss, whole.summary.test_loss);
  EXPECT_EQ(resumed.summary.steps, whole.summary.steps);
  // The ended run's checkpoint resumed: nothing is left to train, and the
  // run ends at once with its model.
  options.resume_from = whole.summary.checkpoint;
  c.train.checkpoint_dir = (dir / "again").string();
  const async_result again = train(c, options);
  EXPECT_EQ(again.summary.steps, whole.summary.steps);
  EXPECT_EQ(again.summary.samples, 0);
  EXPECT_EQ(again.summary.test_loss, whole.summary.test_loss);
}

// See Note [Async checkpoints]: a run with a failed device, stopped in the
// middle of an epoch with rounds in flight and waiting, leaves a checkpoint
// whose claims give those rounds' samples back; resumed on 2 devices
// instead of 4, it ends the job, and over the two runs every sample of every
// epoch is in exactly one committed contribution, by the devices' own
// account.
TEST(AsyncCheckpoints, AStoppedRunResumedOnOtherDevicesCommitsEverySampleOnce) {
  testing::scratch_dir dir;
  job_config c = async_job(4);
  c.train.record_trained = true;
  c.train.checkpoint_dir = (dir / "ck").string();
  c.faults.inject = {"fail:1@3"};
  const async_result first = train_until_stopped(c, 6);  // in epoch 1 (about 5 rounds an epoch)
  ASSERT_TRUE(first.summary.stopped);
  ASSERT_FALSE(first.summary.checkpoint.empty()) << "a stopped run leaves a checkpoint";
  ASSERT_LT(first.epochs.size(), 3u) << "the run ended before the stop";
  const trainer_record record = read_trainer_record(first.summary.checkpoint);
  EXPECT_EQ(record.step, 7) << "the rounds committed";
  ASSERT_TRUE(record.position.async.active);
  std::int64_t back = 0;
  for (const async_epoch_position& e : record.position.async.open)
    for (std::size_t i = 1; i < e.returned.size(); i += 2) back += e.returned[i];
  EXPECT_GT(back, 0) << "no round was in flight at the stop: the test tests nothing";

  job_config again = async_job(2);
  again.sync.workers = 4;
  again.train.record_trained = true;
  again.train.checkpoint_dir = c.train.checkpoint_dir;
  run_options options;
  options.resume_from = first.summary.checkpoint;
  const async_result second = train(again, options);
  EXPECT_FALSE(second.summary.stopped);
  EXPECT_EQ(first.epochs.size() + second.epochs.size(), 3u);
  EXPECT_EQ(every_sample_once_by_the_devices({&first, &second}, 3), "");
  ASSERT_FALSE(second.decisions.empty());
  EXPECT_EQ(second.decisions.front().round, 7) << "the resumed run goes on from the checkpoint's rounds";
  EXPECT_GT(second.summary.test_accuracy, 0.5);
}

// See Note [Async faults]: a device hung in its round (hang:R@S) is given
// up on after the hang timeout, as a failed one is: its round is lost and
// run again elsewhere, the others never wait for it, and every sample of
// every epoch is committed once.
TEST(AsyncRounds, AHungDeviceIsGivenUpOnAndItsRoundRunsElsewhere) {
  job_config c = async_job(4);
  c.train.record_trained = true;
  c.cluster.hang_timeout_s = 0.5;
  c.faults.inject = {"hang:1@3"};
  const async_result r = train(c);
  EXPECT_EQ(every_sample_once_by_the_devices(r, 3), "");
  EXPECT_TRUE(changed(r, "cpu:1 hung: in forward of worker 1's round")) << "the hang is a membership change";
  // (A device descheduled for longer than the timeout on a loaded machine
  // would be given up on too: at least cpu:1's round is lost.)
  std::int64_t lost = 0;
  for (const round_decision_event& d : r.decisions)
    for (const round_contribution& l : d.lost) lost += l.worker == 1 ? 1 : 0;
  EXPECT_EQ(lost, 1) << "cpu:1 ran worker 1 when it hung";
  EXPECT_EQ(r.summary.samples, 3 * 1024);
}

// Below cluster.min_devices live devices the run fails, naming the device.
TEST(AsyncRounds, EveryDeviceFailingEndsTheRunWithAnErrorNamingTheLastOne) {
  job_config c = async_job(2);
  c.faults.inject = {"fail:0@2", "fail:1@2"};
  Engine engine(c);
  engine.start();
  const std::string what = testing::error_of<dpactor::error>([&] { engine.wait(); });
  EXPECT_NE(what.find("failed: "), std::string::npos) << what;
  EXPECT_NE(what.find("below cluster.min_devices = 1"), std::string::npos) << what;
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

// The decisions as a metrics file holds them (JSON Lines), with a record of
// another kind between them, as the CLI writes it.
void write_record(const std::filesystem::path& path, const std::vector<round_decision_event>& decisions) {
  std::ofstream out(path);
  out << to_json(event{membership_event{0, 0, {"cpu:0"}, {1}, "start"}}).dump() << "\n";
  for (const round_decision_event& d : decisions) out << to_json(event{d}).dump() << "\n";
}

bool same_decisions(std::vector<round_decision_event> a, std::vector<round_decision_event> b) {
  const auto text = [](std::vector<round_decision_event>& v) {
    std::string t;
    for (auto& d : v) {
      d.job.clear();  // the first record's identity: the same job, but this compares the decisions
      d.data.clear();
      t += to_json(event{d}).dump() + "\n";
    }
    return t;
  };
  return text(a) == text(b);
}

// The recorded job of `recorded` replayed from `record` on 2 devices, its 4
// logical workers kept, without its faults.
async_result replay_on_two_devices(const job_config& recorded, const std::filesystem::path& record) {
  job_config again = recorded;
  again.cluster.cpus = 2;
  again.sync.workers = 4;
  again.faults = faults_config{};
  run_options options;
  options.replay_rounds = record.string();
  return train(again, options);
}

// The replay's epochs, rounds and decisions are the recorded run's.
void expect_the_recorded_runs_bytes(const async_result& replay, const async_result& first) {
  ASSERT_EQ(replay.epochs.size(), 3u);
  for (std::size_t e = 0; e < 3; ++e) {
    EXPECT_EQ(replay.epochs[e].test_loss, first.epochs[e].test_loss) << "epoch " << e;
    EXPECT_EQ(replay.epochs[e].train_loss, first.epochs[e].train_loss) << "epoch " << e;
    EXPECT_EQ(replay.epochs[e].requeued, first.epochs[e].requeued) << "epoch " << e;
  }
  EXPECT_EQ(replay.summary.steps, first.summary.steps);
  EXPECT_TRUE(same_decisions(replay.decisions, first.decisions)) << "a replay records the decisions it followed";
}

// See Note [Async replay]: a run with a slowed worker, stale contributions
// merged and others dropped, replayed from its decisions on 2 devices instead of 4,
// without the slow-down, gives its bytes: the same test loss after every
// epoch (one evaluation pass on the global model in both), the same
// decisions, the same samples trained again.
TEST(AsyncReplay, AReplayOfTheDecisionsGivesTheRunsBytesOnOtherDevices) {
  testing::scratch_dir dir;
  job_config c = async_job(4);
  c.sync.quorum = 1;
  c.sync.max_staleness = 1;
  c.faults.inject = {"slow:3:3"};
  const auto stale_merged = [](const async_result& r) {
    return std::any_of(r.decisions.begin(), r.decisions.end(), [](const auto& d) {
      return std::any_of(d.merged.begin(), d.merged.end(), [&](const auto& m) { return m.base_round < d.round; });
    });
  };
  // What the run decides follows the clock: on a loaded machine a run may
  // merge no stale contribution; the replay needs one that did.
  async_result first = train(c);
  for (int again = 0; again < 4 && !(stale_merged(first) && first.summary.requeued > 0); ++again) first = train(c);
  ASSERT_EQ(first.epochs.size(), 3u);
  ASSERT_GT(first.summary.requeued, 0) << "nothing was dropped in 5 runs: the replay would not follow a drop";
  ASSERT_TRUE(stale_merged(first)) << "no stale contribution merged in 5 runs: the replay would not weigh one";
  ASSERT_FALSE(first.decisions.empty());
  EXPECT_FALSE(first.decisions.front().job.empty());
  write_record(dir / "m.jsonl", first.decisions);

  const async_result replay = replay_on_two_devices(c, dir / "m.jsonl");
  expect_the_recorded_runs_bytes(replay, first);
}

// Acceptance 3 of issue 30: a run with a slowed worker and a failed device
// (its round lost, run again elsewhere), replayed on 2 devices without
// either fault, gives its bytes and its decisions, the loss included.
TEST(AsyncReplay, AReplayOfARunWithAFailureGivesItsBytes) {
  testing::scratch_dir dir;
  job_config c = async_job(4);
  c.sync.quorum = 2;
  c.sync.max_staleness = 1;
  c.train.record_trained = true;
  c.faults.inject = {"slow:3:3", "fail:1@4"};
  const async_result first = train(c);
  ASSERT_EQ(first.epochs.size(), 3u);
  ASSERT_TRUE(std::any_of(first.decisions.begin(), first.decisions.end(), [](const auto& d) { return !d.lost.empty(); }))
      << "no round was lost: the replay would not follow a failure";
  EXPECT_EQ(every_sample_once_by_the_devices(first, 3), "");
  write_record(dir / "m.jsonl", first.decisions);

  const async_result replay = replay_on_two_devices(c, dir / "m.jsonl");
  expect_the_recorded_runs_bytes(replay, first);
  EXPECT_EQ(every_sample_once_by_the_devices(replay, 3), "");
}

// See Note [Async checkpoints]: a checkpoint keeps the run's decisions up
// to it (decisions.jsonl); replayed on 2 devices, they end where the
// checkpoint was taken, and the replay's own checkpoint there holds the
// model and optimizer bytes of the run's.
TEST(AsyncReplay, ACheckpointsDecisionsReplayToItsModelAndOptimizerBytes) {
  testing::scratch_dir dir;
  job_config c = async_job(4);
  c.sync.quorum = 1;
  c.sync.max_staleness = 1;
  c.faults.inject = {"slow:3:3", "fail:1@4"};
  c.train.checkpoint_dir = (dir / "run").string();
  c.train.checkpoint_every = 5;
  c.train.keep_checkpoints = 0;
  const async_result first = train(c);
  ASSERT_EQ(first.epochs.size(), 3u);
  const std::filesystem::path middle = dir / "run" / "step-00000010";
  ASSERT_TRUE(std::filesystem::exists(middle / "decisions.jsonl"));
  const std::vector<round_decision_event> kept = read_round_decisions((middle / "decisions.jsonl").string());
  ASSERT_FALSE(kept.empty());
  EXPECT_FALSE(kept.front().job.empty()) << "the first record names the job";
  std::int64_t commits = 0;
  for (const round_decision_event& d : kept) commits += d.committed ? 1 : 0;
  EXPECT_EQ(commits, 10) << "the decisions up to the checkpoint, no later one";

  job_config again = async_job(2);
  again.sync.workers = 4;
  again.sync.quorum = 1;
  again.sync.max_staleness = 1;
  again.train.checkpoint_dir = (dir / "replay").string();
  run_options options;
  options.replay_rounds = (middle / "decisions.jsonl").string();
  const async_result replay = train(again, options);
  EXPECT_TRUE(replay.summary.stopped) << "the record ends at the checkpoint";
  EXPECT_EQ(replay.summary.steps, 10);
  const std::filesystem::path end = dir / "replay" / "step-00000010";
  ASSERT_TRUE(std::filesystem::exists(end)) << replay.summary.checkpoint;
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(testing::read_text(end / file) == testing::read_text(middle / file)) << file << " differs";
}

TEST(AsyncReplay, AReplayOfAnotherJobOrDataOrNoRecordIsRefusedNamingTheDifference) {
  testing::scratch_dir dir;
  job_config c = async_job(2);
  c.train.epochs = 1;
  const async_result first = train(c);
  write_record(dir / "m.jsonl", first.decisions);
  run_options options;
  options.replay_rounds = (dir / "m.jsonl").string();
  const auto refusal = [&](job_config job) {
    return testing::error_of<dpactor::error>([&] { train(job, options); });
  };
  job_config lr = c;
  lr.optimizer.lr = 0.07;
  const std::string other_lr = refusal(lr);
  EXPECT_NE(other_lr.find("optimizer.lr = 0.07 (this run) against 0.05 (the recorded run)"), std::string::npos) << other_lr;
  job_config workers = c;
  workers.cluster.cpus = 1;  // sync.workers = 0: one per device
  const std::string other_workers = refusal(workers);
  EXPECT_NE(other_workers.find("sync.workers = 1 (this run) against 2 (the recorded run)"), std::string::npos)
      << other_workers;
  job_config diloco = c;
  diloco.sync.mode = sync_mode::diloco;
  const std::string not_async = refusal(diloco);
  EXPECT_NE(not_async.find("sync.mode = \"async\""), std::string::npos) << not_async;
  // Other data under the same config: the record's fingerprint differs.
  std::vector<round_decision_event> other = first.decisions;
  other.front().data = "train 1 x 1 (1 classes) 0, test 1 x 1 (1 classes) 0";
  write_record(dir / "other.jsonl", other);
  options.replay_rounds = (dir / "other.jsonl").string();
  const std::string data = testing::error_of<data_error>([&] { train(c, options); });
  EXPECT_NE(data.find("recorded a run on other data: train 1 x 1"), std::string::npos) << data;
  // A file with no decisions, and no file.
  write_record(dir / "none.jsonl", {});
  options.replay_rounds = (dir / "none.jsonl").string();
  EXPECT_NE(refusal(c).find("holds no round_decision records"), std::string::npos);
  options.replay_rounds = (dir / "absent.jsonl").string();
  EXPECT_NE(refusal(c).find("absent.jsonl: cannot read"), std::string::npos);
  // A record whose decisions do not fit together: a worker's round decided twice.
  std::vector<round_decision_event> twice = first.decisions;
  twice.back().committed = true;
  twice.push_back(twice.back());
  twice.back().round = twice[twice.size() - 2].round + 1;
  write_record(dir / "twice.jsonl", twice);
  options.replay_rounds = (dir / "twice.jsonl").string();
  EXPECT_NE(refusal(c).find("is decided twice"), std::string::npos) << refusal(c);
}

std::string async_error(const std::vector<std::string>& sets) {
  const std::string text = testing::read_text(std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg");
  std::vector<std::string> all{"sync.mode=\"async\""};
  all.insert(all.end(), sets.begin(), sets.end());
  return testing::error_of<config_error>([&] { parse_job_config(text, "mlp.cfg", all); });
}

TEST(AsyncRounds, WhatThisVersionDoesNotTakeIsRefusedNamingIt) {
  EXPECT_EQ(async_error({}), testing::no_error);  // configs/mlp.cfg writes checkpoints
  const std::string clock = async_error({"train.checkpoint_every_s=10"});
  EXPECT_NE(clock.find("train.checkpoint_every_s"), std::string::npos) << clock;
  const std::string codec = async_error({"train.checkpoint_dir=\"\"", "sync.codec=\"int8\""});
  EXPECT_NE(codec.find("sync.codec = \"int8\""), std::string::npos) << codec;
  const std::string delay = async_error({"train.checkpoint_dir=\"\"", "sync.delay=1"});
  EXPECT_NE(delay.find("sync.delay"), std::string::npos) << delay;
  job_config c = async_job(2);
  c.faults.inject = {"jitter:1:0.5:10"};
  const std::string jitter = testing::error_of<config_error>([&] { Engine(c).start(); });
  EXPECT_NE(jitter.find("jitter:1:0.5:10"), std::string::npos) << jitter;
  // kill ends a worker process (See Note [Async rounds across processes]):
  // one process has none.
  c.faults.inject = {"kill:1@3"};
  const std::string kill = testing::error_of<config_error>([&] { Engine(c).start(); });
  EXPECT_NE(kill.find("names a device of a worker process"), std::string::npos) << kill;
}

// See Note [Async rounds across processes]: a device's progress relay tells
// the reducer (here a test's actor) each change of the device's progress,
// with the device's number there, once the device has been handed a round
// (before, it knows no reducer and says nothing).
TEST(AsyncRelay, ReportsEachChangeOfADevicesProgressToItsReducer) {
  caf::actor_system_config cfg;
  register_message_types(cfg);
  caf::actor_system sys{cfg};
  auto watch = std::make_shared<async_device_watch>();
  const caf::actor device = sys.spawn([](caf::event_based_actor*) -> caf::behavior { return {[](int) {}}; });
  caf::scoped_actor reducer{sys};
  const caf::actor relay = sys.spawn(async_progress_relay, device, watch);
  {
    const std::lock_guard lock(watch->mutex);
    watch->reducer = caf::actor_cast<caf::actor>(reducer);
    watch->number = 3;
  }
  const auto next = [&] {
    async_progress_msg got;
    got.step = -2;
    reducer->receive([&](const async_progress_msg& m) { got = m; },
                     caf::after(std::chrono::seconds(30)) >> [] {});
    return got;
  };
  watch->progress.begin_warm_up(device_phase::forward, 7);
  async_progress_msg m = next();
  while (m.step == -1) m = next();  // its state before the round, if the relay looked first
  EXPECT_EQ(m.device, 3u);
  EXPECT_EQ(m.step, 7);
  EXPECT_EQ(static_cast<device_phase>(m.phase), device_phase::forward);
  EXPECT_TRUE(m.warming);
  watch->progress.end_warm_up();
  watch->progress.mark(device_phase::optimizer, 8);
  m = next();
  while (m.step == 7) m = next();  // the end of its warm-up, if the relay looked in between
  EXPECT_EQ(m.step, 8);
  EXPECT_EQ(static_cast<device_phase>(m.phase), device_phase::optimizer);
  EXPECT_FALSE(m.warming);
  caf::anon_send_exit(device, caf::exit_reason::user_shutdown);  // the relay ends with it
  reducer->wait_for(relay);
}

}  // namespace
}  // namespace dpactor
