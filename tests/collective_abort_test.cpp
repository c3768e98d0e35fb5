// The abort storm: every backend whose ranks share memory must keep a rank's
// posted buffer valid until no peer can touch it, whenever the group is
// aborted (See Note [Posted memory outlives an abort]). Each round starts 2 to 5
// ranks on one group, each running a few calls of one kind (all-reduce,
// reduce-scatter, all-gather, broadcast) on a buffer of odd length that it
// allocates for the call and frees the moment the call returns; one rank,
// chosen at random, aborts the group at a random moment. Run under
// AddressSanitizer (scripts/test), a rank that touches a freed buffer is a
// heap-use-after-free report. Without it, the rounds still check that a call
// either completes on every rank or fails on every rank, and that completed
// sums are right.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comms/local.hpp"
#include "tests/emulated_backend.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;

enum class op { all_reduce, reduce_scatter, all_gather, broadcast };
const char* name(op o) {
  switch (o) {
    case op::all_reduce: return "all_reduce";
    case op::reduce_scatter: return "reduce_scatter";
    case op::all_gather: return "all_gather";
    case op::broadcast: return "broadcast";
  }
  return "?";
}

// How many rounds: DPACTOR_ABORT_STORM_ROUNDS overrides (scripts/test runs
// 1,000 under ASan).
int rounds(int fallback) {
  if (const char* v = std::getenv("DPACTOR_ABORT_STORM_ROUNDS")) return std::max(1, std::atoi(v));
  return fallback;
}

// Busy-waits: sleeping would make every abort land while the ranks wait.
void spin_for(std::chrono::nanoseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) std::this_thread::yield();
}

struct round_plan {
  int ranks = 2;
  op kind = op::all_reduce;
  std::size_t size = 1;
  int calls = 1;
  int aborter = 0;
  int abort_before_call = 0;                 // the aborter aborts just before this call...
  std::chrono::microseconds abort_delay{0};  // ...this long after starting it (from a helper thread)
  std::vector<std::chrono::microseconds> start_skew;
};

round_plan plan(std::mt19937_64& gen) {
  round_plan p;
  p.ranks = std::uniform_int_distribution<int>(2, 5)(gen);
  p.kind = static_cast<op>(std::uniform_int_distribution<int>(0, 3)(gen));
  // Odd sizes, from a handful of floats to a few hundred thousand.
  const int scale = std::uniform_int_distribution<int>(0, 17)(gen);
  p.size = (std::uniform_int_distribution<std::size_t>(0, std::size_t{1} << scale)(gen)) | 1u;
  p.calls = std::uniform_int_distribution<int>(1, 3)(gen);
  p.aborter = std::uniform_int_distribution<int>(0, p.ranks - 1)(gen);
  p.abort_before_call = std::uniform_int_distribution<int>(0, p.calls - 1)(gen);
  p.abort_delay = std::chrono::microseconds(std::uniform_int_distribution<int>(0, 400)(gen));
  for (int r = 0; r < p.ranks; ++r) p.start_skew.emplace_back(std::uniform_int_distribution<int>(0, 100)(gen));
  return p;
}

// Per call and rank: 1 completed, -1 failed with collective_error.
using outcomes = std::vector<std::vector<int>>;

// One rank's part of a round. Every buffer lives exactly as long as its call.
void run_rank(const round_plan& p, int r, collective& c, collective_group& group, outcomes& out,
              std::vector<std::string>& errors) {
  spin_for(p.start_skew[static_cast<std::size_t>(r)]);
  const collective_options options{2s};
  for (int k = 0; k < p.calls; ++k) {
    std::thread aborter;
    if (r == p.aborter && k == p.abort_before_call)
      aborter = std::thread([&group, d = p.abort_delay] {
        spin_for(d);
        group.abort();
      });
    const float mine = static_cast<float>(r + 1);
    bool ok = true;
    try {
      switch (p.kind) {
        case op::all_reduce:
        case op::reduce_scatter: {
          auto data = std::make_unique<float[]>(p.size);
          std::fill_n(data.get(), p.size, mine);
          std::span<float> s(data.get(), p.size);
          if (p.kind == op::all_reduce) c.all_reduce_sum(s, options);
          else c.reduce_scatter_sum(s, options);
          // Ranks r + 1 summed: n(n+1)/2, exact in fp32.
          const float want = static_cast<float>(p.ranks * (p.ranks + 1) / 2);
          const auto [begin, end] = p.kind == op::all_reduce ? std::pair<std::size_t, std::size_t>{0, p.size}
                                                             : c.chunk(p.size, r);
          for (std::size_t i = begin; i < end; ++i)
            if (data[i] != want) {
              errors.push_back(std::string(name(p.kind)) + ": rank " + std::to_string(r) + " index " + std::to_string(i) +
                               " holds " + std::to_string(data[i]));
              break;
            }
          break;  // data freed here, as soon as the call returned
        }
        case op::all_gather: {
          // Two buffers, each rank's list of spans allocated for the call too.
          auto a = std::make_unique<float[]>(p.size);
          auto b = std::make_unique<float[]>(p.size + 2);
          std::fill_n(a.get(), p.size, mine);
          std::fill_n(b.get(), p.size + 2, mine);
          auto parts = std::make_unique<std::span<float>[]>(2);
          parts[0] = {a.get(), p.size};
          parts[1] = {b.get(), p.size + 2};
          c.all_gather(std::span<const std::span<float>>(parts.get(), 2), options);
          for (int owner = 0; owner < p.ranks; ++owner) {
            const auto [begin, end] = c.chunk(p.size, owner);
            if (begin < end && a[begin] != static_cast<float>(owner + 1))
              errors.push_back("all_gather: rank " + std::to_string(r) + " holds the wrong chunk of rank " + std::to_string(owner));
          }
          break;
        }
        case op::broadcast: {
          auto data = std::make_unique<float[]>(p.size);
          std::fill_n(data.get(), p.size, mine);
          const int root = (k + 1) % p.ranks;
          c.broadcast({data.get(), p.size}, root, options);
          if (data[p.size - 1] != static_cast<float>(root + 1))
            errors.push_back("broadcast: rank " + std::to_string(r) + " did not get the root's buffer");
          break;
        }
      }
    } catch (const collective_error&) {
      ok = false;
    }
    out[static_cast<std::size_t>(k)][static_cast<std::size_t>(r)] = ok ? 1 : -1;
    if (aborter.joinable()) aborter.join();
  }
}

using backend = std::function<std::shared_ptr<collective_group>(int ranks)>;

void storm(const backend& make, int n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  int aborted_rounds = 0;
  for (int round = 0; round < n; ++round) {
    const round_plan p = plan(gen);
    auto group = make(p.ranks);
    outcomes out(static_cast<std::size_t>(p.calls), std::vector<int>(static_cast<std::size_t>(p.ranks), 0));
    std::vector<std::vector<std::string>> errors(static_cast<std::size_t>(p.ranks));
    {
      // Endpoints are made on the rank's thread and destroyed when it ends,
      // as a device actor does.
      std::vector<std::thread> threads;
      for (int r = 0; r < p.ranks; ++r)
        threads.emplace_back([&, r] {
          auto endpoint = group->endpoint(r);
          run_rank(p, r, *endpoint, *group, out, errors[static_cast<std::size_t>(r)]);
        });
      for (auto& t : threads) t.join();
    }
    const std::string where = "round " + std::to_string(round) + ": " + std::to_string(p.ranks) + " ranks, " +
                              name(p.kind) + " of " + std::to_string(p.size) + " floats";
    for (const auto& e : errors)
      for (const auto& line : e) ADD_FAILURE() << where << ": " << line;
    for (int k = 0; k < p.calls; ++k) {
      const auto& call = out[static_cast<std::size_t>(k)];
      for (int r = 1; r < p.ranks; ++r)
        ASSERT_EQ(call[static_cast<std::size_t>(r)], call[0])
            << where << ", call " << k << ": ranks disagree on whether it completed";
    }
    if (out.back()[0] < 0) ++aborted_rounds;
  }
  // The storm must actually abort calls, or it proves nothing.
  EXPECT_GT(aborted_rounds, n / 4) << "aborts landed in too few rounds";
}

TEST(AbortStorm, LocalRanksNeverTouchAFreedBuffer) {
  storm([](int ranks) { return make_local_group(ranks); }, rounds(200), 18);
}

TEST(AbortStorm, LocalRanksOversubscribedNeverTouchAFreedBuffer) {
  local_group_options o;
  o.oversubscribed = true;
  storm([o](int ranks) { return make_local_group(ranks, o); }, rounds(100), 1018);
}

TEST(AbortStorm, DriverGroupRanksNeverTouchAFreedBuffer) {
  // The driver-group logic NCCL uses, over the emulated communicator, in
  // which the last rank to arrive carries out the call on every rank's memory.
  auto log = std::make_shared<testing::emulated_log>();
  storm(testing::emulated_backend(log), rounds(200), 2018);
}

// Rank 2 aborts the group from inside the exchange and stays there a while;
// the others, done with their part, must not return before it has left.
TEST(Drain, NoRankReturnsWhileAPeerIsStillInsideTheExchange) {
  std::atomic<bool> left{false};
  local_group_options o;
  std::shared_ptr<collective_group> group;
  o.phase_hook = [&](int rank) {
    if (rank != 2) return;
    group->abort();
    std::this_thread::sleep_for(50ms);
    left = true;  // (the hook returns, rank 2 finishes its part of the exchange)
  };
  group = make_local_group(3, o);
  std::vector<std::thread> threads;
  std::vector<int> saw_left(3, -1);
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      std::vector<float> v(4099, 1.0f);
      EXPECT_THROW(group->endpoint(r)->all_reduce_sum(v, {}), collective_error) << "rank " << r;
      saw_left[static_cast<std::size_t>(r)] = left ? 1 : 0;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(saw_left, (std::vector<int>{1, 1, 1})) << "a rank returned while rank 2 was inside the exchange";
}

// A peer that never leaves the exchange after an abort: the others cannot
// return safely, so they stay in the call for good and say why; the library
// does not end the process (the engine reports a stuck thread).
TEST(DrainDeathTest, APeerStuckInsideTheExchangePoisonsTheGroupAndTheRankNeverReturns) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto stuck_peer = [] {
    local_group_options o;
    o.drain_bound = 200ms;
    std::shared_ptr<collective_group> group;
    o.phase_hook = [&](int rank) {
      if (rank != 1) return;
      group->abort();
      std::this_thread::sleep_for(60s);  // never scheduled again, as far as rank 0 can tell
    };
    group = make_local_group(2, o);
    std::thread peer([&] {
      std::vector<float> v(64, 1.0f);
      group->endpoint(1)->all_reduce_sum(v, {});
    });
    peer.detach();
    std::atomic<bool> returned{false};
    std::thread rank0([&] {
      std::vector<float> v(64, 1.0f);
      try {
        group->endpoint(0)->all_reduce_sum(v, {});
      } catch (const collective_error&) {
      }
      returned = true;
    });
    rank0.detach();
    std::this_thread::sleep_for(3s);  // 15 drain bounds
    std::_Exit(returned ? 0 : 3);     // 3: rank 0 is still inside, as it must be
  };
  EXPECT_EXIT(stuck_peer(), ::testing::ExitedWithCode(3), "local collective poisoned: rank 0 could not leave all_reduce");
}

}  // namespace
}  // namespace dpactor
