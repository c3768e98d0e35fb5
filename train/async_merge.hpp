#pragma once
// What a commit of an asynchronous round adds up (sync.mode = "async"): the
// merged contributions, each scaled by its staleness weight, in a fixed
// order. Pure logic, tested without actors (tests/async_claims_test.cpp).
//
// Note [Async merge]
// A contribution of worker k is n_k x (global_b - inner_k), from the global
// weights of its base round b (Note [Logical workers]). A round merges some
// of the K workers' contributions (Note [Async commit]); their weighted sum
// sum_k n_k / (1 + s_k) x (global_b - inner_k) / n_k x n_k, i.e. each
// contribution times 1 / (1 + s_k), is added by the summation tree over
// worker index (Note [Summation tree]) with the absent workers' leaves
// absent: a node is the float sum left + right of its halves, or the one
// half present. So the sum is a function of the decision (which workers,
// from which bases) and of their contributions, never of the order in which
// they arrived. The outer step divides it by the merged samples.

#include <cstddef>
#include <span>
#include <vector>

namespace dpactor {

struct async_leaf {
  std::size_t worker = 0;
  float factor = 1.0f;             // 1 / (1 + staleness)
  std::span<const float> values;   // the worker's contribution
};

// Writes the weighted sum of `leaves` (distinct workers, below `workers`,
// any order) into `out` (the values' size). With no leaves, zeros.
void async_weighted_sum(std::size_t workers, std::span<const async_leaf> leaves, std::span<float> out);

}  // namespace dpactor
