#pragma once
// The reducer's step accounting, free of actors: it tallies the members'
// step records and cut reports, decides when a step is complete, commits
// complete steps in order (or, after a fault, the steps the state source
// holds), tallies evaluations, keeps the running statistics and the run
// summary, and produces the step, epoch and recovery events.
//
// Exactly-once: a step is committed once, in order, and only after the
// untouched indices of every member that was cut are in (they go back to
// the ledger with the commit: See Note [Cutting a step short]). Commits are
// what the loader applies to its data_source; tests/step_book_test.cpp
// drives both through sequences of reports, cuts and failures and checks the
// epoch ledger after each.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include <dpactor/error.hpp>
#include "tensors/lr_schedule.hpp"
#include "tensors/mlp.hpp"
#include <dpactor/events.hpp>
#include "train/step_record.hpp"
#include "train/straggler.hpp"

namespace dpactor {

// train.verify_replicas found two members that carried different state or
// step counters into a step.
// A step's loss or gradients held NaN or infinite values and
// train.on_nonfinite is "stop" (See Note [Non-finite steps]).
struct nonfinite_step : training_error {
  nonfinite_step(std::int64_t step, const std::string& what) : training_error(what), step(step) {}
  std::int64_t step;  // 0-based
};

struct replicas_diverged : training_error {
  replicas_diverged(std::int64_t step, std::int32_t rank, std::int32_t other, const std::string& what)
      : training_error(what), step(step), rank(rank), other(other) {}
  std::int64_t step;  // 0-based
  std::int32_t rank, other;
};

// What the devices' collectives sent so far (See Note [Bytes sent]).
struct bytes_totals {
  std::uint64_t sent = 0;
  std::uint64_t largest_call = 0;
};

struct step_book_setup {
  lr_schedule schedule;
  std::int64_t start_step = 0;   // steps already trained (resume)
  std::int64_t epoch_steps = 1;  // nominal steps per epoch
  std::int64_t total_steps = 1;  // nominal steps of the run
  std::int64_t log_every = 50;
  bool verify_replicas = false;  // every member reports its checksum; a step needs them all
  bool skip_nonfinite = false;   // train.on_nonfinite = "skip": such steps commit, unapplied
  double smoothing = 0.3;        // of the members' throughput averages
  std::function<bytes_totals()> bytes;  // null: not counted
};

// What a commit tells the loader: every step up to `through` is trained,
// except the `returned` indices of cut members.
struct step_commit {
  std::int64_t through = -1;
  std::vector<step_returned> returned;
  std::vector<std::string> skipped;  // why each step skipped for non-finite values was skipped
};

// An epoch as the loader's ledger closed it.
struct epoch_close {
  std::int64_t epoch = 0;
  std::int64_t committed = 0;  // indices committed in the epoch
  std::int64_t requeued = 0;
  bool evaluated = true;       // an evaluation of the test set follows
};

class step_book {
 public:
  using clock = std::chrono::steady_clock;
  using event_sink = std::function<void(const event&)>;

  step_book(step_book_setup setup, event_sink emit, clock::time_point now);

  std::int64_t committed() const noexcept { return committed_; }
  clock::time_point last_progress() const noexcept { return last_progress_; }
  clock::time_point last_commit() const noexcept { return last_commit_; }
  clock::time_point started() const noexcept { return started_; }
  double median_step_s() const { return step_intervals_.median(); }
  const throughput_tracker& throughput() const noexcept { return throughput_; }
  run_summary& summary() noexcept { return summary_; }
  const run_summary& summary() const noexcept { return summary_; }

  // A new generation of `members` trains from committed() + 1: tallies of
  // steps and evaluations in flight are dropped, throughput is measured anew.
  void start_generation(std::int64_t generation, std::size_t members, clock::time_point now);

  // A member's record of a step (rank 0 carries the step's statistics; with
  // verify_replicas every member reports its checksum). Reports of a step
  // committed already are ignored.
  void record(std::int32_t rank, step_record&& rec);
  // A cut member's untouched indices of `step`.
  void cut(std::int64_t step, std::int32_t rank, std::span<const std::uint32_t> returned);
  // Commits the complete steps that follow committed(), in order. Throws
  // replicas_diverged if two members carried different state into a step
  // (verify_replicas), nonfinite_step if a step's loss or gradients were not
  // finite and such steps are not skipped.
  step_commit commit_ready(std::size_t members, clock::time_point now);
  // After a fault: the state source holds every step up to `through`,
  // complete or not; they are committed as they stand and everything in
  // flight is dropped. A step whose record the fault lost counts no samples
  // until the loader has applied the commit: rollback_applied().
  step_commit commit_through(std::int64_t through, clock::time_point now);
  // The loader applied the oldest commit_through() not yet answered: it has
  // committed `committed_samples` samples in this run, the steps that came
  // without their record included; the summary counts those now.
  void rollback_applied(std::int64_t committed_samples);

  // A fault was detected: the first step of the generation formed after it
  // to commit emits a recovery event, whether it commits on its record or
  // in the recovery from a later fault (steps come in batches, See Note
  // [One step report], and a fault can take a batch's record with it); the
  // steps the fault's own commit_through() commits were trained before it.
  // A second fault before the next generation forms is the same recovery.
  void fault_detected(clock::time_point now);
  // The indices the last fault handed out again.
  void requeued_by_fault(std::int64_t indices);

  // One member's share of an evaluation; true once every member's is in
  // (the summary then holds the test results, and an epoch's evaluation
  // emits the epoch event).
  bool evaluated(std::int64_t step, bool epoch_end, std::int64_t epoch, double loss_sum, std::int64_t correct,
                 std::int64_t samples, std::size_t members, clock::time_point now);
  // The loader closed an epoch; without an evaluation its event goes out now.
  void epoch_closed(const epoch_close& e, clock::time_point now);
  // The run ends: the last committed step gets its step event if it has
  // none yet (as every epoch's last step does before its epoch event).
  void log_last_step(clock::time_point now);

 private:
  struct step_tally {
    std::int32_t reported = 0;
    std::int64_t epoch = 0;
    batch_stats stats;                     // the step's, over all members
    // train.verify_replicas: what the first member to report carried into
    // the step, and the first member that carried something else.
    std::optional<std::uint64_t> checksum;
    std::int64_t counter = 0;
    std::int32_t first_rank = 0;
    std::optional<std::int32_t> differs;
    bool stats_known = false;              // loss, counts and times came in (from rank 0)
    std::set<std::int32_t> cut;            // ranks whose cut report is in
    std::vector<std::uint32_t> returned;   // cut indices of all members
    std::vector<float> compute_s;          // per member
    std::vector<float> member_samples;     // per member
    std::vector<float> member_returned;    // per member: how many indices a cut returned
    std::optional<double> lr;              // the rate applied (rank 0's report)
    std::int64_t nonfinite = 0;            // non-finite gradient values (rank 0's report)
    bool applied = true;
  };
  struct eval_tally {
    std::int32_t reported = 0;
    std::int64_t epoch = 0;
    batch_stats stats;
  };
  struct running_stats {
    batch_stats stats;
    clock::time_point since;
  };

  bool complete(const step_tally& t, std::size_t members) const;
  void account(std::int64_t step, step_tally&& t, step_commit& commit, clock::time_point now);
  void emit_step(std::int64_t step, clock::time_point now);
  void emit_epoch(std::int64_t epoch, std::int64_t step, double test_loss, double test_accuracy, clock::time_point now);

  step_book_setup setup_;
  event_sink emit_;
  std::int64_t committed_;
  std::int64_t generation_ = 0;
  std::map<std::int64_t, step_tally> steps_;
  std::map<std::pair<std::int64_t, bool>, eval_tally> evals_;  // (step, epoch_end)
  std::map<std::int64_t, epoch_close> epoch_closes_;
  running_stats interval_, epoch_stats_;
  std::int64_t epoch_step_ = 0;
  std::int64_t logged_ = -1;           // the last step with a step event
  // The last committed step's epoch and rate: a step committed without its
  // record (after a fault) is in the epoch of the steps before it, or the
  // next one once that epoch's event went out.
  std::int64_t epoch_ = 0;
  std::optional<double> lr_;
  std::int64_t interval_cuts_ = 0;
  std::int64_t interval_skipped_ = 0;
  std::int64_t consecutive_skips_ = 0;
  std::int64_t rate_samples_ = 0;  // since interval_.since
  double last_rate_ = 0.0;         // samples/s of the last step event
  throughput_tracker throughput_;
  rolling_median step_intervals_{64};
  clock::time_point started_, last_commit_, last_progress_;
  // Faults whose recovery event is still to come, oldest first.
  struct pending_recovery {
    clock::time_point detected;
    std::optional<std::int64_t> from;  // the first step of the generation formed after it
    std::int64_t requeued = 0;
  };
  std::deque<pending_recovery> recoveries_;
  std::int64_t skipped_samples_ = 0;  // of steps skipped for non-finite values
  // The samples of the records booked at each commit_through() the loader
  // has not answered yet, oldest first.
  std::deque<std::int64_t> booked_at_rollback_;
  run_summary summary_;
};

}  // namespace dpactor
