#include "data/epoch_ledger.hpp"

#include <algorithm>

#include "data/sampler.hpp"

namespace dpactor {

epoch_ledger::epoch_ledger(std::size_t samples, std::uint64_t seed, bool shuffle)
    : seed_(seed), shuffle_(shuffle), state_(samples, index_state::waiting) {}

void epoch_ledger::start_epoch(std::int64_t epoch) {
  epoch_ = epoch;
  order_ = epoch_order(state_.size(), seed_, epoch, shuffle_);
  cursor_ = 0;
  front_.clear();
  front_head_ = 0;
  std::fill(state_.begin(), state_.end(), index_state::waiting);
  committed_ = 0;
  requeued_total_ = 0;
}

void epoch_ledger::restore(const ledger_position& position) {
  start_epoch(position.epoch);
  if (position.cursor > order_.size())
    throw ledger_error("ledger position: cursor " + std::to_string(position.cursor) + " beyond the epoch's " +
                       std::to_string(order_.size()) + " samples");
  std::vector<bool> waiting(state_.size(), false);
  for (std::size_t i = position.cursor; i < order_.size(); ++i) waiting[order_[i]] = true;
  for (const auto index : position.front) {
    if (index >= state_.size() || waiting[index])
      throw ledger_error("ledger position: index " + std::to_string(index) + " is invalid or listed twice");
    waiting[index] = true;
  }
  cursor_ = position.cursor;
  front_ = position.front;
  for (std::size_t i = 0; i < state_.size(); ++i) {
    state_[i] = waiting[i] ? index_state::waiting : index_state::committed;
    if (!waiting[i]) ++committed_;
  }
}

void epoch_ledger::take(std::size_t n, std::vector<std::uint32_t>& out) {
  while (n > 0 && front_head_ < front_.size()) {
    const auto index = front_[front_head_++];
    state_[index] = index_state::handed_out;
    out.push_back(index);
    --n;
  }
  if (front_head_ == front_.size()) {
    front_.clear();
    front_head_ = 0;
  }
  const std::size_t fresh = std::min(n, order_.size() - cursor_);
  for (std::size_t i = 0; i < fresh; ++i) {
    const auto index = order_[cursor_++];
    state_[index] = index_state::handed_out;
    out.push_back(index);
  }
}

void epoch_ledger::requeue(std::span<const std::uint32_t> indices) {
  for (const auto index : indices) {
    if (index >= state_.size() || state_[index] != index_state::handed_out)
      throw ledger_error("ledger: re-queue of index " + std::to_string(index) + " that is not handed out");
    state_[index] = index_state::waiting;
    front_.push_back(index);
  }
  requeued_total_ += indices.size();
}

void epoch_ledger::requeue_front(std::span<const std::uint32_t> indices) {
  for (const auto index : indices)
    if (index >= state_.size() || state_[index] != index_state::handed_out)
      throw ledger_error("ledger: re-queue of index " + std::to_string(index) + " that is not handed out");
  for (const auto index : indices) state_[index] = index_state::waiting;
  front_.insert(front_.begin() + static_cast<std::ptrdiff_t>(front_head_), indices.begin(), indices.end());
  requeued_total_ += indices.size();
}

void epoch_ledger::commit(std::span<const std::uint32_t> indices) {
  for (const auto index : indices) {
    if (index >= state_.size())
      throw ledger_error("ledger: commit of index " + std::to_string(index) + " outside the dataset");
    if (state_[index] == index_state::committed)
      throw ledger_error("ledger: index " + std::to_string(index) + " committed twice in epoch " + std::to_string(epoch_));
    if (state_[index] != index_state::handed_out)
      throw ledger_error("ledger: commit of index " + std::to_string(index) + " that was never handed out");
    state_[index] = index_state::committed;
    ++committed_;
  }
}

void epoch_ledger::verify_complete() const {
  for (std::size_t i = 0; i < state_.size(); ++i)
    if (state_[i] != index_state::committed)
      throw ledger_error("ledger: epoch " + std::to_string(epoch_) + " ended but index " + std::to_string(i) +
                         " was never trained (" + std::to_string(committed_) + " of " + std::to_string(state_.size()) +
                         " committed)");
}

ledger_position epoch_ledger::position(std::span<const std::uint32_t> in_flight) const {
  ledger_position p;
  p.epoch = epoch_;
  p.cursor = cursor_;
  p.front.assign(in_flight.begin(), in_flight.end());
  p.front.insert(p.front.end(), front_.begin() + static_cast<std::ptrdiff_t>(front_head_), front_.end());
  return p;
}

}  // namespace dpactor
