// The summation tree (Note [Summation tree]): whoever computed which slices,
// in whatever order, the sum is bitwise the one a single device computes
// from all slices; and the collectives finish it the same way.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "comms/local.hpp"
#include "comms/summation_tree.hpp"
#include "tests/emulated_backend.hpp"

namespace dpactor {
namespace {

// Slice gradients whose sum rounds differently in different orders: values
// of very different magnitudes and signs.
std::vector<std::vector<float>> slice_values(std::size_t slices, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<std::vector<float>> v(slices, std::vector<float>(n));
  for (auto& s : v)
    for (float& x : s) x = std::ldexp(mantissa(gen), exponent(gen));
  return v;
}

// What a member holding `mine` (in the order it computed them) contributes.
std::vector<std::pair<std::uint32_t, std::vector<float>>> contribute(const summation_tree& tree,
                                                                     const std::vector<std::vector<float>>& values,
                                                                     const std::vector<std::size_t>& mine) {
  std::vector<std::vector<float>> storage;
  for (const auto s : mine) storage.push_back(values[s]);
  std::vector<std::span<float>> buffers(storage.begin(), storage.end());
  tree_builder b;
  b.reset(tree);
  std::vector<std::size_t> freed;
  for (std::size_t i = 0; i < mine.size(); ++i) b.add_leaf(mine[i], i, buffers, freed);
  std::vector<std::pair<std::uint32_t, std::vector<float>>> out;
  for (const auto& [node, buffer] : b.held()) out.emplace_back(node, storage[buffer]);
  return out;
}

std::vector<float> finish(const summation_tree& tree, const std::vector<std::pair<std::uint32_t, std::vector<float>>>& parts,
                          std::size_t n) {
  std::vector<std::uint32_t> nodes;
  std::vector<const float*> data;
  for (const auto& [node, values] : parts) {
    nodes.push_back(node);
    data.push_back(values.data());
  }
  tree_plan plan;
  plan.build(tree, nodes);
  std::vector<float> out(n);
  plan.run(data.data(), 0, n, out.data());
  return out;
}

// One device computing every slice, in order.
std::vector<float> reference(const summation_tree& tree, const std::vector<std::vector<float>>& values, std::size_t n) {
  std::vector<std::size_t> all(values.size());
  std::iota(all.begin(), all.end(), 0);
  const auto parts = contribute(tree, values, all);
  EXPECT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].first, summation_tree::root());
  return finish(tree, parts, n);
}

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
  const auto tree_sum = reference(t, values, 256);
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
    const std::vector<float> want = reference(tree, values, n);
    // Members own random sets (contiguous runs or scattered), computed in random order.
    const int members = std::uniform_int_distribution<int>(1, 6)(gen);
    std::vector<std::vector<std::size_t>> owned(static_cast<std::size_t>(members));
    const bool contiguous = round % 2 == 0;
    for (std::size_t s = 0; s < slices; ++s) {
      const auto m = contiguous ? s * static_cast<std::size_t>(members) / slices
                                : std::uniform_int_distribution<std::size_t>(0, owned.size() - 1)(gen);
      owned[m].push_back(s);
    }
    std::vector<std::pair<std::uint32_t, std::vector<float>>> parts;
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

// ---- through the collectives ----

using backend = std::function<std::shared_ptr<collective_group>(int)>;

void expect_collective_matches_one_device(const backend& make, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  for (int round = 0; round < 40; ++round) {
    const int ranks = std::uniform_int_distribution<int>(1, 5)(gen);
    const std::size_t slices = std::uniform_int_distribution<std::size_t>(1, 24)(gen);
    const std::size_t n = std::uniform_int_distribution<std::size_t>(0, 3000)(gen) | 1u;
    const auto values = slice_values(slices, n, gen());
    const summation_tree tree(slices);
    const std::vector<float> want = reference(tree, values, n);
    std::vector<std::vector<std::size_t>> owned(static_cast<std::size_t>(ranks));
    for (std::size_t s = 0; s < slices; ++s) owned[std::uniform_int_distribution<std::size_t>(0, owned.size() - 1)(gen)].push_back(s);
    auto group = make(ranks);
    std::vector<std::vector<float>> outs(static_cast<std::size_t>(ranks), std::vector<float>(n, -1.0f));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        auto mine = contribute(tree, values, owned[static_cast<std::size_t>(r)]);
        std::vector<tree_part> parts;
        for (auto& [node, v] : mine) parts.push_back({node, v});
        group->endpoint(r)->reduce_scatter_tree(slices, parts, outs[static_cast<std::size_t>(r)], {});
      });
    for (auto& t : threads) t.join();
    auto c = group->endpoint(0);
    for (int r = 0; r < ranks; ++r) {
      const auto [begin, end] = c->chunk(n, r);
      ASSERT_EQ(std::memcmp(outs[static_cast<std::size_t>(r)].data() + begin, want.data() + begin, (end - begin) * sizeof(float)), 0)
          << "round " << round << ", rank " << r << " of " << ranks << ", " << slices << " slices";
    }
  }
}

TEST(ReduceScatterTree, LocalRanksFinishTheTreeInPlace) {
  expect_collective_matches_one_device([](int ranks) { return make_local_group(ranks); }, 21);
}

TEST(ReduceScatterTree, TheBroadcastFallbackGivesTheSameBytes) {
  // The driver group (NCCL's logic) over the emulated communicator uses the
  // default: parts exchanged by broadcast, evaluated locally.
  auto log = std::make_shared<testing::emulated_log>();
  expect_collective_matches_one_device(testing::emulated_backend(log), 22);
}

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
