// The gloo backend's conformance suite, ranks as threads of this process.
// Each rank gets its own group object over one store, as separate processes
// would, so that everything between ranks goes through Gloo's sockets on
// 127.0.0.1. The sweep copies tests/collective_test (exact sums, first bad
// index); the references are the local backend's bytes, computed from the
// same inputs (See Note [Gloo sums like the local backend]).
// Every test runs over both transports between ranks of different groups:
// TCP on 127.0.0.1, and shared memory (See Note [Same-machine ranks share
// memory]). tests/gloo_process_test runs ranks as processes.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <span>
#include <thread>
#include <vector>

#include "comms/gloo.hpp"
#include "comms/local.hpp"
#include "comms/summation_tree.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

// A fresh key prefix per group, so that tests never see each other's keys.
std::string next_prefix() {
  static std::atomic<int> n{0};
  return "test" + std::to_string(n++);
}

// The transports a test runs over: gloo_group_options::shared_memory.
constexpr bool transports[] = {false, true};
std::string transport_name(bool shared_memory) { return shared_memory ? "shared memory" : "TCP"; }

// `ranks` groups of one rank each, as `ranks` processes would hold.
struct world {
  world(bool shared_memory, int ranks, std::chrono::milliseconds rendezvous = 10s) {
    gloo_group_options o;
    o.prefix = next_prefix();
    o.rendezvous_timeout = rendezvous;
    o.shared_memory = shared_memory;
    for (int r = 0; r < ranks; ++r) groups.push_back(make_gloo_group(store, ranks, o));
  }
  int size() const { return static_cast<int>(groups.size()); }
  std::shared_ptr<rendezvous_store> store = make_memory_store();
  std::vector<std::shared_ptr<collective_group>> groups;
};

// Runs fn(rank, endpoint) on one thread per rank and joins them.
template <class Fn>
void run_ranks(world& w, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < w.size(); ++r)
    threads.emplace_back([&w, &fn, r] { fn(r, *w.groups[static_cast<std::size_t>(r)]->endpoint(r)); });
  for (auto& t : threads) t.join();
}

// The local backend's result for the same per-rank inputs.
template <class Fn>
std::vector<std::vector<float>> local_reference(std::vector<std::vector<float>> in, Fn fn) {
  auto group = make_local_group(static_cast<int>(in.size()));
  std::vector<std::thread> threads;
  for (int r = 0; r < static_cast<int>(in.size()); ++r)
    threads.emplace_back([&, r] { fn(r, *group->endpoint(r), in[static_cast<std::size_t>(r)]); });
  for (auto& t : threads) t.join();
  return in;
}

// Values whose sums round: only the same order of additions gives the same bits.
std::vector<std::vector<float>> inexact(int ranks, std::size_t size) {
  std::vector<std::vector<float>> in(static_cast<std::size_t>(ranks), std::vector<float>(size));
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < size; ++i)
      in[static_cast<std::size_t>(r)][i] = std::sin(static_cast<float>(i * 31 + static_cast<std::size_t>(r) * 7)) * 1e3f / static_cast<float>(1 + r);
  return in;
}

class GlooAllReduce : public ::testing::TestWithParam<std::tuple<int, std::size_t, bool>> {};

TEST_P(GlooAllReduce, SumsExactlyAndIdenticallyOnEveryRank) {
  const auto [ranks, size, shared_memory] = GetParam();
  world w(shared_memory, ranks);
  std::vector<std::vector<float>> buffers(static_cast<std::size_t>(ranks), std::vector<float>(size));
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < size; ++i) buffers[static_cast<std::size_t>(r)][i] = static_cast<float>(r) + static_cast<float>(i % 7);
  run_ranks(w, [&](int r, collective& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), ranks);
    c.all_reduce_sum(buffers[static_cast<std::size_t>(r)], collective_options{20s});
  });
  for (int r = 0; r < ranks; ++r) {
    const auto& b = buffers[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < size; ++i) {
      // rank r sends r + (i mod 7): the sum is n(n-1)/2 + n (i mod 7)
      const float want = static_cast<float>(ranks * (ranks - 1) / 2 + ranks * static_cast<int>(i % 7));
      if (b[i] != want) FAIL() << "rank " << r << ", first bad index " << i << ": got " << b[i] << ", want " << want;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RanksBySizes, GlooAllReduce,
                         ::testing::Combine(::testing::Range(1, 6),
                                            ::testing::Values(std::size_t{0}, std::size_t{1}, std::size_t{7},
                                                              std::size_t{4099}, std::size_t{1} << 20),
                                            ::testing::ValuesIn(transports)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" + std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_shm" : "_tcp");
                         });

TEST(GlooAllReduce, GivesTheLocalBackendsBytesForInexactSums) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    for (int ranks = 2; ranks <= 5; ++ranks) {
      const std::size_t size = 10007;
      auto in = inexact(ranks, size);
      const auto want = local_reference(in, [](int, collective& c, std::vector<float>& v) { c.all_reduce_sum(v, {}); });
      world w(shared_memory, ranks);
      run_ranks(w, [&](int r, collective& c) { c.all_reduce_sum(in[static_cast<std::size_t>(r)], {}); });
      for (int r = 0; r < ranks; ++r)
        EXPECT_EQ(std::memcmp(in[static_cast<std::size_t>(r)].data(), want[0].data(), size * sizeof(float)), 0)
            << ranks << " ranks: rank " << r << " differs from the local backend's sum";
    }
  }
}

TEST(GlooAllReduce, ManyConsecutiveCallsStayInStep) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    world w(shared_memory, 3);
    run_ranks(w, [&](int r, collective& c) {
      std::vector<float> v(33);
      for (int iter = 0; iter < 300; ++iter) {
        std::fill(v.begin(), v.end(), static_cast<float>(r + iter));
        c.all_reduce_sum(v, {});
        ASSERT_EQ(v[0], static_cast<float>(3 + 3 * iter)) << "iteration " << iter << ", rank " << r;
      }
    });
  }
}

TEST(GlooReduceScatter, EachRanksChunkIsTheLocalBackendsBytes) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    for (int ranks = 1; ranks <= 5; ++ranks)
      for (const std::size_t size : {0, 1, 7, 33, 1000, 4099}) {
        auto in = inexact(ranks, size);
        const auto want = local_reference(in, [](int, collective& c, std::vector<float>& v) { c.reduce_scatter_sum(v, {}); });
        world w(shared_memory, ranks);
        run_ranks(w, [&](int r, collective& c) { c.reduce_scatter_sum(in[static_cast<std::size_t>(r)], {}); });
        auto c = make_local_group(ranks)->endpoint(0);
        for (int r = 0; r < ranks; ++r) {
          const auto [begin, end] = c->chunk(size, r);
          for (std::size_t i = begin; i < end; ++i)
            if (std::memcmp(&in[static_cast<std::size_t>(r)][i], &want[static_cast<std::size_t>(r)][i], sizeof(float)) != 0)
              FAIL() << ranks << " ranks, size " << size << ", rank " << r << ", first bad index " << i << ": got "
                     << in[static_cast<std::size_t>(r)][i] << ", want " << want[static_cast<std::size_t>(r)][i];
        }
      }
  }
}

TEST(GlooChunk, IsTheLocalBackendsChunk) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    for (int ranks = 1; ranks <= 5; ++ranks) {
      world w(shared_memory, ranks);
      auto gloo = w.groups[0]->endpoint(0);
      auto local = make_local_group(ranks)->endpoint(0);
      for (const std::size_t size : {0, 1, 7, 16, 17, 100, 1000})
        for (int r = 0; r < ranks; ++r) EXPECT_EQ(gloo->chunk(size, r), local->chunk(size, r)) << ranks << " ranks, size " << size;
    }
  }
}

TEST(GlooAllGather, EveryRankEndsWithEveryRanksParts) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    for (int ranks = 1; ranks <= 5; ++ranks)
      for (const std::size_t size : {0, 1, 7, 33, 1000}) {
        world w(shared_memory, ranks);
        // Two buffers a rank, the second one longer; rank r writes r + 1 (and
        // -(r + 1)) into its own part of each, zero elsewhere.
        std::vector<std::vector<float>> a(static_cast<std::size_t>(ranks), std::vector<float>(size, 0.0f));
        std::vector<std::vector<float>> b(static_cast<std::size_t>(ranks), std::vector<float>(size + 5, 0.0f));
        auto c = make_local_group(ranks)->endpoint(0);
        for (int r = 0; r < ranks; ++r) {
          const auto [ab, ae] = c->chunk(size, r);
          for (std::size_t i = ab; i < ae; ++i) a[static_cast<std::size_t>(r)][i] = static_cast<float>(r + 1);
          const auto [bb, be] = c->chunk(size + 5, r);
          for (std::size_t i = bb; i < be; ++i) b[static_cast<std::size_t>(r)][i] = -static_cast<float>(r + 1);
        }
        run_ranks(w, [&](int r, collective& rc) {
          const std::span<float> mine[] = {a[static_cast<std::size_t>(r)], b[static_cast<std::size_t>(r)]};
          rc.all_gather(mine, {});
        });
        for (int r = 0; r < ranks; ++r)
          for (int owner = 0; owner < ranks; ++owner) {
            const auto [ab, ae] = c->chunk(size, owner);
            for (std::size_t i = ab; i < ae; ++i)
              ASSERT_EQ(a[static_cast<std::size_t>(r)][i], static_cast<float>(owner + 1))
                  << ranks << " ranks, size " << size << ": rank " << r << " lacks rank " << owner << "'s part at " << i;
            const auto [bb, be] = c->chunk(size + 5, owner);
            for (std::size_t i = bb; i < be; ++i)
              ASSERT_EQ(b[static_cast<std::size_t>(r)][i], -static_cast<float>(owner + 1))
                  << ranks << " ranks, second buffer: rank " << r << " lacks rank " << owner << "'s part at " << i;
          }
      }
  }
}

TEST(GlooBroadcast, CopiesTheRootsBufferToEveryRank) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    const int ranks = 4;
    for (int root = 0; root < ranks; ++root) {
      world w(shared_memory, ranks);
      std::vector<std::vector<float>> buffers(ranks, std::vector<float>(1001));
      for (int r = 0; r < ranks; ++r)
        for (std::size_t i = 0; i < 1001; ++i) buffers[static_cast<std::size_t>(r)][i] = static_cast<float>(r * 10000 + static_cast<int>(i));
      run_ranks(w, [&](int r, collective& c) { c.broadcast(buffers[static_cast<std::size_t>(r)], root, {}); });
      for (int r = 0; r < ranks; ++r)
        for (std::size_t i = 0; i < 1001; ++i)
          ASSERT_EQ(buffers[static_cast<std::size_t>(r)][i], static_cast<float>(root * 10000 + static_cast<int>(i)))
              << "root " << root << ", rank " << r << ", index " << i;
    }
  }
}

// Every rank holds some nodes of a step's summation tree; each rank's chunk
// of the result must be the local backend's bytes.
TEST(GlooReduceScatterTree, GivesTheLocalBackendsBytes) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    struct layout {
      std::size_t slices;
      std::vector<std::vector<std::uint8_t>> owned;  // per rank, per slice
    };
    const std::vector<layout> layouts = {
        {8, {{1, 1, 1, 1, 0, 0, 0, 0}, {0, 0, 0, 0, 1, 1, 1, 1}}},
        {7, {{1, 1, 0, 0, 0, 0, 0}, {0, 0, 1, 1, 1, 0, 0}, {0, 0, 0, 0, 0, 1, 1}}},
        {5, {{1, 0, 0, 0, 1}, {0, 1, 1, 0, 0}, {0, 0, 0, 1, 0}, {0, 0, 0, 0, 0}}},
        {3, {{0, 0, 1}, {1, 0, 0}, {0, 1, 0}, {0, 0, 0}, {0, 0, 0}}},
    };
    for (const std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{1037}})
      for (const layout& l : layouts) {
        const int ranks = static_cast<int>(l.owned.size());
        const summation_tree tree(l.slices);
        // Rank r's parts: the cover of its slices, each filled with values
        // that depend on rank and node.
        std::vector<std::vector<std::uint32_t>> nodes(static_cast<std::size_t>(ranks));
        std::vector<std::vector<std::vector<float>>> values(static_cast<std::size_t>(ranks));
        for (int r = 0; r < ranks; ++r) {
          nodes[static_cast<std::size_t>(r)] = tree.cover(l.owned[static_cast<std::size_t>(r)]);
          for (const auto node : nodes[static_cast<std::size_t>(r)]) {
            std::vector<float> v(size);
            for (std::size_t i = 0; i < size; ++i) v[i] = std::sin(static_cast<float>(i * 17 + node * 131)) * 77.7f;
            values[static_cast<std::size_t>(r)].push_back(std::move(v));
          }
        }
        auto run = [&](int r, collective& c, std::vector<float>& out) {
          std::vector<tree_part> parts;
          for (std::size_t k = 0; k < nodes[static_cast<std::size_t>(r)].size(); ++k)
            parts.push_back({nodes[static_cast<std::size_t>(r)][k], values[static_cast<std::size_t>(r)][k]});
          out.assign(size, -1.0f);
          c.reduce_scatter_tree(l.slices, parts, out, {});
        };
        const auto want = local_reference(std::vector<std::vector<float>>(static_cast<std::size_t>(ranks)), run);
        std::vector<std::vector<float>> got(static_cast<std::size_t>(ranks));
        world w(shared_memory, ranks);
        run_ranks(w, [&](int r, collective& c) { run(r, c, got[static_cast<std::size_t>(r)]); });
        auto c = make_local_group(ranks)->endpoint(0);
        for (int r = 0; r < ranks; ++r) {
          const auto [begin, end] = c->chunk(size, r);
          for (std::size_t i = begin; i < end; ++i)
            if (std::memcmp(&got[static_cast<std::size_t>(r)][i], &want[static_cast<std::size_t>(r)][i], sizeof(float)) != 0)
              FAIL() << l.slices << " slices on " << ranks << " ranks, size " << size << ": rank " << r
                     << ", first bad index " << i << ": got " << got[static_cast<std::size_t>(r)][i] << ", want "
                     << want[static_cast<std::size_t>(r)][i];
        }
      }
  }
}

TEST(GlooBarrier, HoldsUntilEveryRankArrives) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    world w(shared_memory, 3);
    std::atomic<bool> last_arrived{false};
    run_ranks(w, [&](int r, collective& c) {
      if (r == 2) {
        std::this_thread::sleep_for(50ms);
        last_arrived = true;
      }
      c.barrier({});
      EXPECT_TRUE(last_arrived) << "rank " << r << " passed the barrier before rank 2 arrived";
    });
  }
}

TEST(GlooMismatch, DifferentSizesFailOnEveryRankBeforeAnyPayload) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    world w(shared_memory, 3);
    std::vector<int> codes(3, -1);
    run_ranks(w, [&](int r, collective& c) {
      std::vector<float> v(r == 1 ? 9 : 8, 1.0f);
      try {
        c.all_reduce_sum(v, collective_options{10s});
      } catch (const collective_error& e) {
        codes[static_cast<std::size_t>(r)] = static_cast<int>(e.code());
      }
      for (const float x : v) EXPECT_EQ(x, 1.0f) << "rank " << r << ": a mismatched call changed the buffer";
    });
    // The ranks that saw the mismatch say so; a rank may instead see the group
    // aborted by a peer that found it first.
    int mismatches = 0;
    for (int r = 0; r < 3; ++r) {
      EXPECT_NE(codes[static_cast<std::size_t>(r)], -1) << "rank " << r << " did not fail";
      mismatches += codes[static_cast<std::size_t>(r)] == static_cast<int>(collective_errc::mismatch);
    }
    EXPECT_GE(mismatches, 1);
  }
}

// The slowest of `ranks - 1` waiting ranks, measured from `abort`: each waits
// in an all-reduce that the last rank never joins. With connect_first, every
// rank passes a barrier first (the last one then stays silent); without, the
// last rank never connects and the others wait in rendezvous.
template <class Abort>
double slowest_wake_ms(world& w, bool connect_first, Abort abort, std::vector<int>& codes) {
  const int waiting_ranks = w.size() - 1;
  std::vector<double> woke(static_cast<std::size_t>(waiting_ranks), -1.0);
  codes.assign(static_cast<std::size_t>(waiting_ranks), -1);
  std::atomic<int> waiting{0};
  std::atomic<bool> aborted{false};
  clock_type::time_point abort_time;
  std::vector<std::thread> threads;
  for (int r = 0; r < w.size(); ++r)
    threads.emplace_back([&, r] {
      auto c = w.groups[static_cast<std::size_t>(r)]->endpoint(r);
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
        c->all_reduce_sum(v, collective_options{60s});
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

TEST(GlooAbort, AGroupAbortedFromOutsideWakesItsRankAndEveryPeerWithin50ms) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    world w(shared_memory, 4);
    std::vector<int> codes;
    // Rank 0's process aborts its group: ranks 1 and 2 (other "processes")
    // learn it through the sockets.
    const double slowest = slowest_wake_ms(w, true, [&] { w.groups[0]->abort(); }, codes);
    for (std::size_t r = 0; r < codes.size(); ++r)
      EXPECT_EQ(codes[r], static_cast<int>(collective_errc::aborted)) << "rank " << r;
    EXPECT_LT(slowest, 50.0);
    EXPECT_TRUE(w.groups[0]->aborted());
    std::vector<float> v(4);
    EXPECT_THROW(w.groups[0]->endpoint(0)->all_reduce_sum(v, {}), collective_error) << "later calls fail fast too";
  }
}

TEST(GlooAbort, AbortDuringRendezvousWakesTheWaitingRanksWithin50ms) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    world w(shared_memory, 3);
    std::vector<int> codes;
    // The last rank never connects: the others wait in rendezvous for its
    // address; each process aborts its own group.
    const double slowest = slowest_wake_ms(w, false, [&] {
      for (auto& g : w.groups) g->abort();
    }, codes);
    for (std::size_t r = 0; r < codes.size(); ++r)
      EXPECT_EQ(codes[r], static_cast<int>(collective_errc::aborted)) << "rank " << r;
    EXPECT_LT(slowest, 50.0);
  }
}

TEST(GlooTimeout, ARankThatNeverConnectsEndsTheRendezvousAtItsTimeout) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    world w(shared_memory, 2, 300ms);
    auto c = w.groups[0]->endpoint(0);
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
    EXPECT_GE(waited, 300ms);
    EXPECT_LT(waited, 5s);
  }
}

TEST(GlooTimeout, ACallThatAPeerNeverJoinsTimesOutAndBreaksTheGroup) {
  for (const bool shared_memory : transports) {
    SCOPED_TRACE(transport_name(shared_memory));
    world w(shared_memory, 2);
    std::vector<int> codes(2, -1);
    run_ranks(w, [&](int r, collective& c) {
      c.barrier({});
      if (r == 1) {
        // Rank 1 joins nothing more until rank 0 has given up.
        std::vector<float> v(8);
        try {
          std::this_thread::sleep_for(400ms);
          c.all_reduce_sum(v, collective_options{5s});
        } catch (const collective_error& e) {
          codes[1] = static_cast<int>(e.code());
        }
        return;
      }
      std::vector<float> v(8);
      const auto start = clock_type::now();
      try {
        c.all_reduce_sum(v, collective_options{100ms});
      } catch (const collective_error& e) {
        codes[0] = static_cast<int>(e.code());
      }
      EXPECT_GE(clock_type::now() - start, 100ms);
    });
    EXPECT_EQ(codes[0], static_cast<int>(collective_errc::timeout));
    EXPECT_EQ(codes[1], static_cast<int>(collective_errc::aborted)) << "the peer of a timed-out rank must fail, not hang";
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
    world w(shared_memory, 4);
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
    o.prefix = next_prefix();
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

// See Note [Same-machine ranks share memory]: a pair uses it only when both
// ends offer it; the others stay on TCP, and the sums are the same bytes.
TEST(GlooSharedMemory, APairUsesItOnlyWhenBothEndsOfferIt) {
  for (const int off : {-1, 0, 2}) {  // the rank that turns it off (-1: none)
    const int ranks = 4;
    SCOPED_TRACE("shared memory off on rank " + std::to_string(off));
    auto store = make_memory_store();
    std::vector<std::shared_ptr<collective_group>> groups;
    gloo_group_options o;
    o.prefix = next_prefix();
    for (int r = 0; r < ranks; ++r) {
      o.shared_memory = r != off;
      groups.push_back(make_gloo_group(store, ranks, o));
    }
    auto in = inexact(ranks, 5003);
    const auto want = local_reference(in, [](int, collective& c, std::vector<float>& v) { c.all_reduce_sum(v, {}); });
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
      EXPECT_EQ(std::memcmp(in[static_cast<std::size_t>(r)].data(), want[0].data(), 5003 * sizeof(float)), 0)
          << "rank " << r << " differs from the local backend's sum";
    }
  }
}

}  // namespace
}  // namespace dpactor
