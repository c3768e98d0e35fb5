#pragma once
// What a run starts from, prepared before any actor exists: the data, the
// replica state and where it comes from (fresh, from weights, or resumed),
// the run's length and learning-rate schedule, the fault plan; and the setups
// of the actors that the engine spawns from it (actors/engine.cpp).

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <caf/all.hpp>

#include "actors/checkpoint_writer.hpp"
#include "actors/device.hpp"
#include <dpactor/engine.hpp>
#include "actors/loader.hpp"
#include "actors/reducer.hpp"
#include "train/checkpoint_directory.hpp"
#include "data/loading.hpp"
#include "tensors/torch_model.hpp"
#include "train/fault_plan.hpp"
#include "train/logical_workers.hpp"
#include "train/powersgd.hpp"
#include "train/round_shape.hpp"

namespace dpactor {

struct launch_plan {
  train_test_data data;
  state_layout layout;
  std::shared_ptr<const std::vector<float>> initial_state;  // every device starts from it
  std::int64_t start_step = 0;                  // steps already trained (resume)
  std::string data_fingerprint;                 // of data (config/job_identity.hpp)
  // What the run may write into its checkpoint directory (See Note [A run
  // owns its checkpoints]).
  checkpoint_claim claim;
  std::optional<ledger_position> resume_position;
  std::int64_t epoch_steps = 1;                 // nominal steps per epoch
  std::int64_t run_steps = 1;                   // nominal steps of the run
  lr_schedule schedule;
  std::vector<fault_spec> faults;
  int replicas = 1;
  int blas_threads = 1;                         // per replica
  std::shared_ptr<record_queue> stream;         // train.mode = "stream": the records to train
  torch_model_factory torch_factory;             // a torch model's (a TorchScript file's, or the embedder's)
  std::shared_ptr<const torch_model> module;    // ... and the first one made: its layout and initial weights
  // The round modes (sync.mode = "local_sgd" or "diloco", See Note [Logical
  // workers]): a step of the engine is a round, the replicas hold the global
  // weights and the outer optimizer's state, and the logical workers' inner
  // states live in rounds->store. Null: every_step.
  std::shared_ptr<const round_setup> rounds;
  round_shape shape;                // rounds only
  optimizer_config outer_optimizer; // rounds only: the replicas' optimizer
  state_layout inner_layout;        // rounds only: an inner replica's (the job's optimizer)
  // sync.codec = "powersgd": what the devices share (See Note [PowerSGD steps]).
  std::shared_ptr<const powersgd_setup> powersgd;
  std::vector<float> resumed_workers;  // rounds, resumed: the workers' states until the store takes them
};

// See Note [Replaying a lost worker's rounds]: what each process of a
// round mode's run across processes keeps of its rounds, at most.
constexpr std::size_t round_history_bytes = std::size_t{512} << 20;

// Loads the data and the initial state and plans the run. Throws data_error,
// checkpoint_error or config_error.
launch_plan prepare_launch(const job_config& config, const run_options& options, int replicas);

// The actor system's configuration: message types, one scheduler thread that
// sleeps while idle.
std::unique_ptr<caf::actor_system_config> make_system_config();

// Note [A lost peer can hold the network layer's shutdown]
// ~actor_system stops CAF's middleman, whose thread runs until every socket
// it manages is closed, and CAF closes a connection gracefully: only once its
// send buffer has drained. A peer cut off by a partition never acknowledges
// what was sent to it just before, so that connection drains only when the
// kernel gives up on it (tcp_retries2, about 15 minutes), and the process
// would not end for as long, with its work long done. So the system is
// destroyed on a helper thread, and a caller waits for it at most a bound;
// past it, the helper keeps the system and its config, and the process
// should end with std::_Exit (See Note [Bounded shutdown]).
//
// Destroys `system`, then `config`, waiting at most `bound`: true if done.
bool destroy_within(std::unique_ptr<caf::actor_system> system, std::unique_ptr<caf::actor_system_config> config,
                    std::chrono::milliseconds bound);

// Device `id`'s setup, with its replica built and holding the initial state.
std::shared_ptr<device_setup> make_device_setup(const job_config& config, const launch_plan& plan, int id);
loader_setup make_loader_setup(const job_config& config, const launch_plan& plan);
// The reducer's setup from the config and the plan; the caller adds the
// actors it talks to, its devices and how it makes each generation's group.
reducer_setup make_reducer_setup(const job_config& config, const launch_plan& plan);
std::shared_ptr<const checkpoint_writer_setup> make_writer_setup(const job_config& config, const launch_plan& plan);

}  // namespace dpactor
