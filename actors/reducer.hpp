#pragma once
// The reducer actor: step orchestrator and membership authority. It owns the
// current generation (ordered members; rank = position) and its collective
// group, tallies the devices' one-way reports into committed steps, tells the
// loader what is committed, assembles checkpoints and events, and decides when
// the run is over. It is never on a step's critical path: devices run from
// shard to shard on their own (See Note [Work flows through the loader]).

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/messages.hpp"
#include "actors/run_control.hpp"
#include "tensors/lr_schedule.hpp"

namespace dpactor {

struct reducer_setup {
  std::shared_ptr<run_control> control;
  std::vector<caf::actor> devices;
  std::vector<std::string> device_names;
  caf::actor loader;
  caf::actor writer;  // invalid when checkpoints are off
  lr_schedule schedule;
  std::int64_t start_step = 0;
  std::int64_t epoch_steps = 1;  // nominal steps per epoch
  std::int64_t total_steps = 1;  // nominal steps of the run
  std::int64_t log_every = 50;
  bool verify_replicas = false;
  std::chrono::steady_clock::time_point started;
};

struct reducer_state {
  using clock = std::chrono::steady_clock;

  struct step_tally {
    std::int32_t reported = 0;
    std::int64_t epoch = 0;
    double loss_sum = 0.0;
    std::int64_t correct = 0;
    std::int64_t samples = 0;
    std::optional<std::uint64_t> checksum;
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
    std::int64_t steps = 0;
    clock::time_point since;
  };
  struct pending_checkpoint {
    std::optional<std::vector<float>> state;
    std::optional<ledger_position> position;
  };

  reducer_setup setup;
  generation_plan plan;
  std::int64_t committed = -1;  // highest committed step
  std::map<std::int64_t, step_tally> steps;
  std::map<std::pair<std::int64_t, bool>, eval_tally> evals;  // (step, epoch_end)
  std::map<std::int64_t, epoch_ledger_msg> epoch_ledgers;
  running_stats interval;  // since the last step event
  running_stats epoch;     // since the start of the current epoch
  std::int64_t epoch_step = 0;
  std::map<std::int64_t, pending_checkpoint> checkpoints;
  std::optional<work_done_msg> work;
  std::optional<std::int64_t> final_eval_step;  // step of the last completed evaluation
  std::optional<std::int64_t> last_checkpoint;  // step of the last checkpoint written
  run_summary summary;
  clock::time_point train_start;
  clock::time_point last_commit;
  bool stop_requested = false;
  bool failed = false;
  static inline const char* name = "reducer";
};

caf::behavior reducer_actor(caf::stateful_actor<reducer_state>* self, reducer_setup setup);

}  // namespace dpactor
