// What the engine reports is what happened (issue "reported figures"): the
// test loss and accuracy a run reports are recomputed here by a plain
// forward pass over the saved model.safetensors and every test row, written
// in the test (double precision, no engine kernel), for a job whose test set
// divides neither by the replicas nor by the micro-batch, on both replica
// kinds and after a resume; and every field of a checkpoint's trainer.json
// against what the test computes from the job and the checkpoint's step.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>

#include <dpactor/engine.hpp>
#include "data/loading.hpp"
#include "data/sampler.hpp"
#include "tensors/json.hpp"
#include "train/sample_digest.hpp"
#include "tensors/safetensors.hpp"
#include "service/metrics_board.hpp"
#include "tests/recorded_run.hpp"
#include "tests/service_support.hpp"
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

struct evaluation {
  double loss = 0.0;          // mean softmax cross-entropy
  std::int64_t correct = 0;   // argmax == label
  std::size_t rows = 0;
};

// The saved model over every test row: layers "<2l>.weight" [out, in] and
// "<2l>.bias", ReLU between them, softmax cross-entropy at the end.
evaluation evaluate_saved_model(const job_config& c, const std::filesystem::path& checkpoint) {
  std::map<std::string, loaded_tensor> tensors;
  for (auto& t : load_safetensors(checkpoint / "model.safetensors").tensors) tensors[t.name] = t;
  const train_test_data data = load_data(c.data, c.model.inputs(), c.model.outputs());
  const dataset& test = *data.test;
  evaluation e;
  e.rows = test.rows;
  const std::size_t layers = c.model.sizes.size() - 1;
  for (std::size_t row = 0; row < test.rows; ++row) {
    std::vector<double> h(test.features.data() + row * test.feature_count,
                          test.features.data() + (row + 1) * test.feature_count);
    for (std::size_t l = 0; l < layers; ++l) {
      const loaded_tensor& w = tensors.at(std::to_string(2 * l) + ".weight");
      const loaded_tensor& b = tensors.at(std::to_string(2 * l) + ".bias");
      const auto out = static_cast<std::size_t>(w.shape[0]), in = static_cast<std::size_t>(w.shape[1]);
      EXPECT_EQ(in, h.size());
      std::vector<double> next(out);
      for (std::size_t o = 0; o < out; ++o) {
        double z = b.values[o];
        for (std::size_t i = 0; i < in; ++i) z += static_cast<double>(w.values[o * in + i]) * h[i];
        next[o] = l + 1 < layers ? std::max(z, 0.0) : z;
      }
      h = std::move(next);
    }
    const double top = *std::max_element(h.begin(), h.end());
    double sum = 0.0;
    for (const double z : h) sum += std::exp(z - top);
    const auto label = static_cast<std::size_t>(test.labels[row]);
    e.loss += std::log(sum) + top - h[label];
    e.correct += std::max_element(h.begin(), h.end()) - h.begin() == static_cast<std::ptrdiff_t>(label);
  }
  e.loss /= static_cast<double>(test.rows);
  return e;
}

// 3 replicas, 1,000 test rows, micro-batches of 64: neither divides.
job_config uneven_job(const std::filesystem::path& dir) {
  job_config c = testing::small_job(testing::current_kind(), 3, 96, 960);
  c.data.synthetic_test = 1000;
  c.train.micro_batch = 64;
  c.train.epochs = 2;
  c.train.checkpoint_dir = dir.string();
  return c;
}

// The reported figures against the evaluation: the accuracy as a count of
// rows, the loss to well within its last printed digit (4 decimals).
void expect_reported(const run_summary& s, const evaluation& e) {
  EXPECT_EQ(std::llround(s.test_accuracy * static_cast<double>(e.rows)), e.correct)
      << "reported accuracy " << s.test_accuracy << ", the saved model gets " << e.correct << " of " << e.rows;
  EXPECT_NEAR(s.test_loss, e.loss, 1e-5) << "the reported test loss is not the saved model's over every test row";
}

class ReportedFigures : public testing::both_replicas {};

TEST_P(ReportedFigures, TheTestLossAndAccuracyAreThoseOfTheSavedModelOverEveryTestRow) {
  testing::scratch_dir dir;
  const job_config c = uneven_job(dir / "run");
  Engine engine(c);
  engine.start();
  const run_summary s = engine.wait();
  ASSERT_EQ(s.epochs, 2);
  ASSERT_FALSE(s.checkpoint.empty());
  const evaluation e = evaluate_saved_model(c, s.checkpoint);
  EXPECT_GT(e.correct, 400) << "the job learns (4 classes)";
  expect_reported(s, e);
}

TEST_P(ReportedFigures, AfterAResumeTheyAreStillThoseOfTheSavedModel) {
  testing::scratch_dir dir;
  job_config c = uneven_job(dir / "first");
  c.train.checkpoint_every = 7;  // step 7 is mid-epoch (10 steps an epoch)
  {
    Engine first(c);
    first.start();
    ASSERT_EQ(first.wait().epochs, 2);
  }
  ASSERT_TRUE(std::filesystem::exists(dir / "first" / "step-00000007"));
  job_config again = c;
  again.cluster.cpus = 2;
  again.train.checkpoint_dir = (dir / "resumed").string();
  Engine resumed(again, testing::resume_from(dir / "first" / "step-00000007"));
  resumed.start();
  const run_summary s = resumed.wait();
  ASSERT_FALSE(s.checkpoint.empty());
  expect_reported(s, evaluate_saved_model(again, s.checkpoint));
}

DPACTOR_ON_BOTH_REPLICAS(ReportedFigures);

// Every field of a checkpoint's trainer.json against what this test computes
// from the job and the checkpoint's step: `rows` samples, global batch `B`,
// E steps an epoch, a quiet run (every step handed out before the
// checkpoint committed).
void expect_trainer_record(const std::filesystem::path& checkpoint, const job_config& c, std::size_t rows) {
  SCOPED_TRACE(checkpoint.string());
  const json j = json::parse(testing::read_text(checkpoint / "trainer.json"));
  const std::string name = checkpoint.filename().string();  // step-00000012
  const std::int64_t step = std::stoll(name.substr(5));
  const auto B = static_cast<std::size_t>(c.train.batch_size);
  const auto E = static_cast<std::int64_t>((rows + B - 1) / B);
  // The epoch of the last committed step; an epoch's last step leaves its
  // epoch complete (the next one has not begun).
  const std::int64_t epoch = (step - 1) / E;
  const std::size_t committed = std::min(rows, static_cast<std::size_t>(step - epoch * E) * B);
  EXPECT_EQ(j.at("step").get<std::int64_t>(), step);
  EXPECT_EQ(j.at("epoch").get<std::int64_t>(), epoch);
  EXPECT_EQ(j.at("train_samples").get<std::uint64_t>(), rows);
  EXPECT_EQ(j.at("rng").at("sampler").at("seed").get<std::uint64_t>(), static_cast<std::uint64_t>(c.train.seed));
  EXPECT_EQ(j.at("rng").at("sampler").at("shuffle").get<bool>(), c.train.shuffle);
  EXPECT_FALSE(j.at("data_fingerprint").get<std::string>().empty());
  EXPECT_NE(j.at("config").get<std::string>().find("batch_size = " + std::to_string(B)), std::string::npos);
  const json& ledger = j.at("ledger");
  EXPECT_EQ(ledger.at("epoch").get<std::int64_t>(), epoch);
  // The ledger: the epoch's order handed out up to the cursor, of which the
  // front holds what is not committed yet (a step the loader had issued
  // ahead), in order: exactly the committed samples are behind it.
  const auto cursor = ledger.at("cursor").get<std::size_t>();
  const auto front = ledger.at("front").get<std::vector<std::uint32_t>>();
  ASSERT_LE(cursor, rows);
  ASSERT_EQ(cursor - front.size(), committed) << "committed samples of epoch " << epoch;
  const std::vector<std::uint32_t> order =
      epoch_order(rows, static_cast<std::uint64_t>(c.train.seed), epoch, c.train.shuffle);
  std::vector<std::uint32_t> pending(order.begin() + static_cast<std::ptrdiff_t>(committed),
                                     order.begin() + static_cast<std::ptrdiff_t>(cursor));
  std::vector<std::uint32_t> sorted_front = front;
  std::sort(pending.begin(), pending.end());
  std::sort(sorted_front.begin(), sorted_front.end());
  EXPECT_EQ(sorted_front, pending) << "the front is the handed-out, uncommitted part of the epoch's order";
}

std::vector<std::filesystem::path> checkpoints_in(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("step-", 0) == 0) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The summary's counts against the job's arithmetic and the devices' own
// account: 1,000 samples at batch 64 are 16 steps an epoch, the last of 40
// samples. A device fails at step 5: the step the state source finished but
// whose record the failure lost still counts its samples (the loader's).
TEST(RunCounts, TheSummarysStepsEpochsAndSamplesAreTheJobsAndTheDevicesOwnAccount) {
  job_config c = testing::small_job(3, 64, 1000);
  c.train.epochs = 2;
  c.train.record_trained = true;
  c.train.log_every = 10;  // 16 steps an epoch: the epochs' last steps are not multiples of it
  c.faults.inject = {"fail:1@5"};
  // What /metrics would serve: the HTTP face's board, fed the same events.
  metrics_board board;
  const auto began = std::chrono::steady_clock::now();
  const testing::recorded_run r =
      testing::run_recorded(c, {}, nullptr, [&board](const event& e) { board.on_event(e); });
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  const std::int64_t rows = 1000, B = 64, E = (rows + B - 1) / B;
  EXPECT_EQ(r.summary.steps, 2 * E);
  EXPECT_EQ(r.summary.epochs, 2);
  EXPECT_EQ(r.summary.samples, 2 * rows) << "the short last step of each epoch counts its 40 samples";
  // The rate is over the training time, inside the test's own clock: at
  // least the samples over the whole call (loading and start-up included).
  EXPECT_GE(r.summary.samples_per_s, static_cast<double>(2 * rows) / wall_s);
  EXPECT_LE(r.summary.train_s, wall_s);
  EXPECT_EQ(r.trained->check(rows, 2), "") << "by the devices' own account, every sample of each epoch once";
  ASSERT_EQ(r.epochs.size(), 2u);
  for (const epoch_event& e : r.epochs) EXPECT_EQ(e.samples, rows) << "epoch " << e.epoch;
  // The step records: every log_every steps and each epoch's last step, in
  // order, their running sample counts those of the job's steps.
  std::vector<std::int64_t> logged;
  for (const step_event& e : r.steps) {
    logged.push_back(e.step);
    EXPECT_EQ(e.epoch_steps, E);
    EXPECT_EQ(e.total_steps, 2 * E);
    EXPECT_EQ(e.step, e.epoch * E + e.epoch_step) << "step " << e.step;
    const std::int64_t full_epochs = e.step / E, in_epoch = e.step % E;
    EXPECT_EQ(e.samples, full_epochs * rows + in_epoch * B) << "step " << e.step;
  }
  EXPECT_EQ(logged, (std::vector<std::int64_t>{10, 16, 20, 30, 32}));
  // /metrics at the end says what the run did, not what its last multiple
  // of log_every did.
  const auto m = testing::parse_prometheus(board.prometheus_text());
  EXPECT_EQ(m.at("dpactor_steps_total"), static_cast<double>(2 * E));
  EXPECT_EQ(m.at("dpactor_epochs_total"), 2.0);
  EXPECT_EQ(m.at("dpactor_train_samples_total"), static_cast<double>(2 * rows));
  EXPECT_EQ(m.at("dpactor_faults_total"), 1.0);
  EXPECT_EQ(m.at("dpactor_cuts_total"), 0.0);
  // A run that ends mid-epoch (train.max_steps) logs its last step too.
  c.faults.inject.clear();
  c.train.max_steps = 21;
  metrics_board short_board;
  const testing::recorded_run cut_short =
      testing::run_recorded(c, {}, nullptr, [&short_board](const event& e) { short_board.on_event(e); });
  EXPECT_EQ(cut_short.summary.steps, 21);
  ASSERT_FALSE(cut_short.steps.empty());
  EXPECT_EQ(cut_short.steps.back().step, 21);
  EXPECT_EQ(cut_short.steps.back().samples, rows + 5 * B);
  EXPECT_EQ(testing::parse_prometheus(short_board.prometheus_text()).at("dpactor_train_samples_total"),
            static_cast<double>(rows + 5 * B));
}

// Decisions that only cost time (the balancer, the straggler policy): a
// wrong one leaves every result intact, so the test looks at the decision
// itself, by the devices' own account of what each trained in each step.
struct step_shares {
  std::map<std::int64_t, std::map<std::string, std::int64_t>> samples;  // step -> device -> trained
  run_summary summary;
};

step_shares run_for_shares(job_config c) {
  c.train.record_trained = true;
  c.train.reproducible = false;  // shards follow the shares (reproducible runs split slices)
  c.train.micro_batch = 8;
  step_shares out;
  std::mutex m;
  Engine engine(c);
  engine.on_event([&](const event& e) {
    if (const auto* t = std::get_if<trained_event>(&e)) {
      std::lock_guard lock(m);
      out.samples[t->step][t->device] += t->samples;
    }
  });
  engine.start();
  out.summary = engine.wait();
  return out;
}

// cpu:1's part of each step it trained, in step order.
std::vector<double> shares_of_cpu1(const step_shares& r) {
  std::vector<double> out;
  for (const auto& [step, devices] : r.samples) {
    std::int64_t all = 0;
    for (const auto& [device, n] : devices) all += n;
    const auto it = devices.find("cpu:1");
    out.push_back(all > 0 && it != devices.end() ? static_cast<double>(it->second) / static_cast<double>(all) : 0.0);
  }
  return out;
}

TEST(Decisions, TheBalancersSharesReachTheLoaderOnlyWhenThePolicyBalances) {
  // cpu:1 computes 20 times slower (a few hundred microseconds a step: no
  // deadline is near, so nothing is cut under any policy).
  job_config c = testing::small_job(2, 64, 2048);  // 32 steps
  c.faults.inject = {"slow:1:20"};
  c.straggler.policy = straggler_policy::balance;
  const step_shares balanced = run_for_shares(c);
  std::vector<double> shares = shares_of_cpu1(balanced);
  ASSERT_EQ(shares.size(), 32u);
  EXPECT_EQ(balanced.summary.cuts, 0);
  shares.erase(shares.begin(), shares.begin() + 16);
  std::sort(shares.begin(), shares.end());
  EXPECT_LT(shares[shares.size() / 2], 0.35) << "the slow member's median share over the second half (0.5 is even)";
  // straggler.policy = "none": every step split evenly, however slow cpu:1 is.
  c.straggler.policy = straggler_policy::none;
  const step_shares even = run_for_shares(c);
  EXPECT_EQ(even.summary.cuts, 0);
  for (const double share : shares_of_cpu1(even)) ASSERT_EQ(share, 0.5) << "policy none split a step unevenly";
}

TEST(Decisions, NobodyIsCutUnlessThePolicyCuts) {
  // cpu:1 is 20 ms late on every step: far past any deadline, but under
  // policy "none" (and "balance") the step waits for it and it trains its
  // whole shard; under "cut" it is cut (cut_recovery_test).
  job_config c = testing::small_job(2, 64, 1024);
  c.faults.inject = {"jitter:1:1.0:20"};
  c.straggler.deadline_factor = 1.1;
  for (const auto policy : {straggler_policy::none, straggler_policy::balance}) {
    c.straggler.policy = policy;
    const step_shares r = run_for_shares(c);
    EXPECT_EQ(r.summary.cuts, 0);
    ASSERT_EQ(r.samples.size(), 16u);
    for (const auto& [step, devices] : r.samples) {
      std::int64_t all = 0;
      for (const auto& [device, n] : devices) all += n;
      EXPECT_EQ(all, 64) << "step " << step + 1 << ": the devices trained only part of it";
    }
  }
}

TEST(CheckpointRecord, EveryFieldIsWhatTheJobAndTheStepMakeMidEpochAtItsEndAfterAFailureAndAfterAResume) {
  testing::scratch_dir dir;
  job_config c = testing::small_job(2, 64, 960);  // 15 steps an epoch
  c.train.epochs = 2;
  c.train.checkpoint_every = 4;  // 4, 8, 12 mid-epoch; 15 (the epoch's end, 16 is 1 into the next)
  c.train.keep_checkpoints = 0;
  c.train.checkpoint_dir = (dir / "first").string();
  {
    Engine first(c);
    first.start();
    ASSERT_EQ(first.wait().steps, 30);
  }
  const auto written = checkpoints_in(dir / "first");
  ASSERT_GE(written.size(), 7u);
  for (const auto& ckpt : written) expect_trainer_record(ckpt, c, 960);
  // A failed device, then a resume on 3 devices from a mid-epoch checkpoint.
  job_config again = c;
  again.cluster.cpus = 3;
  again.train.checkpoint_dir = (dir / "resumed").string();
  again.faults.inject = {"fail:1@17"};
  Engine resumed(again, testing::resume_from(dir / "first" / "step-00000012"));
  resumed.start();
  ASSERT_EQ(resumed.wait().steps, 30);
  const auto rewritten = checkpoints_in(dir / "resumed");
  ASSERT_GE(rewritten.size(), 4u);
  for (const auto& ckpt : rewritten) expect_trainer_record(ckpt, again, 960);
}

// After cuts the committed samples of an epoch are no longer a prefix of its
// order: the ledger's front holds the cut ones, to go out again. Each
// checkpoint's ledger (the order up to the cursor, less the front) holds
// exactly what the devices say they trained in the steps before it, by
// count and by the digest of the indices.
TEST(CheckpointRecord, AfterCutsTheLedgerHoldsExactlyWhatTheDevicesTrained) {
  testing::scratch_dir dir;
  job_config c = testing::small_job(2, 64, 1024);
  c.faults.inject = {"jitter:1:1.0:200"};  // cpu:1 is cut every step (cut_recovery_test)
  c.straggler.policy = straggler_policy::cut;
  c.straggler.deadline_factor = 1.1;
  c.train.reproducible = false;
  c.train.record_trained = true;
  c.train.checkpoint_every = 4;
  c.train.keep_checkpoints = 0;
  c.train.checkpoint_dir = (dir / "ckpt").string();
  std::mutex m;
  std::map<std::int64_t, std::pair<std::int64_t, std::uint64_t>> trained;  // step -> samples, digest
  const testing::recorded_run r = testing::run_recorded(c, {}, nullptr, [&](const event& e) {
    if (const auto* t = std::get_if<trained_event>(&e)) {
      std::lock_guard lock(m);
      trained[t->step].first += t->samples;
      trained[t->step].second += t->digest;
    }
  });
  ASSERT_GT(r.summary.cuts, 0);
  const std::vector<std::uint32_t> order = epoch_order(1024, static_cast<std::uint64_t>(c.train.seed), 0, c.train.shuffle);
  std::size_t checked = 0;
  for (const auto& ckpt : checkpoints_in(dir / "ckpt")) {
    SCOPED_TRACE(ckpt.string());
    const json j = json::parse(testing::read_text(ckpt / "trainer.json"));
    const std::int64_t step = j.at("step").get<std::int64_t>();
    const json& ledger = j.at("ledger");
    EXPECT_EQ(j.at("epoch"), ledger.at("epoch"));
    if (ledger.at("epoch").get<std::int64_t>() != 0) continue;
    const auto cursor = ledger.at("cursor").get<std::size_t>();
    const auto front = ledger.at("front").get<std::vector<std::uint32_t>>();
    ASSERT_LE(cursor, order.size());
    std::int64_t samples = 0;
    std::uint64_t digest = 0;
    for (const auto& [s, t] : trained)
      if (s < step) samples += t.first, digest += t.second;
    const std::vector<std::uint32_t> handed(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(cursor));
    std::vector<std::uint32_t> sorted_handed = handed, sorted_front = front;
    std::sort(sorted_handed.begin(), sorted_handed.end());
    std::sort(sorted_front.begin(), sorted_front.end());
    EXPECT_TRUE(std::adjacent_find(sorted_front.begin(), sorted_front.end()) == sorted_front.end()) << "a front index twice";
    EXPECT_TRUE(std::includes(sorted_handed.begin(), sorted_handed.end(), sorted_front.begin(), sorted_front.end()))
        << "the front holds an index not handed out yet";
    EXPECT_EQ(static_cast<std::int64_t>(cursor - front.size()), samples) << "committed samples at step " << step;
    EXPECT_EQ(sample_digest(handed) - sample_digest(front), digest) << "the committed indices at step " << step;
    ++checked;
  }
  EXPECT_GE(checked, 4u);
}

}  // namespace
}  // namespace dpactor
