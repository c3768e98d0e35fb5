// Numerical guards: a step with NaN or infinite values is applied by no
// replica; "stop" ends the run with an error naming the step and leaves a
// finite newest checkpoint, "skip" drops the step and trains on (See Note
// [Non-finite steps]). Non-finite inputs and initial weights are refused.

#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <limits>
#include <regex>
#include <string>

#include <dpactor/engine.hpp>
#include "data/loading.hpp"
#include <dpactor/error.hpp>
#include "tensors/finite_check.hpp"
#include "tensors/safetensors.hpp"
#include "test_support.hpp"
#include "train/checkpoint.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;

// The engine's guards run on both replica kinds (tests/test_support.hpp).
class NonFinite : public testing::both_replicas {};

// 1024 samples at batch 64: 16 steps per epoch.
job_config guarded_job(int replicas, const std::filesystem::path& checkpoints) {
  job_config c = testing::small_job(testing::current_kind(), replicas, 64, 1024);
  c.train.epochs = 2;
  c.train.verify_replicas = true;  // a replica that applied the step would differ
  c.train.checkpoint_dir = checkpoints.string();
  c.train.keep_checkpoints = 0;
  c.cluster.hang_timeout_s = 30;
  return c;
}

std::string run_for_error(job_config c, run_summary* summary = nullptr) {
  Engine engine(std::move(c));
  engine.start();
  try {
    const run_summary s = testing::wait_or_exit(engine, 120s, "a guarded run");
    if (summary) *summary = s;
  } catch (const training_error& e) {
    return e.what();
  }
  return "";
}

loaded_checkpoint newest(const std::filesystem::path& dir, const job_config& c) {
  return read_checkpoint(dir, make_state_layout(c.model, c.optimizer));  // verifies checksums and finiteness
}

std::vector<float> parameters(const loaded_checkpoint& ckpt, const job_config& c) {
  const state_layout l = make_state_layout(c.model, c.optimizer);
  return {ckpt.state.begin(), ckpt.state.begin() + static_cast<std::ptrdiff_t>(l.layout.size())};
}

TEST_P(NonFinite, ANaNGradientStopsTheRunAtItsStepWithTheStepBeforeCheckpointed) {
  testing::scratch_dir dir;
  job_config c = guarded_job(2, dir / "ckpt");
  c.faults.inject = {"nan:1@5"};
  const std::string error = run_for_error(c);
  EXPECT_TRUE(std::regex_search(error, std::regex("^training stopped: step 5: 1 gradient value is not finite"))) << error;
  EXPECT_NE(error.find("checkpoint written to"), std::string::npos) << error;
  const loaded_checkpoint ckpt = newest(dir / "ckpt", c);
  EXPECT_EQ(ckpt.record.step, 4) << "the state before the step nobody applied";
}

TEST_P(NonFinite, SkipDropsTheStepOnEveryReplicaAndTrainsOn) {
  testing::scratch_dir dir;
  // Steps 1-4, then step 5 with a NaN, skipped: the parameters and optimizer
  // slots after 5 steps are bitwise those after 4.
  job_config four = guarded_job(2, dir / "four");
  four.train.max_steps = 4;
  ASSERT_EQ(run_for_error(four), "");
  job_config five = guarded_job(2, dir / "five");
  five.train.max_steps = 5;
  five.train.on_nonfinite = nonfinite_policy::skip;
  five.faults.inject = {"nan:0@5"};
  run_summary s;
  ASSERT_EQ(run_for_error(five, &s), "") << "skip goes on";
  EXPECT_EQ(s.skipped_steps, 1);
  EXPECT_EQ(s.steps, 5);
  const loaded_checkpoint a = newest(dir / "four", four), b = newest(dir / "five", five);
  EXPECT_EQ(parameters(a, four), parameters(b, five)) << "a replica applied the skipped step";
  EXPECT_EQ(b.record.step, 5);
}

TEST_P(NonFinite, SkipTrainsTheRestOfTheRun) {
  testing::scratch_dir dir;
  job_config c = guarded_job(2, dir / "ckpt");
  c.train.on_nonfinite = nonfinite_policy::skip;
  c.faults.inject = {"nan:1@3", "nan:0@20"};
  run_summary s;
  ASSERT_EQ(run_for_error(c, &s), "");
  EXPECT_EQ(s.skipped_steps, 2);
  EXPECT_EQ(s.steps, 32);
  EXPECT_GT(s.test_accuracy, 0.5);
}

TEST_P(NonFinite, AHugeLearningRateStopsNamingTheStepAndTheNewestCheckpointIsFinite) {
  // Before: optimizer.lr = 1e6 trained on and wrote a checkpoint full of NaN.
  testing::scratch_dir dir;
  job_config c = guarded_job(2, dir / "ckpt");
  c.optimizer.lr = 1e6;
  c.train.checkpoint_every = 1;
  const std::string error = run_for_error(c);
  EXPECT_TRUE(std::regex_search(error, std::regex("^training stopped: step [0-9]+: the loss is (nan|inf)"))) << error;
  const loaded_checkpoint ckpt = newest(dir / "ckpt", c);  // throws on a non-finite value
  EXPECT_FALSE(first_nonfinite(parameters(ckpt, c)).has_value());
}

TEST(NonFiniteValues, ACheckpointWithANaNIsNeitherWrittenNorRead) {
  testing::scratch_dir dir;
  const job_config c = testing::small_job(1, 64);
  const state_layout l = make_state_layout(c.model, c.optimizer);
  std::vector<float> state(l.total_size(), 0.5f);
  write_step_counter(state, l, 3);
  trainer_record r;
  r.step = 3;
  r.train_samples = 1024;
  write_checkpoint(dir.path(), l, state, r);
  state[17] = std::numeric_limits<float>::infinity();
  r.step = 4;
  try {
    write_checkpoint(dir.path(), l, state, r);
    FAIL() << "a state holding inf was written";
  } catch (const checkpoint_error& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite value (inf) at index 17"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_checkpoint(dir.path(), l).record.step, 3) << "the older checkpoint stays the newest";
}

// Big-endian IDX bytes of float32 values (type 0x0D).
std::string idx_floats(const std::vector<std::uint32_t>& dims, const std::vector<float>& values) {
  std::string out{'\0', '\0', '\x0D', static_cast<char>(dims.size())};
  const auto be32 = [&](std::uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((v >> shift) & 0xff);
  };
  for (const auto d : dims) be32(d);
  for (const float v : values) be32(std::bit_cast<std::uint32_t>(v));
  return out;
}

TEST(NonFiniteValues, InputsWithANaNAreRefusedNamingTheSample) {
  // IDX float images: the reader takes any bit pattern; the load refuses it.
  testing::scratch_dir dir;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  testing::write_text(dir / "train-images", idx_floats({3, 2}, {0, 1, 2, 3, nan, 5}));
  testing::write_text(dir / "test-images", idx_floats({1, 2}, {0, 1}));
  testing::write_text(dir / "train-labels", testing::idx_bytes(0x08, {3}, {0, 1, 0}));
  testing::write_text(dir / "test-labels", testing::idx_bytes(0x08, {1}, {1}));
  data_config d;
  d.format = data_format::idx;
  d.train_images = (dir / "train-images").string();
  d.train_labels = (dir / "train-labels").string();
  d.test_images = (dir / "test-images").string();
  d.test_labels = (dir / "test-labels").string();
  try {
    load_data(d, 2, 2);
    FAIL() << "a NaN input was accepted";
  } catch (const data_error& e) {
    EXPECT_NE(std::string(e.what()).find("train-images: sample 2 (0-based), feature 0: the value is nan"),
              std::string::npos)
        << e.what();
  }
  // A NaN label (float IDX labels) is refused by value, never cast.
  testing::write_text(dir / "train-images", idx_floats({3, 2}, {0, 1, 2, 3, 4, 5}));
  testing::write_text(dir / "train-labels", idx_floats({3}, {0, nan, 1}));
  try {
    load_data(d, 2, 2);
    FAIL() << "a NaN label was accepted";
  } catch (const data_error& e) {
    EXPECT_NE(std::string(e.what()).find("train-labels: label nan of sample 1 is out of range"), std::string::npos)
        << e.what();
  }
  // CSV refuses it at the line already.
  testing::write_text(dir / "train.csv", "0,1,2\n1,nan,3\n");
  testing::write_text(dir / "test.csv", "0,1,2\n");
  d.format = data_format::csv;
  d.train_file = (dir / "train.csv").string();
  d.test_file = (dir / "test.csv").string();
  d.label_column = 0;
  try {
    load_data(d, 2, 2);
    FAIL() << "a NaN input was accepted";
  } catch (const data_error& e) {
    EXPECT_NE(std::string(e.what()).find("train.csv:2: field 2: 'nan' is not a finite number"), std::string::npos)
        << e.what();
  }
}

TEST(NonFiniteValues, InitialWeightsWithANaNAreRefused) {
  testing::scratch_dir dir;
  const job_config c = testing::small_job(1, 64);
  const state_layout l = make_state_layout(c.model, c.optimizer);
  std::vector<float> state(l.total_size(), 0.25f);
  state[3] = std::numeric_limits<float>::quiet_NaN();
  // Weights as PyTorch's safetensors.torch.save_file would write them.
  std::vector<float> weights(state.begin(), state.begin() + static_cast<std::ptrdiff_t>(l.parameter_size));
  std::vector<tensor_to_save> tensors;
  for (std::size_t t = 0; t < l.parameter_tensors; ++t) {
    const auto& spec = l.layout.tensors()[t];
    tensors.push_back({spec.name, spec.shape, std::span<const float>(weights).subspan(spec.offset, spec.numel())});
  }
  save_safetensors(dir / "weights.safetensors", tensors, {{"format", "pt"}});
  try {
    read_model_weights(dir / "weights.safetensors", l);
    FAIL() << "weights holding a NaN were accepted";
  } catch (const checkpoint_error& e) {
    EXPECT_NE(std::string(e.what()).find("holds a non-finite value (nan) at index 3"), std::string::npos) << e.what();
  }
}

DPACTOR_ON_BOTH_REPLICAS(NonFinite);

}  // namespace
}  // namespace dpactor
