// GPU tests (ctest label gpu). On a machine without a CUDA device each Gpu
// test skips, saying why (GpuHost, the host side, runs everywhere). On a GPU: every kernel against the CPU reference on
// fresh random inputs with outputs poisoned before each run (fp32 <= 1e-5
// relative, TF32 GEMMs <= 1e-3), the CUDA replica's steps against the CPU
// replica's (resident and streamed data; gradient buckets over NCCL with one
// rank), the NCCL path with one rank, and the default job trained on the GPU.
// Reproducible mode (See Note [The tree on a device]): the tree's kernels
// bitwise against the host, slice gradients that do not depend on the
// replica, and two runs of the default job with the same files.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "config/config_file.hpp"
#include <dpactor/engine.hpp>
#include "train/step_runner.hpp"
#include "comms/local.hpp"
#include "comms/nccl.hpp"
#include "comms/summation_tree.hpp"
#include "cuda/blas.hpp"
#include "cuda/cuda_replica.hpp"
#include "cuda/kernels.hpp"
#include "cuda/resources.hpp"
#include "data/synthetic.hpp"
#include "tensors/cpu_replica.hpp"
#include "tensors/gemm.hpp"
#include "tensors/rng.hpp"
#include "tensors/vector_add.hpp"
#include "tests/test_support.hpp"

namespace dpactor {
namespace {

#define SKIP_WITHOUT_GPU()                                                     \
  do {                                                                         \
    std::string why;                                                           \
    if (visible_cuda_devices(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why; \
  } while (false)

constexpr float poison = std::numeric_limits<float>::quiet_NaN();

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  rng gen(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(gen.uniform(-2.0, 2.0));
  return v;
}

template <class T>
device_buffer<T> upload(const std::vector<T>& host) {
  device_buffer<T> d(host.size());
  CUDA_CHECK(cudaMemcpy(d.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
std::vector<T> download(const device_buffer<T>& d) {
  std::vector<T> host(d.size());
  CUDA_CHECK(cudaMemcpy(host.data(), d.data(), d.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i])) return std::numeric_limits<double>::infinity();  // never written
    diff += (got[i] - want[i]) * static_cast<double>(got[i] - want[i]);
    norm += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

bool cublas_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("libcublas.so") != std::string::npos) return true;
  return false;
}

// See Note [cuBLAS is loaded when a GPU replica first needs it]. Runs with or
// without a GPU: the first handle opens cuBLAS and finds its functions; only
// then may it fail, and without a GPU it does, with cuBLAS's own status.
TEST(GpuHost, CublasIsOpenedByTheFirstHandle) {
  std::string why;
  const bool gpu = visible_cuda_devices(&why) > 0;
  try {
    cublas_handle blas(nullptr, false);
    EXPECT_TRUE(gpu) << "a cuBLAS handle without a GPU";
  } catch (const cuda_error& e) {
    const std::string what = e.what();
    EXPECT_FALSE(gpu) << what;
    EXPECT_NE(what.find("cuBLAS"), std::string::npos) << what;
    EXPECT_EQ(what.find("could not be loaded"), std::string::npos) << what;
    EXPECT_EQ(what.find(" has no "), std::string::npos) << what;
  }
  EXPECT_TRUE(cublas_mapped());
}

TEST(Gpu, GemmMatchesTheCpuInFp32AndTf32) {
  SKIP_WITHOUT_GPU();
  const int m = 130, n = 70, k = 257;
  for (bool tf32 : {false, true}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const auto a = random_floats(static_cast<std::size_t>(m * k), 1 + ta), b = random_floats(static_cast<std::size_t>(k * n), 3 + tb);
        std::vector<float> want(static_cast<std::size_t>(m * n));
        gemm(ta, tb, m, n, k, 1.0f, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.0f, want.data(), n);
        cuda_stream stream;
        cublas_handle blas(stream.get(), tf32);
        auto da = upload(a), db = upload(b);
        auto dc = upload(std::vector<float>(static_cast<std::size_t>(m * n), poison));
        gemm(blas, ta, tb, m, n, k, 1.0f, da.data(), ta ? m : k, db.data(), tb ? k : n, 0.0f, dc.data(), n);
        CUDA_CHECK(cudaStreamSynchronize(stream.get()));
        EXPECT_LE(relative_error(download(dc), want), tf32 ? 1e-3 : 1e-5) << "tf32=" << tf32 << " ta=" << ta << " tb=" << tb;
      }
    }
  }
}

TEST(Gpu, BiasActivationKernelsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (activation act : {activation::relu, activation::gelu, activation::tanh, activation::sigmoid, activation::identity}) {
    const std::size_t rows = 37, cols = 129;
    const auto x = random_floats(rows * cols, 5), bias = random_floats(cols, 6), dy = random_floats(rows * cols, 7);
    std::vector<float> z = x, a(rows * cols), grad = dy, db(cols, 0.0f);
    const bool keep_z = activation_backward_needs_input(act);
    bias_activation_forward(act, rows, cols, bias.data(), z.data(), keep_z ? a.data() : z.data());
    const std::vector<float> a_want = keep_z ? a : z;
    bias_activation_backward(act, rows, cols, keep_z ? z.data() : a_want.data(), grad.data(), db.data());

    auto dz = upload(x), dbias = upload(bias), dgrad = upload(dy);
    auto da = upload(std::vector<float>(rows * cols, poison)), ddb = upload(std::vector<float>(cols, poison));
    cuda::bias_activation_forward(act, rows, cols, dbias.data(), dz.data(), keep_z ? da.data() : dz.data(), nullptr);
    cuda::bias_activation_backward(act, rows, cols, keep_z ? dz.data() : dz.data(), dgrad.data(), ddb.data(), true, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto a_got = keep_z ? download(da) : download(dz);
    EXPECT_LE(relative_error(a_got, a_want), 1e-5) << activation_name(act);
    EXPECT_LE(relative_error(download(dgrad), grad), 1e-5) << activation_name(act);
    EXPECT_LE(relative_error(download(ddb), db), 1e-5) << activation_name(act);
  }
}

TEST(Gpu, LossKernelsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (loss_kind kind : {loss_kind::cross_entropy, loss_kind::mse}) {
    const std::size_t rows = 300, classes = 10;
    const auto logits = random_floats(rows * classes, 8);
    std::vector<std::int32_t> labels(rows);
    for (std::size_t i = 0; i < rows; ++i) labels[i] = static_cast<std::int32_t>((i * 7) % classes);
    std::vector<float> grad(rows * classes);
    const loss_stats want = compute_loss(kind, rows, classes, logits.data(), labels.data(), grad.data());
    auto dl = upload(logits);
    auto dlab = upload(labels);
    auto dgrad = upload(std::vector<float>(rows * classes, poison));
    device_buffer<double> loss(1);
    device_buffer<unsigned long long> correct(1);
    CUDA_CHECK(cudaMemset(loss.data(), 0, sizeof(double)));
    CUDA_CHECK(cudaMemset(correct.data(), 0, sizeof(unsigned long long)));
    cuda::loss(kind, rows, classes, dl.data(), dlab.data(), dgrad.data(), loss.data(), correct.data(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_NEAR(download(loss)[0], want.loss_sum, 1e-5 * std::abs(want.loss_sum)) << loss_name(kind);
    EXPECT_EQ(static_cast<std::int64_t>(download(correct)[0]), want.correct) << loss_name(kind);
    EXPECT_LE(relative_error(download(dgrad), grad), 1e-5) << loss_name(kind);
  }
}

TEST(Gpu, OptimizerKernelsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (optimizer_kind kind : {optimizer_kind::sgd, optimizer_kind::adamw}) {
    optimizer_config cfg;
    cfg.kind = kind;
    cfg.nesterov = kind == optimizer_kind::sgd;
    cfg.weight_decay = 0.01;
    const std::size_t n = 10007;
    auto p = random_floats(n, 9);
    std::vector<float> s0(n, 0.0f), s1(n, 0.0f);
    auto dp = upload(p), ds0 = upload(s0), ds1 = upload(s1);
    for (int step = 0; step < 5; ++step) {
      const auto g = random_floats(n, 100 + static_cast<std::uint64_t>(step));
      std::vector<std::span<float>> slots{s0};
      if (kind == optimizer_kind::adamw) slots.push_back(s1);
      optimizer_step(cfg, p, g, slots, 0.5f, 0.01, step);
      auto dg = upload(g);
      cuda::optimizer_buffers b{dp.data(), dp.data(), dg.data(), ds0.data(), ds0.data(), ds1.data(), ds1.data()};
      cuda::optimizer_step(cfg, b, n, 0.5f, 0.01, step, nullptr);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LE(relative_error(download(dp), p), 1e-5) << optimizer_name(kind);
  }
}

// A small classification problem and initial state shared by the replica tests.
struct replica_case {
  explicit replica_case(std::vector<int> sizes, std::uint64_t seed)
      : spec{std::move(sizes), activation::relu, loss_kind::cross_entropy},
        data(make_synthetic(synthetic_options{512, 64, 10, 0.5f, 1, 0})),
        state(make_state_layout(spec, optimizer_config{}).total_size(), 0.0f) {
    init_mlp_parameters(spec, std::span<float>(state).first(make_state_layout(spec, optimizer_config{}).parameter_size), seed);
  }
  mlp_spec spec;
  dataset data;
  std::vector<float> state;
};

TEST(Gpu, CudaReplicaStepsMatchTheCpuReplica) {
  SKIP_WITHOUT_GPU();
  const replica_case t({64, 48, 10}, 3);
  const dataset& data = t.data;
  cpu_replica cpu(t.spec, optimizer_config{}, 32);
  cuda_replica gpu(t.spec, optimizer_config{}, 32, cuda_replica_options{});
  cpu.import_state(t.state);
  gpu.import_state(t.state);
  std::vector<std::uint32_t> rows(96);
  for (int step = 0; step < 5; ++step) {
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::uint32_t>((step * 97 + i * 5) % 512);
    for (replica* r : std::initializer_list<replica*>{&cpu, &gpu}) {
      r->zero_grad();
      for (std::size_t b = 0; b < rows.size(); b += 32)
        r->accumulate(data.batch(std::span<const std::uint32_t>(rows).subspan(b, 32)));
      r->gradients();
      r->apply_update(0.05, r->samples(), 0, r->layout().parameter_size);
      r->finish_step();
    }
  }
  std::vector<float> want(cpu.layout().parameter_size), got(cpu.layout().parameter_size);
  cpu.copy_parameters(want);
  gpu.copy_parameters(got);
  EXPECT_LE(relative_error(got, want), 1e-5);
  EXPECT_EQ(gpu.optimizer_steps(), 5);
}

// Steps of a replica through the step runner, as the device actor drives it.
struct runner_member {
  runner_member(replica& model, std::shared_ptr<collective_group> group)
      : model(model), group(std::move(group)), comm(this->group->endpoint(0)),
        runner(0, {}, 1, 2.0, 0.001, bucket_limits{1024, 4096}) {}
  void step(const dataset& data, std::int64_t step, std::span<const std::uint32_t> rows) {
    step_shard shard{step, 0, {rows.begin(), rows.end()}};
    const auto c = runner.compute(shard, model, data, control, *group, comm.get());
    started_in_backward = runner.buckets_started_in_backward();
    runner.synchronize(c, 0, model, *comm, {}, nullptr, lr_schedule{});
  }
  replica& model;
  std::shared_ptr<collective_group> group;
  std::unique_ptr<collective> comm;
  step_runner runner;
  device_control control;
  std::size_t started_in_backward = 0;
};

// See Note [Gradient buckets]: NCCL (one rank: NCCL refuses two ranks on one
// GPU) reduces buckets started during backward on its own stream, ordered
// after the replica's stream by events; the result must be the CPU's.
TEST(Gpu, BucketedStepsOnNcclMatchTheCpuReplica) {
  SKIP_WITHOUT_GPU();
  const replica_case t({64, 48, 32, 10}, 5);
  const dataset& data = t.data;
  cpu_replica cpu(t.spec, optimizer_config{}, 32);
  cuda_replica gpu(t.spec, optimizer_config{}, 32, cuda_replica_options{});
  cpu.import_state(t.state);
  gpu.import_state(t.state);
  runner_member on_cpu(cpu, make_local_group(1)), on_gpu(gpu, make_nccl_group({0}));
  ASSERT_GE(on_gpu.runner.buckets(gpu).size(), 3u);
  std::vector<std::uint32_t> rows(80);
  for (int step = 0; step < 5; ++step) {
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::uint32_t>((step * 89 + i * 7) % 512);
    on_cpu.step(data, step, rows);
    on_gpu.step(data, step, rows);
    EXPECT_EQ(on_gpu.started_in_backward, on_gpu.runner.buckets(gpu).size()) << "every bucket started during backward";
  }
  std::vector<float> want(cpu.layout().parameter_size), got(cpu.layout().parameter_size);
  cpu.copy_parameters(want);
  gpu.copy_parameters(got);
  EXPECT_LE(relative_error(got, want), 1e-5);
  EXPECT_EQ(gpu.optimizer_steps(), 5);
}

// See Note [Data on the GPU]: rows streamed through pinned staging slots on
// the copy stream, with and without prefetch, give bitwise the resident path.
TEST(Gpu, StreamedDataMatchesResidentData) {
  SKIP_WITHOUT_GPU();
  const replica_case t({64, 48, 10}, 9);
  const dataset& data = t.data;
  cuda_replica_options resident_options, streamed_options;
  resident_options.data = cuda_data_placement::resident;
  streamed_options.data = cuda_data_placement::streamed;
  cuda_replica resident(t.spec, optimizer_config{}, 32, resident_options);
  cuda_replica streamed(t.spec, optimizer_config{}, 32, streamed_options);
  resident.import_state(t.state);
  streamed.import_state(t.state);
  std::vector<std::uint32_t> rows(96);
  for (int step = 0; step < 6; ++step) {
    for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::uint32_t>((step * 131 + i * 3) % 512);
    batch_stats stats[2];
    int which = 0;
    for (cuda_replica* r : {&resident, &streamed}) {
      r->zero_grad();
      const std::span<const std::uint32_t> all(rows);
      for (std::size_t b = 0; b < rows.size(); b += 32) {
        // Odd steps prefetch the next micro-batch (and once one never used).
        if (step % 2 == 1 && b + 32 < rows.size()) r->prefetch(data.batch(all.subspan(b + 32, 32)));
        if (step == 3 && b == 0) r->prefetch(data.batch(all.subspan(64, 32)));
        stats[which] += r->accumulate(data.batch(all.subspan(b, 32)));
      }
      r->gradients();
      r->apply_update(0.05, r->samples(), 0, r->layout().parameter_size);
      r->finish_step();
      ++which;
    }
    EXPECT_EQ(stats[0].loss_sum, stats[1].loss_sum) << "step " << step;
    EXPECT_EQ(stats[0].correct, stats[1].correct);
    const auto e = streamed.evaluate(data.batch(std::span<const std::uint32_t>(rows).first(32)));
    EXPECT_EQ(e.loss_sum, resident.evaluate(data.batch(std::span<const std::uint32_t>(rows).first(32))).loss_sum);
  }
  EXPECT_EQ(streamed.export_state(), resident.export_state());
}

TEST(Gpu, NcclWithOneRank) {
  SKIP_WITHOUT_GPU();
  auto group = make_nccl_group({0});
  auto endpoint = group->endpoint(0);
  auto d = upload(std::vector<float>{1.0f, 2.0f, 3.0f});
  endpoint->all_reduce_sum(d.span(), {});
  endpoint->broadcast(d.span(), 0, {});
  const std::span<float> sections[] = {d.span()};
  endpoint->all_gather(sections, {});
  std::vector<float> host{4.0f};  // a host buffer goes through device scratch memory
  endpoint->all_reduce_sum(host, {});
  EXPECT_EQ(download(d), (std::vector<float>{1.0f, 2.0f, 3.0f}));
  EXPECT_EQ(host[0], 4.0f);
  group->abort();
  EXPECT_THROW(endpoint->all_reduce_sum(d.span(), {}), collective_error);
}

std::vector<std::uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// See Note [The tree on a device]: the addition and the element program on
// the GPU give the host's bytes.
TEST(Gpu, TreeKernelsGiveTheBytesOfTheHost) {
  SKIP_WITHOUT_GPU();
  const std::size_t n = 10'007;
  std::vector<float> a = random_floats(n, 1);
  const std::vector<float> b = random_floats(n, 2);
  device_buffer<float> da = upload(a);
  const device_buffer<float> db = upload(b);
  cuda::add_into(da.data(), db.data(), n, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  add_into(a.data(), b.data(), n);
  EXPECT_EQ(bits_of(download(da)), bits_of(a));
  // 7 slices held as {0, 1, 2} and {3, 4, 5, 6}: nodes of several levels.
  const summation_tree tree(7);
  std::vector<std::uint32_t> parts;
  for (const auto& owned : {std::vector<std::uint8_t>{1, 1, 1, 0, 0, 0, 0}, std::vector<std::uint8_t>{0, 0, 0, 1, 1, 1, 1}})
    for (const std::uint32_t node : tree.cover(owned)) parts.push_back(node);
  std::vector<std::vector<float>> values;
  std::vector<device_buffer<float>> on_device;
  std::vector<const float*> host_pointers, device_pointers;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    values.push_back(random_floats(n, 10 + p));
    for (std::size_t i = 0; i < n; i += 3) values.back()[i] *= 1e6f;  // magnitudes apart: the order shows
    on_device.push_back(upload(values.back()));
    host_pointers.push_back(values.back().data());
    device_pointers.push_back(on_device.back().data());
  }
  tree_plan plan;
  plan.build(tree, parts);
  std::vector<float> want(n);
  plan.run(host_pointers.data(), 0, n, want.data());
  const auto steps = upload(std::vector<tree_step>(plan.steps().begin(), plan.steps().end()));
  const auto pointers = upload(device_pointers);
  device_buffer<float> out = upload(std::vector<float>(n, poison));
  cuda::run_tree_program(steps.data(), steps.size(), pointers.data(), n, out.data(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(bits_of(download(out)), bits_of(want));
}

// See Note [Summation tree]: a slice's gradients are written whole, the
// same bytes whichever replica computes them and however often, and the
// CPU's within fp32 tolerance.
TEST(Gpu, SliceGradientsDoNotDependOnTheReplica) {
  SKIP_WITHOUT_GPU();
  const replica_case t({64, 48, 10}, 7);
  cpu_replica cpu(t.spec, optimizer_config{}, 32);
  cuda_replica first(t.spec, optimizer_config{}, 32, cuda_replica_options{});
  cuda_replica second(t.spec, optimizer_config{}, 32, cuda_replica_options{});
  for (replica* r : std::initializer_list<replica*>{&cpu, &first, &second}) r->import_state(t.state);
  std::vector<std::uint32_t> rows(32);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<std::uint32_t>(i * 7 % 512);
  const std::size_t p = cpu.layout().parameter_size;
  const auto slice_of = [&](replica& r, std::size_t buffer) {
    const std::span<float> g = r.scratch_gradients(buffer);
    r.accumulate_slice(t.data.batch(rows), g);
    std::vector<float> host(p);
    if (r.native_stream() == nullptr) {
      std::copy(g.begin(), g.end(), host.begin());
    } else {
      CUDA_CHECK(cudaMemcpy(host.data(), g.data(), p * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return host;
  };
  const std::vector<float> want = slice_of(cpu, 0), got = slice_of(first, 0);
  EXPECT_LE(relative_error(got, want), 1e-5);
  EXPECT_EQ(bits_of(slice_of(second, 1)), bits_of(got)) << "another replica";
  EXPECT_EQ(bits_of(slice_of(first, 2)), bits_of(got)) << "the same replica again";
  // The tree's addition on the device is the host's.
  const std::span<float> sum = first.scratch_gradients(0), other = first.scratch_gradients(1);
  first.accumulate_slice(t.data.batch(rows), other);
  first.add_gradients(sum, other);
  std::vector<float> doubled = got;
  add_into(doubled.data(), got.data(), p);
  std::vector<float> host(p);
  CUDA_CHECK(cudaMemcpy(host.data(), sum.data(), p * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(bits_of(host), bits_of(doubled));
  EXPECT_EQ(first.count_nonfinite_in(sum), 0);
}

void train_default_job(gpu_data_placement placement) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  // scripts/gpu-check runs this program away from the source tree.
  const char* root = std::getenv("DPACTOR_SOURCE_DIR");
  job_config c = load_job_config(std::string(root != nullptr ? root : DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg");
  c.cluster.gpus = {0};
  c.cluster.gpu_data = placement;
  c.train.checkpoint_dir = "";
  Engine engine(c);
  engine.start();
  const run_summary s = engine.wait();
  EXPECT_GE(s.test_accuracy, 0.88);
}

TEST(Gpu, TheDefaultJobTrainsOnTheGpu) {
  SKIP_WITHOUT_GPU();
  train_default_job(gpu_data_placement::automatic);
}

TEST(Gpu, TheDefaultJobTrainsOnTheGpuWithStreamedData) {
  SKIP_WITHOUT_GPU();
  train_default_job(gpu_data_placement::streamed);
}

// 300 steps of the default job on `gpus`; the checkpoint written.
std::filesystem::path default_job_checkpoint(std::vector<int> gpus, bool reproducible, const std::filesystem::path& dir) {
  const char* root = std::getenv("DPACTOR_SOURCE_DIR");
  job_config c = load_job_config(std::string(root != nullptr ? root : DPACTOR_SOURCE_DIR) + "/configs/mlp.cfg");
  c.cluster.gpus = std::move(gpus);
  c.train.reproducible = reproducible;
  c.train.max_steps = 300;
  c.train.verify_replicas = true;
  c.train.checkpoint_dir = dir.string();
  Engine engine(c);
  engine.start();
  const run_summary s = engine.wait();
  EXPECT_EQ(s.steps, 300) << dir;
  return s.checkpoint;
}

void expect_same_files(const std::filesystem::path& a, const std::filesystem::path& b, const std::string& what) {
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(!a.empty() && !b.empty() && testing::tensor_bytes(a / file) == testing::tensor_bytes(b / file))
        << file << " differs: " << what;
}

#define SKIP_WITHOUT_FASHION_MNIST()                                                         \
  do {                                                                                      \
    if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) \
      GTEST_SKIP() << "dataset-fashion-mnist is not installed";                             \
  } while (false)

// Issue 32's acceptance: two runs of the default job on the GPU in
// reproducible mode, 300 steps, write the same model and optimizer files;
// so do 2 and 3 replicas sharing the GPU (the same_device backend).
TEST(Gpu, ReproducibleRunsOfTheDefaultJobWriteTheSameFilesOnOneTwoAndThreeReplicas) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_FASHION_MNIST();
  testing::scratch_dir dir;
  const auto first = default_job_checkpoint({0}, true, dir / "first");
  expect_same_files(first, default_job_checkpoint({0}, true, dir / "second"), "two runs on one replica");
  expect_same_files(first, default_job_checkpoint({0, 0}, true, dir / "two"), "2 replicas on the GPU against 1");
  expect_same_files(first, default_job_checkpoint({0, 0, 0}, true, dir / "three"), "3 replicas on the GPU against 1");
}

// Fast mode with replicas sharing the GPU: gradient buckets started during
// backward through the same_device backend; the replicas stay identical
// (verify_replicas) and the job learns.
TEST(Gpu, TwoReplicasSharingTheGpuTrainTheDefaultJobInFastMode) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_FASHION_MNIST();
  testing::scratch_dir dir;
  EXPECT_FALSE(default_job_checkpoint({0, 0}, false, dir / "fast").empty());
}

}  // namespace
}  // namespace dpactor
