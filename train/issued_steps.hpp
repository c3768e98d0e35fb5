#pragma once
// The data_source of a file-backed training set, in epochs: the loader's
// book of the steps it has handed out, over the epoch ledger:
// which indices each step in flight carries, what a commit does to them
// (cut indices go back to the ledger, the rest is committed), and what a
// rollback does (every index of a step after the state source's goes back to
// the front, in order, to be planned again under the same step numbers).
// Together with the step book this is the whole of exactly-once, and it is
// tested the same way (tests/step_book_test.cpp), without actors.

#include <cstdint>
#include <span>
#include <vector>

#include "data/epoch_ledger.hpp"
#include "train/data_source.hpp"
#include "train/in_flight_steps.hpp"
#include "train/step_record.hpp"

namespace dpactor {

class issued_steps final : public booked_source<std::vector<std::uint32_t>> {
 public:
  issued_steps(std::size_t samples, std::uint64_t seed, bool shuffle) : ledger_(samples, seed, shuffle) {}

  epoch_ledger& ledger() noexcept { return ledger_; }
  const epoch_ledger& ledger() const noexcept { return ledger_; }

  next what_next(std::size_t batch) const override;
  // Up to `batch` indices for `step` (re-queued ones first), into the
  // training set.
  step_samples issue(std::int64_t step, std::size_t batch) override;
  // Each step's `returned` indices go back to the ledger.
  std::vector<snapshot> commit(std::int64_t through, std::span<const step_returned> returned) override;
  // Every index of a later step goes back to the ledger's front, in order.
  std::size_t roll_back(std::int64_t through) override;
  // The ledger as a checkpoint after `step` records it: the indices of later
  // steps in flight count as not handed out.
  ledger_position position_after(std::int64_t step) const override;

  std::int64_t epoch() const override { return ledger_.epoch(); }
  double schedule_position(std::int64_t step, std::int64_t epoch_steps, std::int64_t batch) const override;
  std::int64_t requeued() const override { return static_cast<std::int64_t>(ledger_.requeued_total()); }
  epoch_totals end_epoch() override;
  void start_epoch(std::int64_t epoch) override { ledger_.start_epoch(epoch); }
  // Never waits for records: throws std::logic_error.
  bool wake_when_ready(std::size_t batch, std::function<void()> wake) override;

 private:
  // In flight: each step's indices, all shards, rank order.
  epoch_ledger ledger_;
  mutable std::vector<std::uint32_t> scratch_;
};

}  // namespace dpactor
