#pragma once
// The fixed order in which a step's slice gradients are added.
//
// Note [Summation tree]
// In reproducible mode (train.reproducible) a step's global batch is cut into
// fixed slices of train.micro_batch samples, and the slices' gradient sums are
// added by one fixed binary tree over slice index, whoever computed them. A
// node covers slices [k 2^l, (k + 1) 2^l) at level l (leaves are level 0) and
// is the float sum left + right of its halves; a half that holds no slice
// (past the last one) is absent, and the node is then its other half, with no
// addition. Float addition is not associative: this one order is what makes
// the sum, and so the final parameters, a function of the data alone, not of
// the number of members, the shard split or who stole which slice.
//
// A member contributes the largest complete nodes among the slices it
// computed (tree_builder combines them as they complete, by the same rule),
// and the collective finishes the tree from all members' contributions with a
// tree_plan, the same recursion, on every rank and in every backend
// (collective::reduce_scatter_tree). With an aligned even split every member
// contributes one node, and the collective adds as many buffers as today.
//
// Nodes are numbered as in a binary heap: the root is 1, the children of n are
// 2n and 2n + 1, and with P = 2^L >= slices leaves, slice s is node P + s.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "comms/tree_program.hpp"
#include "tensors/vector_add.hpp"  // add_into: the one addition the tree does

namespace dpactor {

class summation_tree {
 public:
  // A tree over `slices` slices (at least 1).
  explicit summation_tree(std::size_t slices);

  std::size_t slices() const noexcept { return slices_; }
  static constexpr std::uint32_t root() noexcept { return 1; }
  std::uint32_t leaf(std::size_t slice) const noexcept { return static_cast<std::uint32_t>(leaves_ + slice); }
  bool is_leaf(std::uint32_t node) const noexcept { return node >= leaves_; }
  // The slices [first, last) the node holds, clipped to slices(); empty for
  // an absent node.
  std::pair<std::size_t, std::size_t> range(std::uint32_t node) const noexcept;
  bool present(std::uint32_t node) const noexcept;
  // Node ids are below this bound.
  std::uint32_t node_bound() const noexcept { return static_cast<std::uint32_t>(2 * leaves_); }

  // The largest complete nodes among the slices marked in `owned` (one flag
  // per slice), in slice order: together they cover exactly the owned slices.
  std::vector<std::uint32_t> cover(std::span<const std::uint8_t> owned) const;

 private:
  std::size_t slices_;
  std::size_t leaves_;  // P, a power of two >= slices_
};

// Evaluates one node of the tree from parts: nodes whose values are given.
// The parts must cover the node's slices exactly once.
class tree_plan {
 public:
  // Plans the evaluation of `target` (default: the root) from
  // parts[i] = the node part i holds. Throws std::invalid_argument when the
  // parts do not cover the target's slices exactly once. Keeps its capacity:
  // planning again allocates nothing once it has seen the largest tree.
  void build(const summation_tree& tree, std::span<const std::uint32_t> parts,
             std::uint32_t target = summation_tree::root());

  // out[i] = the target's value at element i, for i in [begin, end); `data`
  // has one pointer per part, in the order of build()'s parts. `out` may be
  // one of the parts: each block is read completely before it is written.
  void run(const float* const* data, std::size_t begin, std::size_t end, float* out) const;
  // The plan as a program, for a processor that runs it element by element
  // (See Note [The tree on a device]).
  std::span<const tree_step> steps() const noexcept { return steps_; }

 private:
  void plan(const summation_tree& tree, std::span<const std::uint32_t> parts, std::uint32_t node, std::uint8_t reg);

  std::vector<tree_step> steps_;
  std::vector<std::uint32_t> covered_;  // per slice, how many parts hold it (build's check)
  std::uint8_t registers_ = 1;
};

// Adds a node's children as they complete, by the tree's rule: the values it
// hands out are bitwise those any other member or the collective would
// compute for the same nodes. Buffers are the caller's, named by index.
class tree_builder {
 public:
  // How the halves of a node are added: a[i] += b[i] over whole buffers.
  // Empty: add_into, on host memory. A replica whose buffers live elsewhere
  // (a GPU's) adds them there (replica::add_gradients).
  using adder = std::function<void(std::span<float> a, std::span<const float> b)>;

  // Starts a step over `tree`: no node is held.
  void reset(const summation_tree& tree, adder add = {});
  // Slice `slice`'s gradients are in buffer `buffer`. Combines it with every
  // complete sibling it now has (left + right, into the left's buffer) and
  // returns the buffers it freed.
  void add_leaf(std::size_t slice, std::size_t buffer, std::span<const std::span<float>> buffers,
                std::vector<std::size_t>& freed);
  // The nodes held, and their buffers: the largest complete nodes among the
  // slices added.
  const std::vector<std::pair<std::uint32_t, std::size_t>>& held() const noexcept { return held_; }

 private:
  const summation_tree* tree_ = nullptr;
  adder add_;
  std::vector<std::pair<std::uint32_t, std::size_t>> held_;  // (node, buffer)
};

}  // namespace dpactor
