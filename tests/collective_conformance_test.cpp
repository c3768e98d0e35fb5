// One conformance suite for every collective backend (tests/collective_backends.hpp:
// local, gloo_tcp, gloo_shm, driver, nccl), ranks as threads of this process.
// Inputs are chosen so the expected sums are exact in fp32 (a mismatch names
// the first bad index); where they round, the reference is the rank-order sum
// computed here, which is the local backend's bytes (See Note [Bitwise
// identical replicas], Note [Gloo sums like the local backend]), and every
// rank must hold bitwise the same result. What only one backend does is in
// its own file: local_collective_test, gloo_collective_test,
// driver_group_test, gpu_test.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comms/local.hpp"
#include "comms/summation_tree.hpp"
#include "tests/collective_backends.hpp"
#include "tests/summation_slices.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;
using testing::collective_backend;
using testing::collective_backends;
using testing::collective_world;
using testing::run_ranks;

// Skips the test, saying why, where the backend cannot hold `n` ranks here.
#define REQUIRE_RANKS(n)                                                                                \
  do {                                                                                                  \
    std::string why_;                                                                                   \
    if (backend().capacity(why_) < (n)) GTEST_SKIP() << backend().name << ", a test of " << (n) << " ranks: " << why_; \
  } while (false)

// The ranks' buffers, `ranks` of `size` floats.
using buffers = std::vector<std::vector<float>>;

// ---- all-reduce over ranks x sizes ----

struct sweep_case {
  std::size_t backend = 0;
  int ranks = 1;
  std::size_t size = 0;
};

void PrintTo(const sweep_case& c, std::ostream* os) {
  *os << collective_backends()[c.backend].name << ", " << c.ranks << " ranks, " << c.size << " floats";
}

std::vector<sweep_case> ranks_by_sizes() {
  std::vector<sweep_case> cases;
  for (std::size_t b = 0; b < collective_backends().size(); ++b)
    for (int ranks = 1; ranks <= collective_backends()[b].sweep_ranks; ++ranks)
      for (const std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4096}, std::size_t{4099},
                                     std::size_t{1} << 20})
        cases.push_back({b, ranks, size});
  return cases;
}

class AllReduce : public ::testing::TestWithParam<sweep_case> {
 protected:
  const collective_backend& backend() const { return collective_backends()[GetParam().backend]; }
};

TEST_P(AllReduce, SumsExactlyAndIdenticallyOnEveryRank) {
  const int ranks = GetParam().ranks;
  const std::size_t size = GetParam().size;
  REQUIRE_RANKS(ranks);
  buffers in(static_cast<std::size_t>(ranks), std::vector<float>(size));
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < size; ++i) in[static_cast<std::size_t>(r)][i] = static_cast<float>(r) + static_cast<float>(i % 7);
  run_ranks(backend().make(ranks), [&](int r, collective& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), ranks);
    c.all_reduce_sum(in[static_cast<std::size_t>(r)], collective_options{20s});
  });
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < size; ++i) {
      // rank r sends r + (i mod 7): the sum is n(n-1)/2 + n (i mod 7)
      const float want = static_cast<float>(ranks * (ranks - 1) / 2 + ranks * static_cast<int>(i % 7));
      const float got = in[static_cast<std::size_t>(r)][i];
      if (got != want) FAIL() << "rank " << r << ", first bad index " << i << ": got " << got << ", want " << want;
    }
}

INSTANTIATE_TEST_SUITE_P(RanksBySizes, AllReduce, ::testing::ValuesIn(ranks_by_sizes()), [](const auto& info) {
  return collective_backends()[info.param.backend].name + "_" + std::to_string(info.param.ranks) + "ranks_" +
         std::to_string(info.param.size);
});

// ---- every other test, once per backend ----

class on_every_backend : public ::testing::TestWithParam<std::size_t> {
 protected:
  const collective_backend& backend() const { return collective_backends()[GetParam()]; }
  // Up to `n` ranks, as many as the backend holds here.
  int ranks_up_to(int n) const {
    std::string why;
    return std::min(n, backend().capacity(why));
  }
  // Where a rank's result must be the rank-order sum `want`: bitwise, or
  // (NCCL, which sums in its own order) within fp32 rounding.
  void expect_sum(std::span<const float> got, std::span<const float> want, std::size_t begin, std::size_t end,
                  const std::string& where) const {
    for (std::size_t i = begin; i < end; ++i) {
      const bool same = backend().rank_order_sums ? std::memcmp(&got[i], &want[i], sizeof(float)) == 0
                                                  : std::abs(got[i] - want[i]) <= 1e-4f + 1e-5f * std::abs(want[i]);
      if (!same) FAIL() << where << ", first bad index " << i << ": got " << got[i] << ", want " << want[i];
    }
  }
};

#define ON_EVERY_BACKEND(suite)                                                                             \
  class suite : public on_every_backend {};                                                                  \
  INSTANTIATE_TEST_SUITE_P(EveryBackend, suite, ::testing::Range(std::size_t{0}, collective_backends().size()), \
                           [](const auto& info) { return collective_backends()[info.param].name; })

ON_EVERY_BACKEND(InexactSums);
ON_EVERY_BACKEND(ConsecutiveCalls);
ON_EVERY_BACKEND(Broadcast);
ON_EVERY_BACKEND(Chunk);
ON_EVERY_BACKEND(ReduceScatter);
ON_EVERY_BACKEND(AllGather);
ON_EVERY_BACKEND(ReduceScatterTree);
ON_EVERY_BACKEND(AllReduceTree);
ON_EVERY_BACKEND(AllReduceWithHeader);
ON_EVERY_BACKEND(Barrier);
ON_EVERY_BACKEND(Mismatch);
ON_EVERY_BACKEND(Abort);
ON_EVERY_BACKEND(Timeout);
ON_EVERY_BACKEND(AllReduceInt8);
ON_EVERY_BACKEND(Bf16);

TEST_P(InexactSums, AreBitwiseIdenticalOnEveryRankAndTheRankOrderSum) {
  REQUIRE_RANKS(1);
  for (int ranks = 1; ranks <= ranks_up_to(5); ++ranks) {
    const std::size_t size = 10007;
    auto in = testing::inexact_inputs(ranks, size);
    const std::vector<float> want = testing::rank_order_sum(in);
    run_ranks(backend().make(ranks), [&](int r, collective& c) { c.all_reduce_sum(in[static_cast<std::size_t>(r)], {}); });
    expect_sum(in[0], want, 0, size, std::to_string(ranks) + " ranks: rank 0");
    for (int r = 1; r < ranks; ++r)
      EXPECT_EQ(std::memcmp(in[static_cast<std::size_t>(r)].data(), in[0].data(), size * sizeof(float)), 0)
          << ranks << " ranks: rank " << r << " differs from rank 0";
  }
}

TEST_P(ConsecutiveCalls, StayInStep) {
  REQUIRE_RANKS(3);
  run_ranks(backend().make(3), [&](int r, collective& c) {
    std::vector<float> v(33);
    for (int iter = 0; iter < backend().consecutive_calls; ++iter) {
      std::fill(v.begin(), v.end(), static_cast<float>(r + iter));
      c.all_reduce_sum(v, {});
      for (std::size_t i = 0; i < v.size(); ++i)
        ASSERT_EQ(v[i], static_cast<float>(3 + 3 * iter)) << "iteration " << iter << ", rank " << r << ", index " << i;
    }
  });
}

TEST_P(Broadcast, CopiesTheRootsBufferToEveryRank) {
  REQUIRE_RANKS(1);
  for (const int ranks : {1, 2, 4, 5}) {
    if (ranks > ranks_up_to(5)) break;
    for (int root = 0; root < ranks; ++root) {
      buffers v(static_cast<std::size_t>(ranks), std::vector<float>(1001));
      for (int r = 0; r < ranks; ++r)
        for (std::size_t i = 0; i < 1001; ++i) v[static_cast<std::size_t>(r)][i] = static_cast<float>(r * 10000 + static_cast<int>(i));
      run_ranks(backend().make(ranks), [&](int r, collective& c) { c.broadcast(v[static_cast<std::size_t>(r)], root, {}); });
      for (int r = 0; r < ranks; ++r)
        for (std::size_t i = 0; i < 1001; ++i)
          ASSERT_EQ(v[static_cast<std::size_t>(r)][i], static_cast<float>(root * 10000 + static_cast<int>(i)))
              << ranks << " ranks, root " << root << ", rank " << r << ", first bad index " << i;
    }
  }
}

TEST_P(Chunk, PartsTileTheBufferInRankOrderAsTheLocalBackendsDo) {
  REQUIRE_RANKS(1);
  for (int ranks = 1; ranks <= ranks_up_to(5); ++ranks) {
    auto local = make_local_group(ranks)->endpoint(0);
    run_ranks(backend().make(ranks), [&](int, collective& c) {
      c.barrier({});  // every rank has connected
      for (const std::size_t size : {0, 1, 7, 16, 17, 100, 1000}) {
        std::size_t next = 0;
        for (int r = 0; r < ranks; ++r) {
          const auto [begin, end] = c.chunk(size, r);
          EXPECT_EQ(begin, next) << ranks << " ranks, size " << size << ", rank " << r << ": parts must be contiguous";
          EXPECT_LE(begin, end);
          if (end < size) {
            EXPECT_EQ(end % 16, 0u) << "parts end on cache lines (16 floats)";
          }
          EXPECT_EQ(c.chunk(size, r), local->chunk(size, r)) << ranks << " ranks, size " << size;
          next = end;
        }
        EXPECT_EQ(next, size) << ranks << " ranks, size " << size << ": parts must cover the buffer";
      }
      // Past the end, a rank's part is empty: 17 floats on 4 ranks are 16 + 1 + 0 + 0.
      if (ranks == 4) {
        EXPECT_EQ(c.chunk(17, 2), (std::pair<std::size_t, std::size_t>{17, 17}));
      }
    });
  }
}

TEST_P(ReduceScatter, EachRanksPartIsTheRankOrderSum) {
  REQUIRE_RANKS(1);
  for (int ranks = 1; ranks <= ranks_up_to(5); ++ranks)
    for (const std::size_t size : {0, 1, 7, 33, 1000, 4099}) {
      auto in = testing::inexact_inputs(ranks, size);
      const std::vector<float> want = testing::rank_order_sum(in);
      std::vector<std::pair<std::size_t, std::size_t>> parts(static_cast<std::size_t>(ranks));
      run_ranks(backend().make(ranks), [&](int r, collective& c) {
        c.reduce_scatter_sum(in[static_cast<std::size_t>(r)], {});
        parts[static_cast<std::size_t>(r)] = c.chunk(size, r);
      });
      for (int r = 0; r < ranks; ++r) {
        const auto [begin, end] = parts[static_cast<std::size_t>(r)];
        expect_sum(in[static_cast<std::size_t>(r)], want, begin, end,
                   std::to_string(ranks) + " ranks, size " + std::to_string(size) + ", rank " + std::to_string(r));
      }
    }
}

TEST_P(AllGather, EveryRankEndsWithEveryRanksParts) {
  if (!backend().host_all_gather)
    GTEST_SKIP() << backend().name << " gathers device memory only (tests/gpu_test gathers on the GPU)";
  REQUIRE_RANKS(1);
  for (int ranks = 1; ranks <= ranks_up_to(5); ++ranks)
    for (const std::size_t size : {0, 1, 7, 33, 1000}) {
      // Two buffers a rank, the second one longer; rank r writes r + 1 (and
      // -(r + 1)) into its own part of each, zero elsewhere.
      buffers a(static_cast<std::size_t>(ranks), std::vector<float>(size, 0.0f));
      buffers b(static_cast<std::size_t>(ranks), std::vector<float>(size + 5, 0.0f));
      auto c = make_local_group(ranks)->endpoint(0);
      for (int r = 0; r < ranks; ++r) {
        const auto [ab, ae] = c->chunk(size, r);
        for (std::size_t i = ab; i < ae; ++i) a[static_cast<std::size_t>(r)][i] = static_cast<float>(r + 1);
        const auto [bb, be] = c->chunk(size + 5, r);
        for (std::size_t i = bb; i < be; ++i) b[static_cast<std::size_t>(r)][i] = -static_cast<float>(r + 1);
      }
      run_ranks(backend().make(ranks), [&](int r, collective& rc) {
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

// Each rank's chunk of the result is bitwise what one device computes from
// every slice (See Note [Summation tree]), whoever held which nodes.
// `owned[r]`: the slices rank r computed, in the order it computed them.
void expect_tree_of_one_device(const collective_backend& backend, std::size_t slices,
                               const std::vector<std::vector<std::size_t>>& owned, std::size_t size, std::uint64_t seed,
                               const std::string& where) {
  const int ranks = static_cast<int>(owned.size());
  const summation_tree tree(slices);
  const auto values = testing::slice_values(slices, size, seed);
  const std::vector<float> want = testing::one_device_sum(tree, values, size);
  buffers got(static_cast<std::size_t>(ranks), std::vector<float>(size, -1.0f));
  std::vector<std::pair<std::size_t, std::size_t>> chunks(static_cast<std::size_t>(ranks));
  run_ranks(backend.make(ranks), [&](int r, collective& c) {
    auto mine = testing::contribute(tree, values, owned[static_cast<std::size_t>(r)]);
    std::vector<tree_part> parts;
    for (auto& [node, v] : mine) parts.push_back({node, v});
    c.reduce_scatter_tree(slices, parts, got[static_cast<std::size_t>(r)], {});
    chunks[static_cast<std::size_t>(r)] = c.chunk(size, r);
  });
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = chunks[static_cast<std::size_t>(r)].first; i < chunks[static_cast<std::size_t>(r)].second; ++i)
      if (std::memcmp(&got[static_cast<std::size_t>(r)][i], &want[i], sizeof(float)) != 0)
        FAIL() << where << ": rank " << r << " of " << ranks << ", first bad index " << i << ": got "
               << got[static_cast<std::size_t>(r)][i] << ", want " << want[i];
}

// Ranks that hold nodes of different levels, and ranks that hold none.
TEST_P(ReduceScatterTree, GivesTheBytesOfOneDeviceForEveryLayout) {
  if (!backend().host_tree)
    GTEST_SKIP() << backend().name << " moves the tree's parts in device memory only (tests/gpu_test runs it on the GPU)";
  struct layout {
    std::size_t slices;
    std::vector<std::vector<std::size_t>> owned;  // per rank, its slices
  };
  const std::vector<layout> layouts = {
      {8, {{0, 1, 2, 3}, {4, 5, 6, 7}}},
      {7, {{0, 1}, {2, 3, 4}, {5, 6}}},
      {5, {{0, 4}, {1, 2}, {3}, {}}},
      {3, {{2}, {0}, {1}, {}, {}}},
  };
  REQUIRE_RANKS(2);
  for (const std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{1037}})
    for (const layout& l : layouts) {
      if (static_cast<int>(l.owned.size()) > ranks_up_to(5)) continue;
      expect_tree_of_one_device(backend(), l.slices, l.owned, size, size + l.slices,
                                std::to_string(l.slices) + " slices, size " + std::to_string(size));
      if (HasFatalFailure()) return;
    }
}

TEST_P(ReduceScatterTree, AnyOwnershipGivesTheBytesOfOneDevice) {
  if (!backend().host_tree)
    GTEST_SKIP() << backend().name << " moves the tree's parts in device memory only (tests/gpu_test runs it on the GPU)";
  REQUIRE_RANKS(1);
  std::mt19937_64 gen(21);
  for (int round = 0; round < 40; ++round) {
    const int ranks = std::uniform_int_distribution<int>(1, ranks_up_to(5))(gen);
    const std::size_t slices = std::uniform_int_distribution<std::size_t>(1, 24)(gen);
    const std::size_t size = std::uniform_int_distribution<std::size_t>(0, 3000)(gen) | 1u;
    std::vector<std::vector<std::size_t>> owned(static_cast<std::size_t>(ranks));
    for (std::size_t s = 0; s < slices; ++s) owned[std::uniform_int_distribution<std::size_t>(0, owned.size() - 1)(gen)].push_back(s);
    expect_tree_of_one_device(backend(), slices, owned, size, gen(),
                              "round " + std::to_string(round) + ", " + std::to_string(slices) + " slices");
    if (HasFatalFailure()) return;
  }
}

// See Note [One call a step]: the step header summed in rank order
// (bitwise what all_reduce_sum gives), then every rank holds the whole
// one-device tree sum; with `proceed` false, nothing of the output changes,
// on every rank alike. Ownerships where each rank holds one node (the gloo
// backend sends whole parts between two ranks then) and where ranks hold
// several or none.
TEST_P(AllReduceTree, GivesEveryRankTheHeaderSumAndTheWholeTreeOfOneDevice) {
  if (!backend().host_tree)
    GTEST_SKIP() << backend().name << " moves the tree's parts in device memory only (tests/gpu_test runs it on the GPU)";
  REQUIRE_RANKS(1);
  struct layout {
    std::size_t slices;
    std::vector<std::vector<std::size_t>> owned;
  };
  const std::vector<layout> layouts = {
      {2, {{0}, {1}}},
      {4, {{0, 1}, {2, 3}}},
      {8, {{0, 1, 2, 3}, {4, 5, 6, 7}}},
      {5, {{0, 1, 2}, {3, 4}}},
      {3, {{0, 1, 2}, {}}},
      {1, {{0}}},
      {7, {{0, 1}, {2, 3, 4}, {5, 6}}},
      {5, {{0, 4}, {1, 2}, {3}, {}}},
  };
  for (const std::size_t size : {std::size_t{1}, std::size_t{1037}, std::size_t{70001}})
    for (const layout& l : layouts) {
      const int ranks = static_cast<int>(l.owned.size());
      if (ranks > ranks_up_to(5)) continue;
      const std::string where = std::to_string(ranks) + " ranks, " + std::to_string(l.slices) + " slices, size " +
                                std::to_string(size);
      const summation_tree tree(l.slices);
      const auto values = testing::slice_values(l.slices, size, size + l.slices);
      const std::vector<float> want = testing::one_device_sum(tree, values, size);
      const std::size_t header_size = 5 + 3 * static_cast<std::size_t>(ranks);
      buffers headers(static_cast<std::size_t>(ranks), std::vector<float>(header_size));
      for (int r = 0; r < ranks; ++r)
        for (std::size_t i = 0; i < header_size; ++i)
          headers[static_cast<std::size_t>(r)][i] = 0.1f * static_cast<float>(i + 1) + 0.37f * static_cast<float>(r);
      // The reference: the same headers by all_reduce_sum.
      buffers want_header = headers;
      run_ranks(backend().make(ranks),
                [&](int r, collective& c) { c.all_reduce_sum(want_header[static_cast<std::size_t>(r)], {}); });
      for (const bool go : {true, false}) {
        buffers got(static_cast<std::size_t>(ranks), std::vector<float>(size, -1.0f));
        buffers header = headers;
        std::vector<int> proceeded(static_cast<std::size_t>(ranks), -1);
        std::vector<std::vector<float>> seen(static_cast<std::size_t>(ranks));
        run_ranks(backend().make(ranks), [&](int r, collective& c) {
          auto mine = testing::contribute(tree, values, l.owned[static_cast<std::size_t>(r)]);
          std::vector<tree_part> parts;
          for (auto& [node, v] : mine) parts.push_back({node, v});
          proceeded[static_cast<std::size_t>(r)] = c.all_reduce_tree(
              l.slices, parts, got[static_cast<std::size_t>(r)], header[static_cast<std::size_t>(r)],
              [&](std::span<const float> h) {
                seen[static_cast<std::size_t>(r)].assign(h.begin(), h.end());
                return go;
              },
              collective_options{20s}, collective_options{20s});
        });
        for (int r = 0; r < ranks; ++r) {
          const auto ru = static_cast<std::size_t>(r);
          EXPECT_EQ(proceeded[ru], go ? 1 : 0) << where << ": rank " << r;
          expect_sum(header[ru], want_header[ru], 0, header_size, where + ", rank " + std::to_string(r) + "'s header");
          expect_sum(seen[ru], want_header[ru], 0, header_size, where + ", what rank " + std::to_string(r) + "'s proceed saw");
          if (HasFatalFailure()) return;
          if (!go) {
            for (std::size_t i = 0; i < size; ++i)
              if (got[ru][i] != -1.0f) FAIL() << where << ": rank " << r << " changed the output at " << i << " without proceeding";
            continue;
          }
          if (!backend().rank_order_sums) continue;  // NCCL: its own order (the tree is checked elsewhere)
          for (std::size_t i = 0; i < size; ++i)
            if (std::memcmp(&got[ru][i], &want[i], sizeof(float)) != 0)
              FAIL() << where << ": rank " << r << ", first bad index " << i << ": got " << got[ru][i] << ", want " << want[i];
        }
      }
    }
}

TEST_P(AllReduceTree, ConsecutiveStepsStayInStep) {
  if (!backend().host_tree)
    GTEST_SKIP() << backend().name << " moves the tree's parts in device memory only (tests/gpu_test runs it on the GPU)";
  REQUIRE_RANKS(2);
  const summation_tree tree(2);
  const std::size_t size = 4099;
  const auto values = testing::slice_values(2, size, 5);
  const std::vector<float> want = testing::one_device_sum(tree, values, size);
  buffers got(2, std::vector<float>(size));
  std::vector<float> last_samples(2);
  run_ranks(backend().make(2), [&](int r, collective& c) {
    for (int step = 0; step < 20; ++step) {
      auto mine = testing::contribute(tree, values, {static_cast<std::size_t>(r)});
      std::vector<tree_part> parts;
      for (auto& [node, v] : mine) parts.push_back({node, v});
      std::vector<float> header(11, static_cast<float>(step));
      if (step == 5 && r == 1) std::this_thread::sleep_for(30ms);  // the other rank's wait looks up the connection
      // Every third step is skipped, as a non-finite one is.
      c.all_reduce_tree(2, parts, got[static_cast<std::size_t>(r)], header,
                        [&](std::span<const float>) { return step % 3 != 0; }, {}, {});
      last_samples[static_cast<std::size_t>(r)] = header[0];
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(last_samples[static_cast<std::size_t>(r)], 38.0f) << "rank " << r;
    expect_sum(got[static_cast<std::size_t>(r)], want, 0, size, "rank " + std::to_string(r));
  }
}

// See Note [Parts sent with the header] (gloo, two ranks over TCP): calls
// that grow, shrink, skip and finally disagree on one group; every result is
// the one-device tree, and the disagreement fails cleanly on every rank.
TEST_P(AllReduceTree, SizesThatGrowShrinkOrDisagreeKeepTheBytesAndFailCleanly) {
  if (!backend().host_tree)
    GTEST_SKIP() << backend().name << " moves the tree's parts in device memory only (tests/gpu_test runs it on the GPU)";
  REQUIRE_RANKS(2);
  const std::vector<std::size_t> sizes = {100, 100, 300, 50, 50, 300, 7};
  std::vector<std::vector<float>> want;
  std::vector<std::vector<std::vector<float>>> values;
  const summation_tree tree(2);
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    values.push_back(testing::slice_values(2, sizes[k], 40 + k));
    want.push_back(testing::one_device_sum(tree, values.back(), sizes[k]));
  }
  // The disagreement below the largest size agreed (300), where parts go
  // early, and above it, where a part sent early would not fit.
  for (const auto& [size0, size1] : {std::pair<std::size_t, std::size_t>{80, 90}, {400, 350}}) {
    const std::string where = "then " + std::to_string(size0) + " against " + std::to_string(size1) + " floats";
    std::vector<int> codes(2, -1);
    std::vector<std::string> wrong(2);
    run_ranks(backend().make(2), [&](int r, collective& c) {
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        auto mine = testing::contribute(tree, values[k], {static_cast<std::size_t>(r)});
        std::vector<tree_part> parts;
        for (auto& [node, v] : mine) parts.push_back({node, v});
        std::vector<float> out(sizes[k], -1.0f), header(11, 1.0f);
        c.all_reduce_tree(2, parts, out, header, [&](std::span<const float>) { return k != 4; },
                          collective_options{20s}, collective_options{20s});
        if (k == 4) continue;
        if (std::memcmp(out.data(), want[k].data(), sizes[k] * sizeof(float)) != 0 && wrong[static_cast<std::size_t>(r)].empty())
          wrong[static_cast<std::size_t>(r)] = "call " + std::to_string(k) + " of " + std::to_string(sizes[k]) + " floats";
      }
      if (!backend().detects_mismatch) return;
      std::vector<float> v(r == 0 ? size0 : size1, 1.0f), out(v.size()), header(11, 1.0f);
      const tree_part part{tree.leaf(static_cast<std::size_t>(r)), v};
      try {
        c.all_reduce_tree(2, {&part, 1}, out, header, [](std::span<const float>) { return true; },
                          collective_options{10s}, collective_options{10s});
      } catch (const collective_error& e) {
        codes[static_cast<std::size_t>(r)] = static_cast<int>(e.code());
      }
    });
    for (int r = 0; r < 2; ++r) EXPECT_EQ(wrong[static_cast<std::size_t>(r)], "") << where << ": rank " << r;
    if (!backend().detects_mismatch) return;
    for (int r = 0; r < 2; ++r) EXPECT_NE(codes[static_cast<std::size_t>(r)], -1) << where << ": rank " << r << " did not fail";
    if (backend().names_mismatch)
      EXPECT_TRUE(codes[0] == static_cast<int>(collective_errc::mismatch) ||
                  codes[1] == static_cast<int>(collective_errc::mismatch))
          << where;
  }
}

// Fast mode's one call a step (Note [One call a step]): the header, then
// the data, each summed as all_reduce_sum sums it; nothing of the data
// changes where the step does not proceed. On one group, calls that grow,
// shrink and finally disagree (two ranks over TCP send the data with the
// header once a size is agreed: Note [Parts sent with the header]).
TEST_P(AllReduceWithHeader, SumsTheHeaderAndTheDataAsAllReduceSumDoes) {
  REQUIRE_RANKS(1);
  const std::vector<std::size_t> sizes = {1037, 1037, 70001, 500, 500, 70001};
  for (int ranks = 1; ranks <= ranks_up_to(4); ++ranks) {
    const auto rs = static_cast<std::size_t>(ranks);
    // Inputs and the reference: all_reduce_sum of the same buffers.
    std::vector<buffers> in(sizes.size(), buffers(rs)), want(sizes.size(), buffers(rs));
    buffers header_in(rs, std::vector<float>(5 + 3 * rs)), header_want;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      for (std::size_t r = 0; r < rs; ++r) {
        in[k][r].resize(sizes[k]);
        for (std::size_t i = 0; i < sizes[k]; ++i) in[k][r][i] = 0.1f * static_cast<float>((i * 7 + r * 13 + k) % 101) - 3.3f;
      }
    for (std::size_t r = 0; r < rs; ++r)
      for (std::size_t i = 0; i < header_in[r].size(); ++i) header_in[r][i] = 0.37f * static_cast<float>(i + 1) + 0.11f * static_cast<float>(r);
    header_want = header_in;
    want = in;
    run_ranks(backend().make(ranks), [&](int r, collective& c) {
      const auto ru = static_cast<std::size_t>(r);
      c.all_reduce_sum(header_want[ru], {});
      for (std::size_t k = 0; k < sizes.size(); ++k) c.all_reduce_sum(want[k][ru], {});
    });
    std::vector<std::string> wrong(rs);
    std::vector<int> failed(rs, -1);
    run_ranks(backend().make(ranks), [&](int r, collective& c) {
      const auto ru = static_cast<std::size_t>(r);
      const auto note = [&](const std::string& what) {
        if (wrong[ru].empty()) wrong[ru] = what;
      };
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        std::vector<float> data = in[k][ru], header = header_in[ru];
        const bool go = k != 4;
        // A late rank: the others' waits look up the connection meanwhile
        // (Note [Gloo waits look up every health_slice]) while the data sent
        // with the header is under way.
        if (k == 1 && r == ranks - 1) std::this_thread::sleep_for(30ms);
        const bool proceeded = c.all_reduce_with_header(data, header, [&](std::span<const float>) { return go; },
                                                        collective_options{20s}, collective_options{20s});
        if (proceeded != go) note("call " + std::to_string(k) + " proceeded " + std::to_string(proceeded));
        if (std::memcmp(header.data(), header_want[ru].data(), header.size() * sizeof(float)) != 0 && backend().rank_order_sums)
          note("call " + std::to_string(k) + ": the header is not all_reduce_sum's");
        const auto& expect = go ? want[k][ru] : in[k][ru];
        if (backend().rank_order_sums && std::memcmp(data.data(), expect.data(), data.size() * sizeof(float)) != 0)
          note("call " + std::to_string(k) + " of " + std::to_string(sizes[k]) + " floats: the data is not " +
               (go ? "all_reduce_sum's" : "left as it was"));
      }
      if (ranks != 2 || !backend().detects_mismatch) return;
      // The ranks disagree, rank 1 above the largest size agreed.
      std::vector<float> data(r == 0 ? 600 : 80000, 1.0f), header = header_in[ru];
      try {
        c.all_reduce_with_header(data, header, [](std::span<const float>) { return true; }, collective_options{10s},
                                 collective_options{10s});
      } catch (const collective_error& e) {
        failed[ru] = static_cast<int>(e.code());
      }
    });
    for (std::size_t r = 0; r < rs; ++r) EXPECT_EQ(wrong[r], "") << ranks << " ranks, rank " << r;
    if (ranks == 2 && backend().detects_mismatch)
      for (std::size_t r = 0; r < rs; ++r) EXPECT_NE(failed[r], -1) << "rank " << r << " did not fail on the disagreement";
    if (HasFailure()) return;
  }
}

TEST_P(Barrier, HoldsUntilEveryRankArrives) {
  REQUIRE_RANKS(3);
  std::atomic<bool> last_arrived{false};
  run_ranks(backend().make(3), [&](int r, collective& c) {
    c.barrier({});  // every rank has connected
    if (r == 2) {
      std::this_thread::sleep_for(50ms);
      last_arrived = true;
    }
    c.barrier({});
    EXPECT_TRUE(last_arrived) << "rank " << r << " passed the barrier before rank 2 arrived";
  });
}

// The int8 codec's exchange (Note [Int8 pseudo-gradients]): values whose
// partial sums stay within int8, any sign; every rank ends with the exact sum,
// and a rank in a float all-reduce of as many values is a mismatch.
TEST_P(AllReduceInt8, SumsExactlyOnEveryRankWhateverTheRanks) {
  REQUIRE_RANKS(1);
  for (int ranks = 1; ranks <= ranks_up_to(5); ++ranks)
    for (const std::size_t size : {std::size_t{1}, std::size_t{13}, std::size_t{4099}}) {
      std::vector<std::vector<std::int8_t>> in(static_cast<std::size_t>(ranks), std::vector<std::int8_t>(size));
      std::vector<int> want(size, 0);
      for (int r = 0; r < ranks; ++r)
        for (std::size_t i = 0; i < size; ++i) {
          // |value| <= 127 / ranks: every partial sum fits.
          const int limit = 127 / ranks;
          const int v = static_cast<int>((i * 37 + static_cast<std::size_t>(r) * 11) % static_cast<std::size_t>(2 * limit + 1)) - limit;
          in[static_cast<std::size_t>(r)][i] = static_cast<std::int8_t>(v);
          want[i] += v;
        }
      run_ranks(backend().make(ranks), [&](int r, collective& c) {
        c.all_reduce_sum_int8(in[static_cast<std::size_t>(r)], collective_options{20s});
      });
      for (int r = 0; r < ranks; ++r)
        for (std::size_t i = 0; i < size; ++i)
          if (in[static_cast<std::size_t>(r)][i] != want[i])
            FAIL() << backend().name << ", " << ranks << " ranks, " << size << " values, rank " << r
                   << ": first bad index " << i << ": got " << int{in[static_cast<std::size_t>(r)][i]} << ", want "
                   << want[i];
    }
}

TEST_P(AllReduceInt8, ARankInAFloatAllReduceIsAMismatch) {
  if (!backend().detects_mismatch) GTEST_SKIP() << backend().name << " cannot tell ranks called with different calls";
  if (backend().name != "local" && backend().name.rfind("gloo", 0) != 0)
    GTEST_SKIP() << backend().name << " widens int8 to a float all-reduce";
  REQUIRE_RANKS(2);
  std::vector<int> failed(2, 0);
  run_ranks(backend().make(2), [&](int r, collective& c) {
    std::vector<float> f(16, 1.0f);
    std::vector<std::int8_t> q(16, 1);
    try {
      if (r == 0) c.all_reduce_sum(f, collective_options{10s});
      else c.all_reduce_sum_int8(q, collective_options{10s});
    } catch (const collective_error&) {
      failed[static_cast<std::size_t>(r)] = 1;
    }
  });
  EXPECT_EQ(failed, (std::vector<int>{1, 1}));
}

// The bf16 codec's exchange (Note [Bf16 pseudo-gradients]): leaves held in
// bf16 by any ranks reduce to the one device's tree sum of their widened
// values, bitwise; the gather copies every rank's chunk.
TEST_P(Bf16, TheTreeOfBf16LeavesIsTheOneDeviceSumOfTheirFloatsAndTheGatherCopiesEveryChunk) {
  if (!backend().host_tree)
    GTEST_SKIP() << backend().name << " moves the tree's parts in device memory only (and GPU replicas refuse bf16)";
  REQUIRE_RANKS(1);
  std::mt19937_64 gen(5);
  for (int round = 0; round < 12; ++round) {
    const int ranks = std::uniform_int_distribution<int>(1, ranks_up_to(4))(gen);
    const std::size_t slices = std::uniform_int_distribution<std::size_t>(1, 9)(gen);
    const std::size_t size = std::uniform_int_distribution<std::size_t>(1, 2000)(gen);
    const std::string where = "round " + std::to_string(round) + ", " + std::to_string(ranks) + " ranks, " +
                              std::to_string(slices) + " slices, " + std::to_string(size) + " values";
    // Leaves: values already bf16, as floats and as their upper halves.
    auto values = testing::slice_values(slices, size, gen());
    std::vector<std::vector<std::uint16_t>> halves(slices, std::vector<std::uint16_t>(size));
    for (std::size_t k = 0; k < slices; ++k)
      for (std::size_t i = 0; i < size; ++i) {
        std::uint32_t u;
        std::memcpy(&u, &values[k][i], 4);
        halves[k][i] = static_cast<std::uint16_t>(u >> 16);
        u &= 0xffff0000u;
        std::memcpy(&values[k][i], &u, 4);
      }
    const summation_tree tree(slices);
    const std::vector<float> want = testing::one_device_sum(tree, values, size);
    std::vector<std::vector<std::size_t>> owned(static_cast<std::size_t>(ranks));
    for (std::size_t k = 0; k < slices; ++k) owned[std::uniform_int_distribution<std::size_t>(0, owned.size() - 1)(gen)].push_back(k);
    std::vector<std::vector<float>> got(static_cast<std::size_t>(ranks), std::vector<float>(size));
    std::vector<std::vector<std::uint16_t>> gathered(static_cast<std::size_t>(ranks), std::vector<std::uint16_t>(size));
    std::vector<std::pair<std::size_t, std::size_t>> chunks(static_cast<std::size_t>(ranks));
    run_ranks(backend().make(ranks), [&](int r, collective& c) {
      std::vector<tree_part_bf16> parts;
      for (const std::size_t k : owned[static_cast<std::size_t>(r)]) parts.push_back({tree.leaf(k), halves[k]});
      c.reduce_scatter_tree_bf16(slices, parts, got[static_cast<std::size_t>(r)], collective_options{20s});
      chunks[static_cast<std::size_t>(r)] = ranks > 1 ? c.chunk(size, r) : std::pair<std::size_t, std::size_t>{0, size};
      auto& mine = gathered[static_cast<std::size_t>(r)];
      for (std::size_t i = chunks[static_cast<std::size_t>(r)].first; i < chunks[static_cast<std::size_t>(r)].second; ++i)
        mine[i] = static_cast<std::uint16_t>(i * 7 + static_cast<std::size_t>(r));
      c.all_gather_bf16(mine, collective_options{20s});
    });
    for (int r = 0; r < ranks; ++r) {
      const auto [b, e] = chunks[static_cast<std::size_t>(r)];
      for (std::size_t i = b; i < e; ++i)
        if (std::memcmp(&got[static_cast<std::size_t>(r)][i], &want[i], sizeof(float)) != 0)
          FAIL() << where << ": rank " << r << ", first bad index " << i << ": got " << got[static_cast<std::size_t>(r)][i]
                 << ", want " << want[i];
    }
    for (int r = 0; r < ranks; ++r)
      for (int owner = 0; owner < ranks; ++owner) {
        const auto [b, e] = chunks[static_cast<std::size_t>(owner)];
        for (std::size_t i = b; i < e; ++i)
          if (gathered[static_cast<std::size_t>(r)][i] != static_cast<std::uint16_t>(i * 7 + static_cast<std::size_t>(owner)))
            FAIL() << where << ": rank " << r << " holds a wrong value at " << i << " of rank " << owner << "'s chunk";
      }
  }
}

TEST_P(Mismatch, DifferentSizesFailOnEveryRankBeforeAnyPayload) {
  if (!backend().detects_mismatch) GTEST_SKIP() << backend().name << " cannot tell ranks called with different sizes";
  REQUIRE_RANKS(3);
  std::vector<int> codes(3, -1);
  run_ranks(backend().make(3), [&](int r, collective& c) {
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
  if (backend().names_mismatch) {
    EXPECT_GE(mismatches, 1);
  }
}

TEST_P(Abort, AGroupAbortedFromOutsideWakesEveryWaitingRank) {
  REQUIRE_RANKS(4);
  const collective_world w = backend().make(4);
  std::vector<int> codes;
  // Rank 0's process aborts its group; where ranks hold groups of their
  // own, ranks 1 and 2 learn it from their peers.
  const double slowest = testing::slowest_wake_ms(w, true, [&] { w.group_of(0).abort(); }, codes);
  std::printf("[ measured ] %s: the slowest waiting rank woke %.2f ms after the abort\n", backend().name.c_str(),
              slowest);
  // The abort woke them, not their calls' timeout: the error says so, and
  // they woke long before it.
  for (std::size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], static_cast<int>(collective_errc::aborted)) << "rank " << r;
  const double third_of_the_timeout_ms =
      std::chrono::duration<double, std::milli>(testing::abort_test_call_timeout).count() / 3;
  EXPECT_LT(slowest, third_of_the_timeout_ms);
  EXPECT_TRUE(w.group_of(0).aborted());
  std::vector<float> v(4);
  EXPECT_THROW(w.endpoint(0)->all_reduce_sum(v, {}), collective_error) << "later calls fail fast too";
}

TEST_P(Timeout, ACallThatAPeerNeverJoinsTimesOutAndBreaksTheGroup) {
  REQUIRE_RANKS(2);
  std::vector<int> codes(2, -1);
  run_ranks(backend().make(2), [&](int r, collective& c) {
    c.barrier({});
    std::vector<float> v(8);
    if (r == 1) {
      // Rank 1 joins nothing more until rank 0 has given up.
      try {
        std::this_thread::sleep_for(400ms);
        c.all_reduce_sum(v, collective_options{5s});
      } catch (const collective_error& e) {
        codes[1] = static_cast<int>(e.code());
      }
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      c.all_reduce_sum(v, collective_options{100ms});
    } catch (const collective_error& e) {
      codes[0] = static_cast<int>(e.code());
    }
    EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
  });
  EXPECT_EQ(codes[0], static_cast<int>(collective_errc::timeout));
  EXPECT_EQ(codes[1], static_cast<int>(collective_errc::aborted)) << "the peer of a timed-out rank must fail, not hang";
}

}  // namespace
}  // namespace dpactor
