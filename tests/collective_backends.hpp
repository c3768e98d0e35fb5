#pragma once
// The collective backends that tests/collective_conformance_test runs every
// test on, behind one small factory: a backend makes a world of `ranks` ranks
// and says what it promises beyond comms/collective.hpp.
//
//   local     comms/local.hpp: ranks are threads of one process, one group
//   gloo_tcp  comms/gloo.hpp: one group per rank over one store, as separate
//             processes would hold them, so that everything between ranks
//             goes through Gloo's sockets on 127.0.0.1
//   gloo_shm  the same over shared memory (See Note [Same-machine ranks
//             share memory])
//   driver    the driver group NCCL's logic runs on (comms/driver_group.hpp)
//             over the emulated communicator (tests/emulated_backend.hpp)
//   nccl      comms/nccl.hpp, one rank per CUDA device
//
// A backend that cannot hold a test's ranks here (no Gloo or CUDA in this
// build, fewer CUDA devices than ranks) makes the test skip, saying why.

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comms/collective.hpp"

namespace dpactor::testing {

// The ranks of one backend. groups[r] is the group rank r's process holds:
// the same group for every rank where ranks are threads of one process.
struct collective_world {
  std::vector<std::shared_ptr<collective_group>> groups;
  int size() const noexcept { return static_cast<int>(groups.size()); }
  collective_group& group_of(int rank) const { return *groups.at(static_cast<std::size_t>(rank)); }
  std::unique_ptr<collective> endpoint(int rank) const { return group_of(rank).endpoint(rank); }
};

// Runs fn(rank, endpoint) on one thread per rank, each endpoint made on its
// rank's thread (as a device actor makes its own), and joins them.
template <class Fn>
void run_ranks(const collective_world& w, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < w.size(); ++r)
    threads.emplace_back([&w, &fn, r] {
      auto c = w.endpoint(r);
      fn(r, *c);
    });
  for (auto& t : threads) t.join();
}

struct collective_backend {
  std::string name;
  // A fresh world of `ranks` ranks.
  std::function<collective_world(int ranks)> make;
  // How many ranks it can hold here; where fewer than a test needs, `why`
  // says why.
  std::function<int(std::string& why)> capacity;
  // The sweep of RanksBySizes/AllReduce goes from 1 to this many ranks.
  int sweep_ranks = 5;
  // Every element is summed in rank order 0, 1, ..., n-1 (comms/rank_order.hpp):
  // bitwise the local backend's sum. NCCL only promises that every rank
  // gets the same bytes.
  bool rank_order_sums = true;
  // Ranks called with different sizes fail before any payload moves; NCCL
  // cannot tell (it would read past the shorter buffer).
  bool detects_mismatch = true;
  // ... and hear collective_errc::mismatch; the driver group cannot tell a
  // mismatch from another failure of its communicator (aborted).
  bool names_mismatch = true;
  // all_gather takes host memory (NCCL's takes device memory only).
  bool host_all_gather = true;
  // The reproducible step's tree takes host memory (NCCL's moves device
  // memory: See Note [The tree on a device]).
  bool host_tree = true;
  // The calls ManyConsecutiveCalls makes (local ones cost microseconds).
  int consecutive_calls = 300;
};

// local, gloo_tcp, gloo_shm, driver, nccl: in this order in every build.
const std::vector<collective_backend>& collective_backends();

// A gloo world with its own key prefix (tests never see each other's keys).
collective_world gloo_world(bool shared_memory, int ranks,
                            std::chrono::milliseconds rendezvous_timeout = std::chrono::seconds(10));

// The timeout of the calls slowest_wake_ms aborts. A test tells the abort
// from this timeout by the error (aborted, not timeout) and by a bound of a
// third of it, far above any wake-up a loaded machine gives.
inline constexpr std::chrono::seconds abort_test_call_timeout{60};

// The slowest of `w.size() - 1` waiting ranks to wake, in ms from `abort`:
// each waits in an all-reduce (abort_test_call_timeout) that the last rank
// never joins. With
// connect_first every rank passes a barrier first (the last one then stays
// silent); without, the last rank never connects and the others wait in
// rendezvous. codes[r]: the collective_errc each waiting rank got, -1 none.
double slowest_wake_ms(const collective_world& w, bool connect_first, const std::function<void()>& abort,
                       std::vector<int>& codes);

// Values whose sums round: only the same order of additions gives the same
// bits. in[r][i] for `ranks` ranks of `size` floats.
std::vector<std::vector<float>> inexact_inputs(int ranks, std::size_t size);

// Their sum in rank order, one float at a time: in[0] + in[1] + ...
std::vector<float> rank_order_sum(const std::vector<std::vector<float>>& in);

}  // namespace dpactor::testing
