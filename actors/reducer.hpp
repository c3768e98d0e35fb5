#pragma once
// The reducer actor: step orchestrator and membership authority. It owns the
// current generation (ordered members; rank = position) and its collective
// group, tallies the devices' one-way reports into committed steps, tells the
// loader what is committed, steers shard sizes and cuts stragglers short,
// detects failed and hung members, forms the next generation, assembles
// checkpoints and events, and decides when the run is over. It is never on a
// step's critical path: devices run from shard to shard on their own
// (See Note [Work flows through the loader]).
//
// Note [Generations]
// A generation ends at a step boundary the reducer chooses:
// - gracefully (a device joins or leaves): the loader pauses after a step L,
//   every member finishes L, and the next generation starts at L + 1 from the
//   members' identical state;
// - on a fault (an exception, an exit, a collective that failed, a member
//   silent past the hang timeout): the reducer aborts the group from outside,
//   asks every survivor for the last step it applied, takes the most advanced
//   one (oldest on a tie) as the state source S, commits the steps up to S,
//   and rolls the loader back so that every index of a later step is handed
//   out again. Work lost: the steps in flight, nothing else.
// Every new generation gets a fresh collective group, and its members adopt
// the state source's state by broadcast (Note [Replica state buffer]).

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/device.hpp"
#include "actors/fault_plan.hpp"
#include "actors/job_config.hpp"
#include "actors/messages.hpp"
#include "actors/run_control.hpp"
#include "actors/straggler.hpp"
#include "tensors/lr_schedule.hpp"

namespace dpactor {

struct member_handle {
  caf::actor actor;
  int id = 0;
  std::string name;
  std::shared_ptr<device_control> control;
};

struct reducer_setup {
  std::shared_ptr<run_control> control;
  std::vector<member_handle> devices;
  // Spawns a new device with the given id (joins); in-process.
  std::function<member_handle(int id)> spawn_device;
  // The collective group of a generation, for its members' device ids.
  std::function<std::shared_ptr<collective_group>(const std::vector<int>& ids)> make_group;
  caf::actor loader;
  caf::actor writer;  // invalid when checkpoints are off
  lr_schedule schedule;
  straggler_config straggler;
  std::int64_t min_devices = 1;
  double hang_timeout_s = 0.0;  // 0 = automatic
  std::int64_t prefetch = 2;
  std::vector<fault_spec> membership_faults;  // leave and join specs
  std::int64_t start_step = 0;
  std::int64_t epoch_steps = 1;  // nominal steps per epoch
  std::int64_t total_steps = 1;  // nominal steps of the run
  std::int64_t log_every = 50;
  bool verify_replicas = false;
  std::chrono::steady_clock::time_point started;
};

struct reducer_state {
  using clock = std::chrono::steady_clock;

  struct member_info {
    member_handle handle;
    std::int64_t last_done = -1;    // last step it reported done
    clock::time_point last_heard;   // any report
    clock::time_point step_started; // when its current step began (its previous step_done)
    bool gone = false;              // removed; keeps its rank until the next generation
  };
  struct step_tally {
    std::int32_t reported = 0;
    std::int64_t epoch = 0;
    double loss_sum = 0.0;
    std::int64_t correct = 0;
    std::int64_t samples = 0;
    std::optional<std::uint64_t> checksum;
    std::set<std::int32_t> cut;            // ranks whose cut report is in
    std::vector<std::uint32_t> returned;   // cut indices of all members
    bool checksums_differ = false;
    bool stats_known = false;              // loss, counts and times came in (from rank 0)
    std::vector<float> compute_s;          // per member
    std::vector<float> member_samples;     // per member
    std::vector<float> member_returned;    // per member: how many indices a cut returned
  };
  struct eval_tally {
    std::int32_t reported = 0;
    std::int64_t epoch = 0;
    double loss_sum = 0.0;
    std::int64_t correct = 0;
    std::int64_t samples = 0;
  };
  struct running_stats {
    double loss_sum = 0.0;
    std::int64_t correct = 0;
    std::int64_t samples = 0;
    clock::time_point since;
  };
  struct pending_checkpoint {
    std::optional<std::vector<float>> state;
    std::optional<ledger_position> position;
    bool sent = false;
  };
  enum class phase { running, pausing, recovering, stopping };

  reducer_setup setup;
  phase current = phase::running;
  generation_plan plan;
  std::vector<member_info> members;  // rank order
  std::vector<caf::actor> every_device;  // ever spawned, for shutdown
  int next_device_id = 0;
  throughput_tracker throughput{0.3, 0};
  rolling_median step_intervals{64};

  // Steps, evaluations, checkpoints.
  std::int64_t committed = -1;
  std::map<std::int64_t, step_tally> steps;
  std::map<std::pair<std::int64_t, bool>, eval_tally> evals;  // (step, epoch_end)
  bool eval_outstanding = false;
  std::map<std::int64_t, epoch_ledger_msg> epoch_ledgers;
  running_stats interval;
  running_stats epoch;
  std::int64_t epoch_step = 0;
  std::int64_t interval_cuts = 0;
  std::map<std::int64_t, pending_checkpoint> checkpoints;
  std::optional<work_done_msg> work;
  std::optional<std::int64_t> final_eval_step;
  std::optional<std::int64_t> last_checkpoint;
  std::vector<double> sent_shares;

  // Who members waiting in a collective last reported late (late_msg).
  struct late_report {
    std::int64_t step = -1;
    std::vector<std::int32_t> missing;
    std::vector<std::int32_t> waiting;  // the members that reported
  };
  late_report late;
  clock::time_point last_progress;  // last commit or evaluation result

  // Membership changes.
  std::vector<fault_spec> planned_changes;      // leave/join specs not yet applied, by step
  std::vector<std::string> pending_leaves;      // names
  std::int64_t pending_joins = 0;
  std::vector<std::shared_ptr<std::promise<std::string>>> join_replies;
  std::optional<std::int64_t> pause_point;      // last step before a graceful change
  std::vector<std::string> change_reasons;      // for the next membership event
  std::map<int, std::int64_t> suspend_replies;  // device id -> last step applied
  std::set<int> awaiting_suspend;               // device ids
  std::optional<clock::time_point> fault_time;  // detection of the fault being recovered from
  std::int64_t requeued_by_fault = 0;
  std::optional<std::pair<std::int64_t, std::vector<float>>> rescue_state;  // from a failed device
  std::string stop_message;                     // why training is stopping (phase::stopping)

  run_summary summary;
  clock::time_point train_start;
  clock::time_point last_commit;
  bool stop_requested = false;
  bool failed = false;
  static inline const char* name = "reducer";
};

using reducer_ptr = caf::stateful_actor<reducer_state>*;

caf::behavior reducer_actor(caf::stateful_actor<reducer_state>* self, reducer_setup setup);

// Steps (reducer.cpp), used by the membership code.
// Adds a committed step to the statistics; appends its returned indices.
void account_step(reducer_ptr self, std::int64_t step, reducer_state::step_tally&& tally, committed_msg& commit);
void maybe_finish(reducer_ptr self);
void try_write_checkpoint(reducer_ptr self, std::int64_t step);

// Membership (reducer_membership.cpp), used by the reducer's handlers.
void form_generation(reducer_ptr self, std::int32_t state_source);
void handle_fault(reducer_ptr self, std::optional<std::size_t> rank, const std::string& reason);
void request_graceful_change(reducer_ptr self);
void check_pause_complete(reducer_ptr self);
void check_hangs(reducer_ptr self);
void on_late(reducer_ptr self, const late_msg& msg);
double hang_timeout(const reducer_state& st);
void fail_run(reducer_ptr self, std::exception_ptr error);

}  // namespace dpactor
