// What only the local backend does (comms/local.hpp), ranks as threads of one
// process. What every backend does, local included, is in
// tests/collective_conformance_test; the abort storms and the drain after an
// abort are in tests/collective_abort_test.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "comms/collective.hpp"
#include "comms/local.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;

// A rank alone in a call times out on its own (no rendezvous to wait in),
// and the peer that arrives later is told that a rank timed out.
TEST(LocalTimeout, ALoneRankTimesOutAndTheLatePeerIsToldARankTimedOut) {
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
  std::printf("[ measured ] a 50 ms call timed out after %.1f ms\n",
              std::chrono::duration<double, std::milli>(waited).count());
  EXPECT_GE(waited, 50ms);
  // Its own 50 ms, not the default timeout (ten minutes) nor a hang; the
  // bound is far from both, so a loaded machine does not trip it.
  EXPECT_LT(waited, default_collective_timeout / 60);
  // The peer arriving late learns that the group is broken.
  try {
    group->endpoint(1)->all_reduce_sum(v, {});
    FAIL() << "a broken group accepted a call";
  } catch (const collective_error& e) {
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dpactor
