// The libtorch replica's binding (model.kind = "torchscript"), checked
// against libtorch itself on the module's own tensors: gradients through
// dpactor's flat buffers are bitwise the module's own; one optimizer step
// equals torch::optim::SGD's on the same weights; N replicas at global batch
// B give one replica's gradients at B; a module's buffers (BatchNorm) are
// the module's own after each step and live in the state; bad files are
// refused, naming the file. The models are the committed TorchScript files
// (configs/cnn.pt, tests/data/torch/*.pt); no Python is needed. Through the
// engine: tests/torch_engine_test.

#include <gtest/gtest.h>

#include <torch/script.h>
#include <torch/torch.h>

#include <random>

#include "tensors/cpu_replica.hpp"
#include <dpactor/error.hpp>
#include "tensors/torch_model.hpp"
#include "tests/torch_support.hpp"

namespace dpactor {
namespace {

using testing::cnn_module;
using testing::torch_models;
using testing::values;

// Random images and labels: `rows` samples of 784 features, 10 classes.
struct batch {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  std::vector<std::uint32_t> indices;
};

batch random_batch(std::size_t rows, std::uint32_t seed, std::size_t features = 784, int classes = 10) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::uniform_int_distribution<int> label(0, classes - 1);
  batch b;
  b.x.resize(rows * features);
  for (auto& v : b.x) v = pixel(gen);
  for (std::size_t i = 0; i < rows; ++i) {
    b.y.push_back(label(gen));
    b.indices.push_back(static_cast<std::uint32_t>(i));
  }
  return b;
}

batch_ref rows_of(const batch& b, std::size_t begin, std::size_t end, std::size_t features = 784) {
  return batch_ref{b.x.data(), features, b.y.data(),
                   std::span<const std::uint32_t>(b.indices).subspan(begin, end - begin), b.y.size()};
}

torch_model_options cnn_options(std::size_t micro_batch) {
  torch_model_options o;
  o.path = cnn_module;
  o.input_shape = {1, 28, 28};
  o.features = 784;
  o.max_batch = micro_batch;
  return o;
}

optimizer_config sgd(double momentum) {
  optimizer_config o;
  o.kind = optimizer_kind::sgd;
  o.lr = 0.05;
  o.momentum = momentum;
  return o;
}

// A CPU replica on the CNN, holding the module's saved weights.
std::unique_ptr<cpu_replica> cnn_replica(std::size_t micro_batch, const optimizer_config& opt) {
  auto model = open_torch_model(cnn_options(micro_batch));
  std::vector<float> state;
  auto r = std::make_unique<cpu_replica>(std::move(model), opt);
  state.assign(r->layout().total_size(), 0.0f);
  open_torch_model(cnn_options(1))->initial_parameters(std::span<float>(state).first(r->layout().parameter_size));
  r->import_state(state);
  return r;
}

// A tensor's values out of a flat buffer laid out by `layout`.
std::vector<float> slice(std::span<const float> flat, const tensor_spec& t) {
  return {flat.begin() + static_cast<std::ptrdiff_t>(t.offset),
          flat.begin() + static_cast<std::ptrdiff_t>(t.offset + t.numel())};
}

torch::Tensor images(batch& b, std::size_t rows) {
  return torch::from_blob(b.x.data(), {static_cast<std::int64_t>(rows), 1, 28, 28});
}

torch::Tensor labels(const batch& b) {
  std::vector<std::int64_t> y(b.y.begin(), b.y.end());
  return torch::tensor(y);
}

TEST(TorchModel, GradientsThroughTheFlatBuffersAreBitwiseTheModulesOwn) {
  SKIP_WITHOUT_TORCH();
  batch b = random_batch(24, 1);
  auto r = cnn_replica(8, sgd(0.9));
  r->zero_grad();
  // Three micro-batches accumulate into the one gradient buffer.
  for (std::size_t begin = 0; begin < 24; begin += 8) r->accumulate(rows_of(b, begin, begin + 8));
  const auto grads = r->gradients();

  torch::jit::Module reference = torch::jit::load(cnn_module);
  for (std::size_t begin = 0; begin < 24; begin += 8) {
    const torch::Tensor x = images(b, 24).narrow(0, static_cast<std::int64_t>(begin), 8);
    const torch::Tensor y = labels(b).narrow(0, static_cast<std::int64_t>(begin), 8);
    torch::nn::functional::cross_entropy(reference.forward({x}).toTensor(), y,
                                         torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
        .backward();
  }
  const auto& tensors = r->layout().layout.tensors();
  std::size_t i = 0;
  for (const auto& p : reference.named_parameters()) {
    ASSERT_LT(i, r->layout().parameter_tensors);
    EXPECT_EQ(tensors[i].name, p.name) << "the layout follows the state_dict";
    EXPECT_EQ(slice(grads, tensors[i]), values(p.value.grad())) << p.name;
    ++i;
  }
  EXPECT_EQ(i, r->layout().parameter_tensors);
}

// Two steps of SGD with momentum, so that the momentum buffer matters.
TEST(TorchModel, AStepMatchesPlainLibtorchSgdOnTheSameWeights) {
  SKIP_WITHOUT_TORCH();
  constexpr std::size_t rows = 32;
  auto r = cnn_replica(rows, sgd(0.9));
  torch::jit::Module reference = torch::jit::load(cnn_module);
  std::vector<torch::Tensor> params;
  for (const auto& p : reference.parameters()) params.push_back(p);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  for (std::uint32_t step = 0; step < 2; ++step) {
    batch b = random_batch(rows, 10 + step);
    r->zero_grad();
    r->accumulate(rows_of(b, 0, rows));
    r->update_in_place(0.05, static_cast<double>(rows));

    opt.zero_grad();
    torch::nn::functional::cross_entropy(reference.forward({images(b, rows)}).toTensor(), labels(b)).backward();
    opt.step();
  }
  const std::vector<float> state = r->export_state();
  std::vector<float> ours, theirs;
  std::size_t i = 0;
  for (const auto& p : reference.parameters()) {
    const auto mine = slice(state, r->layout().layout.tensors()[i++]);
    ours.insert(ours.end(), mine.begin(), mine.end());
    const auto ref = values(p);
    theirs.insert(theirs.end(), ref.begin(), ref.end());
  }
  EXPECT_EQ(r->optimizer_steps(), 2);
  EXPECT_LE(testing::relative_difference(ours, theirs), 1e-6);
  std::vector<float> initial(r->layout().parameter_size);
  open_torch_model(cnn_options(1))->initial_parameters(initial);
  EXPECT_GT(testing::relative_difference(std::vector<float>(state.begin(), state.begin() + initial.size()), initial),
            1e-4)
      << "the step changed the weights";
}

TEST(TorchModel, NReplicasAtGlobalBatchBGiveOneReplicasGradients) {
  SKIP_WITHOUT_TORCH();
  constexpr std::size_t global = 48;
  batch b = random_batch(global, 3);
  auto one = cnn_replica(global, sgd(0.0));
  one->zero_grad();
  one->accumulate(rows_of(b, 0, global));
  const std::vector<float> whole(one->gradients().begin(), one->gradients().end());
  for (const std::size_t n : {2u, 4u, 3u}) {
    std::vector<double> sum(whole.size(), 0.0);
    std::vector<float> summed(whole.size());
    std::vector<std::unique_ptr<cpu_replica>> members;
    for (std::size_t m = 0; m < n; ++m) members.push_back(cnn_replica(global, sgd(0.0)));
    std::vector<float> reduced(whole.size(), 0.0f);
    for (std::size_t m = 0; m < n; ++m) {  // summed in rank order, as the collective does
      members[m]->zero_grad();
      members[m]->accumulate(rows_of(b, m * global / n, (m + 1) * global / n));
      const auto g = members[m]->gradients();
      for (std::size_t k = 0; k < g.size(); ++k) reduced[k] += g[k];
    }
    EXPECT_LE(testing::relative_difference(reduced, whole), 1e-6) << n << " replicas";
  }
}

// See Note [Module buffers]: BatchNorm's running statistics after a step are
// the module's own after its forward on that step's batch, and the next step
// starts from them (kept in the state, not in the module).
TEST(TorchModel, BuffersAreTheModulesOwnAfterEachStepAndLiveInTheState) {
  SKIP_WITHOUT_TORCH();
  torch_model_options o;
  o.path = torch_models + "batchnorm.pt";
  o.input_shape = {16};
  o.features = 16;
  o.max_batch = 32;
  auto model = open_torch_model(o);
  std::vector<float> initial(model->layout().size());
  model->initial_parameters(initial);
  cpu_replica r(std::move(model), sgd(0.9));
  std::vector<float> state(r.layout().total_size(), 0.0f);
  std::copy(initial.begin(), initial.end(), state.begin());
  r.import_state(state);
  ASSERT_LT(r.layout().buffer_begin, r.layout().parameter_size) << "the module's buffers are in the state";

  torch::jit::Module reference = torch::jit::load(torch_models + "batchnorm.pt");
  reference.train();
  for (std::uint32_t step = 0; step < 2; ++step) {
    batch b = random_batch(32, 20 + step, 16, 4);
    r.zero_grad();
    r.accumulate(rows_of(b, 0, 32, 16));
    const std::vector<float> grads(r.gradients().begin(), r.gradients().end());
    r.update_in_place(0.0, 32.0);  // rate 0: the reference's weights stay the replica's
    const std::vector<float> after = r.export_state();
    torch::NoGradGuard no_grad;
    reference.forward({torch::from_blob(b.x.data(), {32, 16})});
    std::size_t checked = 0;
    for (const auto& buffer : reference.named_buffers()) {
      const tensor_spec* t = r.layout().layout.find(buffer.name);
      ASSERT_NE(t, nullptr) << buffer.name;
      ASSERT_GE(t->offset, r.layout().buffer_begin) << buffer.name;
      const auto expected = values(buffer.value.to(torch::kFloat));
      EXPECT_EQ(slice(grads, *t), expected) << buffer.name << ", step " << step;
      EXPECT_EQ(slice(after, *t), expected) << buffer.name << " in the state, step " << step;
      ++checked;
    }
    EXPECT_EQ(checked, 3u) << "running_mean, running_var, num_batches_tracked";
  }
}

// Each bad file or shape is refused before training with a config_error
// that names the file and says what is wrong.
TEST(TorchModel, BadFilesAreRefusedNamingTheFile) {
  SKIP_WITHOUT_TORCH();
  testing::scratch_dir dir;
  testing::write_text(dir / "notes.pt", "these are not weights\n");
  const auto refused = [](const std::string& path, std::vector<std::int64_t> shape, const std::string& says) {
    torch_model_options o;
    o.path = path;
    o.input_shape = std::move(shape);
    o.features = 16;
    try {
      open_torch_model(o);
      ADD_FAILURE() << path << " was accepted";
    } catch (const config_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path), std::string::npos) << what;
      EXPECT_NE(what.find(says), std::string::npos) << what;
    }
  };
  refused((dir / "missing.pt").string(), {16}, "cannot open the file");
  refused((dir / "notes.pt").string(), {16}, "is not a TorchScript file");
  refused(torch_models + "state_dict.pt", {16}, "is not a TorchScript module");
  refused(torch_models + "newer.pt", {16}, "newer PyTorch (file format version 99)");
  refused(torch_models + "float64.pt", {16}, "parameter 0.weight is Double");
  refused(torch_models + "float64_buffer.pt", {16}, "buffer scale is Double; dpactor keeps float32 buffers and int64 counters only");
  refused(torch_models + "flat_output.pt", {16}, "one row of class scores per sample");
  refused(torch_models + "mlp_16_32_4.pt", {15}, "model.input_shape = [15] is 15 values per sample, but the data has 16");
  refused(cnn_module, {16}, "forward of one sample shaped [1, 16]");
}

}  // namespace
}  // namespace dpactor
