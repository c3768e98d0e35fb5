#pragma once
// Straggler bookkeeping, free of actors so it can be tested alone: each
// member's smoothed throughput (for throughput-proportional shards), the
// recent compute times (for cut deadlines), and the split of a global batch by
// weight.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace dpactor {

// Splits `total` samples across members in proportion to `weights`
// (largest-remainder rounding). When total >= members, every member gets at
// least one sample, so its throughput stays measured. Ties go to members in
// rank order starting at `first`: the loader rotates it with the step, so that
// a member cut again and again is not also handed every leftover sample
// (which, at the end of an epoch, would hand the last index to it forever).
// Equal weights give the even split: total % n members, from `first` on, get
// one more.
std::vector<std::size_t> split_by_weight(std::size_t total, std::span<const double> weights, std::size_t first = 0);

// The median of the last `capacity` values pushed. Allocates only when
// constructed: it sits on every step's path.
class rolling_median {
 public:
  explicit rolling_median(std::size_t capacity);
  void push(double v);
  void clear() noexcept { count_ = 0; }
  bool empty() const noexcept { return count_ == 0; }
  double median() const;  // 0 when empty

 private:
  std::vector<double> ring_;
  std::size_t next_ = 0;
  std::size_t count_ = 0;
  mutable std::vector<double> scratch_;
};

class throughput_tracker {
 public:
  // `smoothing`: weight of the newest measurement in the exponential average.
  throughput_tracker(double smoothing, std::size_t members);

  void reset(std::size_t members);
  // A member computed `samples` in `seconds` (before entering the collective;
  // a shard cut short counts with what it computed).
  void record(std::size_t rank, std::int64_t samples, double seconds);
  // Samples per second of a member; 0 until measured.
  double throughput(std::size_t rank) const { return rates_.at(rank); }
  // Normalised weights; members not yet measured get the mean of the others
  // (all equal before any measurement).
  std::vector<double> shares() const;

 private:
  double smoothing_;
  std::vector<double> rates_;
};

}  // namespace dpactor
