// The local collective, N ranks as threads of this process. Inputs are
// chosen so the expected sums are exact in fp32; every rank must hold bitwise
// the same result.

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <cmath>
#include <thread>
#include <span>
#include <vector>

#include "comms/local.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;

// Runs fn(rank, endpoint) on n threads and joins them.
template <class Fn>
void run_ranks(collective_group& group, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r)
    threads.emplace_back([&group, &fn, r] { fn(r, *group.endpoint(r)); });
  for (auto& t : threads) t.join();
}

class AllReduce : public ::testing::TestWithParam<std::tuple<int, std::size_t>> {};

TEST_P(AllReduce, SumsExactlyAndIdenticallyOnEveryRank) {
  const auto [ranks, size] = GetParam();
  auto group = make_local_group(ranks);
  std::vector<std::vector<float>> buffers(static_cast<std::size_t>(ranks), std::vector<float>(size));
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < size; ++i) buffers[static_cast<std::size_t>(r)][i] = static_cast<float>(r) + static_cast<float>(i % 7);
  run_ranks(*group, [&](int r, collective& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), ranks);
    c.all_reduce_sum(buffers[static_cast<std::size_t>(r)], collective_options{5s});
  });
  for (int r = 0; r < ranks; ++r) {
    const auto& b = buffers[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < size; ++i) {
      // rank r sends r + (i mod 7): the sum is n(n-1)/2 + n (i mod 7)
      const float want = static_cast<float>(ranks * (ranks - 1) / 2 + ranks * static_cast<int>(i % 7));
      if (b[i] != want) {
        FAIL() << "rank " << r << ", first bad index " << i << ": got " << b[i] << ", want " << want;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RanksBySizes, AllReduce,
                         ::testing::Combine(::testing::Range(1, 9),
                                            ::testing::Values(std::size_t{0}, std::size_t{1}, std::size_t{7},
                                                              std::size_t{4096}, std::size_t{1} << 20)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" + std::to_string(std::get<1>(info.param));
                         });

TEST(AllReduce, IsBitwiseIdenticalForInexactSums) {
  // Random values whose sum rounds: every rank must still agree bit for bit.
  const int ranks = 5;
  const std::size_t size = 10007;
  auto group = make_local_group(ranks);
  std::vector<std::vector<float>> buffers(ranks, std::vector<float>(size));
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < size; ++i) buffers[r][i] = std::sin(static_cast<float>(i * 31 + r * 7)) * 1e3f / (1 + r);
  run_ranks(*group, [&](int r, collective& c) { c.all_reduce_sum(buffers[r], {}); });
  for (int r = 1; r < ranks; ++r) EXPECT_EQ(std::memcmp(buffers[0].data(), buffers[r].data(), size * 4), 0) << "rank " << r;
}

TEST(AllReduce, ManyConsecutiveCallsStayInStep) {
  const int ranks = 3;
  auto group = make_local_group(ranks);
  run_ranks(*group, [&](int r, collective& c) {
    std::vector<float> v(33);
    for (int iter = 0; iter < 2000; ++iter) {
      std::fill(v.begin(), v.end(), static_cast<float>(r + iter));
      c.all_reduce_sum(v, {});
      ASSERT_EQ(v[32], static_cast<float>(3 + 3 * iter)) << "iteration " << iter;
    }
  });
}

TEST(Broadcast, CopiesTheRootsBufferToEveryRank) {
  for (int ranks : {1, 2, 5}) {
    for (int root = 0; root < ranks; ++root) {
      auto group = make_local_group(ranks);
      std::vector<std::vector<float>> buffers(ranks, std::vector<float>(1001));
      for (int r = 0; r < ranks; ++r)
        for (std::size_t i = 0; i < 1001; ++i) buffers[r][i] = static_cast<float>(r * 10000 + static_cast<int>(i));
      run_ranks(*group, [&](int r, collective& c) { c.broadcast(buffers[r], root, {}); });
      for (int r = 0; r < ranks; ++r) EXPECT_EQ(buffers[r], buffers[root]) << ranks << " ranks, root " << root;
    }
  }
}

// ---- chunks, reduce-scatter and all-gather against plain references ----

TEST(Chunk, PartsTileTheBufferInRankOrder) {
  for (int ranks = 1; ranks <= 5; ++ranks) {
    auto c = make_local_group(ranks)->endpoint(0);
    for (const std::size_t size : {0, 1, 7, 16, 17, 100, 1000}) {
      std::size_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        const auto [begin, end] = c->chunk(size, r);
        EXPECT_EQ(begin, next) << ranks << " ranks, size " << size << ", rank " << r << ": parts must be contiguous";
        EXPECT_LE(begin, end);
        if (end < size) EXPECT_EQ(end % 16, 0u) << "parts end on cache lines (16 floats)";
        next = end;
      }
      EXPECT_EQ(next, size) << ranks << " ranks, size " << size << ": parts must cover the buffer";
    }
  }
  // Past the end, a rank's part is empty: 17 floats on 4 ranks are 16 + 1 + 0 + 0.
  auto c = make_local_group(4)->endpoint(0);
  EXPECT_EQ(c->chunk(17, 2), (std::pair<std::size_t, std::size_t>{17, 17}));
}

TEST(ReduceScatter, EachRanksPartIsTheRankOrderSum) {
  for (int ranks = 1; ranks <= 5; ++ranks)
    for (const std::size_t size : {0, 1, 7, 33, 1000, 4099}) {
      auto group = make_local_group(ranks);
      std::vector<std::vector<float>> in(static_cast<std::size_t>(ranks), std::vector<float>(size));
      for (int r = 0; r < ranks; ++r)
        for (std::size_t i = 0; i < size; ++i)
          in[static_cast<std::size_t>(r)][i] = std::sin(static_cast<float>(i * 13 + r * 101)) * static_cast<float>(1 + r * 1000);
      std::vector<float> want = in[0];  // the reference: rank 0 + rank 1 + ... in order
      for (int r = 1; r < ranks; ++r)
        for (std::size_t i = 0; i < size; ++i) want[i] += in[static_cast<std::size_t>(r)][i];
      auto out = in;
      run_ranks(*group, [&](int r, collective& c) { c.reduce_scatter_sum(out[static_cast<std::size_t>(r)], {}); });
      auto c = group->endpoint(0);
      for (int r = 0; r < ranks; ++r) {
        const auto [begin, end] = c->chunk(size, r);
        for (std::size_t i = begin; i < end; ++i)
          if (out[static_cast<std::size_t>(r)][i] != want[i])
            FAIL() << ranks << " ranks, size " << size << ", rank " << r << ", first bad index " << i << ": got "
                   << out[static_cast<std::size_t>(r)][i] << ", want " << want[i];
      }
    }
}

TEST(AllGather, EveryRankEndsWithEveryRanksParts) {
  for (int ranks = 1; ranks <= 5; ++ranks)
    for (const std::size_t size : {0, 1, 7, 33, 1000}) {
      auto group = make_local_group(ranks);
      // Two buffers a rank, the second one longer; rank r writes r + 1 (and
      // -(r + 1)) into its own part of each, zero elsewhere.
      std::vector<std::vector<float>> a(static_cast<std::size_t>(ranks), std::vector<float>(size, 0.0f));
      std::vector<std::vector<float>> b(static_cast<std::size_t>(ranks), std::vector<float>(size + 5, 0.0f));
      auto c = group->endpoint(0);
      for (int r = 0; r < ranks; ++r) {
        const auto [ab, ae] = c->chunk(size, r);
        for (std::size_t i = ab; i < ae; ++i) a[static_cast<std::size_t>(r)][i] = static_cast<float>(r + 1);
        const auto [bb, be] = c->chunk(size + 5, r);
        for (std::size_t i = bb; i < be; ++i) b[static_cast<std::size_t>(r)][i] = -static_cast<float>(r + 1);
      }
      run_ranks(*group, [&](int r, collective& rc) {
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

TEST(Abort, WakesEveryWaitingRankWithin100ms) {
  const int ranks = 4;
  auto group = make_local_group(ranks);
  std::vector<double> woke_after_ms(ranks - 1, -1.0);
  std::vector<char> aborted(ranks - 1, 0);  // one byte per thread (vector<bool> packs them into one word: a data race)
  std::atomic<int> waiting{0};
  std::chrono::steady_clock::time_point abort_time;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks - 1; ++r) {  // the last rank never arrives
    threads.emplace_back([&, r] {
      auto c = group->endpoint(r);
      std::vector<float> v(100, 1.0f);
      ++waiting;
      try {
        c->all_reduce_sum(v, collective_options{60s});
      } catch (const collective_error& e) {
        aborted[r] = e.code() == collective_errc::aborted;
      }
      woke_after_ms[r] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - abort_time).count();
    });
  }
  while (waiting < ranks - 1) std::this_thread::yield();
  std::this_thread::sleep_for(20ms);  // let them get past spinning into the sleep phase
  abort_time = std::chrono::steady_clock::now();
  group->abort();
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks - 1; ++r) {
    EXPECT_TRUE(aborted[r]) << "rank " << r;
    EXPECT_LT(woke_after_ms[r], 100.0) << "rank " << r;
  }
  // Later calls fail fast too.
  std::vector<float> v(4);
  EXPECT_THROW(group->endpoint(0)->all_reduce_sum(v, {}), collective_error);
  EXPECT_TRUE(group->aborted());
}

TEST(Timeout, FiresAndBreaksTheGroup) {
  auto group = make_local_group(2);
  auto c = group->endpoint(0);
  std::vector<float> v(8);
  const auto start = std::chrono::steady_clock::now();
  try {
    c->all_reduce_sum(v, collective_options{50ms});
    FAIL() << "no timeout";
  } catch (const collective_error& e) {
    EXPECT_EQ(e.code(), collective_errc::timeout) << e.what();
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, 50ms);
  EXPECT_LT(waited, 2s);
  // The peer arriving late learns that the group is broken.
  try {
    group->endpoint(1)->all_reduce_sum(v, {});
    FAIL() << "a broken group accepted a call";
  } catch (const collective_error& e) {
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
  }
}

TEST(Mismatch, DifferentSizesFailOnEveryRank) {
  auto group = make_local_group(2);
  std::atomic<int> failures{0};
  run_ranks(*group, [&](int r, collective& c) {
    std::vector<float> v(r == 0 ? 10 : 11);
    try {
      c.all_reduce_sum(v, {});
    } catch (const collective_error&) {
      ++failures;
    }
  });
  EXPECT_EQ(failures, 2);
}

TEST(Barrier, HoldsUntilEveryRankArrives) {
  const int ranks = 3;
  auto group = make_local_group(ranks);
  std::atomic<int> arrived{0};
  run_ranks(*group, [&](int, collective& c) {
    ++arrived;
    c.barrier({});
    EXPECT_EQ(arrived.load(), ranks);
  });
}

}  // namespace
}  // namespace dpactor
