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
//
// The outer rate: `sync.outer_lr` where it is set; else diloco's (0.7 x
// min(1, H / 16), Note [Delayed rounds] for the rest of the rule) times
// min(1, the round's merged samples / the H x B of a full round). A round
// that commits without some workers, or with a slowed worker's shorter
// round, merges fewer samples, and the epoch has more rounds: at diloco's
// rate the outer momentum would move the weights that much further an
// epoch (the reason diloco's rate follows H below 16). Measured on the
// default job with one worker slowed 3x: without the scaling async ended
// 0.9 points below diloco, with it level (docs/PERFORMANCE.md, "Asynchronous
// rounds").

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "train/async_commit.hpp"

namespace dpactor {

struct async_leaf {
  std::size_t worker = 0;
  float factor = 1.0f;             // 1 / (1 + staleness)
  std::span<const float> values;   // the worker's contribution
};

// Writes the weighted sum of `leaves` (distinct workers, below `workers`,
// any order) into `out` (the values' size). With no leaves, zeros.
void async_weighted_sum(std::size_t workers, std::span<const async_leaf> leaves, std::span<float> out);

// The leaves of a decision's merged contributions: each worker's values
// (`values(worker)`) with the factor weight / samples = 1 / (1 + staleness).
std::vector<async_leaf> merged_leaves(const async_decision& d,
                                      const std::function<std::span<const float>(std::size_t worker)>& values);

// The outer rate of a round that merged `samples`, a full round's being
// `nominal` (H x B): `rate` (the plan's outer rate) where the user set it
// (`set`), else scaled as above.
double async_outer_rate(double rate, bool set, double samples, double nominal);

}  // namespace dpactor
