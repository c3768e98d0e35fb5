// GPU step time of the CUDA replica (one GPU, no collective), against the
// GEMM rate cuBLAS reaches on the same GPU. Prints one JSON line per case;
// scripts/gpu-check runs it beside bench/pytorch_gpu.py and prints the table.
//
//   gpu_bench        # default MLP at batch 256 and 4096, wide MLP at 4096

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/blas.hpp"
#include "cuda/cuda_replica.hpp"
#include "cuda/resources.hpp"
#include "data/synthetic.hpp"
#include "tensors/rng.hpp"

namespace dpactor {
namespace {

double time_steps(cuda_replica& model, const dataset& data, std::size_t batch, int steps) {
  std::vector<std::uint32_t> rows(batch);
  rng gen(1);
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    for (auto& r : rows) r = static_cast<std::uint32_t>(gen.below(data.rows));
    model.zero_grad();
    model.accumulate(data.batch(rows));  // reads its loss back: a synchronisation per step
    model.gradients();
    model.apply_update(0.01, model.samples(), 0, model.layout().parameter_size);
    model.finish_step();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
}

void bench_mlp(const std::string& name, const mlp_spec& spec, std::size_t batch) {
  synthetic_options o;
  o.rows = std::max<std::size_t>(batch * 4, 16384);
  o.features = static_cast<std::size_t>(spec.inputs());
  o.classes = spec.outputs();
  const dataset data = make_synthetic(o);
  cuda_replica model(spec, optimizer_config{}, batch, cuda_replica_options{});
  std::vector<float> state(model.layout().total_size(), 0.0f);
  init_mlp_parameters(spec, std::span<float>(state).first(model.layout().parameter_size), 1);
  model.import_state(state);
  time_steps(model, data, batch, 20);  // warm-up: dataset upload, cuBLAS heuristics
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) t.push_back(time_steps(model, data, batch, 50));
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
  return 0;
}
