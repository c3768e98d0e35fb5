// Note [NCCL's unique id through the store], without NCCL: generation rank 0
// makes the id and every other rank reads the same bytes; a waiting rank sees
// an abort long before its deadline and gives up at its deadline.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "comms/collective.hpp"
#include "comms/nccl_rendezvous.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
constexpr std::size_t id_bytes = 128;  // sizeof(ncclUniqueId)

std::vector<char> some_id(char seed) {
  std::vector<char> id(id_bytes);
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(seed + static_cast<char>(i * 7));
  return id;
}

TEST(NcclRendezvous, EveryRankGetsTheIdRankZeroMade) {
  for (const int ranks : {1, 2, 5}) {
    auto store = make_memory_store();
    std::atomic<int> made{0};
    const std::atomic<bool> aborted{false};
    std::vector<std::vector<char>> got(static_cast<std::size_t>(ranks));
    std::vector<std::thread> threads;
    // The others start first: they wait for rank 0.
    for (int r = ranks - 1; r >= 0; --r)
      threads.emplace_back([&, r] {
        got[static_cast<std::size_t>(r)] = share_unique_id(*store, "g3", r, id_bytes, [&] {
          ++made;
          return some_id(static_cast<char>(r + 1));
        }, aborted, clock_type::now() + 10s);
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(made, 1) << ranks << " ranks: only rank 0 makes an id";
    for (int r = 0; r < ranks; ++r) EXPECT_EQ(got[static_cast<std::size_t>(r)], some_id(1)) << "rank " << r;
  }
}

// The abort, not the 60 s deadline, ends the wait: the error says aborted
// (the deadline says timeout), and it comes long before the deadline.
TEST(NcclRendezvous, AWaitingRankSeesAnAbortLongBeforeItsDeadline) {
  auto store = make_memory_store();
  std::atomic<bool> aborted{false};
  clock_type::time_point set_at;
  std::thread aborter([&] {
    std::this_thread::sleep_for(200ms);
    set_at = clock_type::now();
    aborted = true;
  });
  try {
    share_unique_id(*store, "g1", 1, id_bytes, [] { return some_id(0); }, aborted, clock_type::now() + 60s);
    ADD_FAILURE() << "no id was published, yet the wait ended without an error";
  } catch (const collective_error& e) {
    EXPECT_EQ(e.code(), collective_errc::aborted) << e.what();
  }
  const auto woke = clock_type::now();
  aborter.join();
  std::printf("[ measured ] the wait ended %.2f ms after the abort\n",
              std::chrono::duration<double, std::milli>(woke - set_at).count());
  EXPECT_LT(woke - set_at, 20s) << "a third of the deadline";
}

TEST(NcclRendezvous, AWaitingRankGivesUpAtItsDeadline) {
  auto store = make_memory_store();
  const std::atomic<bool> aborted{false};
  const auto start = clock_type::now();
  try {
    share_unique_id(*store, "g1", 2, id_bytes, [] { return some_id(0); }, aborted, start + 300ms);
    ADD_FAILURE() << "no timeout";
  } catch (const collective_error& e) {
    EXPECT_EQ(e.code(), collective_errc::timeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("g1/nccl_id"), std::string::npos) << e.what();
  }
  const auto waited = clock_type::now() - start;
  std::printf("[ measured ] a 300 ms deadline ended the wait after %.1f ms\n",
              std::chrono::duration<double, std::milli>(waited).count());
  EXPECT_GE(waited, 300ms);
  EXPECT_LT(waited, 10s) << "the wait outlived its deadline many times over";
}

TEST(NcclRendezvous, AnIdOfTheWrongSizeIsAMismatch) {
  auto store = make_memory_store();
  const std::atomic<bool> aborted{false};
  store->set("g1/nccl_id", std::vector<char>(12, 'x'));
  try {
    share_unique_id(*store, "g1", 1, id_bytes, [] { return some_id(0); }, aborted, clock_type::now() + 5s);
    ADD_FAILURE() << "a 12-byte id was taken";
  } catch (const collective_error& e) {
    EXPECT_EQ(e.code(), collective_errc::mismatch) << e.what();
  }
}

}  // namespace
}  // namespace dpactor
