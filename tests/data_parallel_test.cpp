// Data-parallel equivalence through the whole engine, without
// train.reproducible (its bitwise equality is tests/reproducible_test.cpp's):
// N replicas on shards of the global batch, split sample by sample, must
// follow one replica on the whole batch to float rounding, and the replicas
// must stay bitwise identical after every step (train.verify_replicas makes
// the reducer compare parameter checksums of all members at every step and
// fail the run on any difference).

#include <gtest/gtest.h>

#include <cmath>

#include "config/config_file.hpp"
#include <dpactor/engine.hpp>
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

// Trains and returns every parameter of the final checkpoint, in order.
std::vector<float> train(int replicas, std::int64_t batch, optimizer_kind opt, const std::filesystem::path& dir) {
  job_config c = testing::small_job(replicas, batch, 1000);
  c.train.epochs = 10;
  c.train.max_steps = 50;
  c.train.micro_batch = 16;  // shards span several micro-batches
  c.train.verify_replicas = true;
  c.train.reproducible = false;  // shards of any size, summed in rank order
  c.train.checkpoint_dir = dir.string();
  c.optimizer.kind = opt;
  if (opt == optimizer_kind::adamw) c.optimizer.lr = 1e-3;
  Engine engine(c);
  engine.start();
  const run_summary s = engine.wait();
  EXPECT_EQ(s.steps, 50);
  return testing::checkpoint_parameters(s.checkpoint);
}

TEST(DataParallel, TwoReplicasMatchOneOnTheWholeBatch) {
  testing::scratch_dir dir;
  const auto one = train(1, 64, optimizer_kind::sgd, dir / "one");
  const auto two = train(2, 64, optimizer_kind::sgd, dir / "two");
  ASSERT_EQ(one.size(), two.size());
  EXPECT_NE(one, train(1, 32, optimizer_kind::sgd, dir / "other")) << "the comparison can tell runs apart";
  EXPECT_LE(testing::relative_difference(two, one), 1e-5);
}

TEST(DataParallel, ThreeReplicasWithAnUnevenBatchMatchOne) {
  testing::scratch_dir dir;
  // 64 = 22 + 21 + 21 per step; the last batch of each epoch (1000 % 64 = 40) splits 14 + 13 + 13.
  const auto one = train(1, 64, optimizer_kind::sgd, dir / "one");
  const auto three = train(3, 64, optimizer_kind::sgd, dir / "three");
  EXPECT_LE(testing::relative_difference(three, one), 1e-5);
}

TEST(DataParallel, HoldsForAdamW) {
  testing::scratch_dir dir;
  const auto one = train(1, 64, optimizer_kind::adamw, dir / "one");
  const auto two = train(2, 64, optimizer_kind::adamw, dir / "two");
  EXPECT_LE(testing::relative_difference(two, one), 1e-5);
}

TEST(DataParallel, MoreReplicasThanSamplesInAStep) {
  // Global batch 2 on 3 replicas: one member gets an empty shard every step
  // and still joins the all-reduce.
  testing::scratch_dir dir;
  const auto one = train(1, 2, optimizer_kind::sgd, dir / "one");
  const auto three = train(3, 2, optimizer_kind::sgd, dir / "three");
  EXPECT_LE(testing::relative_difference(three, one), 1e-5);
}

TEST(FashionMnist, OneEpochOfTheDefaultJobLearns) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed (scripts/setup installs it)";
  job_config c = load_job_config(std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg");
  c.train.epochs = 1;
  c.train.checkpoint_dir = "";
  c.cluster.cpus = 2;
  Engine engine(c);
  engine.start();
  const run_summary s = engine.wait();
  EXPECT_EQ(s.epochs, 1);
  EXPECT_EQ(s.samples, 60000);
  EXPECT_GE(s.test_accuracy, 0.80) << "one epoch of SGD reaches about 0.83";
}

}  // namespace
}  // namespace dpactor
