// What the engine reports is what happened (issue "reported figures"): the
// test loss and accuracy a run reports are recomputed here by a plain
// forward pass over the saved model.safetensors and every test row, written
// in the test (double precision, no engine kernel), for a job whose test set
// divides neither by the replicas nor by the micro-batch, on both replica
// kinds and after a resume.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include <dpactor/engine.hpp>
#include "data/loading.hpp"
#include "tensors/safetensors.hpp"
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

}  // namespace
}  // namespace dpactor
