#include "comms/collective.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "comms/summation_tree.hpp"

namespace dpactor {

// Exchanges who holds which node (one small all-reduce), then every part by
// broadcast from its holder, and evaluates this rank's chunk locally: the
// same plan, so the same bytes, as a backend that reads the parts in place.
void collective::reduce_scatter_tree(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                                     const collective_options& options) {
  const summation_tree tree(slices);
  std::vector<float> holder(tree.node_bound(), 0.0f);  // rank + 1 of each node's holder
  for (const tree_part& p : parts) {
    if (p.node >= tree.node_bound() || p.data.size() != out.size())
      throw collective_error(collective_errc::mismatch, "reduce_scatter_tree: a part does not fit the tree or the output");
    holder[p.node] = static_cast<float>(rank() + 1);
  }
  if (size() > 1) all_reduce_sum(holder, options);
  std::vector<std::uint32_t> nodes;
  std::vector<std::vector<float>> copies;
  std::vector<const float*> data;
  for (std::uint32_t n = 0; n < tree.node_bound(); ++n) {
    if (holder[n] == 0.0f) continue;
    const int from = static_cast<int>(holder[n]) - 1;
    nodes.push_back(n);
    if (from == rank()) {
      const auto mine = std::find_if(parts.begin(), parts.end(), [&](const tree_part& p) { return p.node == n; });
      data.push_back(mine->data.data());
      if (size() > 1) broadcast(mine->data, from, options);
    } else {
      copies.emplace_back(out.size());
      broadcast(copies.back(), from, options);
      data.push_back(copies.back().data());
    }
  }
  tree_plan plan;
  try {
    plan.build(tree, nodes);
  } catch (const std::invalid_argument& e) {
    throw collective_error(collective_errc::mismatch, std::string("reduce_scatter_tree: ") + e.what());
  }
  const auto [begin, end] = chunk(out.size(), rank());
  plan.run(data.data(), begin, end, out.data());
}

bool collective::all_reduce_tree(std::size_t slices, std::span<const tree_part> parts, std::span<float> out,
                                 std::span<float> header, const std::function<bool(std::span<const float>)>& proceed,
                                 const collective_options& header_options, const collective_options& options) {
  if (size() > 1) all_reduce_sum(header, header_options);
  if (!proceed(header)) return false;
  reduce_scatter_tree(slices, parts, out, options);
  if (size() > 1) {
    const std::span<float> whole[] = {out};
    all_gather(whole, options);
  }
  return true;
}

bool collective::all_reduce_with_header(std::span<float> data, std::span<float> header,
                                        const std::function<bool(std::span<const float>)>& proceed,
                                        const collective_options& header_options, const collective_options& options) {
  if (size() > 1) all_reduce_sum(header, header_options);
  if (!proceed(header)) return false;
  if (size() > 1) all_reduce_sum(data, options);
  return true;
}

void collective::all_reduce_sum_int8(std::span<std::int8_t> data, const collective_options& options) {
  if (size() == 1) return;
  std::vector<float> wide(data.begin(), data.end());
  all_reduce_sum(wide, options);
  for (std::size_t i = 0; i < data.size(); ++i) {
    if (!(std::fabs(wide[i]) <= 127.0f))
      throw collective_error(collective_errc::mismatch, "all_reduce_sum_int8: the sum at index " + std::to_string(i) +
                                                            " does not fit in int8");
    data[i] = static_cast<std::int8_t>(wide[i]);
  }
}

namespace {
float widen_bf16(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }
}  // namespace

void collective::reduce_scatter_tree_bf16(std::size_t slices, std::span<const tree_part_bf16> parts, std::span<float> out,
                                          const collective_options& options) {
  std::vector<std::vector<float>> wide(parts.size());
  std::vector<tree_part> as_floats;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    wide[i].resize(parts[i].data.size());
    std::transform(parts[i].data.begin(), parts[i].data.end(), wide[i].begin(), widen_bf16);
    as_floats.push_back({parts[i].node, wide[i]});
  }
  reduce_scatter_tree(slices, as_floats, out, options);
}

void collective::all_gather_bf16(std::span<std::uint16_t> data, const collective_options& options) {
  if (size() == 1) return;
  std::vector<float> wide(data.size());
  std::transform(data.begin(), data.end(), wide.begin(), widen_bf16);
  const std::span<float> one[] = {wide};
  all_gather(one, options);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(wide[i]) >> 16);
}

}  // namespace dpactor
