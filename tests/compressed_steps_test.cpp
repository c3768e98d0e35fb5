// Compressed synchronous steps (sync.mode = "every_step" with sync.codec =
// "bf16", See Note [Bf16 steps]): the engine against a plain loop written
// here from the note, bitwise, on 1, 2 and 4 devices; fast mode keeps the
// members' states equal; bad input is refused before training.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include <dpactor/engine.hpp>
#include <dpactor/error.hpp>
#include "config/config_file.hpp"
#include "data/loading.hpp"
#include "data/sampler.hpp"
#include "tensors/gemm.hpp"
#include "tensors/mlp.hpp"
#include "tensors/optimizer.hpp"
#include "tensors/safetensors.hpp"
#include "train/bf16_codec.hpp"
#include "tests/recorded_run.hpp"
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

float round_bf16(float x) { return from_bf16(to_bf16(x)); }

// Adds equal-length vectors pairwise, the summation tree's order for a
// power-of-two count of slices: ((0 + 1) + (2 + 3)) ...
std::vector<float> tree_sum(std::vector<std::vector<float>> level) {
  while (level.size() > 1) {
    std::vector<std::vector<float>> up;
    for (std::size_t i = 0; i < level.size(); i += 2) {
      std::vector<float> s(level[i].size());
      for (std::size_t j = 0; j < s.size(); ++j) s[j] = level[i][j] + level[i + 1][j];
      up.push_back(std::move(s));
    }
    level = std::move(up);
  }
  return level.front();
}

struct reference_state {
  std::vector<float> params, momentum;  // in the checkpoint's tensor order
};

// Note [Bf16 steps] in reproducible mode, written out: each step's slices of
// train.micro_batch rows (the sampler's order), each slice's gradient sum
// rounded to bf16, the rounded sums added in the tree's order, the sum
// rounded to bf16, and the job's optimizer step with it over the step's
// samples. `bf16` false: the same in fp32, for the comparison.
reference_state reference_steps(const job_config& c, int steps, bool bf16) {
  set_blas_threads(1);
  const train_test_data data = load_data(c.data, c.model.inputs(), c.model.outputs());
  const auto micro = static_cast<std::size_t>(c.train.micro_batch), batch = static_cast<std::size_t>(c.train.batch_size);
  mlp model(c.model, micro);
  const std::size_t n = model.layout().size();
  const auto order = epoch_order(data.train->rows, static_cast<std::uint64_t>(c.train.seed), 0, c.train.shuffle);
  std::vector<float> params(n, 0.0f), momentum(n, 0.0f);
  init_mlp_parameters(c.model, params, static_cast<std::uint64_t>(c.train.seed));
  std::vector<float> x(micro * static_cast<std::size_t>(c.model.inputs()));
  std::vector<std::int32_t> y(micro);
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<float>> leaves;
    for (std::size_t at = 0; at < batch; at += micro) {
      const std::span<const std::uint32_t> rows(order.data() + static_cast<std::size_t>(step) * batch + at, micro);
      const batch_ref b = data.train->batch(rows);
      for (std::size_t i = 0; i < rows.size(); ++i) {
        std::copy_n(b.features + rows[i] * b.feature_count, b.feature_count, x.data() + i * b.feature_count);
        y[i] = b.labels[rows[i]];
      }
      std::vector<float> g(n);
      model.forward_backward(params.data(), g.data(), x.data(), y.data(), micro, /*overwrite=*/true);
      if (bf16)
        for (float& v : g) v = round_bf16(v);
      leaves.push_back(std::move(g));
    }
    std::vector<float> sum = tree_sum(std::move(leaves));
    if (bf16)
      for (float& v : sum) v = round_bf16(v);
    const std::span<float> slots[1] = {momentum};
    optimizer_step(c.optimizer, params, sum, slots, static_cast<float>(1.0 / static_cast<double>(batch)),
                   c.optimizer.lr, step);
  }
  reference_state out;
  for (const auto& t : model.layout().tensors()) {
    out.params.insert(out.params.end(), params.begin() + static_cast<std::ptrdiff_t>(t.offset),
                      params.begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel()));
    out.momentum.insert(out.momentum.end(), momentum.begin() + static_cast<std::ptrdiff_t>(t.offset),
                        momentum.begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel()));
  }
  return out;
}

std::vector<float> file_values(const std::filesystem::path& file) {
  std::vector<float> values;
  for (const auto& t : load_safetensors(file).tensors) values.insert(values.end(), t.values.begin(), t.values.end());
  return values;
}

job_config bf16_job(std::int64_t devices, const std::filesystem::path& dir) {
  job_config c = testing::small_job(devices, 64, 512);  // 8 steps
  c.train.micro_batch = 16;                             // 4 slices a step: the tree ((0 + 1) + (2 + 3))
  c.sync.codec = sync_codec::bf16;
  c.train.checkpoint_dir = dir.string();
  return c;
}

TEST(Bf16Steps, EachStepAppliesTheBf16SumOfItsSlicesRoundedToBf16OnOneTwoAndFourDevices) {
  testing::scratch_dir dir;
  const job_config shape = bf16_job(1, dir / "shape");
  const reference_state expected = reference_steps(shape, 8, /*bf16=*/true);
  for (const std::int64_t devices : {1, 2, 4}) {
    SCOPED_TRACE(std::to_string(devices) + " device(s)");
    const job_config c = bf16_job(devices, dir / ("d" + std::to_string(devices)));
    Engine engine(c);
    engine.start();
    const run_summary s = engine.wait();
    ASSERT_EQ(s.steps, 8);
    EXPECT_EQ(file_values(std::filesystem::path(s.checkpoint) / "model.safetensors"), expected.params);
    EXPECT_EQ(file_values(std::filesystem::path(s.checkpoint) / "optimizer.safetensors"), expected.momentum);
  }
  // The comparison can tell bf16 from fp32.
  EXPECT_NE(reference_steps(shape, 8, /*bf16=*/false).params, expected.params);
}

// The leaves are the slices, so faults change nothing in the bytes: a
// failed, a joining and a leaving device against a quiet run, and every
// sample once by the devices' own account.
TEST(Bf16Steps, AFailureAJoinAndALeaveGiveTheBytesOfAQuietRun) {
  testing::scratch_dir dir;
  const auto run = [&](const std::string& name, int devices, std::vector<std::string> faults) {
    job_config c = testing::faulty_job(devices, faults, testing::replica_kind::mlp);
    c.train.micro_batch = 16;
    c.sync.codec = sync_codec::bf16;
    c.train.checkpoint_dir = (dir / name).string();
    const testing::recorded_run r = testing::run_recorded(c);
    EXPECT_EQ(r.summary.steps, 48) << name;
    testing::expect_exactly_once(r, 3);
    if (!faults.empty()) {
      EXPECT_GE(r.memberships.size(), 4u) << "the start, the failure, the join and the leave";
      EXPECT_GE(r.recoveries.size(), 1u);
    }
    const std::filesystem::path last = r.summary.checkpoint;
    return std::pair{file_values(last / "model.safetensors"), file_values(last / "optimizer.safetensors")};
  };
  const auto quiet = run("quiet", 2, {});
  EXPECT_EQ(run("faulty", 3, {"fail:1@5", "join:cpu@12", "leave:0@30"}), quiet);
}

// Fast mode: each member's gradient sum is one leaf; every member applies the
// gathered sum itself, so the replicas stay equal (train.verify_replicas
// compares them every step), and the run trains.
TEST(Bf16Steps, InFastModeTheMembersStayEqualAndTheRunTrains) {
  testing::scratch_dir dir;
  for (const sync_codec codec : {sync_codec::bf16, sync_codec::fp32}) {
    job_config c = testing::small_job(2, 64, 1024);
    c.train.reproducible = false;
    c.train.verify_replicas = true;
    c.train.epochs = 3;
    c.sync.codec = codec;
    Engine engine(c);
    engine.start();
    const run_summary s = engine.wait();
    ASSERT_EQ(s.steps, 48);
    EXPECT_GT(s.test_accuracy, 0.5) << (codec == sync_codec::bf16 ? "bf16" : "fp32");  // 4 classes: chance is 0.25
  }
}

std::string sync_error(const std::vector<std::string>& sets) {
  const std::string text = testing::read_text(std::string(DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg");
  return testing::error_of<config_error>([&] { parse_job_config(text, "mlp.cfg", sets); });
}

TEST(Bf16Steps, WhatEveryStepCannotCompressIsRefusedBeforeTraining) {
  EXPECT_EQ(sync_error({"sync.codec=\"bf16\""}), testing::no_error);
  EXPECT_EQ(sync_error({"sync.codec=\"bf16\"", "train.reproducible=false"}), testing::no_error);
  const std::string int8 = sync_error({"sync.codec=\"int8\""});
  EXPECT_NE(int8.find("sync.codec = \"int8\" needs a round mode"), std::string::npos) << int8;
  const std::string gpus = sync_error({"sync.codec=\"bf16\"", "cluster.gpus=[0]"});
  EXPECT_NE(gpus.find("sync.codec = \"bf16\" runs on CPU replicas only"), std::string::npos) << gpus;
  const std::string torch = testing::error_of<config_error>([] {
    job_config c = testing::small_job(testing::replica_kind::torch, 1, 64);
    c.sync.codec = sync_codec::bf16;
    Engine engine(c);
    engine.start();
  });
  EXPECT_NE(torch.find("native MLP replicas only"), std::string::npos) << torch;
}

}  // namespace
}  // namespace dpactor
