// GPU step time of the CUDA replica against the GEMM rate cuBLAS reaches on
// the same GPU. Prints one JSON line per case; scripts/gpu-check runs it
// beside bench/pytorch_gpu.py and prints the table.
//
//   gpu_bench   # default MLP at batch 256 and 4096, wide MLP at 4096, each as
//               # one replica alone steps (resident data, update in place);
//               # then the same with streamed data, and through the step
//               # runner over NCCL with one rank (gradient buckets started
//               # during backward), which have no PyTorch counterpart; and
//               # the default job's step (batch 128 and 1024 in micro-batches
//               # of 64) through the runner in fast and reproducible mode
//               # (slices and the summation tree: See Note [The tree on a
//               # device]), side by side

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "train/step_runner.hpp"
#include "comms/nccl.hpp"
#include "cuda/blas.hpp"
#include "cuda/cuda_replica.hpp"
#include "cuda/resources.hpp"
#include "data/synthetic.hpp"
#include "tensors/rng.hpp"

namespace dpactor {
namespace {

// How a step is driven: the replica's own calls, as a member alone does
// them, or the step runner over a collective (NCCL, one rank).
enum class driver { replica_alone, nccl_runner, nccl_reproducible };

double time_steps(cuda_replica& model, const dataset& data, std::size_t batch, int steps, driver how,
                  step_runner& runner, collective_group* group, collective* comm) {
  step_shard shard{0, 0, std::vector<std::uint32_t>(batch)};
  if (how == driver::nccl_reproducible) {  // one member owns every slice
    shard.slice_rows = static_cast<std::uint32_t>(model.max_rows());
    shard.last_slice = static_cast<std::uint32_t>(shard.slices());
  }
  rng gen(1);
  device_control control;
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    for (auto& r : shard.indices) r = static_cast<std::uint32_t>(gen.below(data.rows));
    if (how == driver::nccl_runner || how == driver::nccl_reproducible) {
      const auto c = how == driver::nccl_runner ? runner.compute(shard, model, data, control, *group, comm)
                                                : runner.compute_slices(shard, model, data, control, *group);
      runner.synchronize(c, 0, model, *comm, {}, nullptr, lr_schedule{});
      ++shard.step;
      continue;
    }
    model.zero_grad();
    model.accumulate(data.batch(shard.indices));  // reads its loss back: a synchronisation per step
    model.gradients();
    model.update_in_place(0.01, model.samples());
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
}

// `micro`: rows per pass (0: the whole batch in one).
void bench_mlp(const std::string& name, const mlp_spec& spec, std::size_t batch,
               cuda_data_placement data_placement = cuda_data_placement::resident, driver how = driver::replica_alone,
               std::size_t micro = 0) {
  synthetic_options o;
  o.rows = std::max<std::size_t>(batch * 4, 16384);
  o.features = static_cast<std::size_t>(spec.inputs());
  o.classes = spec.outputs();
  const dataset data = make_synthetic(o);
  cuda_replica_options options;
  options.data = data_placement;
  cuda_replica model(spec, optimizer_config{}, micro > 0 ? micro : batch, options);
  std::vector<float> state(model.layout().total_size(), 0.0f);
  init_mlp_parameters(spec, std::span<float>(state).first(model.layout().parameter_size), 1);
  model.import_state(state);
  std::shared_ptr<collective_group> group;
  std::unique_ptr<collective> comm;
  if (how != driver::replica_alone) {
    group = make_nccl_group({0});
    comm = group->endpoint(0);
  }
  step_runner runner(0, {}, 1, 2.0, 0.001);  // DDP's bucket sizes
  time_steps(model, data, batch, 20, how, runner, group.get(), comm.get());  // warm-up: uploads, cuBLAS heuristics
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) t.push_back(time_steps(model, data, batch, 50, how, runner, group.get(), comm.get()));
  std::sort(t.begin(), t.end());
  const double step = t[t.size() / 2];
  std::printf("{\"case\": \"%s\", \"batch\": %zu, \"step_us\": %.1f, \"tflops\": %.2f}\n", name.c_str(), batch, step * 1e6,
              spec.train_flops_per_sample() * static_cast<double>(batch) / step / 1e12);
  std::fflush(stdout);
}

void bench_cublas() {
  const int n = 4096;
  cuda_stream stream;
  cublas_handle blas(stream.get(), false);
  device_buffer<float> a(static_cast<std::size_t>(n) * n), b(static_cast<std::size_t>(n) * n), c(static_cast<std::size_t>(n) * n);
  std::vector<float> host(static_cast<std::size_t>(n) * n);
  rng gen(2);
  for (float& x : host) x = static_cast<float>(gen.uniform(-1.0, 1.0));
  CUDA_CHECK(cudaMemcpy(a.data(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(b.data(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  for (int i = 0; i < 5; ++i) gemm(blas, false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  const int reps = 20;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) gemm(blas, false, true, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
  std::printf("{\"case\": \"cublas_sgemm_4096\", \"tflops\": %.2f}\n", 2.0 * n * n * n / s / 1e12);
}

}  // namespace
}  // namespace dpactor

int main() {
  using namespace dpactor;
  std::string why;
  if (visible_cuda_devices(&why) == 0) {
    std::fprintf(stderr, "gpu_bench: no CUDA device (%s)\n", why.c_str());
    return 1;
  }
  const mlp_spec mlp{{784, 256, 128, 10}, activation::relu, loss_kind::cross_entropy};
  const mlp_spec wide{{784, 4096, 4096, 4096, 4096, 10}, activation::relu, loss_kind::cross_entropy};
  bench_cublas();
  bench_mlp("mlp_784_256_128_10", mlp, 256);
  bench_mlp("mlp_784_256_128_10", mlp, 4096);
  bench_mlp("wide_4x4096", wide, 4096);
  // No PyTorch counterpart: the cost of streaming the data (See Note [Data on
  // the GPU]) and of the engine's step over NCCL with gradient buckets.
  bench_mlp("mlp_784_256_128_10_streamed", mlp, 256, cuda_data_placement::streamed);
  bench_mlp("wide_4x4096_streamed", wide, 4096, cuda_data_placement::streamed);
  bench_mlp("mlp_784_256_128_10_nccl_runner", mlp, 256, cuda_data_placement::resident, driver::nccl_runner);
  bench_mlp("wide_4x4096_nccl_runner", wide, 4096, cuda_data_placement::resident, driver::nccl_runner);
  // Issue 32: what reproducible mode costs against the fast mode.
  for (const std::size_t batch : {std::size_t{128}, std::size_t{1024}}) {
    bench_mlp("default_job_fast", mlp, batch, cuda_data_placement::resident, driver::nccl_runner, 64);
    bench_mlp("default_job_reproducible", mlp, batch, cuda_data_placement::resident, driver::nccl_reproducible, 64);
  }
  return 0;
}
