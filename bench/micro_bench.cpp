// Micro-benchmarks (Google Benchmark): the local collective, each fused
// kernel, and one training step as a plain loop over the device's step
// arithmetic against the same step through the engine.
//
//   build/bin/micro_bench                      # everything
//   build/bin/micro_bench --benchmark_filter=AllReduce
//
// Results and their reading: docs/PERFORMANCE.md.

#include <benchmark/benchmark.h>

#include <array>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include <dpactor/engine.hpp>
#include "train/step_runner.hpp"
#include "comms/local.hpp"
#include "data/synthetic.hpp"
#include "tensors/activation.hpp"
#include "tensors/cpu_replica.hpp"
#include "tensors/float_env.hpp"
#include "tensors/gemm.hpp"
#include "tensors/loss.hpp"
#include "tensors/optimizer.hpp"
#include "tensors/rng.hpp"

namespace dpactor {
namespace {

constexpr std::size_t mlp_parameters = 235'146;  // 784-256-128-10
const mlp_spec default_mlp{{784, 256, 128, 10}, activation::relu, loss_kind::cross_entropy};

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  rng gen(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(gen.uniform(-1.0, 1.0));
  return v;
}

// ---- the local collective ------------------------------------------------

// One group per benchmark and rank count, shared by the benchmark's threads
// (= ranks).
std::shared_ptr<collective_group> group_for(const std::string& name, int ranks) {
  static std::mutex m;
  static std::map<std::pair<std::string, int>, std::shared_ptr<collective_group>> groups;
  std::lock_guard lock(m);
  auto& g = groups[{name, ranks}];
  if (!g) g = make_local_group(ranks);
  return g;
}

void BM_LocalAllReduce(benchmark::State& state) {
  const int ranks = state.threads();
  auto endpoint = group_for("all_reduce", ranks)->endpoint(state.thread_index());
  std::vector<float> buffer = random_floats(mlp_parameters, static_cast<std::uint64_t>(state.thread_index()));
  for (auto _ : state) endpoint->all_reduce_sum(buffer, {});
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * mlp_parameters * sizeof(float)));
}
BENCHMARK(BM_LocalAllReduce)->Threads(2)->Threads(4)->UseRealTime();

void BM_LocalReduceScatterAllGather(benchmark::State& state) {
  // The sharded step's exchange: reduce-scatter the gradients, all-gather
  // parameters and momentum (See Note [Sharded optimizer step]).
  auto endpoint = group_for("reduce_scatter", state.threads())->endpoint(state.thread_index());
  std::vector<float> grads = random_floats(mlp_parameters, 1), params(mlp_parameters), momentum(mlp_parameters);
  const std::span<float> sections[] = {params, momentum};
  for (auto _ : state) {
    endpoint->reduce_scatter_sum(grads, {});
    endpoint->all_gather(sections, {});
  }
}

// ---- kernels ---------------------------------------------------------------

void BM_BiasActivationForward(benchmark::State& state) {
  const auto act = static_cast<activation>(state.range(0));
  const std::size_t rows = 64, cols = 256;
  std::vector<float> z = random_floats(rows * cols, 1), bias = random_floats(cols, 2), a(rows * cols);
  for (auto _ : state) {
    bias_activation_forward(act, rows, cols, bias.data(), z.data(), activation_backward_needs_input(act) ? a.data() : z.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(activation_name(act)) + ", 64x256");
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * rows * cols));
}
BENCHMARK(BM_BiasActivationForward)->DenseRange(1, 4);

void BM_BiasActivationBackward(benchmark::State& state) {
  const auto act = static_cast<activation>(state.range(0));
  const std::size_t rows = 64, cols = 256;
  std::vector<float> saved = random_floats(rows * cols, 1), grad = random_floats(rows * cols, 2), db(cols);
  for (auto _ : state) {
    bias_activation_backward(act, rows, cols, saved.data(), grad.data(), db.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(activation_name(act)) + ", 64x256");
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * rows * cols));
}
BENCHMARK(BM_BiasActivationBackward)->DenseRange(1, 4);

void BM_SoftmaxCrossEntropy(benchmark::State& state) {
  const std::size_t rows = 64, classes = 10;
  std::vector<float> logits = random_floats(rows * classes, 1), grad(rows * classes);
  std::vector<std::int32_t> labels(rows);
  for (std::size_t i = 0; i < rows; ++i) labels[i] = static_cast<std::int32_t>(i % classes);
  for (auto _ : state) benchmark::DoNotOptimize(softmax_cross_entropy(rows, classes, logits.data(), labels.data(), grad.data()));
  state.SetLabel("64x10");
}
BENCHMARK(BM_SoftmaxCrossEntropy);

// range(0): 0 SGD momentum, 1 AdamW; range(1): 0 in place (a member alone),
// 1 from the current into the pending state (Note [Pending state]).
void BM_OptimizerStep(benchmark::State& state) {
  flush_denormals_to_zero();
  optimizer_config cfg;
  cfg.kind = state.range(0) == 0 ? optimizer_kind::sgd : optimizer_kind::adamw;
  const bool apart = state.range(1) == 1;
  const std::size_t n_slots = optimizer_slot_names(cfg).size();
  std::vector<float> grads = random_floats(mlp_parameters, 2);
  // Two copies of the state, swapped after each step when apart.
  std::vector<std::vector<float>> params{random_floats(mlp_parameters, 1), random_floats(mlp_parameters, 1)};
  std::vector<std::vector<float>> slots(2 * n_slots, std::vector<float>(mlp_parameters));
  std::int64_t step = 0;
  int current = 0;
  for (auto _ : state) {
    const int out = apart ? 1 - current : current;
    std::array<std::span<const float>, 2> in_views;
    std::array<std::span<float>, 2> out_views;
    for (std::size_t s = 0; s < n_slots; ++s) {
      in_views[s] = slots[static_cast<std::size_t>(current) * n_slots + s];
      out_views[s] = slots[static_cast<std::size_t>(out) * n_slots + s];
    }
    optimizer_step(cfg, params[static_cast<std::size_t>(current)], params[static_cast<std::size_t>(out)], grads,
                   std::span<const std::span<const float>>(in_views.data(), n_slots),
                   std::span<const std::span<float>>(out_views.data(), n_slots), 1.0f / 64, 0.01, step++);
    current = out;
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(cfg.kind == optimizer_kind::sgd ? "SGD momentum" : "AdamW") +
                 (apart ? ", into the pending state" : ", in place") + ", 235146 parameters");
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * mlp_parameters * sizeof(float) *
                                                    (cfg.kind == optimizer_kind::sgd ? 5 : 7)));
}
BENCHMARK(BM_OptimizerStep)->Args({0, 0})->Args({1, 0})->Args({0, 1})->Args({1, 1});

void BM_ForwardBackward(benchmark::State& state) {
  set_blas_threads(1);
  const auto rows = static_cast<std::size_t>(state.range(0));
  mlp model(default_mlp, rows);
  aligned_buffer<float> params(model.layout().size()), grads(model.layout().size());
  init_mlp_parameters(default_mlp, params.span(), 1);
  std::vector<float> x = random_floats(rows * 784, 3);
  std::vector<std::int32_t> y(rows, 1);
  for (auto _ : state) benchmark::DoNotOptimize(model.forward_backward(params.data(), grads.data(), x.data(), y.data(), rows, true));
  state.counters["GFLOP/s"] = benchmark::Counter(static_cast<double>(state.iterations() * rows) * default_mlp.train_flops_per_sample() / 1e9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ForwardBackward)->Arg(1)->Arg(64)->Arg(256);

// ---- one training step: plain loop against the engine ----------------------

const dataset& bench_data() {
  static const dataset data = [] {
    synthetic_options o;
    o.rows = 60000;
    o.features = 784;
    o.classes = 10;
    return make_synthetic(o);
  }();
  return data;
}

// Two members running the device's step arithmetic (step_runner) in a plain
// loop: no actors, no messages. Reports microseconds per step.
void BM_PlainLoopStep(benchmark::State& state) {
  const auto per_member = static_cast<std::size_t>(state.range(0));
  const int members = 2;
  const dataset& data = bench_data();
  set_blas_threads(1);
  lr_schedule schedule;
  for (auto _ : state) {
    auto group = make_local_group(members);
    const int steps = 2000;
    std::vector<double> seconds(members);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < members; ++rank) {
      threads.emplace_back([&, rank] {
        flush_denormals_to_zero();
        cpu_replica model(default_mlp, optimizer_config{}, 256);
        step_runner runner(rank, {}, 1, 1.5, 0.0005);
        device_control control;
        auto comm = group->endpoint(rank);
        std::vector<std::uint32_t> order(data.rows);
        std::iota(order.begin(), order.end(), 0u);
        rng(7).shuffle(order);
        step_shard shard{0, 0, std::vector<std::uint32_t>(per_member)};
        const auto start = std::chrono::steady_clock::now();
        for (int step = 0; step < steps; ++step) {
          const std::size_t base = (static_cast<std::size_t>(step) * members * per_member + rank * per_member) % (data.rows - per_member);
          std::copy_n(order.begin() + static_cast<std::ptrdiff_t>(base), per_member, shard.indices.begin());
          shard.step = step;
          const auto c = runner.compute(shard, model, data, control, *group);
          runner.synchronize(c, 0, model, *comm, {}, nullptr, schedule);
        }
        seconds[static_cast<std::size_t>(rank)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      });
    }
    for (auto& t : threads) t.join();
    state.counters["us_per_step"] = seconds[0] / steps * 1e6;
  }
  state.SetLabel(std::to_string(members) + " members x " + std::to_string(per_member) + " samples");
}
BENCHMARK(BM_PlainLoopStep)->Arg(64)->Arg(256)->Iterations(3)->Unit(benchmark::kMillisecond);

// The same step through the engine: 2 replicas, global batch 2 x per member,
// steady-state step time from the step records.
void BM_EngineStep(benchmark::State& state) {
  const auto per_member = state.range(0);
  for (auto _ : state) {
    job_config c;
    c.model = default_mlp;
    c.data.format = data_format::synthetic;
    c.data.synthetic_train = 60000;
    c.data.synthetic_test = 1000;
    c.data.scale = feature_scaling::none;
    c.train.batch_size = 2 * per_member;
    c.train.epochs = 1000;
    c.train.max_steps = 2200;
    c.train.log_every = 100;
    c.train.eval_every = 0;
    c.train.checkpoint_dir = "";
    c.cluster.cpus = 2;
    c.straggler.policy = straggler_policy::none;
    std::mutex m;
    std::vector<double> step_us;
    Engine engine(c);
    engine.on_event([&](const event& e) {
      if (const auto* s = std::get_if<step_event>(&e); s && s->step > 200) {
        std::lock_guard lock(m);
        step_us.push_back(static_cast<double>(c.train.batch_size) / s->samples_per_s * 1e6);
      }
    });
    engine.start();
    engine.wait();
    std::sort(step_us.begin(), step_us.end());
    state.counters["us_per_step"] = step_us[step_us.size() / 2];
  }
  state.SetLabel("2 replicas x " + std::to_string(per_member) + " samples");
}
BENCHMARK(BM_EngineStep)->Arg(64)->Arg(256)->Iterations(3)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace dpactor

BENCHMARK(dpactor::BM_LocalReduceScatterAllGather)->Threads(2)->UseRealTime();

BENCHMARK_MAIN();
