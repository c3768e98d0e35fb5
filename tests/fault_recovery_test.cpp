// Faults and elasticity through the whole engine (DESIGN.md, "Membership,
// faults, elasticity", "Exactly once"): failed, hung and leaving devices,
// joins, newcomers that adopt the survivors' state, min_devices, a replica
// that carries other state, a diverging run. The ledger checks at the end of
// every epoch that each index was committed exactly once and fails the run
// otherwise, so every run below that completes has kept exactly-once; the
// tests also check the counts it reports, and what the devices say they
// trained. Each test runs on both replica kinds: the native MLP and the same
// network as a TorchScript module on the libtorch replica (skipped, saying
// why, where the plugin is not built). Cuts and stragglers:
// tests/cut_recovery_test.

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <regex>
#include <thread>

#include "comms/local.hpp"
#include "config/config_file.hpp"
#include <dpactor/engine.hpp>
#include <dpactor/error.hpp>
#include "tensors/safetensors.hpp"
#include "tests/recorded_run.hpp"
#include "train/checkpoint.hpp"

namespace dpactor {
namespace {

namespace fs = std::filesystem;

using testing::expect_exactly_once;
using testing::faulty_job;
using testing::recorded_run;
using testing::run_recorded;

class Faults : public testing::both_replicas {};
class Numerics : public testing::both_replicas {};

TEST_P(Faults, AFailedDeviceCostsItsStepAndNoData) {
  const recorded_run r = run_recorded(faulty_job(3, {"fail:1@20"}));
  ASSERT_EQ(r.memberships.size(), 2u);
  const membership_event& after = r.memberships[1];
  EXPECT_EQ(after.members, (std::vector<std::string>{"cpu:0", "cpu:2"}));
  EXPECT_NE(after.reason.find("cpu:1 failed: injected failure"), std::string::npos) << after.reason;
  EXPECT_EQ(after.step, 19) << "step 20's update was never applied";
  EXPECT_EQ(after.actor_ids[0], r.memberships[0].actor_ids[0]) << "survivors are not restarted";
  EXPECT_EQ(after.actor_ids[1], r.memberships[0].actor_ids[2]);
  ASSERT_EQ(r.recoveries.size(), 1u);
  EXPECT_EQ(r.recoveries[0].step, 20) << "the failed step is trained again";
  EXPECT_GT(r.recoveries[0].requeued, 0);
  ASSERT_EQ(r.epochs.size(), 3u);
  for (const auto& e : r.epochs) EXPECT_EQ(e.samples, 1024) << "epoch " << e.epoch << ": every sample exactly once";
  expect_exactly_once(r);
  EXPECT_GT(r.epochs[1].requeued, 0) << "the failure was in epoch 2 (steps 17-32)";
  EXPECT_EQ(r.summary.steps, 48);
  EXPECT_EQ(r.summary.membership_changes, 1);
  EXPECT_GT(r.summary.test_accuracy, 0.5);
}

TEST_P(Faults, AFailureOnTheLastStepOfAnEpochRetrainsItInThatEpoch) {
  const recorded_run r = run_recorded(faulty_job(2, {"fail:0@16"}));
  ASSERT_EQ(r.epochs.size(), 3u);
  EXPECT_EQ(r.epochs[0].samples, 1024);
  EXPECT_EQ(r.memberships.back().members, std::vector<std::string>{"cpu:1"});
  expect_exactly_once(r);
}

TEST_P(Faults, AHungDeviceIsDetectedWithinTheHangTimeout) {
  job_config c = faulty_job(2, {"hang:1@10"});
  c.cluster.hang_timeout_s = 0.5;
  const auto start = std::chrono::steady_clock::now();
  const recorded_run r = run_recorded(c);
  // (On a loaded machine a stall of the whole job may also end a generation
  // on the way, with nobody removed; the hang itself must remove cpu:1.)
  const auto hung = std::find_if(r.memberships.begin(), r.memberships.end(),
                                 [](const auto& m) { return m.reason.find("cpu:1 hung") != std::string::npos; });
  ASSERT_NE(hung, r.memberships.end());
  EXPECT_EQ(hung->members, std::vector<std::string>{"cpu:0"});
  EXPECT_EQ(hung->step, 9) << "the hang was in step 10";
  EXPECT_EQ(r.memberships.back().members, std::vector<std::string>{"cpu:0"});
  for (const auto& e : r.epochs) EXPECT_EQ(e.samples, 1024);
  expect_exactly_once(r);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "the hung thread did not block shutdown";
}

TEST_P(Faults, TheLastDevicesLeavingCheckpointTheirStateAndStop) {
  // Before: the leaving devices were let go first, and the run stopped with
  // "no replica state left to checkpoint".
  for (const auto& faults : {std::vector<std::string>{"leave:0@5"}, std::vector<std::string>{"leave:0@5", "leave:1@5"}}) {
    testing::scratch_dir dir;
    job_config c = faulty_job(static_cast<int>(faults.size()), faults);
    c.train.checkpoint_dir = (dir / "ckpt").string();
    try {
      run_recorded(c);
      FAIL() << "the run went on without devices";
    } catch (const training_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("training stopped after step 4: 0 devices left"), std::string::npos) << what;
      EXPECT_NE(what.find("checkpoint written to"), std::string::npos) << what;
    }
    const loaded_checkpoint ckpt = read_checkpoint(dir / "ckpt", make_state_layout(c.model, c.optimizer));
    EXPECT_EQ(ckpt.record.step, 4) << "the state the devices held when they left";
  }
}

TEST_P(Faults, JoinAndLeaveTakeEffectAtTheirStepBoundaries) {
  const recorded_run r = run_recorded(faulty_job(2, {"join:cpu@10", "leave:0@30"}));
  ASSERT_EQ(r.memberships.size(), 3u);
  EXPECT_EQ(r.memberships[1].step, 9) << "the newcomer trains from step 10";
  EXPECT_EQ(r.memberships[1].members, (std::vector<std::string>{"cpu:0", "cpu:1", "cpu:2"}));
  EXPECT_EQ(r.memberships[2].step, 29) << "cpu:0 trains up to step 29";
  EXPECT_EQ(r.memberships[2].members, (std::vector<std::string>{"cpu:1", "cpu:2"}));
  // Same actors throughout: nobody was restarted.
  EXPECT_EQ(r.memberships[1].actor_ids[1], r.memberships[0].actor_ids[1]);
  EXPECT_EQ(r.memberships[2].actor_ids[0], r.memberships[0].actor_ids[1]);
  EXPECT_EQ(r.memberships[2].actor_ids[1], r.memberships[1].actor_ids[2]);
  EXPECT_TRUE(r.recoveries.empty()) << "graceful changes lose no step";
  EXPECT_EQ(r.summary.steps, 48) << "and no step is repeated";
  for (const auto& e : r.epochs) EXPECT_EQ(e.requeued, 0);
  expect_exactly_once(r);
}

// The test's own comparison, with the engine's (train.verify_replicas) off:
// the newcomer carries the survivors' very bytes into its first step, and
// every member of every step carries the same state.
void expect_newcomer_adopts_the_survivors_state(std::vector<std::string> faults, const std::string& newcomer) {
  SCOPED_TRACE(faults.back());
  job_config c = faulty_job(2, std::move(faults));
  c.train.verify_replicas = false;
  const recorded_run r = run_recorded(c);
  const auto first = r.trained->first_step_of(newcomer);
  ASSERT_TRUE(first) << newcomer << " never trained";
  const auto members = r.trained->members_of(*first);
  ASSERT_GE(members.size(), 2u) << "no survivor trained step " << *first + 1 << " beside " << newcomer;
  EXPECT_EQ(r.trained->replicas_agree(), "");
  expect_exactly_once(r);
}

TEST_P(Faults, ANewcomerCarriesTheSurvivorsBytesIntoItsFirstStep) {
  expect_newcomer_adopts_the_survivors_state({"join:cpu@20"}, "cpu:2");
}

TEST_P(Faults, ANewcomerAfterAFailureCarriesTheSurvivorsBytesIntoItsFirstStep) {
  expect_newcomer_adopts_the_survivors_state({"fail:1@10", "join:cpu@20"}, "cpu:2");
}

TEST_P(Faults, ANewcomerMatchesAJobThatHadItsMembersFromTheStart) {
  // With even shards, a run that grows from 2 to 3 members must compute the
  // same parameters as one that had 3 from the start (to float rounding),
  // since the newcomer adopts the exact state and the batch math is global.
  testing::scratch_dir dir;
  job_config grow = faulty_job(2, {"join:cpu@1"});
  grow.train.checkpoint_dir = (dir / "grow").string();
  job_config three = faulty_job(3, {});
  three.train.checkpoint_dir = (dir / "three").string();
  const auto a = load_safetensors(fs::path(run_recorded(grow).summary.checkpoint) / "model.safetensors");
  const auto b = load_safetensors(fs::path(run_recorded(three).summary.checkpoint) / "model.safetensors");
  for (std::size_t t = 0; t < a.tensors.size(); ++t)
    for (std::size_t i = 0; i < a.tensors[t].values.size(); ++i)
      ASSERT_NEAR(a.tensors[t].values[i], b.tensors[t].values[i], 1e-5) << a.tensors[t].name;
}

TEST_P(Faults, FailingEveryDeviceCheckpointsAndStopsWithAClearError) {
  testing::scratch_dir dir;
  job_config c = faulty_job(2, {"fail:0@12", "fail:1@12"});
  c.train.checkpoint_dir = (dir / "ckpt").string();
  try {
    run_recorded(c);
    FAIL() << "the run did not stop";
  } catch (const training_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("training stopped after step 11: 0 devices left, fewer than cluster.min_devices = 1"), std::string::npos)
        << what;
    EXPECT_NE(what.find("injected failure"), std::string::npos) << what;
    EXPECT_NE(what.find("checkpoint written to"), std::string::npos) << what;
  }
  ASSERT_TRUE(fs::exists(dir / "ckpt" / "step-00000011")) << "the state after the last completed step";
  // The checkpoint resumes: the run finishes its three epochs.
  job_config resume = faulty_job(2, {});
  resume.train.checkpoint_dir = (dir / "ckpt").string();
  const recorded_run r = run_recorded(resume, testing::resume_from(dir / "ckpt"));
  EXPECT_EQ(r.summary.steps, 48);
  EXPECT_EQ(r.summary.samples, 3 * 1024 - 11 * 64);
}

TEST_P(Faults, FallingBelowMinDevicesStops) {
  testing::scratch_dir dir;
  job_config c = faulty_job(2, {"fail:1@5"});
  c.cluster.min_devices = 2;
  c.train.checkpoint_dir = (dir / "ckpt").string();
  try {
    run_recorded(c);
    FAIL() << "trained on below min_devices";
  } catch (const training_error& e) {
    EXPECT_NE(std::string(e.what()).find("1 device left, fewer than cluster.min_devices = 2"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::exists(dir / "ckpt" / "step-00000004"));
}

TEST_P(Faults, MinDevicesAboveTheReplicasIsRefusedAtStart) {
  job_config c = faulty_job(2, {});
  c.cluster.min_devices = 3;
  Engine engine(c);
  try {
    engine.start();
    FAIL() << "a run that could never train was started";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("cluster.min_devices = 3 but the run starts with 2 replicas"), std::string::npos)
        << e.what();
  }
}

TEST_P(Faults, AReplicaThatCarriesOtherStateIntoAStepIsNamed) {
  // perturb:1@5 flips a bit of cpu:1's first parameter before step 5. That
  // element is rank 0's part of the update, so the step's gather would make
  // the replicas equal again: only the state carried into the step shows it.
  job_config c = faulty_job(2, {"perturb:1@5"});
  try {
    run_recorded(c);
    FAIL() << "a corrupted replica went unnoticed";
  } catch (const training_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("replicas diverged"), std::string::npos) << what;
    EXPECT_NE(what.find("into step 5 "), std::string::npos) << what;
    EXPECT_NE(what.find("cpu:0"), std::string::npos) << what;
    EXPECT_NE(what.find("cpu:1"), std::string::npos) << what;
  }
}

TEST_P(Numerics, ADivergingRunStopsAtTheFirstNonFiniteLossNamingTheStep) {
  job_config c = faulty_job(2, {});
  c.optimizer.lr = 1e6;
  try {
    run_recorded(c);
    FAIL() << "a run with lr = 1e6 ended without an error";
  } catch (const training_error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(std::regex_search(what, std::regex("^training stopped: step [0-9]+: the loss is (nan|inf)"))) << what;
    EXPECT_NE(what.find("lower optimizer.lr"), std::string::npos) << what;
  }
}

TEST_P(Faults, AddAndRemoveDevicesFromAnotherThread) {
  job_config c = testing::small_job(testing::current_kind(), 2, 32, 4096);
  c.train.epochs = 1000;
  c.train.verify_replicas = true;
  // This test is about joins and leaves: a step slowed past the default hang
  // timeout (1 s) on a loaded machine made a fault generation in between
  // (seen once in `ctest --repeat until-fail:10 --parallel 4` while a build ran).
  c.cluster.hang_timeout_s = 60;
  std::mutex m;
  std::condition_variable changed;
  std::vector<membership_event> memberships;
  Engine engine(c);
  engine.on_event([&](const event& e) {
    std::lock_guard lock(m);
    if (const auto* x = std::get_if<membership_event>(&e)) memberships.push_back(*x);
    changed.notify_all();
  });
  engine.start();
  std::string added;
  std::thread operator_thread([&] {
    added = engine.add_device();
    engine.remove_device("cpu:0");
  });
  operator_thread.join();
  EXPECT_EQ(added, "cpu:2");
  // Wait for the removal to take effect (a generous bound: a run that failed
  // meanwhile shows its error at wait()), then stop.
  {
    std::unique_lock lock(m);
    changed.wait_for(lock, std::chrono::seconds(60), [&] { return memberships.size() >= 3; });
  }
  engine.stop();
  engine.wait();
  ASSERT_GE(memberships.size(), 3u);
  EXPECT_EQ(memberships[1].members, (std::vector<std::string>{"cpu:0", "cpu:1", "cpu:2"}));
  EXPECT_NE(memberships[1].reason.find("cpu:2 joined"), std::string::npos);
  EXPECT_EQ(memberships[2].members, (std::vector<std::string>{"cpu:1", "cpu:2"}));
  EXPECT_NE(memberships[2].reason.find("cpu:0 left"), std::string::npos);
}

TEST_P(Faults, AFaultEvery50StepsKeepsTheLedgerAndTheAccuracy) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (scripts/setup installs it)";
  job_config c = load_job_config(std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg");
  c.train.epochs = 1;
  c.train.checkpoint_dir = "";
  c.cluster.cpus = 2;
  c.straggler.policy = straggler_policy::none;
  c.train.record_trained = true;
  const recorded_run clean = run_recorded(c);
  // One epoch is 469 steps: a device fails every 50 steps and a new one joins
  // right after, nine times over.
  for (int k = 1; k <= 9; ++k) {
    c.faults.inject.push_back("fail:" + std::to_string(k - 1) + "@" + std::to_string(50 * k));
    c.faults.inject.push_back("join:cpu@" + std::to_string(50 * k + 1));
  }
  // Devices 0 and 1 start; joins become cpu:2, cpu:3, ...: the k-th failure
  // hits cpu:(k-1), which is a member by then.
  const recorded_run faulty = run_recorded(c);
  EXPECT_EQ(faulty.summary.membership_changes, 18);
  ASSERT_EQ(faulty.epochs.size(), 1u);
  EXPECT_EQ(faulty.epochs[0].samples, 60000) << "the ledger's count";
  EXPECT_EQ(faulty.trained->check(60000, 1), "") << "the devices' account";
  EXPECT_GT(faulty.epochs[0].requeued, 0);
  EXPECT_NEAR(faulty.summary.test_accuracy, clean.summary.test_accuracy, 0.01);
}

// See Note [A record before the exchange across processes]: the local
// backend under a group that says its ranks live in several processes and
// whose rank 0 fails its `fail_at`-th step call after the call has ended on
// every rank, as when a worker dies between its sends to two peers. The
// other members apply the step; rank 0 does not.
class ends_elsewhere_group final : public collective_group {
  struct endpoint final : collective {
    endpoint(std::unique_ptr<collective> inner, std::shared_ptr<collective_group> group,
             std::shared_ptr<std::atomic<int>> calls, int fail_at)
        : inner_(std::move(inner)), group_(std::move(group)), calls_(std::move(calls)), fail_at_(fail_at) {}
    int rank() const noexcept override { return inner_->rank(); }
    int size() const noexcept override { return inner_->size(); }
    void all_reduce_sum(std::span<float> d, const collective_options& o) override { inner_->all_reduce_sum(d, o); }
    std::pair<std::size_t, std::size_t> chunk(std::size_t n, int r) const noexcept override { return inner_->chunk(n, r); }
    void reduce_scatter_sum(std::span<float> d, const collective_options& o) override { inner_->reduce_scatter_sum(d, o); }
    void all_gather(std::span<const std::span<float>> b, const collective_options& o) override { inner_->all_gather(b, o); }
    void broadcast(std::span<float> d, int root, const collective_options& o) override { inner_->broadcast(d, root, o); }
    void reduce_scatter_tree(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                             const collective_options& o) override {
      inner_->reduce_scatter_tree(slices, parts, out, o);
    }
    void barrier(const collective_options& o) override { inner_->barrier(o); }
    // Every member gathers the reduced gradients: the step's one call is its last.
    bool gathers_gradients() const noexcept override { return true; }
    bool all_reduce_tree(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                         std::span<float> header, const std::function<bool(std::span<const float>)>& proceed,
                         const collective_options& header_options, const collective_options& options) override {
      const bool proceeded = inner_->all_reduce_tree(slices, parts, out, header, proceed, header_options, options);
      if (rank() == 0 && calls_->fetch_add(1) + 1 == fail_at_) {
        group_->abort();  // as a failed Gloo call does: the others' next call fails too
        throw collective_error(collective_errc::aborted, "lost a peer after the others had the step (test)");
      }
      return proceeded;
    }
    std::unique_ptr<collective> inner_;
    std::shared_ptr<collective_group> group_;
    std::shared_ptr<std::atomic<int>> calls_;
    int fail_at_;
  };

 public:
  ends_elsewhere_group(int members, std::shared_ptr<std::atomic<int>> calls, int fail_at)
      : inner_(make_local_group(members)), calls_(std::move(calls)), fail_at_(fail_at) {}
  int size() const noexcept override { return inner_->size(); }
  std::unique_ptr<collective> endpoint(int rank) override {
    return std::make_unique<struct endpoint>(inner_->endpoint(rank), inner_, calls_, fail_at_);
  }
  void abort() override { inner_->abort(); }
  bool aborted() const noexcept override { return inner_->aborted(); }
  bool spans_processes() const noexcept override { return true; }

 private:
  std::shared_ptr<collective_group> inner_;
  std::shared_ptr<std::atomic<int>> calls_;
  int fail_at_;
};

TEST(FaultsAcrossProcesses, AStepThatEndedOnlyOnTheOtherMembersKeepsTheRecordOfTheMemberWhoseCallFailed) {
  job_config c = testing::faulty_job(3, {}, testing::replica_kind::mlp);
  c.straggler.policy = straggler_policy::none;  // every member trains its own slices,
  c.train.micro_batch = 16;                      // one or two of a step's four
  auto calls = std::make_shared<std::atomic<int>>(0);
  run_options o;
  o.collective_backend = [calls](int members) { return std::make_shared<ends_elsewhere_group>(members, calls, 20); };
  const testing::recorded_run r = testing::run_recorded(c, o);
  ASSERT_GE(calls->load(), 20) << "rank 0 never reached its 20th step call";
  ASSERT_GE(r.memberships.size(), 2u);
  EXPECT_EQ(r.memberships[1].step, 20) << "step 20, which the others applied, is committed ("
                                       << r.memberships[1].reason << ")";
  ASSERT_EQ(r.epochs.size(), 3u);
  for (const auto& e : r.epochs) EXPECT_EQ(e.samples, 1024) << "epoch " << e.epoch << ": the ledger's count";
  testing::expect_exactly_once(r);
  EXPECT_EQ(r.trained->members_of(19).size(), 3u) << "every member's record of step 20";
}

DPACTOR_ON_BOTH_REPLICAS(Faults);
DPACTOR_ON_BOTH_REPLICAS(Numerics);

}  // namespace
}  // namespace dpactor
