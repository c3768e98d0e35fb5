#include "tests/collective_backends.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "comms/local.hpp"
#include "tests/emulated_backend.hpp"
#if DPACTOR_HAS_GLOO
#include "comms/gloo.hpp"
#endif
#if DPACTOR_HAS_CUDA
#include "comms/nccl.hpp"
#include "cuda/resources.hpp"
#endif

namespace dpactor::testing {
namespace {

using namespace std::chrono_literals;

// Backends whose ranks are threads of one process hold one group.
collective_world one_group(std::shared_ptr<collective_group> group) {
  collective_world w;
  w.groups.assign(static_cast<std::size_t>(group->size()), group);
  return w;
}

// No limit but the machine's for backends on the CPU.
int unlimited(std::string&) { return 64; }

collective_backend local_backend() {
  collective_backend b;
  b.name = "local";
  b.make = [](int ranks) { return one_group(make_local_group(ranks)); };
  b.capacity = unlimited;
  b.sweep_ranks = 8;
  b.consecutive_calls = 2000;
  return b;
}

collective_backend gloo_backend(bool shared_memory) {
  collective_backend b;
  b.name = shared_memory ? "gloo_shm" : "gloo_tcp";
  b.make = [shared_memory](int ranks) { return gloo_world(shared_memory, ranks); };
#if DPACTOR_HAS_GLOO
  b.capacity = unlimited;
#else
  b.capacity = [](std::string& why) {
    why = "built without Gloo (DPACTOR_WITH_GLOO=OFF, or no Gloo found)";
    return 0;
  };
#endif
  return b;
}

collective_backend driver_backend() {
  collective_backend b;
  b.name = "driver";
  b.make = [](int ranks) { return one_group(emulated_backend(std::make_shared<emulated_log>())(ranks)); };
  b.capacity = unlimited;
  b.sweep_ranks = 8;
  b.names_mismatch = false;
  b.consecutive_calls = 2000;
  return b;
}

collective_backend nccl_backend() {
  collective_backend b;
  b.name = "nccl";
#if DPACTOR_HAS_CUDA
  b.make = [](int ranks) {
    std::vector<int> devices(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) devices[static_cast<std::size_t>(r)] = r;
    return one_group(make_nccl_group(devices));
  };
  b.capacity = [](std::string& why) {
    std::string reason;
    const int devices = visible_cuda_devices(&reason);
    why = devices == 0 ? "no CUDA device: " + reason
                       : "NCCL takes one CUDA device per rank (it refuses two ranks on one) and this machine has " +
                             std::to_string(devices);
    return devices;
  };
#else
  b.make = [](int) -> collective_world { throw std::logic_error("built without CUDA"); };
  b.capacity = [](std::string& why) {
    why = "built without CUDA (no nvcc found, or DPACTOR_WITH_CUDA=OFF): the nccl backend is not compiled";
    return 0;
  };
#endif
  b.sweep_ranks = 2;
  b.rank_order_sums = false;
  b.detects_mismatch = false;
  b.names_mismatch = false;
  b.host_all_gather = false;
  b.host_tree = false;
  return b;
}

}  // namespace

const std::vector<collective_backend>& collective_backends() {
  static const std::vector<collective_backend> all = {local_backend(), gloo_backend(false), gloo_backend(true),
                                                      driver_backend(), nccl_backend()};
  return all;
}

collective_world gloo_world(bool shared_memory, int ranks, std::chrono::milliseconds rendezvous_timeout) {
#if DPACTOR_HAS_GLOO
  static std::atomic<int> groups{0};
  gloo_group_options o;
  o.prefix = "test" + std::to_string(groups++);
  o.rendezvous_timeout = rendezvous_timeout;
  o.shared_memory = shared_memory;
  const auto store = make_memory_store();
  collective_world w;
  for (int r = 0; r < ranks; ++r) w.groups.push_back(make_gloo_group(store, ranks, o));
  return w;
#else
  (void)shared_memory, (void)ranks, (void)rendezvous_timeout;
  throw std::logic_error("built without Gloo");
#endif
}

double slowest_wake_ms(const collective_world& w, bool connect_first, const std::function<void()>& abort,
                       std::vector<int>& codes) {
  using clock_type = std::chrono::steady_clock;
  const int waiting_ranks = w.size() - 1;
  std::vector<double> woke(static_cast<std::size_t>(waiting_ranks), -1.0);
  codes.assign(static_cast<std::size_t>(waiting_ranks), -1);
  std::atomic<int> waiting{0};
  std::atomic<bool> aborted{false};
  clock_type::time_point abort_time;
  std::vector<std::thread> threads;
  for (int r = 0; r < w.size(); ++r)
    threads.emplace_back([&, r] {
      auto c = w.endpoint(r);
      if (connect_first) c->barrier(collective_options{60s});
      if (r == waiting_ranks) {  // the silent one
        if (connect_first) {
          while (!aborted) std::this_thread::sleep_for(1ms);
        }
        return;
      }
      std::vector<float> v(1000, 1.0f);
      ++waiting;
      try {
        c->all_reduce_sum(v, collective_options{abort_test_call_timeout});
      } catch (const collective_error& e) {
        codes[static_cast<std::size_t>(r)] = static_cast<int>(e.code());
      }
      const auto now = clock_type::now();
      while (!aborted) std::this_thread::yield();
      woke[static_cast<std::size_t>(r)] = std::chrono::duration<double, std::milli>(now - abort_time).count();
    });
  while (waiting < waiting_ranks) std::this_thread::yield();
  std::this_thread::sleep_for(200ms);  // well inside their wait
  abort_time = clock_type::now();
  abort();
  aborted = true;
  for (auto& t : threads) t.join();
  double slowest = 0;
  for (const double ms : woke) slowest = std::max(slowest, ms);
  return slowest;
}

std::vector<std::vector<float>> inexact_inputs(int ranks, std::size_t size) {
  std::vector<std::vector<float>> in(static_cast<std::size_t>(ranks), std::vector<float>(size));
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < size; ++i)
      in[static_cast<std::size_t>(r)][i] =
          std::sin(static_cast<float>(i * 31 + static_cast<std::size_t>(r) * 7)) * 1e3f / static_cast<float>(1 + r);
  return in;
}

std::vector<float> rank_order_sum(const std::vector<std::vector<float>>& in) {
  std::vector<float> sum = in.at(0);
  for (std::size_t r = 1; r < in.size(); ++r)
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += in[r][i];
  return sum;
}

}  // namespace dpactor::testing
