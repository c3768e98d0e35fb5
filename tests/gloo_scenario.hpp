#pragma once
// The calls tests/gloo_rank makes as one process of a Gloo group ("conform"),
// shared with tests/gloo_process_test, which makes the same calls on the
// local backend to compare the bytes.

#include <cmath>
#include <cstdint>
#include <vector>

#include "comms/collective.hpp"
#include "comms/summation_tree.hpp"

namespace dpactor::testing {

// Values whose sums round: only the same order of additions gives the same bits.
inline std::vector<float> inexact(int rank, std::size_t size) {
  std::vector<float> v(size);
  for (std::size_t i = 0; i < size; ++i)
    v[i] = std::sin(static_cast<float>(i * 31 + static_cast<std::size_t>(rank) * 7)) * 1e3f / static_cast<float>(1 + rank);
  return v;
}

inline constexpr std::size_t conform_sum_floats = 10007;
inline constexpr std::size_t conform_tree_floats = 1037;

// An inexact all-reduce of conform_sum_floats, then a tree reduce-scatter of
// 7 slices (rank r holds the slices s with s % size == r) over
// conform_tree_floats: both results, one after the other.
inline std::vector<float> conform_results(collective& c) {
  const int rank = c.rank(), size = c.size();
  std::vector<float> out = inexact(rank, conform_sum_floats);
  c.all_reduce_sum(out, {});
  const summation_tree tree(7);
  std::vector<std::uint8_t> owned(7, 0);
  for (std::size_t s = 0; s < 7; ++s) owned[s] = static_cast<int>(s % static_cast<std::size_t>(size)) == rank;
  const auto nodes = tree.cover(owned);
  std::vector<std::vector<float>> values;
  for (const auto node : nodes) values.push_back(inexact(static_cast<int>(node) + 10, conform_tree_floats));
  std::vector<tree_part> parts;
  for (std::size_t k = 0; k < nodes.size(); ++k) parts.push_back({nodes[k], values[k]});
  std::vector<float> result(conform_tree_floats, 0.0f);
  c.reduce_scatter_tree(7, parts, result, {});
  out.insert(out.end(), result.begin(), result.end());
  return out;
}

}  // namespace dpactor::testing
