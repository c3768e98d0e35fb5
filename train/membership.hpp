#pragma once
// The reducer's membership book-keeping, free of actors (See Note
// [Generations] in actors/reducer.hpp): the members of the current generation
// in rank order, keyed by device id; the generation number; the changes that
// wait for a step boundary (joins, leaves, planned join/leave specs); the
// choice of the state source after a fault; and who is suspected when a step
// stops making progress.
//
// Invariants: a member removed during a generation keeps its rank (marked
// gone) until the next generation is formed, so ranks in reports stay valid;
// a device id is a member at most once.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "train/fault_plan.hpp"

namespace dpactor {

struct member {
  int id = 0;        // device number, stable across generations
  std::string name;  // "cpu:0"
  bool gone = false; // removed; keeps its rank until the next generation
};

// After a fault: the state every survivor adopts, and the last step it holds.
struct state_source {
  std::optional<std::size_t> rank;  // none: no survivor holds a usable state
  std::int64_t through = -1;        // steps up to this one are in that state
};

class membership {
 public:
  using clock = std::chrono::steady_clock;

  // `planned`: join and leave specs, applied at their step boundaries.
  membership(std::vector<member> initial, std::vector<fault_spec> planned);

  std::int64_t generation() const noexcept { return generation_; }
  const std::vector<member>& members() const noexcept { return members_; }
  std::size_t live() const noexcept;
  std::optional<std::size_t> rank_of(int id) const noexcept;
  std::optional<std::size_t> rank_of(const std::string& name) const noexcept;

  // --- changes -------------------------------------------------------------
  // Takes a member out (it stays at its rank, gone); the reason goes into the
  // next generation's event. False if it was gone already.
  bool remove(std::size_t rank, const std::string& reason);
  // A reason for the next generation that names no member (a stall).
  void note(const std::string& reason);
  void request_join() { ++pending_joins_; }
  // A graceful leave at the next boundary; false if `name` is not a member.
  bool request_leave(const std::string& name);
  void plan(const fault_spec& change);
  // The last step before the next graceful change: the committed step when a
  // join or leave is pending, else the step before the earliest planned one;
  // none when nothing is waiting. Planned changes after `last_step` (the
  // run's last) are dropped: they would never happen.
  std::optional<std::int64_t> next_pause(std::int64_t committed, std::optional<std::int64_t> last_step);
  // At the pause point: planned changes due by then become pending.
  void take_due_changes(std::int64_t pause_point);
  // Removes the members whose leave is pending, except `keep` (the state
  // source), whose leave waits for the next boundary; then gone members
  // leave their ranks (ranks change: a new generation must follow). Returns
  // the ids of the members that left.
  std::vector<int> apply_leaves(std::optional<int> keep = std::nullopt);
  // How many joins are pending; they are admitted with admit().
  std::int64_t pending_joins() const noexcept { return pending_joins_; }
  void admit(member newcomer);
  // Why the next generation will differ, joined with "; ".
  std::string reasons() const;
  // Starts the next generation: gone members leave their ranks. Returns the
  // reasons for the change.
  std::string form_generation();

  // --- faults --------------------------------------------------------------
  // The most advanced survivor, by the last step each applied (`applied`, by
  // device id); the oldest (lowest rank) on a tie. A survivor behind
  // `committed` holds no state worth keeping (a newcomer whose broadcast
  // failed). A rescue state (a failed device's last state, `rescue_step`)
  // counts only when no survivor qualifies; it is ignored if behind
  // `committed`.
  state_source choose_state_source(const std::map<int, std::int64_t>& applied, std::int64_t committed,
                                   std::optional<std::int64_t> rescue_step) const;

  // A member waiting in step `step`'s collective reported the ranks it
  // waits for (`missing`; empty when the backend cannot tell). Returns the
  // ranks to cut. The suspects of the step are those missing from every
  // report, never one that reported waiting itself.
  std::vector<std::int32_t> on_late(std::int64_t step, std::int32_t rank, std::span<const std::int32_t> missing,
                                    std::int64_t committed);
  // The ranks the members waiting in the collective of the step after
  // `committed` reported missing (See Note [Progress-based hang detection]).
  std::vector<std::size_t> late_suspects(std::int64_t committed) const;

 private:
  struct late_report {
    std::int64_t step = -1;
    std::vector<std::int32_t> missing;
    std::vector<std::int32_t> waiting;  // the members that reported
  };

  std::vector<member> members_;
  std::int64_t generation_ = -1;
  std::vector<fault_spec> planned_;          // joins and leaves not yet due, by step
  std::vector<std::string> pending_leaves_;  // names
  std::int64_t pending_joins_ = 0;
  std::vector<std::string> reasons_;         // for the next generation's event
  late_report late_;
};

// A generation's members for its log line: every name up to
// `listed_in_full` members, else the first and last few around how many
// are left out ("sim:0, sim:1, ... 992 more ..., sim:999"); the generation
// event and GET /status carry the whole list. A thousand names made each
// line some 10 KB, one a membership change.
std::string member_list(std::span<const std::string> names, std::size_t listed_in_full = 16);

}  // namespace dpactor
