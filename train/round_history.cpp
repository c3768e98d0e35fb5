#include "train/round_history.hpp"

namespace dpactor {

namespace {

std::size_t floats(const std::vector<float>& v) { return v.size() * sizeof(float); }

}  // namespace

void round_history::keep(std::size_t max_bytes) {
  const std::lock_guard lock(mutex_);
  max_bytes_ = max_bytes;
  trim();
}

void round_history::record(rounds& into, std::int64_t round, std::span<const float> values) {
  const std::lock_guard lock(mutex_);
  if (max_bytes_ == 0 || into.count(round)) return;
  into.emplace(round, std::vector<float>(values.begin(), values.end()));
  bytes_ += values.size() * sizeof(float);
  trim();
}

std::optional<std::vector<float>> round_history::find(const rounds& in, std::int64_t round) const {
  const std::lock_guard lock(mutex_);
  const auto it = in.find(round);
  if (it == in.end()) return std::nullopt;
  return it->second;
}

void round_history::checkpoint_asked(std::int64_t step) {
  const std::lock_guard lock(mutex_);
  if (step <= asked_) return;
  const std::int64_t round = asked_ + 1;  // the rounds after the one asked before are kept
  asked_ = step;
  for (auto* m : {&starts_, &maxima_})
    for (auto it = m->begin(); it != m->end() && it->first < round;) {
      bytes_ -= floats(it->second);
      it = m->erase(it);
    }
}

std::size_t round_history::bytes() const {
  const std::lock_guard lock(mutex_);
  return bytes_;
}

void round_history::trim() {
  while (bytes_ > max_bytes_ && !starts_.empty()) {  // the oldest round first
    const std::int64_t oldest = starts_.begin()->first;
    bytes_ -= floats(starts_.begin()->second);
    starts_.erase(starts_.begin());
    for (auto it = maxima_.begin(); it != maxima_.end() && it->first <= oldest;) {
      bytes_ -= floats(it->second);
      it = maxima_.erase(it);
    }
  }
}

}  // namespace dpactor
