#include "train/straggler.hpp"

#include <algorithm>
#include <numeric>

namespace dpactor {

std::vector<std::size_t> split_by_weight(std::size_t total, std::span<const double> weights, std::size_t first) {
  const std::size_t n = weights.size();
  std::vector<std::size_t> out(n, 0);
  if (n == 0) return out;
  std::size_t floor_each = 0;
  if (total >= n) floor_each = 1;  // everyone keeps being measured
  std::size_t rest = total - floor_each * n;
  double sum = 0.0;
  for (double w : weights) sum += std::max(w, 0.0);
  std::vector<double> exact(n);
  for (std::size_t r = 0; r < n; ++r)
    exact[r] = sum > 0.0 ? static_cast<double>(rest) * std::max(weights[r], 0.0) / sum
                         : static_cast<double>(rest) / static_cast<double>(n);
  std::size_t given = 0;
  for (std::size_t r = 0; r < n; ++r) {
    out[r] = floor_each + static_cast<std::size_t>(exact[r]);
    given += static_cast<std::size_t>(exact[r]);
  }
  // Largest remainders first; ties in rank order from `first`.
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = (first + i) % n;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return exact[a] - static_cast<double>(static_cast<std::size_t>(exact[a])) >
           exact[b] - static_cast<double>(static_cast<std::size_t>(exact[b]));
  });
  for (std::size_t i = 0; given < rest; ++i, ++given) ++out[order[i % n]];
  return out;
}

rolling_median::rolling_median(std::size_t capacity) : ring_(capacity) { scratch_.reserve(capacity); }

void rolling_median::push(double v) {
  ring_[next_] = v;
  next_ = (next_ + 1) % ring_.size();
  count_ = std::min(count_ + 1, ring_.size());
}

double rolling_median::median() const {
  if (count_ == 0) return 0.0;
  scratch_.assign(ring_.begin(), ring_.begin() + static_cast<std::ptrdiff_t>(count_));
  const auto mid = scratch_.begin() + static_cast<std::ptrdiff_t>(count_ / 2);
  std::nth_element(scratch_.begin(), mid, scratch_.end());
  return *mid;
}

throughput_tracker::throughput_tracker(double smoothing, std::size_t members)
    : smoothing_(smoothing), rates_(members, 0.0) {}

void throughput_tracker::reset(std::size_t members) {
  rates_.assign(members, 0.0);
}

void throughput_tracker::record(std::size_t rank, std::int64_t samples, double seconds) {
  if (rank >= rates_.size() || samples <= 0 || seconds <= 0.0) return;
  const double rate = static_cast<double>(samples) / seconds;
  rates_[rank] = rates_[rank] == 0.0 ? rate : smoothing_ * rate + (1.0 - smoothing_) * rates_[rank];
}

std::vector<double> throughput_tracker::shares() const {
  double sum = 0.0;
  std::size_t measured = 0;
  for (double r : rates_)
    if (r > 0.0) {
      sum += r;
      ++measured;
    }
  std::vector<double> out(rates_.size(), 1.0);
  if (measured == 0) return out;
  const double mean = sum / static_cast<double>(measured);
  for (std::size_t i = 0; i < rates_.size(); ++i) out[i] = rates_[i] > 0.0 ? rates_[i] : mean;
  const double total = std::accumulate(out.begin(), out.end(), 0.0);
  for (double& w : out) w /= total;
  return out;
}

}  // namespace dpactor
