// The libtorch replica (model.kind = "torchscript"), checked against libtorch
// itself: this test links libtorch to compute the references; dpactor's side
// reaches it through the plugin, as the engine does (See Note [The libtorch
// plugin]). The models are the committed TorchScript files (configs/cnn.pt,
// tests/data/torch/*.pt); no Python is needed.
//  - the binding: gradients through dpactor's flat buffers are bitwise the
//    module's own on its own tensors;
//  - one optimizer step equals torch::optim::SGD's on the same weights;
//  - N replicas at global batch B give one replica's gradients at B;
//  - through the engine: replicas stay bitwise identical after every step,
//    two follow one, and the reproducible mode gives the same bytes on 1, 2
//    and 3 replicas;
//  - a module defined in C++ (torch/module_model.hpp) trains the same way;
//  - bad files are refused before training, naming the file.

#include <gtest/gtest.h>

#include <torch/script.h>
#include <torch/torch.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <random>

#include "actors/engine.hpp"
#include "tensors/cpu_replica.hpp"
#include "tensors/error.hpp"
#include "tensors/safetensors.hpp"
#include "tensors/torch_model.hpp"
#include "tests/test_support.hpp"
#include "torch/module_model.hpp"

namespace dpactor {
namespace {

const std::string source_dir = DPACTOR_SOURCE_DIR;
const std::string cnn_file = source_dir + "/configs/cnn.pt";
const std::string models = source_dir + "/tests/data/torch/";

#define SKIP_WITHOUT_TORCH() DPACTOR_SKIP_WITHOUT(testing::replica_kind::torch)

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
  o.path = cnn_file;
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

std::vector<float> values(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
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

  torch::jit::Module reference = torch::jit::load(cnn_file);
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
  torch::jit::Module reference = torch::jit::load(cnn_file);
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

// The engine runs of these tests: `steps` steps of job `c` (over its 1000
// samples), checkpointed in `dir`. train.verify_replicas compares every
// member's state checksum at every step and fails the run on any difference.
run_summary run_steps(job_config c, const std::filesystem::path& dir, std::int64_t steps = 40, run_options options = {}) {
  c.train.epochs = 10;
  c.train.max_steps = steps;
  c.train.verify_replicas = true;
  c.train.checkpoint_dir = dir.string();
  Engine engine(std::move(c), std::move(options));
  engine.start();
  const run_summary s = engine.wait();
  EXPECT_EQ(s.steps, steps);
  return s;
}

// Through the engine, not reproducible: shards of any size, summed in rank
// order.
std::vector<float> train(int replicas, bool reproducible, const std::filesystem::path& dir, std::int64_t batch = 64) {
  job_config c = testing::small_job(testing::replica_kind::torch, replicas, batch, 1000);
  c.train.micro_batch = 16;
  c.train.reproducible = reproducible;
  return testing::checkpoint_parameters(run_steps(c, dir).checkpoint);
}

TEST(TorchEngine, ReplicasStayBitwiseIdenticalAndTwoFollowOne) {
  SKIP_WITHOUT_TORCH();
  testing::scratch_dir dir;
  const auto one = train(1, false, dir / "one");
  const auto two = train(2, false, dir / "two");
  const auto three = train(3, false, dir / "three");
  ASSERT_EQ(one.size(), two.size());
  EXPECT_NE(one, train(1, false, dir / "other", 32)) << "the comparison can tell runs apart";
  EXPECT_LE(testing::relative_difference(two, one), 1e-5);
  EXPECT_LE(testing::relative_difference(three, one), 1e-5);
}

TEST(TorchEngine, TheReproducibleModeGivesTheSameBytesOnOneTwoAndThreeReplicas) {
  SKIP_WITHOUT_TORCH();
  testing::scratch_dir dir;
  const auto one = train(1, true, dir / "one");
  EXPECT_EQ(train(2, true, dir / "two"), one);
  EXPECT_EQ(train(3, true, dir / "three"), one);
}

TEST(TorchEngine, CheckpointsUseTheModulesStateDictNames) {
  SKIP_WITHOUT_TORCH();
  testing::scratch_dir dir;
  job_config c = testing::small_job(testing::replica_kind::torch, 2, 32, 256);
  c.train.checkpoint_dir = dir.path().string();
  c.optimizer.lr = 0.0;  // the weights stay the module's as saved
  c.optimizer.momentum = 0.0;
  Engine engine(c);
  engine.start();
  const run_summary s = engine.wait();
  std::vector<std::string> names;
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<float> weights;
  for (const auto& t : load_safetensors(std::filesystem::path(s.checkpoint) / "model.safetensors").tensors) {
    names.push_back(t.name);
    shapes.push_back(t.shape);
    weights.insert(weights.end(), t.values.begin(), t.values.end());
  }
  // The module's own values: the run trained the file's module, not the
  // native MLP of the same shapes.
  torch::jit::Module saved = torch::jit::load(models + "mlp_16_32_4.pt");
  std::vector<float> expected;
  for (const auto& p : saved.parameters()) {
    const auto v = values(p);
    expected.insert(expected.end(), v.begin(), v.end());
  }
  EXPECT_EQ(weights, expected);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ(shapes, (std::vector<std::vector<std::int64_t>>{{32, 16}, {32}, {4, 32}, {4}}));
}

// The tests' 16-32-4 network defined in C++, with the state_dict names of
// nn.Sequential.
struct TwinImpl : torch::nn::Module {
  TwinImpl()
      : fc1(register_module("0", torch::nn::Linear(16, 32))), fc2(register_module("2", torch::nn::Linear(32, 4))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Twin);

// A factory whose every module draws other weights (seed 0, 1, 2, ...).
struct twin_factory {
  std::shared_ptr<std::atomic<int>> made = std::make_shared<std::atomic<int>>(0);
  torch_model_factory factory() const {
    return torch_module([made = made] {
      torch::manual_seed(made->fetch_add(1));
      return torch::nn::AnyModule(Twin());
    });
  }
};

std::vector<float> twin_weights(std::uint64_t seed) {
  torch::manual_seed(seed);
  Twin twin;
  std::vector<float> out;
  for (const auto& p : twin->parameters()) {
    const auto v = values(p);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::vector<float> train_twin(int replicas, double lr, const std::filesystem::path& dir, const twin_factory& twins) {
  job_config c = testing::small_job(replicas, 64, 1000);
  c.module.input_shape = {16};
  c.train.reproducible = false;
  c.optimizer.lr = lr;
  run_options o;
  o.torch_model = twins.factory();
  // Bitwise identical at every step, though each module drew its own weights.
  return testing::checkpoint_parameters(run_steps(c, dir, 40, o).checkpoint);
}

TEST(TorchEngine, AModuleDefinedInCppTrainsWithNoFileInBetween) {
  SKIP_WITHOUT_TORCH();
  testing::scratch_dir dir;
  twin_factory frozen;
  // At rate 0 the weights stay the first module's (seed 0), on every replica.
  EXPECT_EQ(train_twin(2, 0.0, dir / "frozen", frozen), twin_weights(0));
  EXPECT_EQ(frozen.made->load(), 3) << "one module to lay the state out, one per replica";
  EXPECT_NE(twin_weights(0), twin_weights(1)) << "the modules did draw other weights";
  const auto one = train_twin(1, 0.05, dir / "one", twin_factory{});
  const auto two = train_twin(2, 0.05, dir / "two", twin_factory{});
  EXPECT_NE(one, twin_weights(0)) << "it trained";
  EXPECT_LE(testing::relative_difference(two, one), 1e-5);
}

// A job of 40 steps on the tests' small data with a module from `factory`
// (none: the job's model.path); returns the checkpoint's tensors by name.
std::map<std::string, std::vector<float>> train_with(torch_model_factory factory, int replicas,
                                                     const std::filesystem::path& dir) {
  job_config c = testing::small_job(testing::replica_kind::torch, replicas, 64, 1000);
  c.train.micro_batch = 16;
  c.train.reproducible = true;
  run_options o;
  o.torch_model = std::move(factory);
  const run_summary s = run_steps(c, dir, 40, o);
  std::map<std::string, std::vector<float>> out;
  for (auto& t : load_safetensors(std::filesystem::path(s.checkpoint) / "model.safetensors").tensors)
    out[t.name] = std::move(t.values);
  return out;
}

// A TorchScript module the program loaded itself trains as its file does,
// and keeps its own weights: every replica trains a deep copy.
TEST(TorchEngine, ALoadedTorchScriptModuleTrainsTheBytesOfItsFile) {
  SKIP_WITHOUT_TORCH();
  testing::scratch_dir dir;
  const auto from_file = train_with(nullptr, 2, dir / "file");
  torch::jit::Module loaded = torch::jit::load(models + "mlp_16_32_4.pt");
  std::vector<float> before;
  for (const auto& p : loaded.parameters()) {
    const auto v = values(p);
    before.insert(before.end(), v.begin(), v.end());
  }
  EXPECT_EQ(train_with(torch_script_module(loaded), 2, dir / "loaded"), from_file);
  std::vector<float> after;
  for (const auto& p : loaded.parameters()) {
    const auto v = values(p);
    after.insert(after.end(), v.begin(), v.end());
  }
  EXPECT_EQ(after, before) << "the caller's module was trained in place";
  EXPECT_NE(from_file.at("0.weight"), std::vector<float>(before.begin(), before.begin() + 512)) << "it trained";
}

// The tests' network with a BatchNorm, defined in C++: its buffers train as
// a TorchScript module's do (See Note [Module buffers]).
struct NormedImpl : torch::nn::Module {
  NormedImpl()
      : fc1(register_module("0", torch::nn::Linear(16, 32))), norm(register_module("1", torch::nn::BatchNorm1d(32))),
        fc2(register_module("3", torch::nn::Linear(32, 4))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(norm(fc1(x)))); }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d norm;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Normed);

TEST(TorchEngine, ACppModuleWithBuffersKeepsItsReplicasIdenticalAndCheckpointsTheBuffers) {
  SKIP_WITHOUT_TORCH();
  testing::scratch_dir dir;
  const auto make = [] {
    torch::manual_seed(3);
    return torch::nn::AnyModule(Normed());
  };
  const auto one = train_with(torch_module(make), 1, dir / "one");
  const auto two = train_with(torch_module(make), 2, dir / "two");  // verify_replicas: identical at every step
  ASSERT_TRUE(two.count("1.running_mean") && two.count("1.running_var") && two.count("1.num_batches_tracked"));
  EXPECT_EQ(two.at("1.num_batches_tracked"), std::vector<float>{40.0f});
  EXPECT_NE(two.at("1.running_mean"), std::vector<float>(32, 0.0f)) << "the statistics moved";
  EXPECT_EQ(two, one) << "reproducible mode: the step's first slice's buffers, on any number of replicas";
}

TEST(TorchEngine, AModuleDefinedInCppNeedsItsInputShape) {
  SKIP_WITHOUT_TORCH();
  job_config c = testing::small_job(1, 64, 256);
  run_options o;
  o.torch_model = twin_factory{}.factory();
  Engine engine(c, o);
  try {
    engine.start();
    ADD_FAILURE() << "started";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("set model.input_shape"), std::string::npos) << e.what();
  }
}

// See Note [Module buffers]: BatchNorm's running statistics after a step are
// the module's own after its forward on that step's batch, and the next step
// starts from them (kept in the state, not in the module).
TEST(TorchModel, BuffersAreTheModulesOwnAfterEachStepAndLiveInTheState) {
  SKIP_WITHOUT_TORCH();
  torch_model_options o;
  o.path = models + "batchnorm.pt";
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

  torch::jit::Module reference = torch::jit::load(models + "batchnorm.pt");
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

std::vector<float> train_batchnorm(int replicas, bool reproducible, const std::filesystem::path& dir,
                                   std::int64_t steps = 40, run_options options = {}) {
  job_config c = testing::small_job(testing::replica_kind::torch, replicas, 64, 1000);
  c.module.path = models + "batchnorm.pt";
  c.train.micro_batch = reproducible ? 16 : 32;
  c.train.reproducible = reproducible;
  // The buffers are in the state: verify_replicas finds them bitwise identical at every step.
  const run_summary s = run_steps(c, dir, steps, std::move(options));
  const auto file = load_safetensors(std::filesystem::path(s.checkpoint) / "model.safetensors");
  bool found = false;
  for (const auto& t : file.tensors)
    if (t.name == "1.num_batches_tracked") {
      found = true;
      EXPECT_EQ(t.values.at(0), static_cast<float>(steps)) << "one forward a step counts (rank 0's, or slice 0's)";
    }
  EXPECT_TRUE(found) << "the checkpoint names the buffers as the state_dict does";
  return testing::checkpoint_parameters(s.checkpoint);
}

TEST(TorchEngine, AModuleWithBuffersTrainsOnReplicasThatStayIdenticalAndReproducible) {
  SKIP_WITHOUT_TORCH();
  testing::scratch_dir dir;
  train_batchnorm(2, false, dir / "fast");
  const auto one = train_batchnorm(1, true, dir / "one");
  EXPECT_EQ(train_batchnorm(2, true, dir / "two"), one);
  EXPECT_EQ(train_batchnorm(3, true, dir / "three"), one);
}

// The buffers are saved with the parameters and come back on resume: a run
// stopped at step 17 and resumed to 40 ends on the bytes of one that never
// stopped, running statistics and the count of batches included.
TEST(TorchEngine, AModulesBuffersComeBackOnResume) {
  SKIP_WITHOUT_TORCH();
  testing::scratch_dir dir;
  const auto straight = train_batchnorm(2, false, dir / "straight");
  train_batchnorm(2, false, dir / "split", 17);
  EXPECT_EQ(train_batchnorm(2, false, dir / "split", 40, testing::resume_from(dir / "split")), straight);
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
  refused(models + "state_dict.pt", {16}, "is not a TorchScript module");
  refused(models + "newer.pt", {16}, "newer PyTorch (file format version 99)");
  refused(models + "float64.pt", {16}, "parameter 0.weight is Double");
  refused(models + "float64_buffer.pt", {16}, "buffer scale is Double; dpactor keeps float32 buffers and int64 counters only");
  refused(models + "flat_output.pt", {16}, "one row of class scores per sample");
  refused(models + "mlp_16_32_4.pt", {15}, "model.input_shape = [15] is 15 values per sample, but the data has 16");
  refused(cnn_file, {16}, "forward of one sample shaped [1, 16]");
}

TEST(TorchEngine, AModuleWithFewerClassesThanTheDataIsRefusedBeforeTraining) {
  SKIP_WITHOUT_TORCH();
  testing::scratch_dir dir;
  // Labels 0..4: five classes; the module outputs 4 scores.
  std::string rows;
  for (int i = 0; i < 20; ++i) {
    rows += std::to_string(i % 5);
    for (int f = 0; f < 16; ++f) rows += ",0.5";
    rows += "\n";
  }
  testing::write_text(dir / "five.csv", rows);
  job_config c = testing::small_job(testing::replica_kind::torch, 1, 32, 256);
  c.data.format = data_format::csv;
  c.data.train_file = c.data.test_file = (dir / "five.csv").string();
  Engine engine(c);
  try {
    engine.start();
    ADD_FAILURE() << "started";
  } catch (const error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("mlp_16_32_4.pt"), std::string::npos) << what;
    EXPECT_NE(what.find("outputs 4 class scores per sample"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace dpactor
