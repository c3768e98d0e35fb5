// The summation tree (Note [Summation tree]): whoever computed which slices,
// in whatever order, the sum is bitwise the one a single device computes
// from all slices; ranks that disagree on the tree fail. That every backend
// finishes the tree the same way is in tests/collective_conformance_test.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "comms/local.hpp"
#include "comms/summation_tree.hpp"
#include "tests/summation_slices.hpp"

namespace dpactor {
namespace {

using testing::contribute;
using testing::finish;
using testing::slice_values;
using testing::tree_values;

TEST(SummationTree, NodesCoverTheirSlices) {
  const summation_tree t(5);  // 8 leaves, 5 present
  EXPECT_EQ(t.range(1), (std::pair<std::size_t, std::size_t>{0, 5}));
  EXPECT_EQ(t.range(2), (std::pair<std::size_t, std::size_t>{0, 4}));
  EXPECT_EQ(t.range(3), (std::pair<std::size_t, std::size_t>{4, 5}));
  EXPECT_EQ(t.range(t.leaf(4)), (std::pair<std::size_t, std::size_t>{4, 5}));
  EXPECT_FALSE(t.present(7)) << "slices 6 and 7 do not exist";
  const std::vector<std::uint8_t> owned{1, 1, 0, 1, 1};
  EXPECT_EQ(t.cover(owned), (std::vector<std::uint32_t>{4, 11, 3})) << "slices 0-1, slice 3, slices 4-7 (only 4 present)";
}

TEST(SummationTree, TheOrderOfAdditionMattersForTheseValues) {
  // Otherwise the tests below could not tell orders apart.
  const auto values = slice_values(9, 256, 1);
  const summation_tree t(9);
  const auto tree_sum = testing::one_device_sum(t, values, 256);
  std::vector<float> sequential(256, 0.0f);
  for (const auto& s : values) add_into(sequential.data(), s.data(), 256);
  EXPECT_NE(std::memcmp(tree_sum.data(), sequential.data(), 256 * sizeof(float)), 0);
}

TEST(SummationTree, AnyOwnershipAndOrderGivesTheBytesOfOneDevice) {
  std::mt19937_64 gen(11);
  for (int round = 0; round < 300; ++round) {
    const std::size_t slices = std::uniform_int_distribution<std::size_t>(1, 40)(gen);
    const std::size_t n = 97;
    const auto values = slice_values(slices, n, gen());
    const summation_tree tree(slices);
    const std::vector<float> want = testing::one_device_sum(tree, values, n);
    // Members own random sets (contiguous runs or scattered), computed in random order.
    const int members = std::uniform_int_distribution<int>(1, 6)(gen);
    std::vector<std::vector<std::size_t>> owned(static_cast<std::size_t>(members));
    const bool contiguous = round % 2 == 0;
    for (std::size_t s = 0; s < slices; ++s) {
      const auto m = contiguous ? s * static_cast<std::size_t>(members) / slices
                                : std::uniform_int_distribution<std::size_t>(0, owned.size() - 1)(gen);
      owned[m].push_back(s);
    }
    std::vector<tree_values> parts;
    for (auto& mine : owned) {
      std::shuffle(mine.begin(), mine.end(), gen);
      for (auto& p : contribute(tree, values, mine)) parts.push_back(std::move(p));
    }
    std::shuffle(parts.begin(), parts.end(), gen);
    const std::vector<float> got = finish(tree, parts, n);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0)
        << "round " << round << ": " << slices << " slices over " << members << " members";
  }
}

TEST(SummationTree, APlanRefusesPartsThatDoNotCoverEverySliceOnce) {
  const summation_tree t(4);
  tree_plan plan;
  EXPECT_THROW(plan.build(t, std::vector<std::uint32_t>{2}), std::invalid_argument) << "slices 2 and 3 missing";
  EXPECT_THROW(plan.build(t, std::vector<std::uint32_t>{2, 3, t.leaf(0)}), std::invalid_argument) << "slice 0 twice";
  EXPECT_NO_THROW(plan.build(t, std::vector<std::uint32_t>{2, t.leaf(2), t.leaf(3)}));
}

// ---- through a collective ----
// Every backend finishes the tree as one device does:
// tests/collective_conformance_test (ReduceScatterTree.*).

TEST(ReduceScatterTree, RanksThatDisagreeOnTheSliceCountFail) {
  auto group = make_local_group(2);
  std::vector<std::thread> threads;
  int failures = 0;
  std::mutex m;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      const summation_tree tree(static_cast<std::size_t>(2 + r));
      std::vector<float> v(8, 1.0f), out(8);
      std::vector<tree_part> parts{{tree.leaf(static_cast<std::size_t>(r)), v}};
      try {
        group->endpoint(r)->reduce_scatter_tree(static_cast<std::size_t>(2 + r), parts, out, {});
      } catch (const collective_error& e) {
        std::lock_guard lock(m);
        ++failures;
        EXPECT_EQ(e.code(), collective_errc::mismatch);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 2);
}

}  // namespace
}  // namespace dpactor
