#pragma once
// Slice gradients for the tests of the summation tree (See Note [Summation
// tree]): values whose sums round differently in other orders, what a member
// holding some slices contributes, and the sum one device makes of them all.
// tests/summation_tree_test checks the tree alone with them,
// tests/collective_conformance_test every backend's reduce_scatter_tree.

#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "comms/summation_tree.hpp"

namespace dpactor::testing {

// A node of the tree and its values.
using tree_values = std::pair<std::uint32_t, std::vector<float>>;

// Slice gradients whose sum rounds differently in different orders: values
// of very different magnitudes and signs.
inline std::vector<std::vector<float>> slice_values(std::size_t slices, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<std::vector<float>> v(slices, std::vector<float>(n));
  for (auto& s : v)
    for (float& x : s) x = std::ldexp(mantissa(gen), exponent(gen));
  return v;
}

// What a member holding `mine` (in the order it computed them) contributes.
inline std::vector<tree_values> contribute(const summation_tree& tree, const std::vector<std::vector<float>>& values,
                                           const std::vector<std::size_t>& mine) {
  std::vector<std::vector<float>> storage;
  for (const auto s : mine) storage.push_back(values[s]);
  std::vector<std::span<float>> buffers(storage.begin(), storage.end());
  tree_builder b;
  b.reset(tree);
  std::vector<std::size_t> freed;
  for (std::size_t i = 0; i < mine.size(); ++i) b.add_leaf(mine[i], i, buffers, freed);
  std::vector<tree_values> out;
  for (const auto& [node, buffer] : b.held()) out.emplace_back(node, storage[buffer]);
  return out;
}

// The root's value from parts that hold every slice once.
inline std::vector<float> finish(const summation_tree& tree, const std::vector<tree_values>& parts, std::size_t n) {
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
inline std::vector<float> one_device_sum(const summation_tree& tree, const std::vector<std::vector<float>>& values,
                                         std::size_t n) {
  std::vector<std::size_t> all(values.size());
  std::iota(all.begin(), all.end(), 0);
  const auto parts = contribute(tree, values, all);
  EXPECT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].first, summation_tree::root());
  return finish(tree, parts, n);
}

}  // namespace dpactor::testing
