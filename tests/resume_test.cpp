// Resuming from a checkpoint continues bit-exactly: the final parameters
// and optimizer state equal those of a run that never stopped, on both
// replica kinds.

#include <gtest/gtest.h>

#include <dpactor/engine.hpp>
#include <dpactor/error.hpp>
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

namespace fs = std::filesystem;

// Every test runs on both replica kinds (tests/test_support.hpp).
class Resume : public testing::both_replicas {};

// 1000 samples at batch 64: 16 steps per epoch, the last one partial (40).
job_config resumable_job(const fs::path& dir) {
  job_config c = testing::small_job(testing::current_kind(), 2, 64, 1000);
  c.train.epochs = 2;
  c.train.checkpoint_dir = dir.string();
  c.train.keep_checkpoints = 0;
  c.schedule.kind = schedule_kind::cosine;
  c.schedule.total_steps = 32;  // the schedule spans both epochs in every run below
  return c;
}

run_summary run(job_config c, run_options o = {}) {
  Engine engine(std::move(c), std::move(o));
  engine.start();
  return engine.wait();
}

void expect_same_files(const fs::path& a, const fs::path& b) {
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const auto ta = testing::tensor_bytes(a / file), tb = testing::tensor_bytes(b / file);
    ASSERT_EQ(ta.size(), tb.size()) << file;
    for (std::size_t i = 0; i < ta.size(); ++i) {
      EXPECT_EQ(ta[i].first, tb[i].first);
      EXPECT_TRUE(ta[i].second == tb[i].second) << file << ": tensor " << ta[i].first << " differs";
    }
  }
}

TEST_P(Resume, OneEpochThenOneMoreEqualsTwoStraight) {
  testing::scratch_dir dir;
  const run_summary straight = run(resumable_job(dir / "straight"));
  EXPECT_EQ(straight.steps, 32);

  job_config first = resumable_job(dir / "split");
  first.train.max_steps = 16;  // stop after epoch 1
  const run_summary half = run(first);
  EXPECT_EQ(half.steps, 16);
  const run_summary resumed = run(resumable_job(dir / "split"), testing::resume_from(dir / "split"));
  EXPECT_EQ(resumed.steps, 32);
  EXPECT_EQ(resumed.samples, 1000) << "only the second epoch was trained";
  expect_same_files(straight.checkpoint, resumed.checkpoint);
}

TEST_P(Resume, MidEpochWithStepsInFlightIsBitExact) {
  testing::scratch_dir dir;
  const run_summary straight = run(resumable_job(dir / "straight"));
  for (std::int64_t stop_at : {5, 15, 21}) {
    SCOPED_TRACE(stop_at);
    const fs::path split = dir / ("split" + std::to_string(stop_at));
    job_config first = resumable_job(split);
    first.train.max_steps = stop_at;
    run(first);
    const run_summary resumed = run(resumable_job(split), testing::resume_from(split));
    EXPECT_EQ(resumed.steps, 32);
    expect_same_files(straight.checkpoint, resumed.checkpoint);
  }
}

TEST_P(Resume, FromAPeriodicCheckpointOfAnUninterruptedRun) {
  testing::scratch_dir dir;
  job_config c = resumable_job(dir / "periodic");
  c.train.checkpoint_every = 7;
  const run_summary straight = run(c);
  EXPECT_TRUE(fs::exists(dir / "periodic" / "step-00000007"));
  EXPECT_TRUE(fs::exists(dir / "periodic" / "step-00000028"));
  job_config again = resumable_job(dir / "again");
  const run_summary resumed = run(again, testing::resume_from(dir / "periodic" / "step-00000021"));
  EXPECT_EQ(resumed.steps, 32);
  expect_same_files(straight.checkpoint, resumed.checkpoint);
}

TEST_P(Resume, InitFromLoadsWeightsWithAFreshOptimizer) {
  testing::scratch_dir dir;
  const run_summary trained = run(resumable_job(dir / "a"));
  job_config c = resumable_job(dir / "b");
  c.train.max_steps = 1;
  const run_summary one = run(c, testing::init_from(fs::path(trained.checkpoint) / "model.safetensors"));
  EXPECT_EQ(one.steps, 1) << "the step counter starts again";
  EXPECT_GT(one.test_accuracy, 0.5) << "it starts from the trained weights";
}

TEST_P(Resume, ADifferentSeedIsRefused) {
  testing::scratch_dir dir;
  job_config c = resumable_job(dir / "a");
  c.train.max_steps = 3;
  run(c);
  job_config other = resumable_job(dir / "a");
  other.train.seed = 7;
  Engine engine(other, testing::resume_from(dir / "a"));
  EXPECT_THROW(engine.start(), config_error);
}

DPACTOR_ON_BOTH_REPLICAS(Resume);

}  // namespace
}  // namespace dpactor
