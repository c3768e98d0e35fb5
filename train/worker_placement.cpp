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

}  // namespace dpactor
