// Compressed synchronous steps (sync.mode = "every_step" with sync.codec =
// "bf16", See Note [Bf16 steps], and "powersgd", See Note [PowerSGD
// steps]): the engine against a plain loop written here from the notes,
// bitwise, on 1, 2 and 4 devices; faults change nothing in the bytes; fast
// mode keeps the members' states equal; bad input is refused before training.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
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
#include "train/powersgd.hpp"
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
// A quiet run of the faults job on 2 devices against one on 3 with a failed,
// a joining and a leaving device, with the codec `set` chooses (4 slices a step):
// the same files, and every sample once in both.
void expect_faults_change_no_bytes(const std::function<void(job_config&)>& set) {
  testing::scratch_dir dir;
  const auto run = [&](const std::string& name, int devices, std::vector<std::string> faults) {
    job_config c = testing::faulty_job(devices, faults, testing::replica_kind::mlp);
    c.train.micro_batch = 16;
    set(c);
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

TEST(Bf16Steps, AFailureAJoinAndALeaveGiveTheBytesOfAQuietRun) {
  expect_faults_change_no_bytes([](job_config& c) { c.sync.codec = sync_codec::bf16; });
}

// Fast mode: each member's gradient sum is one leaf (with powersgd one unit,
// its residual its own); every member applies the gathered sum itself, so
// the replicas stay equal (train.verify_replicas compares them every step),
// and the run trains.
TEST(Bf16Steps, InFastModeTheMembersStayEqualAndTheRunTrains) {
  testing::scratch_dir dir;
  for (const sync_codec codec : {sync_codec::bf16, sync_codec::powersgd, sync_codec::fp32}) {
    job_config c = testing::small_job(2, 64, 1024);
    c.train.reproducible = false;
    c.train.verify_replicas = true;
    c.train.epochs = 3;
    c.sync.codec = codec;
    c.sync.powersgd_rank = 2;
    c.sync.powersgd_start_step = 4;
    Engine engine(c);
    engine.start();
    const run_summary s = engine.wait();
    ASSERT_EQ(s.steps, 48);
    EXPECT_GT(s.test_accuracy, 0.5) << sync_codec_name(codec);  // 4 classes: chance is 0.25
  }
}

// Note [PowerSGD steps] written out: steps before `start` are the fp32
// tree's; from it each slice's M = g + e, the factors of each weight matrix
// whose rows x cols is at least 2 (rows + cols) r (the others and the biases
// summed whole), P = tree sum of M Q, Gram-Schmidt, Q' = tree sum of M^T P,
// the step applies P Q'^T, each slice keeps M - P (M^T P)^T, and Q' is the
// next step's basis. `feedback` and `warm` false: without error feedback or
// warm start, for the comparison.
reference_state reference_powersgd_steps(const job_config& c, int steps, bool feedback = true, bool warm = true) {
  set_blas_threads(1);
  const train_test_data data = load_data(c.data, c.model.inputs(), c.model.outputs());
  const auto micro = static_cast<std::size_t>(c.train.micro_batch), batch = static_cast<std::size_t>(c.train.batch_size);
  const auto r = static_cast<std::size_t>(c.sync.powersgd_rank);
  mlp model(c.model, micro);
  const std::size_t n = model.layout().size();
  struct factor { std::size_t offset, rows, cols; };
  std::vector<factor> matrices;
  std::vector<bool> in_matrix(n, false);
  for (const auto& t : model.layout().tensors()) {
    if (t.shape.size() != 2) continue;
    const auto rows = static_cast<std::size_t>(t.shape[0]), cols = static_cast<std::size_t>(t.shape[1]);
    if (rows * cols < 2 * (rows + cols) * r) continue;
    matrices.push_back({t.offset, rows, cols});
    std::fill_n(in_matrix.begin() + static_cast<std::ptrdiff_t>(t.offset), rows * cols, true);
  }
  const std::vector<float> first_basis =
      powersgd_plan(make_state_layout(c.model, c.optimizer), r).initial_basis(static_cast<std::uint64_t>(c.train.seed));
  std::vector<std::vector<float>> basis;  // each matrix's Q (cols x r)
  for (std::size_t m = 0, at = 0; m < matrices.size(); at += matrices[m].cols * r, ++m)
    basis.emplace_back(first_basis.begin() + static_cast<std::ptrdiff_t>(at),
                       first_basis.begin() + static_cast<std::ptrdiff_t>(at + matrices[m].cols * r));
  const auto order = epoch_order(data.train->rows, static_cast<std::uint64_t>(c.train.seed), 0, c.train.shuffle);
  std::vector<float> params(n, 0.0f), momentum(n, 0.0f);
  init_mlp_parameters(c.model, params, static_cast<std::uint64_t>(c.train.seed));
  std::vector<float> x(micro * static_cast<std::size_t>(c.model.inputs()));
  std::vector<std::int32_t> y(micro);
  std::vector<std::vector<float>> residual(batch / micro, std::vector<float>(n, 0.0f));
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
      leaves.push_back(std::move(g));
    }
    std::vector<float> applied;
    if (step < c.sync.powersgd_start_step) {
      applied = tree_sum(leaves);
    } else {
      for (std::size_t s = 0; s < leaves.size(); ++s)
        for (std::size_t i = 0; i < n; ++i) leaves[s][i] += residual[s][i];
      applied = tree_sum(leaves);  // the values sent whole are this sum's
      for (std::size_t m = 0; m < matrices.size(); ++m) {
        const auto [offset, rows, cols] = matrices[m];
        const auto ri = static_cast<int>(rows), ci = static_cast<int>(cols), rk = static_cast<int>(r);
        std::vector<std::vector<float>> ps, qs;
        for (const auto& leaf : leaves) {
          std::vector<float> p(rows * r);
          gemm(false, false, ri, rk, ci, 1.0f, leaf.data() + offset, ci, basis[m].data(), rk, 0.0f, p.data(), rk);
          ps.push_back(std::move(p));
        }
        std::vector<float> p = tree_sum(ps);
        for (std::size_t k = 0; k < r; ++k) {  // Gram-Schmidt, column after column
          double norm = 0.0;
          for (std::size_t i = 0; i < rows; ++i) norm += static_cast<double>(p[i * r + k]) * p[i * r + k];
          norm = std::sqrt(norm);
          for (std::size_t i = 0; i < rows; ++i) p[i * r + k] = norm > 0.0 ? static_cast<float>(p[i * r + k] / norm) : 0.0f;
          for (std::size_t l = k + 1; l < r; ++l) {
            double dot = 0.0;
            for (std::size_t i = 0; i < rows; ++i) dot += static_cast<double>(p[i * r + k]) * p[i * r + l];
            for (std::size_t i = 0; i < rows; ++i) p[i * r + l] = static_cast<float>(p[i * r + l] - dot * p[i * r + k]);
          }
        }
        for (const auto& leaf : leaves) {
          std::vector<float> q(cols * r);
          gemm(true, false, ci, rk, ri, 1.0f, leaf.data() + offset, ci, p.data(), rk, 0.0f, q.data(), rk);
          qs.push_back(std::move(q));
        }
        const std::vector<float> q = tree_sum(qs);
        gemm(false, true, ri, ci, rk, 1.0f, p.data(), rk, q.data(), rk, 0.0f, applied.data() + offset, ci);
        for (std::size_t s = 0; s < leaves.size(); ++s)
          gemm(false, true, ri, ci, rk, -1.0f, p.data(), rk, qs[s].data(), rk, 1.0f, leaves[s].data() + offset, ci);
        if (warm) basis[m] = q;
      }
      for (std::size_t s = 0; s < leaves.size(); ++s)
        for (std::size_t i = 0; i < n; ++i) residual[s][i] = feedback && in_matrix[i] ? leaves[s][i] : 0.0f;
    }
    const std::span<float> slots[1] = {momentum};
    optimizer_step(c.optimizer, params, applied, slots, static_cast<float>(1.0 / static_cast<double>(batch)),
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

job_config powersgd_job(std::int64_t devices, const std::filesystem::path& dir) {
  job_config c = testing::small_job(devices, 64, 512);  // 8 steps
  c.train.micro_batch = 16;                             // 4 slices a step
  c.sync.codec = sync_codec::powersgd;
  c.sync.powersgd_rank = 2;       // the 32 x 16 matrix travels as factors, the 4 x 32 one whole
  c.sync.powersgd_start_step = 2;  // steps 0 and 1 in fp32
  c.train.checkpoint_dir = dir.string();
  return c;
}

TEST(PowerSgdSteps, EachStepAppliesTheFactorsOfItsSlicesWithErrorFeedbackAndWarmStartOnOneTwoAndFourDevices) {
  testing::scratch_dir dir;
  const job_config shape = powersgd_job(1, dir / "shape");
  ASSERT_EQ(powersgd_plan(make_state_layout(shape.model, shape.optimizer), 2).matrices().size(), 1u);
  const reference_state expected = reference_powersgd_steps(shape, 8);
  for (const std::int64_t devices : {1, 2, 4}) {
    SCOPED_TRACE(std::to_string(devices) + " device(s)");
    const job_config c = powersgd_job(devices, dir / ("d" + std::to_string(devices)));
    Engine engine(c);
    engine.start();
    const run_summary s = engine.wait();
    ASSERT_EQ(s.steps, 8);
    EXPECT_EQ(file_values(std::filesystem::path(s.checkpoint) / "model.safetensors"), expected.params);
    EXPECT_EQ(file_values(std::filesystem::path(s.checkpoint) / "optimizer.safetensors"), expected.momentum);
  }
  // The comparison can tell each part of the arithmetic.
  EXPECT_NE(reference_powersgd_steps(shape, 8, /*feedback=*/false).params, expected.params);
  EXPECT_NE(reference_powersgd_steps(shape, 8, true, /*warm=*/false).params, expected.params);
  EXPECT_NE(reference_steps(shape, 8, /*bf16=*/false).params, expected.params);
}

// Fast mode: a member is one unit with its own residual and basis. One
// device whose micro-batch is the whole step computes what reproducible mode
// computes for one slice, so the note's loop with one slice a step is its
// bytes too: the member's error feedback and warm start, bitwise.
TEST(PowerSgdSteps, InFastModeOneMemberIsOneUnitWithItsOwnErrorFeedbackAndWarmStart) {
  testing::scratch_dir dir;
  job_config c = powersgd_job(1, dir / "fast");
  c.train.micro_batch = c.train.batch_size;
  c.train.reproducible = false;
  c.cluster.blas_threads = 1;
  c.straggler.policy = straggler_policy::none;
  Engine engine(c);
  engine.start();
  const run_summary s = engine.wait();
  ASSERT_EQ(s.steps, 8);
  const reference_state expected = reference_powersgd_steps(c, 8);
  EXPECT_EQ(file_values(std::filesystem::path(s.checkpoint) / "model.safetensors"), expected.params);
  EXPECT_EQ(file_values(std::filesystem::path(s.checkpoint) / "optimizer.safetensors"), expected.momentum);
  EXPECT_NE(reference_powersgd_steps(c, 8, /*feedback=*/false).params, expected.params);
  EXPECT_NE(reference_powersgd_steps(c, 8, true, /*warm=*/false).params, expected.params);
}

// A slice's residual lives in the store the devices share, so a failed, a
// joining and a leaving device change nothing in the bytes, and every sample
// is trained once by the devices' own account.
TEST(PowerSgdSteps, AFailureAJoinAndALeaveGiveTheBytesOfAQuietRun) {
  expect_faults_change_no_bytes([](job_config& c) {
    c.sync.codec = sync_codec::powersgd;
    c.sync.powersgd_rank = 2;
    c.sync.powersgd_start_step = 3;
  });
}

// A checkpoint holds each slice's residual and the basis
// (powersgd.safetensors), so a resume after the first compressed step, on
// another number of devices, ends with the bytes of the run never
// interrupted; another slice count is refused naming both, as is a
// checkpoint of a fast-mode run, which holds none.
TEST(PowerSgdSteps, AResumeOnAnotherNumberOfDevicesGivesTheBytesOfTheRunNeverInterrupted) {
  testing::scratch_dir dir;
  job_config c = powersgd_job(2, dir / "whole");
  c.train.checkpoint_every = 1;
  c.train.keep_checkpoints = 0;  // all of them
  Engine whole(c);
  whole.start();
  const run_summary ended = whole.wait();
  ASSERT_EQ(ended.steps, 8);
  const std::filesystem::path middle = dir / "whole" / "step-00000005";
  ASSERT_TRUE(std::filesystem::exists(middle / "powersgd.safetensors"));
  for (const std::int64_t devices : {1, 3}) {
    SCOPED_TRACE(std::to_string(devices) + " device(s)");
    const job_config again = powersgd_job(devices, dir / ("again" + std::to_string(devices)));
    Engine resumed(again, testing::resume_from(middle));
    resumed.start();
    const run_summary s = resumed.wait();
    ASSERT_EQ(s.steps, 8);
    EXPECT_EQ(file_values(std::filesystem::path(s.checkpoint) / "model.safetensors"),
              file_values(std::filesystem::path(ended.checkpoint) / "model.safetensors"));
    EXPECT_EQ(file_values(std::filesystem::path(s.checkpoint) / "optimizer.safetensors"),
              file_values(std::filesystem::path(ended.checkpoint) / "optimizer.safetensors"));
  }
  job_config other = powersgd_job(1, dir / "other");
  other.train.micro_batch = 32;
  const std::string slices = testing::error_of<config_error>([&] {
    Engine e(other, testing::resume_from(middle));
    e.start();
  });
  EXPECT_NE(slices.find("holds PowerSGD residuals of 4 slices, this config has 2"), std::string::npos) << slices;
  job_config fast = powersgd_job(1, dir / "fast");
  fast.train.reproducible = false;
  fast.train.max_steps = 3;
  {
    Engine e(fast);
    e.start();
    ASSERT_EQ(e.wait().steps, 3);
  }
  const std::string missing = testing::error_of<checkpoint_error>([&] {
    Engine e(powersgd_job(1, dir / "from_fast"), testing::resume_from(dir / "fast" / "step-00000003"));
    e.start();
  });
  EXPECT_NE(missing.find("powersgd.safetensors: missing"), std::string::npos) << missing;
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

TEST(PowerSgdSteps, WhatPowerSgdDoesNotRunIsRefusedBeforeTraining) {
  EXPECT_EQ(sync_error({"sync.codec=\"powersgd\"", "sync.powersgd_rank=2"}), testing::no_error);
  const std::string rounds = sync_error({"sync.codec=\"powersgd\"", "sync.mode=\"diloco\""});
  EXPECT_NE(rounds.find("sync.codec = \"powersgd\" compresses the gradients of sync.mode = \"every_step\""),
            std::string::npos) << rounds;
  const std::string gpus = sync_error({"sync.codec=\"powersgd\"", "cluster.gpus=[0]"});
  EXPECT_NE(gpus.find("sync.codec = \"powersgd\" runs on CPU replicas only"), std::string::npos) << gpus;
  const std::string rank = sync_error({"sync.codec=\"powersgd\"", "sync.powersgd_rank=0"});
  EXPECT_NE(rank.find("sync.powersgd_rank"), std::string::npos) << rank;
  const std::string across = testing::error_of<config_error>([] {
    job_config c = testing::small_job(1, 64, 512);
    c.sync.codec = sync_codec::powersgd;
    run_options o;
    o.coordinator = coordinator_options{};
    Engine engine(c, o);
    engine.start();
  });
  EXPECT_NE(across.find("sync.codec = \"powersgd\" with train.reproducible = true runs in one process"),
            std::string::npos) << across;
}

}  // namespace
}  // namespace dpactor
