#include "train/issued_records.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "data/epoch_ledger.hpp"

namespace dpactor {
namespace {

constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();

// Row `row` of a chunk as a record again.
record row_record(const dataset& chunk, std::size_t row) {
  const float* f = chunk.features.data() + row * chunk.feature_count;
  return record{chunk.sequences[row], chunk.labels[row], std::vector<float>(f, f + chunk.feature_count)};
}

}  // namespace

issued_records::issued_records(record_queue& queue, const stream_position& resume)
    : queue_(queue),
      base_(resume.committed),
      max_taken_(resume.committed),
      trained_above_(resume.trained_above.begin(), resume.trained_above.end()) {}

data_source::next issued_records::what_next(std::size_t batch) const {
  const std::size_t ready = available();
  if (ready >= batch || (ready > 0 && queue_.closed())) return next::step;
  if (ready == 0 && queue_.closed()) return in_flight_.empty() ? next::end : next::wait_commits;
  return next::wait_records;
}

data_source::step_samples issued_records::issue(std::int64_t step, std::size_t want) {
  scratch_.clear();
  while (scratch_.size() < want && !front_.empty()) {
    scratch_.push_back(std::move(front_.front()));
    front_.pop_front();
  }
  if (scratch_.size() < want) queue_.take(want - scratch_.size(), scratch_);
  auto chunk = std::make_shared<dataset>("stream", scratch_.size(), queue_.feature_count(), queue_.classes());
  chunk->sequences.resize(scratch_.size());
  for (std::size_t i = 0; i < scratch_.size(); ++i) {
    const record& r = scratch_[i];
    std::copy(r.features.begin(), r.features.end(), chunk->features.data() + i * chunk->feature_count);
    chunk->labels[i] = r.label;
    chunk->sequences[i] = r.sequence;
    max_taken_ = std::max(max_taken_, r.sequence);
  }
  in_flight_.add(step) = chunk;
  rows_.resize(chunk->rows);
  std::iota(rows_.begin(), rows_.end(), 0u);
  return {rows_, chunk};
}

std::vector<data_source::snapshot> issued_records::commit(std::int64_t through,
                                                          std::span<const step_returned> returned) {
  return in_flight_.commit_through(
      through, returned,
      [this](std::int64_t step, const std::shared_ptr<const dataset>& flight, const step_returned* sent_back) {
        const dataset& chunk = *flight;
        std::vector<bool> back(chunk.rows, false);
        if (sent_back != nullptr)
          for (const auto row : sent_back->indices) {
            if (row >= chunk.rows || back[row])
              throw ledger_error("stream step " + std::to_string(step + 1) + ": row " + std::to_string(row) +
                                 " returned twice or out of range");
            back[row] = true;
            front_.push_back(row_record(chunk, row));
            ++requeued_;
          }
        for (std::size_t row = 0; row < chunk.rows; ++row) {
          if (back[row]) continue;
          ++committed_samples_;
          const std::int64_t s = chunk.sequences[row];
          if (s <= base_ || !trained_above_.insert(s).second)
            throw ledger_error("stream step " + std::to_string(step + 1) + ": the record with sequence number " +
                               std::to_string(s) + " is already trained");
        }
        advance_base(step);  // (it looks at the steps after this one only)
      },
      [this](std::int64_t step) { return position_after(step); });
}

std::size_t issued_records::roll_back(std::int64_t through) {
  std::vector<record> undo;
  in_flight_.take_after(through, [&](const std::shared_ptr<const dataset>& flight) {
    for (std::size_t row = 0; row < flight->rows; ++row) undo.push_back(row_record(*flight, row));
  });
  front_.insert(front_.begin(), std::make_move_iterator(undo.begin()), std::make_move_iterator(undo.end()));
  return undo.size();
}

std::int64_t issued_records::lowest_untrained(std::int64_t step) const {
  std::int64_t lowest = none;
  for (const record& r : front_) lowest = std::min(lowest, r.sequence);
  in_flight_.for_each_after(step, [&](const std::shared_ptr<const dataset>& flight) {
    for (const auto s : flight->sequences) lowest = std::min(lowest, s);
  });
  return lowest;
}

// Records leave the queue in sequence order, so whatever is still queued, or
// not yet fed, is above every record that went out: below the lowest one not
// trained, or up to the highest that went out when all are, every record fed
// is trained.
void issued_records::advance_base(std::int64_t step) {
  const std::int64_t lowest = lowest_untrained(step);
  base_ = std::max(base_, lowest == none ? max_taken_ : lowest - 1);
  trained_above_.erase(trained_above_.begin(), trained_above_.upper_bound(base_));
}

ledger_position issued_records::position_after(std::int64_t step) const {
  ledger_position position;
  stream_position& p = position.stream;
  p.active = true;
  const std::int64_t lowest = lowest_untrained(step);
  p.committed = std::max(base_, lowest == none ? max_taken_ : lowest - 1);
  for (const auto s : trained_above_)
    if (s > p.committed) p.trained_above.push_back(s);
  return position;
}

data_source::epoch_totals issued_records::end_epoch() { throw std::logic_error("a stream has no epochs to end"); }

void issued_records::start_epoch(std::int64_t) { throw std::logic_error("a stream has no epochs to start"); }

bool issued_records::wake_when_ready(std::size_t batch, std::function<void()> wake) {
  const std::size_t want = batch > front_.size() ? batch - front_.size() : 0;
  return queue_.notify_when(want, std::move(wake));
}

}  // namespace dpactor
