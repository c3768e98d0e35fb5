#pragma once
// The steps a data_source has handed out and not yet committed, in step
// order, each with what it carries (`Payload`: a file-backed step's indices,
// a stream step's chunk) and whether a checkpoint is taken right after it.
// Both sources commit and roll back the same way, walking these steps
// (train/data_source.hpp); booked_source<Payload> is the part of a
// data_source that is this book alone.

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "train/data_source.hpp"
#include "train/step_record.hpp"

namespace dpactor {

template <class Payload>
class in_flight_steps {
 public:
  // A new step's payload, to fill in.
  Payload& add(std::int64_t step) { return steps_[step].payload; }
  std::size_t size() const noexcept { return steps_.size(); }
  bool empty() const noexcept { return steps_.empty(); }
  bool contains(std::int64_t step) const { return steps_.count(step) != 0; }
  void mark_snapshot(std::int64_t step) { steps_.at(step).snapshot = true; }
  bool snapshot_marked(std::int64_t step) const { return steps_.at(step).snapshot; }

  // Commits every step up to `through`, oldest first: commit(step, payload,
  // returned) with the step's entry of `returned` (in step order; null when
  // the step has none), then the step leaves the book. For a step marked for
  // a snapshot, position_after(step) is taken once it has left (later steps
  // still in flight) and returned with the others, in order.
  template <class Commit, class PositionAfter>
  std::vector<data_source::snapshot> commit_through(std::int64_t through, std::span<const step_returned> returned,
                                                    Commit commit, PositionAfter position_after) {
    std::vector<data_source::snapshot> snapshots;
    std::size_t next_returned = 0;
    while (!steps_.empty() && steps_.begin()->first <= through) {
      auto it = steps_.begin();
      const std::int64_t step = it->first;
      while (next_returned < returned.size() && returned[next_returned].step < step) ++next_returned;
      const step_returned* back =
          next_returned < returned.size() && returned[next_returned].step == step ? &returned[next_returned] : nullptr;
      commit(step, it->second.payload, back);
      const bool wanted = it->second.snapshot;
      steps_.erase(it);
      if (wanted) snapshots.push_back({step, position_after(step)});
    }
    return snapshots;
  }

  // Removes every step after `through`, oldest first, handing each payload
  // to take(payload).
  template <class Take>
  void take_after(std::int64_t through, Take take) {
    for (auto it = steps_.upper_bound(through); it != steps_.end();) {
      take(it->second.payload);
      it = steps_.erase(it);
    }
  }

  // visit(payload) for each step after `step`, oldest first.
  template <class Visit>
  void for_each_after(std::int64_t step, Visit visit) const {
    for (auto it = steps_.upper_bound(step); it != steps_.end(); ++it) visit(it->second.payload);
  }

 private:
  struct entry {
    Payload payload{};
    bool snapshot = false;
  };
  std::map<std::int64_t, entry> steps_;
};

// The part of a data_source that is the book of its steps in flight.
template <class Payload>
class booked_source : public data_source {
 public:
  std::size_t steps_in_flight() const override { return in_flight_.size(); }
  bool in_flight(std::int64_t step) const override { return in_flight_.contains(step); }
  void mark_snapshot(std::int64_t step) override { in_flight_.mark_snapshot(step); }
  bool snapshot_marked(std::int64_t step) const override { return in_flight_.snapshot_marked(step); }
  std::int64_t committed_samples() const override { return committed_samples_; }

 protected:
  in_flight_steps<Payload> in_flight_;
  std::int64_t committed_samples_ = 0;  // the implementations' commit() counts them
};

}  // namespace dpactor
