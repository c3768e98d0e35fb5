// The libtorch replica (model.kind = "torchscript") through the engine:
// replicas stay bitwise identical after every step, two follow one, and the
// reproducible mode gives the same bytes on 1, 2 and 3 replicas; checkpoints
// carry the module's state_dict names and values; a module defined in C++
// (dpactor/torch_module.hpp) or a TorchScript module the program loaded itself
// trains with no file in between; a module's buffers (BatchNorm) keep the
// replicas identical and come back on resume; a module that does not fit the
// job is refused before training. The binding alone, against libtorch:
// tests/torch_model_test.

#include <gtest/gtest.h>

#include <torch/script.h>
#include <torch/torch.h>

#include <atomic>
#include <filesystem>
#include <map>

#include <dpactor/engine.hpp>
#include <dpactor/error.hpp>
#include "tensors/safetensors.hpp"
#include "tensors/torch_model.hpp"
#include "tests/torch_support.hpp"
#include <dpactor/torch_module.hpp>

namespace dpactor {
namespace {

using testing::concatenated_values;
using testing::torch_models;

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
  EXPECT_EQ(weights, concatenated_values(torch::jit::load(torch_models + "mlp_16_32_4.pt").parameters()));
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
  return concatenated_values(Twin()->parameters());
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
  torch::jit::Module loaded = torch::jit::load(torch_models + "mlp_16_32_4.pt");
  const std::vector<float> before = concatenated_values(loaded.parameters());
  EXPECT_EQ(train_with(torch_script_module(loaded), 2, dir / "loaded"), from_file);
  EXPECT_EQ(concatenated_values(loaded.parameters()), before) << "the caller's module was trained in place";
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

std::vector<float> train_batchnorm(int replicas, bool reproducible, const std::filesystem::path& dir,
                                   std::int64_t steps = 40, run_options options = {},
                                   sync_codec codec = sync_codec::fp32) {
  job_config c = testing::small_job(testing::replica_kind::torch, replicas, 64, 1000);
  c.module.path = torch_models + "batchnorm.pt";
  c.train.micro_batch = reproducible ? 16 : 32;
  c.train.reproducible = reproducible;
  c.sync.codec = codec;
  c.sync.powersgd_rank = 2;        // the 32 x 16 weight travels as factors; the 4 x 32 one, the
  c.sync.powersgd_start_step = 5;  // BatchNorm's parameters and its buffers whole
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

// PowerSGD steps of a torch module (Note [PowerSGD steps]): its weight
// matrices travel as factors, its buffers whole as in fp32 steps (slice 0's
// count), so the replicas stay identical in fast mode and a reproducible run
// is the same bytes on 1, 2 and 3 replicas, not fp32's.
TEST(TorchEngine, PowerSgdStepsOfAModuleWithBuffersKeepReplicasIdenticalAndAreReproducible) {
  SKIP_WITHOUT_TORCH();
  testing::scratch_dir dir;
  train_batchnorm(2, false, dir / "fast", 40, {}, sync_codec::powersgd);
  const auto one = train_batchnorm(1, true, dir / "one", 40, {}, sync_codec::powersgd);
  EXPECT_EQ(train_batchnorm(2, true, dir / "two", 40, {}, sync_codec::powersgd), one);
  EXPECT_EQ(train_batchnorm(3, true, dir / "three", 40, {}, sync_codec::powersgd), one);
  EXPECT_NE(train_batchnorm(1, true, dir / "fp32"), one);
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
