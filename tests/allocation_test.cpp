// Steady-state training steps allocate nothing (on the C++ heap): two members
// run the device's step arithmetic (step_runner: shard gather, forward and
// backward, the header all-reduce, reduce-scatter, optimizer part,
// all-gather) with a counting operator new. Messaging is not counted: CAF
// allocates a small envelope per message, and a shard message carries a few
// steps.

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <thread>

#include "train/step_runner.hpp"
#include "comms/local.hpp"
#include "data/synthetic.hpp"
#include "tensors/cpu_replica.hpp"
#include "tensors/gemm.hpp"

namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};

void* counted(std::size_t n, std::size_t align = 0) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  void* p = align ? std::aligned_alloc(align, (n + align - 1) / align * align) : std::malloc(n ? n : 1);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t n) { return counted(n); }
void* operator new[](std::size_t n) { return counted(n); }
void* operator new(std::size_t n, std::align_val_t a) { return counted(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted(n, static_cast<std::size_t>(a)); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace dpactor {
namespace {

TEST(Allocations, SteadyStateStepsAllocateNothing) {
  set_blas_threads(1);
  const mlp_spec spec{{784, 256, 128, 10}, activation::relu, loss_kind::cross_entropy};
  synthetic_options data_options;
  data_options.rows = 4096;
  data_options.features = 784;
  data_options.classes = 10;
  const dataset data = make_synthetic(data_options);
  auto group = make_local_group(2);
  lr_schedule schedule;
  schedule.kind = schedule_kind::cosine;
  schedule.total_steps = 1000;
  constexpr int warmup = 20, measured = 100;
  std::atomic<int> ready{0};
  std::vector<std::thread> members;
  for (int rank = 0; rank < 2; ++rank) {
    members.emplace_back([&, rank] {
      cpu_replica model(spec, optimizer_config{}, 32);  // 64 per member: two micro-batches
      step_runner runner(rank, {}, 1, 1.5, 0.0005);
      device_control control;
      auto comm = group->endpoint(rank);
      step_shard shard{0, 0, std::vector<std::uint32_t>(64)};
      for (int step = 0; step < warmup + measured; ++step) {
        if (step == warmup) {
          // Both members have warmed up before counting starts.
          ++ready;
          while (ready.load() < 2) std::this_thread::yield();
          if (rank == 0) counting = true;
          comm->barrier({});
        }
        shard.step = step;
        for (std::size_t i = 0; i < shard.indices.size(); ++i)
          shard.indices[i] = static_cast<std::uint32_t>((step * 131 + rank * 64 + static_cast<int>(i) * 7) % 4096);
        const auto c = runner.compute(shard, model, data, control, *group);
        runner.synchronize(c, 0, model, *comm, {}, nullptr, schedule);
      }
      comm->barrier({});
      counting = false;
    });
  }
  for (auto& t : members) t.join();
  EXPECT_EQ(allocations.load(), 0) << "allocations in " << measured << " steps of two members";
}

}  // namespace
}  // namespace dpactor
