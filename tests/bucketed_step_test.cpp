// The GPU path's step on CPU replicas (See Note [Gradient buckets]): an
// asynchronous backend (tests/emulated_backend.hpp, the driver-group logic
// NCCL runs on) makes the step runner start gradient buckets during the
// backward pass of a shard's last micro-batch, the header after them, and
// all-gather bucket by bucket. The arithmetic must stay that of the global
// batch, the replicas bitwise identical, and faults, hangs and cuts must work
// although the backend cannot name the late members.

#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <numeric>

#include <dpactor/engine.hpp>
#include "train/step_runner.hpp"
#include "comms/local.hpp"
#include "data/synthetic.hpp"
#include "tensors/cpu_replica.hpp"
#include "tensors/safetensors.hpp"
#include "tests/emulated_backend.hpp"
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

// Bytes of small_job's MLP 16-32-4: 0.weight 2048, 0.bias 128, 2.weight 512,
// 2.bias 16. These limits give three buckets: {2.bias}, {2.weight, 0.bias},
// {0.weight}.
constexpr bucket_limits small_buckets{16, 600};
constexpr double mib = 1 << 20;

const mlp_spec small_spec{{16, 32, 4}, activation::relu, loss_kind::cross_entropy};

std::vector<std::pair<char, std::size_t>> calls(testing::emulated_log& log) {
  std::lock_guard lock(log.mutex);
  return log.calls;
}

// One member on its own: a shard of 40 rows in micro-batches of 16.
struct lone_member {
  explicit lone_member(std::shared_ptr<collective_group> g)
      : group(std::move(g)), comm(group->endpoint(0)), model(small_spec, optimizer_config{}, 16),
        train(make_synthetic({64, 16, 4, 0.5f, 3, 0})), runner(0, {}, 1, 2.0, 0.001, small_buckets) {
    std::vector<float> state = model.export_state();
    init_mlp_parameters(small_spec, state, 11);
    model.import_state(state);
    shard.indices.resize(40);
    std::iota(shard.indices.begin(), shard.indices.end(), 0u);
  }
  void step() {
    const auto c = runner.compute(shard, model, train, control, *group, comm.get());
    started_in_backward = runner.buckets_started_in_backward();
    runner.synchronize(c, shard.indices.size() - c.done, model, *comm, {}, nullptr, lr_schedule{});
    ++shard.step;
  }
  std::shared_ptr<collective_group> group;
  std::unique_ptr<collective> comm;
  cpu_replica model;
  dataset train;
  step_runner runner;
  device_control control;
  step_shard shard;
  std::size_t started_in_backward = 0;
};

TEST(BucketedStep, BucketsStartDuringTheLastMicroBatchAndTheHeaderFollows) {
  auto log = std::make_shared<testing::emulated_log>();
  lone_member bucketed(testing::emulated_backend(log)(1));
  lone_member plain(make_local_group(1));
  const auto buckets = bucketed.runner.buckets(bucketed.model);
  ASSERT_EQ(buckets.size(), 3u);
  for (int s = 0; s < 3; ++s) {
    bucketed.step();
    plain.step();
    EXPECT_EQ(bucketed.started_in_backward, 3u) << "step " << s << ": every bucket started during backward";
  }
  // Per step: the three buckets last layer first, then the header. A member
  // alone gathers nothing (it updates in place); the bucket-wise all-gather of
  // several members is counted in the engine test below.
  const auto log_calls = calls(*log);
  ASSERT_EQ(log_calls.size(), 3u * 4u);
  for (std::size_t s = 0; s < 3; ++s) {
    for (std::size_t b = 0; b < 3; ++b)
      EXPECT_EQ(log_calls[4 * s + b], (std::pair<char, std::size_t>{'r', buckets[b].size()}));
    EXPECT_EQ(log_calls[4 * s + 3], (std::pair<char, std::size_t>{'r', h_members + 3}));
  }
  EXPECT_EQ(bucketed.model.export_state(), plain.model.export_state())
      << "bucket by bucket, the update is bitwise the whole-buffer one";
}

TEST(BucketedStep, ACutShardStartsItsBucketsAfterBackwardInTheSameOrder) {
  auto log = std::make_shared<testing::emulated_log>();
  lone_member m(testing::emulated_backend(log)(1));
  m.control.cut_step = 0;  // cut before the first micro-batch: backward never runs
  m.step();
  EXPECT_EQ(m.started_in_backward, 0u);
  const auto log_calls = calls(*log);
  ASSERT_EQ(log_calls.size(), 4u);
  const auto buckets = m.runner.buckets(m.model);
  for (std::size_t b = 0; b < 3; ++b) EXPECT_EQ(log_calls[b], (std::pair<char, std::size_t>{'r', buckets[b].size()}));
  EXPECT_EQ(m.model.optimizer_steps(), 1);
}

// Engine runs on the emulated backend (or the local one, for reference).
struct recorded_run {
  run_summary summary;
  std::vector<membership_event> memberships;
  std::vector<epoch_event> epochs;
  std::vector<float> params;
};

recorded_run run(job_config c, std::shared_ptr<testing::emulated_log> log) {
  recorded_run r;
  std::mutex m;
  c.cluster.first_bucket_mb = static_cast<double>(small_buckets.first_bytes) / mib;
  c.cluster.bucket_cap_mb = static_cast<double>(small_buckets.cap_bytes) / mib;
  run_options o;
  if (log) o.collective_backend = testing::emulated_backend(log);
  Engine engine(std::move(c), std::move(o));
  engine.on_event([&](const event& e) {
    std::lock_guard lock(m);
    if (const auto* x = std::get_if<membership_event>(&e)) r.memberships.push_back(*x);
    if (const auto* x = std::get_if<epoch_event>(&e)) r.epochs.push_back(*x);
  });
  engine.start();
  r.summary = engine.wait();
  if (!r.summary.checkpoint.empty())
    for (const auto& t : load_safetensors(std::filesystem::path(r.summary.checkpoint) / "model.safetensors").tensors)
      r.params.insert(r.params.end(), t.values.begin(), t.values.end());
  return r;
}

job_config equivalence_job(int replicas, const std::filesystem::path& dir) {
  job_config c = testing::small_job(replicas, 64, 1000);
  c.train.epochs = 10;
  c.train.max_steps = 50;
  c.train.micro_batch = 16;  // shards span several micro-batches
  c.train.verify_replicas = true;
  c.train.reproducible = false;  // buckets overlap backward only then
  c.train.checkpoint_dir = dir.string();
  return c;
}

TEST(BucketedStep, ReplicasOnTheAsynchronousBackendFollowOneReplicaOnTheWholeBatch) {
  testing::scratch_dir dir;
  const recorded_run one = run(equivalence_job(1, dir / "one"), nullptr);
  for (const int replicas : {2, 3}) {  // 64 = 22 + 21 + 21; the last batch of an epoch 14 + 13 + 13
    auto log = std::make_shared<testing::emulated_log>();
    const recorded_run r = run(equivalence_job(replicas, dir / (std::to_string(replicas) + "-replicas")), log);
    EXPECT_EQ(r.summary.steps, 50);
    ASSERT_EQ(r.params.size(), one.params.size());
    EXPECT_LE(testing::relative_difference(r.params, one.params), 1e-5) << replicas << " replicas";
    // Each of the 50 steps reduced the three buckets (and a header) and
    // gathered (parameters, momentum) x 3 buckets in one call.
    const state_layout l = make_state_layout(small_spec, optimizer_config{});
    const auto log_calls = calls(*log);
    for (const auto& b : plan_gradient_buckets(l.layout, l.parameter_tensors, l.parameter_size, small_buckets))
      EXPECT_EQ(std::count(log_calls.begin(), log_calls.end(), std::pair<char, std::size_t>{'r', b.size()}), 50)
          << "bucket [" << b.begin << ", " << b.end << ")";
    EXPECT_EQ(std::count(log_calls.begin(), log_calls.end(), std::pair<char, std::size_t>{'g', 6}), 50);
  }
}

job_config faulty_job(int replicas, std::vector<std::string> faults) {
  job_config c = testing::small_job(replicas, 64, 1024);
  c.train.epochs = 3;
  c.train.verify_replicas = true;
  c.train.reproducible = false;  // buckets overlap backward only then
  c.cluster.hang_timeout_s = 30;  // no fault generation from a loaded machine; the hang test sets its own
  c.faults.inject = std::move(faults);
  return c;
}

TEST(BucketedStep, LateMembersAreCutThoughTheBackendCannotNameThem) {
  // cpu:1 is delayed 200 ms on every step: the reducer must infer that it is
  // the one missing from the members that said they are waiting.
  job_config c = faulty_job(2, {"jitter:1:1.0:200"});
  c.straggler.policy = straggler_policy::cut;
  // 1.1 x the median compute time, and 200 ms late: past the deadline
  // however slow a loaded machine makes the step, with time for the cut to
  // reach the member (the delay ends at the cut, so a cut step stays short).
  // At 30 ms and 1.5 a 2-core machine running four tests at once often cut
  // nobody.
  c.straggler.deadline_factor = 1.1;
  c.train.epochs = 1;
  const recorded_run r = run(c, std::make_shared<testing::emulated_log>());
  ASSERT_EQ(r.epochs.size(), 1u);
  EXPECT_EQ(r.epochs[0].samples, 1024) << "nothing dropped";
  EXPECT_GT(r.summary.cuts, 0);
  EXPECT_GT(r.epochs[0].requeued, 0);
}

TEST(BucketedStep, AFailedMemberIsReplacedByTheNextGeneration) {
  auto log = std::make_shared<testing::emulated_log>();
  const recorded_run r = run(faulty_job(3, {"fail:1@20"}), log);
  ASSERT_EQ(r.memberships.size(), 2u);
  EXPECT_EQ(r.memberships[1].members, (std::vector<std::string>{"cpu:0", "cpu:2"}));
  EXPECT_EQ(r.memberships[1].step, 19) << "step 20's update was never applied";
  for (const auto& e : r.epochs) EXPECT_EQ(e.samples, 1024) << "epoch " << e.epoch << ": every sample exactly once";
  EXPECT_EQ(r.summary.steps, 48);
  EXPECT_EQ(log->groups, 2);
}

TEST(BucketedStep, AHungMemberIsNamedFromTheOthersLateReports) {
  job_config c = faulty_job(2, {"hang:1@10"});
  c.cluster.hang_timeout_s = 0.5;
  const recorded_run r = run(c, std::make_shared<testing::emulated_log>());
  const auto hung = std::find_if(r.memberships.begin(), r.memberships.end(),
                                 [](const auto& m) { return m.reason.find("cpu:1 hung") != std::string::npos; });
  ASSERT_NE(hung, r.memberships.end()) << "the waiting member's empty late list still names cpu:1";
  EXPECT_EQ(hung->members, std::vector<std::string>{"cpu:0"});
  EXPECT_EQ(hung->step, 9);
  for (const auto& e : r.epochs) EXPECT_EQ(e.samples, 1024);
}

}  // namespace
}  // namespace dpactor
