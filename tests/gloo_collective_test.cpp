// What only the gloo backend does, ranks as threads of this process, each
// with its own group over one store as separate processes would hold:
// rendezvous (a rank that never connects, an abort while waiting for one),
// naming the ranks that are late, several ranks of one process in one group,
// and which pairs use shared memory (See Note [Same-machine ranks share
// memory]). Every test runs over both transports between ranks of different
// groups: TCP on 127.0.0.1, and shared memory. What every backend does, gloo
// included, is in tests/collective_conformance_test; tests/gloo_process_test
// runs ranks as processes.

#include <gtest/gtest.h>

#include <pthread.h>

#include <csignal>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <span>
#include <thread>
#include <vector>

#include "comms/gloo.hpp"
#include "tests/collective_backends.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using testing::collective_world;
using testing::run_ranks;

// The transports a test runs over: gloo_group_options::shared_memory.
constexpr bool transports[] = {false, true};
std::string transport_name(bool shared_memory) { return shared_memory ? "shared memory" : "TCP"; }

// The abort, not the rendezvous timeout (10 s) or the calls' timeout, wakes
// them: the error says aborted (either timeout says timeout), and they wake
// long before the calls' timeout.
TEST(GlooAbort, AbortDuringRendezvousWakesTheWaitingRanksLongBeforeTheirTimeouts) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    const collective_world w = testing::gloo_world(shared_memory, 3);
    std::vector<int> codes;
    // The last rank never connects: the others wait in rendezvous for its
    // address; each process aborts its own group.
    const double slowest = testing::slowest_wake_ms(w, false, [&] {
      for (auto& g : w.groups) g->abort();
    }, codes);
    std::printf("[ measured ] %s: the slowest rank woke %.2f ms after the abort\n",
                transport_name(shared_memory).c_str(), slowest);
    for (std::size_t r = 0; r < codes.size(); ++r)
      EXPECT_EQ(codes[r], static_cast<int>(collective_errc::aborted)) << "rank " << r;
    const double third_of_the_timeout_ms =
        std::chrono::duration<double, std::milli>(testing::abort_test_call_timeout).count() / 3;
    EXPECT_LT(slowest, third_of_the_timeout_ms);
  }
}

TEST(GlooTimeout, ARankThatNeverConnectsEndsTheRendezvousAtItsTimeout) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    const collective_world w = testing::gloo_world(shared_memory, 2, 300ms);
    auto c = w.endpoint(0);
    std::vector<float> v(8);
    const auto start = clock_type::now();
    try {
      c->all_reduce_sum(v, collective_options{60s});
      FAIL() << "no timeout";
    } catch (const collective_error& e) {
      EXPECT_EQ(e.code(), collective_errc::timeout) << e.what();
      EXPECT_NE(std::string(e.what()).find("rendezvous"), std::string::npos) << e.what();
    }
    const auto waited = clock_type::now() - start;
    std::printf("[ measured ] %s: a 300 ms rendezvous timed out after %.1f ms\n",
                transport_name(shared_memory).c_str(), std::chrono::duration<double, std::milli>(waited).count());
    EXPECT_GE(waited, 300ms);
    // Its own 300 ms, not the call's 60 s nor the default rendezvous timeout (10 s).
    EXPECT_LT(waited, 5s);
  }
}

class missing_recorder final : public late_observer {
 public:
  void on_late(std::span<const int> missing) override {
    calls++;
    ranks.assign(missing.begin(), missing.end());
  }
  int calls = 0;
  std::vector<int> ranks;
};

TEST(GlooLate, AWaitingRankNamesTheRanksThatHaveNotArrived) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    const collective_world w = testing::gloo_world(shared_memory, 4);
    std::vector<missing_recorder> seen(4);
    run_ranks(w, [&](int r, collective& c) {
      c.barrier({});
      if (r == 2) std::this_thread::sleep_for(300ms);
      std::vector<float> v(16, 1.0f);
      collective_options o{10s};
      o.observer = &seen[static_cast<std::size_t>(r)];
      o.late_at = clock_type::now() + 100ms;
      c.all_reduce_sum(v, o);
      EXPECT_EQ(v[0], 4.0f);
    });
    for (const int r : {0, 1, 3}) {
      EXPECT_EQ(seen[static_cast<std::size_t>(r)].calls, 1) << "rank " << r;
      EXPECT_EQ(seen[static_cast<std::size_t>(r)].ranks, std::vector<int>{2}) << "rank " << r;
    }
    EXPECT_EQ(seen[2].calls, 0) << "the late rank found everyone waiting";
  }
}

TEST(GlooGroup, RanksOfOneProcessCanShareAGroup) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    // A node with several local ranks holds one group for all of them.
    const int ranks = 3;
    gloo_group_options o;
    o.shared_memory = shared_memory;
    auto group = make_gloo_group(make_memory_store(), ranks, o);
    std::vector<std::vector<float>> buffers(ranks, std::vector<float>(100));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        std::fill(buffers[static_cast<std::size_t>(r)].begin(), buffers[static_cast<std::size_t>(r)].end(), static_cast<float>(r + 1));
        group->endpoint(r)->all_reduce_sum(buffers[static_cast<std::size_t>(r)], {});
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(buffers[static_cast<std::size_t>(r)][99], 6.0f) << "rank " << r;
  }
}

// See Note [SIGPIPE without a process-wide disposition]: a call leaves the
// process's SIGPIPE disposition and the calling thread's mask as they were.
TEST(GlooProcessEffects, ACallChangesNeitherSigpipesDispositionNorTheCallersMask) {
  struct sigaction before {};
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &before), 0);
  std::vector<sigset_t> masks_before(2), masks_after(2);
  auto group = make_gloo_group(make_memory_store(), 2, gloo_group_options{});
  std::vector<std::vector<float>> buffers(2, std::vector<float>(1000, 1.0f));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      const auto i = static_cast<std::size_t>(r);
      pthread_sigmask(SIG_SETMASK, nullptr, &masks_before[i]);
      group->endpoint(r)->all_reduce_sum(buffers[i], {});
      pthread_sigmask(SIG_SETMASK, nullptr, &masks_after[i]);
    });
  for (auto& t : threads) t.join();
  struct sigaction after {};
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &after), 0);
  EXPECT_EQ(after.sa_handler, before.sa_handler) << "SIGPIPE's disposition changed";
  for (std::size_t r = 0; r < 2; ++r)
    EXPECT_EQ(sigismember(&masks_after[r], SIGPIPE), sigismember(&masks_before[r], SIGPIPE)) << "rank " << r;
  EXPECT_EQ(buffers[1][999], 2.0f);
}

// See Note [Same-machine ranks share memory]: a pair uses it only when both
// ends offer it; the others stay on TCP, and the sums are the same bytes.
TEST(GlooSharedMemory, APairUsesItOnlyWhenBothEndsOfferIt) {
  for (const int off : {-1, 0, 2}) {  // the rank that turns it off (-1: none)
    const int ranks = 4;
    SCOPED_TRACE("shared memory off on rank " + std::to_string(off));
    auto store = make_memory_store();
    std::vector<std::shared_ptr<collective_group>> groups;
    gloo_group_options o;
    for (int r = 0; r < ranks; ++r) {
      o.shared_memory = r != off;
      groups.push_back(make_gloo_group(store, ranks, o));
    }
    auto in = testing::inexact_inputs(ranks, 5003);
    const std::vector<float> want = testing::rank_order_sum(in);
    std::vector<int> peers(ranks, -1);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        auto c = groups[static_cast<std::size_t>(r)]->endpoint(r);
        c->all_reduce_sum(in[static_cast<std::size_t>(r)], {});
        peers[static_cast<std::size_t>(r)] = gloo_shared_memory_peers(*c);
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < ranks; ++r) {
      const int expected = off < 0 ? ranks - 1 : r == off ? 0 : ranks - 2;
      EXPECT_EQ(peers[static_cast<std::size_t>(r)], expected) << "rank " << r;
      EXPECT_EQ(std::memcmp(in[static_cast<std::size_t>(r)].data(), want.data(), 5003 * sizeof(float)), 0)
          << "rank " << r << " differs from the rank-order sum (the local backend's)";
    }
  }
}

}  // namespace
}  // namespace dpactor
