#pragma once
// The loader's book of the steps it has handed out, over the epoch ledger:
// which indices each step in flight carries, what a commit does to them
// (cut indices go back to the ledger, the rest is committed), and what a
// rollback does (every index of a step after the state source's goes back to
// the front, in order, to be planned again under the same step numbers).
// Together with the step book this is the whole of exactly-once, and it is
// tested the same way (tests/step_book_test.cpp), without actors.

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "data/epoch_ledger.hpp"
#include "train/step_record.hpp"

namespace dpactor {

class issued_steps {
 public:
  issued_steps(std::size_t samples, std::uint64_t seed, bool shuffle) : ledger_(samples, seed, shuffle) {}

  epoch_ledger& ledger() noexcept { return ledger_; }
  const epoch_ledger& ledger() const noexcept { return ledger_; }
  bool empty() const noexcept { return in_flight_.empty(); }
  bool in_flight(std::int64_t step) const { return in_flight_.count(step) != 0; }

  // Hands out up to `want` indices for `step` (re-queued ones first); the
  // returned span stays valid until the step is committed or rolled back.
  std::span<const std::uint32_t> issue(std::int64_t step, std::size_t want);
  // A checkpoint is taken after `step`: commit() reports it.
  void mark_snapshot(std::int64_t step) { in_flight_.at(step).snapshot = true; }
  bool snapshot_marked(std::int64_t step) const { return in_flight_.at(step).snapshot; }
  // A checkpoint's ledger: where the epoch stood once `step` was committed.
  struct snapshot {
    std::int64_t step = 0;
    ledger_position position;
  };
  // Commits every step up to `through`, in order; each step's `returned`
  // indices (cut, never trained) go back to the ledger. Returns the ledger
  // positions of the committed steps marked for a snapshot, each taken right
  // after its step (later steps still in flight).
  std::vector<snapshot> commit(std::int64_t through, std::span<const step_returned> returned);
  // Steps after `through` are not in the next generation's state: their
  // indices go back to the front, in order. Returns how many.
  std::size_t roll_back(std::int64_t through);
  // The ledger as a checkpoint after `step` records it: the indices of later
  // steps in flight count as not handed out.
  ledger_position position_after(std::int64_t step) const;

 private:
  struct step_in_flight {
    std::vector<std::uint32_t> indices;  // all shards, rank order
    bool snapshot = false;
  };
  epoch_ledger ledger_;
  std::map<std::int64_t, step_in_flight> in_flight_;
  mutable std::vector<std::uint32_t> scratch_;
};

}  // namespace dpactor
