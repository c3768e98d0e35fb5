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
  auto& indices = in_flight_.add(step);
  ledger_.take(std::min(batch, ledger_.waiting()), indices);
  return {indices, nullptr};
}

std::vector<data_source::snapshot> issued_steps::commit(std::int64_t through, std::span<const step_returned> returned) {
  return in_flight_.commit_through(
      through, returned,
      [this](std::int64_t, std::vector<std::uint32_t>& indices, const step_returned* back) {
        if (back != nullptr) {
          ledger_.requeue(back->indices);
          std::vector<std::uint32_t> sorted = back->indices;
          std::sort(sorted.begin(), sorted.end());
          std::erase_if(indices, [&](std::uint32_t i) { return std::binary_search(sorted.begin(), sorted.end(), i); });
        }
        ledger_.commit(indices);
        committed_samples_ += static_cast<std::int64_t>(indices.size());
      },
      [this](std::int64_t step) { return position_after(step); });
}

std::size_t issued_steps::roll_back(std::int64_t through) {
  std::vector<std::uint32_t> undo;
  in_flight_.take_after(through, [&](const std::vector<std::uint32_t>& indices) {
    undo.insert(undo.end(), indices.begin(), indices.end());
  });
  ledger_.requeue_front(undo);
  return undo.size();
}

ledger_position issued_steps::position_after(std::int64_t step) const {
  scratch_.clear();
  in_flight_.for_each_after(step, [this](const std::vector<std::uint32_t>& indices) {
    scratch_.insert(scratch_.end(), indices.begin(), indices.end());
  });
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
