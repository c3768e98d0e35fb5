#pragma once
// What the engine reports while it trains (public API): to the event
// callbacks (Engine::on_event), and through the command line to the metrics
// file as JSON Lines (train/event_json.hpp).

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

namespace dpactor {

// sync.mode = "async": one logical worker's account so far (docs/async.md,
// "Asynchronous rounds").
struct worker_account {
  std::int64_t contributed = 0;  // contributions merged into committed rounds
  std::int64_t dropped = 0;      // dropped as stale (their samples trained again)
  double mean_staleness = 0.0;   // rounds, over its merged contributions
  std::int64_t inner_steps = 0;  // of its last round (H_k)
  double samples_per_s = 0.0;    // its smoothed throughput
};

// Every train.log_every steps, and for the last step of each epoch and of
// the run when it is not one of those.
struct step_event {
  std::int64_t step = 0;           // optimizer steps done
  std::int64_t epoch = 0;          // 0-based
  std::int64_t epoch_step = 0;     // steps done in this epoch
  std::int64_t epoch_steps = 0;    // nominal steps per epoch
  std::int64_t total_steps = 0;    // nominal steps of the whole run
  double loss = 0.0;               // mean over the samples since the last step event
  double accuracy = 0.0;           // training accuracy over the same samples
  double lr = 0.0;                 // rate of the last step
  double samples_per_s = 0.0;      // since the last step event
  std::int64_t generation = 0;
  std::int64_t cuts = 0;           // members cut short since the last step event
  std::int64_t skipped = 0;        // steps skipped for non-finite values since the last step event
  std::vector<double> shares;      // each member's share of the global batch, rank order
  std::vector<double> throughput;  // each member's smoothed samples/s, rank order
  std::int64_t bytes_sent = 0;     // by every device's collectives so far (docs/async.md, "Bytes sent")
  std::int64_t samples = 0;        // samples trained in this run so far (as run_summary::samples)
  std::vector<worker_account> workers;  // sync.mode = "async": each logical worker's, worker order; else empty
};

struct epoch_event {
  std::int64_t epoch = 0;
  std::int64_t step = 0;
  double train_loss = 0.0;
  double train_accuracy = 0.0;
  double test_loss = 0.0;
  double test_accuracy = 0.0;
  double samples_per_s = 0.0;
  double seconds = 0.0;
  std::int64_t samples = 0;     // committed this epoch
  std::int64_t requeued = 0;    // indices handed out again this epoch
};

struct membership_event {
  std::int64_t generation = 0;
  std::int64_t step = 0;                   // steps done when the generation starts
  std::vector<std::string> members;        // rank order
  std::vector<std::uint64_t> actor_ids;    // the members' actor ids: a restarted member would get a new one
  std::string reason;                      // "start", "cpu:1 failed: ...", "cpu:3 joined", "cpu:0 left", "cpu:2 hung: ..."
};

// The first step committed after a membership change caused by a fault.
struct recovery_event {
  std::int64_t generation = 0;
  std::int64_t step = 0;
  double recovery_ms = 0.0;  // from the fault's detection to the step's commit
  std::int64_t requeued = 0; // indices handed out again because of the fault
};

struct checkpoint_event {
  std::int64_t step = 0;
  std::string path;
  // Stream mode: every record fed up to this sequence number is trained and
  // inside this checkpoint: commit the upstream offset after it (See Note
  // [Exactly-once offsets], data/record_queue.hpp). -1: none, or no stream.
  std::int64_t committed_sequence = -1;
};

// What one device trained in one step it applied, reported by the device
// itself when train.record_trained is on: evidence of exactly-once that does
// not come from the ledger that keeps it. Over an epoch the samples of every
// device's reports add up to the training set's size, and their digests to
// the digest of every index, when each sample was trained exactly once.
struct trained_event {
  std::string device;
  std::int64_t step = 0;    // 0-based step
  std::int64_t epoch = 0;
  std::int64_t samples = 0;
  std::uint64_t digest = 0;  // the sum, mod 2^64, of sample_digest(i) over the indices trained
  // A checksum of the state the device carried into the step (parameters,
  // optimizer slots, step counter), taken before the step's gather: equal on
  // every member of a step when the replicas are identical.
  std::uint64_t carried = 0;
  // The generation the device trained the step in. A device in another
  // process than the coordinator says what it trained before the step's
  // exchange (See Note [A remote device's record arrives before its
  // gradients]), so its record may be of a step that membership_event
  // then rolls back: it counts only if no later generation starts at or
  // before its step.
  std::int64_t generation = 0;
  // sync.mode = "async": the logical worker and its own round number (See
  // round_decision_event): its samples count if a decision merged that round;
  // `step` is then the worker's round too, and `carried` 0. -1 otherwise.
  std::int64_t worker = -1;
  std::int64_t worker_round = -1;
};

// sync.mode = "async": one decision of the commit rule that merged or
// dropped contributions, in the order the run made them; with the run's
// config and data they fix its bytes (docs/async.md, "Replay":
// run_options::replay_rounds runs a job again following them).
struct round_contribution {
  std::int64_t worker = 0;
  std::int64_t worker_round = 0;  // the worker's own round counter (its first round is 0)
  std::int64_t base_round = 0;    // the committed rounds of the global weights it started from
  // Its claim: positions [first, first + samples) of epoch `epoch`'s order.
  std::int64_t epoch = 0;
  std::int64_t first = 0;
  std::int64_t samples = 0;
};
struct round_decision_event {
  std::int64_t round = 0;         // the open round: committed rounds before it
  bool committed = false;         // the round committed, merging `merged`
  std::vector<round_contribution> merged;   // in arrival order
  std::vector<round_contribution> dropped;  // past sync.max_staleness: their samples went back
  // Rounds whose device was lost before they arrived (a record of its own:
  // not committed, nothing merged or dropped): their samples went back, and
  // the worker runs that round again (docs/async.md, "Faults").
  std::vector<round_contribution> lost;
  // The run's first record only: what a replay must match (the config
  // without its node-specific parts, and the data's fingerprint).
  std::string job;
  std::string data;
  std::int64_t workers = 0;  // K logical workers (the first record only)
};

using event = std::variant<step_event, epoch_event, membership_event, recovery_event, checkpoint_event, trained_event,
                           round_decision_event>;

struct run_summary {
  double test_accuracy = 0.0;
  double test_loss = 0.0;
  double samples_per_s = 0.0;  // training samples over training time
  double wall_s = 0.0;         // from start() to the end, data loading included
  double train_s = 0.0;
  std::int64_t steps = 0;      // optimizer steps done in total (resumed ones included)
  std::int64_t epochs = 0;     // epochs completed
  std::int64_t samples = 0;    // samples trained in this run
  std::int64_t membership_changes = 0;
  std::int64_t cuts = 0;          // members cut short at their deadline
  std::int64_t skipped_steps = 0; // not applied: non-finite loss or gradients (train.on_nonfinite = "skip")
  std::int64_t requeued = 0;      // indices handed out again (cuts and faults)
  // Bytes every device's collectives sent in this run, and the most one call
  // of one device sent (docs/async.md, "Bytes sent"); every process's devices.
  std::int64_t bytes_sent = 0;
  std::int64_t largest_send = 0;
  // Round exchanges that ran while the next round computed (sync.delay = 1,
  // sync.overlap; docs/async.md), counted by the devices of this process.
  std::int64_t overlapped_exchanges = 0;
  double max_recovery_ms = 0.0;   // longest fault-to-next-step time
  std::string checkpoint;      // the last checkpoint written, if any
  bool stopped = false;        // ended by stop() before the planned end
};

// Called on an engine thread for every event; must not block for long.
using event_callback = std::function<void(const event&)>;

}  // namespace dpactor
