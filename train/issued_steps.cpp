#include "train/issued_steps.hpp"

#include <algorithm>
#include <stdexcept>

#include "train/schedule_position.hpp"

namespace dpactor {

data_source::next issued_steps::what_next(std::size_t) const {
  if (ledger_.waiting() > 0) return next::step;
  return in_flight_.empty() ? next::epoch_end : next::wait_commits;  // an epoch ends once all of it is committed
}

data_source::step_samples issued_steps::issue(std::int64_t step, std::size_t batch) {
  auto& flight = in_flight_[step];
  ledger_.take(std::min(batch, ledger_.waiting()), flight.indices);
  return {flight.indices, nullptr};
}

std::vector<data_source::snapshot> issued_steps::commit(std::int64_t through, std::span<const step_returned> returned) {
  std::vector<snapshot> snapshots;
  std::size_t next_returned = 0;
  while (!in_flight_.empty() && in_flight_.begin()->first <= through) {
    auto it = in_flight_.begin();
    const std::int64_t step = it->first;
    auto& indices = it->second.indices;
    while (next_returned < returned.size() && returned[next_returned].step < step) ++next_returned;
    if (next_returned < returned.size() && returned[next_returned].step == step) {
      const auto& back = returned[next_returned].indices;
      ledger_.requeue(back);
      std::vector<std::uint32_t> sorted = back;
      std::sort(sorted.begin(), sorted.end());
      std::erase_if(indices, [&](std::uint32_t i) { return std::binary_search(sorted.begin(), sorted.end(), i); });
    }
    ledger_.commit(indices);
    const bool wanted = it->second.snapshot;
    in_flight_.erase(it);
    if (wanted) snapshots.push_back({step, position_after(step)});
  }
  return snapshots;
}

std::size_t issued_steps::roll_back(std::int64_t through) {
  std::vector<std::uint32_t> undo;
  for (auto it = in_flight_.upper_bound(through); it != in_flight_.end();) {
    undo.insert(undo.end(), it->second.indices.begin(), it->second.indices.end());
    it = in_flight_.erase(it);
  }
  ledger_.requeue_front(undo);
  return undo.size();
}

ledger_position issued_steps::position_after(std::int64_t step) const {
  scratch_.clear();
  for (auto it = in_flight_.upper_bound(step); it != in_flight_.end(); ++it)
    scratch_.insert(scratch_.end(), it->second.indices.begin(), it->second.indices.end());
  return ledger_.position(scratch_);
}

double issued_steps::schedule_position(std::int64_t, std::int64_t epoch_steps, std::int64_t batch) const {
  return dpactor::schedule_position(ledger_.epoch(), epoch_steps,
                                    ledger_.samples() - ledger_.waiting(), batch);
}

data_source::epoch_totals issued_steps::end_epoch() {
  ledger_.verify_complete();
  return {ledger_.epoch(), static_cast<std::int64_t>(ledger_.committed()), requeued()};
}

bool issued_steps::wake_when_ready(std::size_t, std::function<void()>) {
  throw std::logic_error("a training set's steps never wait for records");
}

}  // namespace dpactor
