#include "train/async_commit.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace dpactor {
namespace {

double median_of(std::vector<double> v) {
  const std::size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  return 0.5 * (upper + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)));
}

}  // namespace

async_commit::async_commit(async_rule rule) : rule_(rule) {
  if (rule_.quorum == 0) throw std::invalid_argument("async_rule: a quorum of 0 would commit empty rounds");
  if (rule_.max_staleness < 0) throw std::invalid_argument("async_rule: max_staleness < 0");
  if (rule_.window == 0) rule_.window = 1;
}

void async_commit::record_arrival(double seconds) {
  arrivals_.push_back(seconds);
  while (arrivals_.size() > rule_.window) arrivals_.pop_front();
}

// See Note [Async commit]: median + k x MAD, at least the grace window.
double async_commit::deadline_s() const {
  if (arrivals_.empty()) return rule_.grace_s;
  std::vector<double> v(arrivals_.begin(), arrivals_.end());
  const double median = median_of(v);
  for (double& x : v) x = std::abs(x - median);
  const double mad = median_of(std::move(v));
  return std::max(rule_.grace_s, median + rule_.mad_factor * mad);
}

async_decision async_commit::decide(std::int64_t round, std::span<const async_contribution> arrived, std::size_t alive,
                                    double open_s) const {
  async_decision d;
  std::vector<std::size_t> seen;
  for (const async_contribution& c : arrived) {
    if (c.base_round > round)
      throw std::logic_error("a contribution from round " + std::to_string(c.base_round) + " arrived in round " +
                             std::to_string(round));
    if (std::find(seen.begin(), seen.end(), c.worker) != seen.end())
      throw std::logic_error("logical worker " + std::to_string(c.worker) + " contributed twice to round " +
                             std::to_string(round));
    seen.push_back(c.worker);
    const std::int64_t staleness = round - c.base_round;
    if (staleness > rule_.max_staleness) {
      d.dropped.push_back(c);
      continue;
    }
    d.merged.push_back({c.worker, staleness, c.samples, async_weight(c.samples, staleness)});
    d.samples += c.samples;
  }
  const std::size_t needed = std::min(rule_.quorum, std::max<std::size_t>(alive, 1));
  d.commit = d.merged.size() >= needed || (!d.merged.empty() && open_s >= deadline_s());
  if (!d.commit) {  // nothing merges yet: only the drops are final
    d.merged.clear();
    d.samples = 0.0;
  }
  return d;
}

}  // namespace dpactor
