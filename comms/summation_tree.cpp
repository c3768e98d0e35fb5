#include "comms/summation_tree.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>
#include <string>


namespace dpactor {
namespace {

// Elements evaluated per block: a block of every register stays in L1/L2.
constexpr std::size_t block = 512;
constexpr std::size_t max_registers = tree_max_registers;

}  // namespace

summation_tree::summation_tree(std::size_t slices) : slices_(std::max<std::size_t>(1, slices)), leaves_(1) {
  while (leaves_ < slices_) leaves_ *= 2;
}

std::pair<std::size_t, std::size_t> summation_tree::range(std::uint32_t node) const noexcept {
  // A node at depth d (root 0) spans leaves_ >> d slices.
  std::size_t width = leaves_;
  std::uint32_t first_at_depth = 1;
  while (first_at_depth * 2 <= node) {
    first_at_depth *= 2;
    width /= 2;
  }
  const std::size_t first = (node - first_at_depth) * width;
  return {std::min(first, slices_), std::min(first + width, slices_)};
}

bool summation_tree::present(std::uint32_t node) const noexcept {
  if (node == 0 || node >= node_bound()) return false;
  const auto [first, last] = range(node);
  return first < last;
}

std::vector<std::uint32_t> summation_tree::cover(std::span<const std::uint8_t> owned) const {
  std::vector<std::uint32_t> out;
  // Top-down: a node whose slices are all owned is taken whole.
  std::vector<std::uint32_t> pending{root()};
  while (!pending.empty()) {
    const std::uint32_t n = pending.back();
    pending.pop_back();
    if (!present(n)) continue;
    const auto [first, last] = range(n);
    const auto begin = owned.begin() + static_cast<std::ptrdiff_t>(first);
    const auto end = owned.begin() + static_cast<std::ptrdiff_t>(last);
    if (std::all_of(begin, end, [](std::uint8_t o) { return o != 0; })) {
      out.push_back(n);
    } else if (std::any_of(begin, end, [](std::uint8_t o) { return o != 0; })) {
      pending.push_back(2 * n + 1);  // popped after the left half: slice order
      pending.push_back(2 * n);
    }
  }
  return out;
}

void tree_plan::build(const summation_tree& tree, std::span<const std::uint32_t> parts, std::uint32_t target) {
  steps_.clear();
  registers_ = 1;
  covered_.assign(tree.slices(), 0);
  for (const std::uint32_t p : parts) {
    if (!tree.present(p)) throw std::invalid_argument("summation tree: part " + std::to_string(p) + " is not a node");
    const auto [first, last] = tree.range(p);
    for (std::size_t s = first; s < last; ++s) ++covered_[s];
  }
  const auto [first, last] = tree.range(target);
  for (std::size_t s = 0; s < tree.slices(); ++s) {
    const std::uint32_t want = s >= first && s < last ? 1 : 0;
    if (covered_[s] != want)
      throw std::invalid_argument("summation tree: slice " + std::to_string(s) + " is held by " +
                                  std::to_string(covered_[s]) + " parts, expected " + std::to_string(want));
  }
  plan(tree, parts, target, 0);
}

void tree_plan::plan(const summation_tree& tree, std::span<const std::uint32_t> parts, std::uint32_t node,
                     std::uint8_t reg) {
  auto part_of = [&](std::uint32_t n) -> std::ptrdiff_t {
    const auto it = std::find(parts.begin(), parts.end(), n);
    return it == parts.end() ? -1 : it - parts.begin();
  };
  if (reg + 1u >= max_registers) throw std::invalid_argument("summation tree: too deep");
  registers_ = std::max<std::uint8_t>(registers_, static_cast<std::uint8_t>(reg + 1));
  if (const auto p = part_of(node); p >= 0) {
    steps_.push_back({tree_step::load, reg, static_cast<std::uint32_t>(p)});
    return;
  }
  const std::uint32_t left = 2 * node, right = 2 * node + 1;
  plan(tree, parts, left, reg);
  if (!tree.present(right)) return;  // the node is its left half
  if (const auto p = part_of(right); p >= 0) {
    steps_.push_back({tree_step::add_part, reg, static_cast<std::uint32_t>(p)});
  } else {
    plan(tree, parts, right, static_cast<std::uint8_t>(reg + 1));
    steps_.push_back({tree_step::add_register, reg, static_cast<std::uint32_t>(reg + 1)});
  }
}

void tree_plan::run(const float* const* data, std::size_t begin, std::size_t end, float* out) const {
  if (steps_.size() == 1) {  // one part holds the whole target
    const float* src = data[steps_[0].src];
    if (src != out && end > begin) std::memcpy(out + begin, src + begin, (end - begin) * sizeof(float));
    return;
  }
  std::array<std::array<float, block>, max_registers> regs;
  for (std::size_t b = begin; b < end; b += block) {
    const std::size_t len = std::min(block, end - b);
    for (const tree_step& s : steps_) {
      float* dst = regs[s.reg].data();
      switch (s.kind) {
        case tree_step::load: std::memcpy(dst, data[s.src] + b, len * sizeof(float)); break;
        case tree_step::add_part: add_into(dst, data[s.src] + b, len); break;
        case tree_step::add_register: add_into(dst, regs[s.src].data(), len); break;
      }
    }
    std::memcpy(out + b, regs[0].data(), len * sizeof(float));
  }
}

void tree_builder::reset(const summation_tree& tree, adder add) {
  tree_ = &tree;
  add_ = std::move(add);
  held_.clear();
}

void tree_builder::add_leaf(std::size_t slice, std::size_t buffer, std::span<const std::span<float>> buffers,
                            std::vector<std::size_t>& freed) {
  std::uint32_t node = tree_->leaf(slice);
  while (node != summation_tree::root()) {
    const std::uint32_t sibling = node ^ 1u;
    if (!tree_->present(sibling)) {  // the parent is this node alone
      node /= 2;
      continue;
    }
    const auto it = std::find_if(held_.begin(), held_.end(), [&](const auto& h) { return h.first == sibling; });
    if (it == held_.end()) break;
    // left + right, into the left one's buffer (float addition commutes).
    const std::size_t other = it->second;
    const bool left = (node & 1u) == 0;
    const std::size_t keep = left ? buffer : other, drop = left ? other : buffer;
    if (add_) add_(buffers[keep], buffers[drop]);
    else add_into(buffers[keep].data(), buffers[drop].data(), buffers[keep].size());
    freed.push_back(drop);
    held_.erase(it);
    buffer = keep;
    node /= 2;
  }
  held_.emplace_back(node, buffer);
}

}  // namespace dpactor
