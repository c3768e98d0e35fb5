#include "train/async_merge.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "tensors/vector_add.hpp"

namespace dpactor {
namespace {

// The node over workers [lo, lo + width) into `out`; false if no leaf is in
// it (See Note [Async merge]). scratch[depth] holds its right half.
bool node_sum(const std::vector<const async_leaf*>& by_worker, std::size_t lo, std::size_t width,
              std::span<float> out, std::vector<std::vector<float>>& scratch, std::size_t depth) {
  if (lo >= by_worker.size()) return false;
  if (width == 1) {
    const async_leaf* leaf = by_worker[lo];
    if (leaf == nullptr) return false;
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = leaf->values[i] * leaf->factor;
    return true;
  }
  const std::size_t half = width / 2;
  const bool left = node_sum(by_worker, lo, half, out, scratch, depth + 1);
  if (!left) return node_sum(by_worker, lo + half, half, out, scratch, depth + 1);
  std::vector<float>& right = scratch[depth];
  right.resize(out.size());
  if (node_sum(by_worker, lo + half, half, right, scratch, depth + 1)) add_into(out.data(), right.data(), out.size());
  return true;
}

}  // namespace

void async_weighted_sum(std::size_t workers, std::span<const async_leaf> leaves, std::span<float> out) {
  std::vector<const async_leaf*> by_worker(workers, nullptr);
  for (const async_leaf& l : leaves) {
    if (l.worker >= workers || by_worker[l.worker] != nullptr)
      throw std::logic_error("async_weighted_sum: worker " + std::to_string(l.worker) + " is not one of " +
                             std::to_string(workers) + " or comes twice");
    if (l.values.size() != out.size()) throw std::logic_error("async_weighted_sum: a contribution of another size");
    by_worker[l.worker] = &l;
  }
  std::size_t width = 1, levels = 1;
  for (; width < workers; width *= 2) ++levels;
  std::vector<std::vector<float>> scratch(levels);  // one right half a level, sized before any reference is taken
  if (!node_sum(by_worker, 0, width, out, scratch, 0)) std::fill(out.begin(), out.end(), 0.0f);
}

std::vector<async_leaf> merged_leaves(const async_decision& d,
                                      const std::function<std::span<const float>(std::size_t worker)>& values) {
  std::vector<async_leaf> leaves;
  for (const auto& m : d.merged)
    leaves.push_back({m.worker, static_cast<float>(m.weight / m.samples), values(m.worker)});
  return leaves;
}

double async_outer_rate(double rate, bool set, double samples, double nominal) {
  if (set || !(nominal > 0.0)) return rate;
  return rate * std::min(1.0, samples / nominal);
}

}  // namespace dpactor
