// The reproducible step of the GPU path, on CPU replicas (See Note [The tree
// on a device]). The emulated asynchronous backend (tests/emulated_backend,
// the driver-group logic the nccl backend runs on) moves the tree's parts
// and evaluates the tree with evaluate_tree_element, the function the GPU
// kernel runs for each element. The final bytes must be the local
// backend's, for any number of replicas and with a member that fails, and
// every step's tree must go through the driver's tree call.

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <bit>
#include <cmath>
#include <random>

#include "comms/local.hpp"
#include "comms/summation_tree.hpp"
#include "data/synthetic.hpp"
#include "tensors/cpu_replica.hpp"
#include "train/step_runner.hpp"
#include "tests/emulated_backend.hpp"
#include "tests/recorded_run.hpp"
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

TEST(DeviceTree, TheElementProgramGivesTheBytesOfTheHostPlan) {
  std::mt19937_64 gen(32);
  for (int round = 0; round < 200; ++round) {
    const std::size_t slices = std::uniform_int_distribution<std::size_t>(1, 40)(gen);
    const summation_tree tree(slices);
    // Random ownership over up to 5 members, each contributing the largest
    // complete nodes of its slices (as tree_builder leaves them).
    const std::size_t members = std::uniform_int_distribution<std::size_t>(1, 5)(gen);
    std::vector<std::vector<std::uint8_t>> owned(members, std::vector<std::uint8_t>(slices, 0));
    for (std::size_t s = 0; s < slices; ++s) owned[gen() % members][s] = 1;
    std::vector<std::uint32_t> parts;
    for (const auto& o : owned)
      for (const std::uint32_t node : tree.cover(o)) parts.push_back(node);
    std::shuffle(parts.begin(), parts.end(), gen);
    const std::size_t n = std::uniform_int_distribution<std::size_t>(1, 1500)(gen);
    // Values of many magnitudes, so that the order of additions shows.
    std::vector<std::vector<float>> values(parts.size(), std::vector<float>(n));
    std::vector<const float*> data;
    for (auto& v : values) {
      for (float& x : v)
        x = std::ldexp(std::uniform_real_distribution<float>(-1.0f, 1.0f)(gen),
                       std::uniform_int_distribution<int>(-20, 20)(gen));
      data.push_back(v.data());
    }
    tree_plan plan;
    plan.build(tree, parts);
    std::vector<float> host(n), element(n);
    plan.run(data.data(), 0, n, host.data());
    for (std::size_t i = 0; i < n; ++i)
      element[i] = evaluate_tree_element(plan.steps().data(), plan.steps().size(), data.data(), i);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(element[i]), std::bit_cast<std::uint32_t>(host[i]))
          << "round " << round << ", " << slices << " slices, " << parts.size() << " parts, element " << i << ": "
          << element[i] << " against " << host[i];
  }
}

// A CPU replica that counts the calls a GPU replica must serve on its
// device: the tree's additions and the non-finite counts over the nodes.
class counting_replica final : public replica {
 public:
  counting_replica(const mlp_spec& spec, std::size_t micro) : inner_(spec, optimizer_config{}, micro) {}
  int adds = 0, counts = 0;

  void add_gradients(std::span<float> into, std::span<const float> from) override {
    ++adds;
    inner_.add_gradients(into, from);
  }
  std::int64_t count_nonfinite_in(std::span<const float> values) override {
    ++counts;
    return inner_.count_nonfinite_in(values);
  }
  const state_layout& layout() const noexcept override { return inner_.layout(); }
  std::size_t max_rows() const noexcept override { return inner_.max_rows(); }
  void zero_grad() override { inner_.zero_grad(); }
  using replica::accumulate;
  batch_stats accumulate(const batch_ref& rows, gradient_listener* l) override { return inner_.accumulate(rows, l); }
  batch_stats evaluate(const batch_ref& rows) override { return inner_.evaluate(rows); }
  double samples() const override { return inner_.samples(); }
  batch_stats accumulate_slice(const batch_ref& rows, std::span<float> grads) override {
    return inner_.accumulate_slice(rows, grads);
  }
  std::span<float> scratch_gradients(std::size_t i) override { return inner_.scratch_gradients(i); }
  bool computes_slices() const noexcept override { return true; }
  std::span<float> gradients() override { return inner_.gradients(); }
  void apply_update(double lr, double total, std::size_t b, std::size_t e) override { inner_.apply_update(lr, total, b, e); }
  std::span<const std::span<float>> state_sections() override { return inner_.state_sections(); }
  void finish_step() override { inner_.finish_step(); }
  void update_in_place(double lr, double total) override { inner_.update_in_place(lr, total); }
  void skip_step() override { inner_.skip_step(); }
  std::span<float> state_buffer() override { return inner_.state_buffer(); }
  std::int64_t optimizer_steps() const override { return inner_.optimizer_steps(); }
  std::vector<float> export_state() const override { return inner_.export_state(); }
  void import_state(std::span<const float> state) override { inner_.import_state(state); }
  void copy_parameters(std::span<float> out) const override { inner_.copy_parameters(out); }
  std::uint64_t state_checksum() const override { return inner_.state_checksum(); }

 private:
  cpu_replica inner_;
};

// See Note [The tree on a device]: a GPU replica's slice buffers are device
// memory, so the step runner adds tree nodes and counts their non-finite
// values through the replica, never on the host itself.
TEST(DeviceTree, TheStepRunnerAddsTreeNodesThroughTheReplica) {
  const mlp_spec spec{{16, 32, 4}, activation::relu, loss_kind::cross_entropy};
  counting_replica model(spec, 16);
  const dataset train = make_synthetic({64, 16, 4, 0.5f, 3, 0});
  auto group = make_local_group(1);
  auto comm = group->endpoint(0);
  step_runner runner(0, {}, 1, 2.0, 0.001);
  device_control control;
  step_shard shard;
  shard.indices.resize(64);
  std::iota(shard.indices.begin(), shard.indices.end(), 0u);
  shard.slice_rows = 16;  // four slices, all this member's: three additions make the root
  shard.last_slice = 4;
  const auto c = runner.compute_slices(shard, model, train, control, *group);
  EXPECT_EQ(model.adds, 3);
  runner.synchronize(c, 0, model, *comm, {}, nullptr, lr_schedule{});
  EXPECT_EQ(model.counts, 1) << "the non-finite count over the one node held";
  EXPECT_EQ(model.optimizer_steps(), 1);
}

// small_job at batch 64 in slices of 16: four slices a step over 1, 2 or 3
// members, so members hold one, two or uneven nodes.
job_config tree_job(int replicas, const std::filesystem::path& dir, std::vector<std::string> faults = {}) {
  job_config c = testing::faulty_job(replicas, std::move(faults), testing::replica_kind::mlp);
  c.train.epochs = 2;
  c.train.micro_batch = 16;
  c.train.reproducible = true;
  c.train.checkpoint_dir = dir.string();
  return c;
}

void expect_same_files(const std::filesystem::path& a, const std::filesystem::path& b, const std::string& what) {
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const auto x = testing::tensor_bytes(a / file), y = testing::tensor_bytes(b / file);
    ASSERT_EQ(x.size(), y.size()) << what << ": " << file;
    for (std::size_t t = 0; t < x.size(); ++t)
      EXPECT_TRUE(x[t] == y[t]) << what << ": " << file << ", tensor " << x[t].first << " differs";
  }
}

std::int64_t tree_calls(testing::emulated_log& log) {
  std::lock_guard lock(log.mutex);
  return std::count_if(log.calls.begin(), log.calls.end(), [](const auto& c) { return c.first == 't'; });
}

TEST(DeviceTree, ReproducibleStepsOnTheAsynchronousBackendGiveTheLocalBackendsBytes) {
  testing::scratch_dir dir;
  const testing::recorded_run local = testing::run_recorded(tree_job(1, dir / "local"));
  ASSERT_EQ(local.summary.steps, 32);
  for (const int replicas : {1, 2, 3}) {
    auto log = std::make_shared<testing::emulated_log>();
    run_options o;
    o.collective_backend = testing::emulated_backend(log);
    const std::string name = std::to_string(replicas) + "-replicas";
    const testing::recorded_run r = testing::run_recorded(tree_job(replicas, dir / name), o);
    EXPECT_EQ(r.summary.steps, 32) << name;
    expect_same_files(local.summary.checkpoint, r.summary.checkpoint, name);
    EXPECT_EQ(tree_calls(*log), 32) << name << ": each step's tree through the driver's tree call";
  }
}

TEST(DeviceTree, AFailedMemberOnTheAsynchronousBackendLeavesTheBytesOfAQuietRun) {
  testing::scratch_dir dir;
  const testing::recorded_run quiet = testing::run_recorded(tree_job(1, dir / "quiet"));
  auto log = std::make_shared<testing::emulated_log>();
  run_options o;
  o.collective_backend = testing::emulated_backend(log);
  const testing::recorded_run r = testing::run_recorded(tree_job(3, dir / "failed", {"fail:1@10"}), o);
  EXPECT_EQ(r.recoveries.size(), 1u);
  expect_same_files(quiet.summary.checkpoint, r.summary.checkpoint, "a member failed at step 10");
  testing::expect_exactly_once(r, 2);
}

}  // namespace
}  // namespace dpactor
