#include "train/worker_placement.hpp"

#include <algorithm>
#include <stdexcept>

#include "train/straggler.hpp"

namespace dpactor {

// See Note [Worker placement].
worker_placement place_workers(std::size_t workers, std::span<const placement_node> nodes,
                               std::span<const std::string> previous) {
  if (nodes.empty()) throw std::invalid_argument("place_workers: no node to place logical workers on");
  if (!previous.empty() && previous.size() != workers)
    throw std::invalid_argument("place_workers: " + std::to_string(previous.size()) + " previous owners for " +
                                std::to_string(workers) + " workers");
  std::vector<double> devices;
  for (const placement_node& n : nodes) {
    if (n.devices == 0) throw std::invalid_argument("place_workers: node " + n.name + " has no devices");
    devices.push_back(static_cast<double>(n.devices));
  }
  const std::vector<std::size_t> share = split_by_weight(workers, devices);
  const auto index_of = [&](const std::string& name) -> std::ptrdiff_t {
    for (std::size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i].name == name) return static_cast<std::ptrdiff_t>(i);
    return -1;
  };
  std::vector<std::ptrdiff_t> at(workers, -1);
  std::vector<std::size_t> count(nodes.size(), 0);
  if (previous.empty()) {
    std::size_t k = 0;
    for (std::size_t i = 0; i < nodes.size(); ++i)
      for (std::size_t j = 0; j < share[i]; ++j, ++k) at[k] = static_cast<std::ptrdiff_t>(i);
    for (std::size_t i = 0; i < nodes.size(); ++i) count[i] = share[i];
  } else {
    for (std::size_t k = 0; k < workers; ++k)
      if ((at[k] = index_of(previous[k])) >= 0) ++count[static_cast<std::size_t>(at[k])];
    const auto load = [&](std::size_t i) { return static_cast<double>(count[i]) / devices[i]; };
    for (std::size_t k = 0; k < workers; ++k) {
      if (at[k] >= 0) continue;
      std::size_t best = 0;
      for (std::size_t i = 1; i < nodes.size(); ++i)
        if (load(i) < load(best)) best = i;
      at[k] = static_cast<std::ptrdiff_t>(best);
      ++count[best];
    }
    for (std::size_t i = 0; i < nodes.size(); ++i)
      while (count[i] < share[i]) {
        std::ptrdiff_t donor = -1;
        for (std::size_t j = 0; j < nodes.size(); ++j)
          if (count[j] > share[j] && (donor < 0 || load(j) > load(static_cast<std::size_t>(donor))))
            donor = static_cast<std::ptrdiff_t>(j);
        if (donor < 0) break;
        std::size_t k = workers;
        while (at[--k] != donor) {
        }
        at[k] = static_cast<std::ptrdiff_t>(i);
        --count[static_cast<std::size_t>(donor)];
        ++count[i];
      }
  }
  worker_placement out;
  for (std::size_t k = 0; k < workers; ++k) {
    out.owner.push_back(nodes[static_cast<std::size_t>(at[k])].name);
    const std::string from = previous.empty() ? std::string() : previous[k];
    if (from != out.owner.back()) out.moves.push_back({k, from, out.owner.back()});
  }
  return out;
}

// See Note [Worker placement]: a node's workers, split over its members.
std::vector<std::vector<std::uint32_t>> worker_slices(std::span<const std::int32_t> node_of_member,
                                                      std::span<const std::int32_t> node_of_worker,
                                                      std::span<const double> weights, std::size_t rotation,
                                                      std::size_t slices) {
  if (weights.size() != node_of_member.size())
    throw std::invalid_argument("worker_slices: " + std::to_string(weights.size()) + " weights for " +
                                std::to_string(node_of_member.size()) + " members");
  if (slices > node_of_worker.size())
    throw std::invalid_argument("worker_slices: a round of " + std::to_string(slices) + " slices for " +
                                std::to_string(node_of_worker.size()) + " workers");
  std::vector<std::vector<std::uint32_t>> out(node_of_member.size());
  std::vector<bool> done(node_of_worker.size(), false);
  for (std::size_t k = 0; k < slices; ++k) {
    if (done[k]) continue;
    const std::int32_t node = node_of_worker[k];
    std::vector<std::uint32_t> workers;
    for (std::size_t j = k; j < slices; ++j)
      if (node_of_worker[j] == node) {
        workers.push_back(static_cast<std::uint32_t>(j));
        done[j] = true;
      }
    std::vector<std::size_t> members;
    std::vector<double> shares;
    for (std::size_t r = 0; r < node_of_member.size(); ++r)
      if (node_of_member[r] == node) {
        members.push_back(r);
        shares.push_back(weights[r]);
      }
    if (members.empty())
      throw std::invalid_argument("worker_slices: logical worker " + std::to_string(k) + " is on node " +
                                  std::to_string(node) + ", which has no member");
    const std::vector<std::size_t> sizes = split_by_weight(workers.size(), shares, rotation % members.size());
    std::size_t at = 0;
    for (std::size_t i = 0; i < members.size(); ++i) {
      out[members[i]].assign(workers.begin() + static_cast<std::ptrdiff_t>(at),
                             workers.begin() + static_cast<std::ptrdiff_t>(at + sizes[i]));
      at += sizes[i];
    }
  }
  return out;
}

}  // namespace dpactor
