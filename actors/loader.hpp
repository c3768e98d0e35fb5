#pragma once
// The loader actor: owns the sampler and the epoch ledger, cuts every step's
// global batch into one shard per member, and streams work to the devices.
//
// Note [Work flows through the loader]
// Everything a device does arrives from the loader, in one FIFO stream per
// device: begin_generation, then shards, with evaluate, snapshot and finish
// messages placed between them exactly at the step boundary they belong to.
// CAF keeps the order of messages between two actors, so "snapshot after step
// 470" needs no synchronisation: the device reaches it after shard 470 and
// before shard 471. The loader keeps `train.prefetch` shard messages queued
// ahead at each device, so a device finds its next shard already there. At
// small step times one message carries several consecutive steps
// (train.steps_per_message, automatic by default: about 2 ms of work per
// message), which keeps the control plane's messages, and the cores their
// handling takes from the devices, rare. The reducer steers only through the
// loader (plans, commits, stop).
//
// A failure rolls the loader back to the state source's last step: later steps'
// indices go back to the ledger's front and are planned again, with the same
// step numbers, for the next generation.
//
// The loader draws steps from a data_source (train/data_source.hpp) and
// does what it says comes next, never asking which kind it is. A stream has
// no epochs: a step is the next batch_size records of the stream (See Note
// [Exactly-once offsets]), and the loader waits, telling the reducer it is
// idle, while fewer are queued. At the end of the stream
// the last step takes what is left, and the run ends as after its last epoch.
//
// Epochs do not overlap: the next epoch's shards go out once every index of
// the current one is committed and its evaluation is complete, so indices
// re-queued late in an epoch are still trained in it, the evaluation sees the
// epoch's final parameters, and an evaluation cut short by a failure is simply
// sent again to the next generation.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include <caf/all.hpp>

#include "train/round_shape.hpp"

#include "actors/protocol.hpp"
#include "data/record_queue.hpp"
#include "train/data_source.hpp"

namespace dpactor {

struct loader_setup {
  std::size_t train_rows = 0;
  std::size_t test_rows = 0;
  std::int64_t batch_size = 1;
  std::int64_t epoch_steps = 1;       // full-epoch steps without cuts (See Note [Schedule position])
  std::int64_t epochs = 1;
  std::int64_t eval_every = 1;        // epochs between test evaluations; 0 = only at the end
  std::int64_t max_steps = 0;  // 0 = no limit
  std::int64_t prefetch = 2;          // shard messages queued ahead at each device (at most, with work_ahead_s)
  double work_ahead_s = 0.0;          // > 0: about this much work queued ahead (See Note [Work queued ahead across processes])
  std::int64_t steps_per_message = 0; // 0 = automatic
  std::uint64_t seed = 0;
  bool shuffle = true;
  bool checkpoints = false;          // a checkpoint is wanted at the end
  std::int64_t checkpoint_every = 0;
  std::int64_t start_step = 0;       // steps already trained (resume)
  std::uint32_t slice_rows = 0;      // reproducible mode: the slice size (See Note [Stealing slices])
  bool steal_slices = false;         // ... and whether members steal them
  // Round modes: a step is a round of batch_size = H x B samples, a slice is a
  // logical worker's share (See Note [Round data]).
  std::optional<round_shape> rounds;
  std::optional<std::int64_t> crash_at;  // fault spec crash:loader@S: throw as this step is issued
  std::optional<ledger_position> resume_position;
  double checkpoint_every_s = 0.0;  // also a checkpoint when this long passed since the last (0: off)
  // Stream mode (train.mode = "stream"): the records to train, in place of
  // the training set (See Note [Exactly-once offsets]). In-process only.
  std::shared_ptr<record_queue> stream;
};

struct loader_state {
  loader_setup setup;
  // Round modes: every round's shard, whole (See Note [Replaying a lost
  // worker's rounds]): its step's indices, slices and position, about
  // 0.5 KB a round on the default job.
  std::map<std::int64_t, step_shard> round_log;
  reducer_actor reducer;  // from the generation plan
  std::unique_ptr<data_source> source;  // the training set's epochs or the stream, and the steps in flight
  bool idle = false;                     // told the reducer it waits for records (a stream)
  std::chrono::steady_clock::time_point last_snapshot_mark{};
  std::int64_t last_snapshot_step = -1;  // the step of the last checkpoint asked for
  double lr_override = 0.0;               // > 0: every step issued carries it (Engine::set_lr)
  bool checkpoint_requested = false;      // Engine::request_checkpoint: at the next step issued
  generation_plan plan;
  bool have_plan = false;
  // The last step issued: its slices and generation (See Note [A
  // checkpoint's logical workers]).
  std::size_t issued_slices = 0;
  std::int64_t issued_generation = -1;
  std::vector<double> weights;         // shard shares, rank order (empty: even)
  std::int64_t next_step = 0;
  std::int64_t committed_step = -1;
  std::optional<std::int64_t> pause_after;  // issue no step after this one
  bool paused = false;                      // until the next generation plan
  bool finished = false;
  bool stop_requested = false;
  std::int64_t requeued_before = 0;  // indices re-queued in earlier epochs of this run
  std::int64_t steps_per_message = 1;
  double step_seconds = 0.0;          // smoothed time per committed step
  std::chrono::steady_clock::time_point last_commit_time{};
  std::int64_t last_commit_step = -1;
  std::optional<evaluate_msg> pending_eval;  // sent, not yet complete: re-sent to a new generation
  static inline const char* name = "loader";
};

loader_actor::behavior_type loader_behavior(loader_actor::stateful_pointer<loader_state> self, loader_setup setup);

}  // namespace dpactor
