#pragma once
// dpactor::Engine, the public facade: train a job in-process from a config.
//
//   dpactor::Engine engine(dpactor::load_job_config("configs/mlp.cfg"));
//   engine.on_event([](const dpactor::event& e) { ... });
//   engine.start();                      // returns at once
//   auto weights = engine.snapshot();    // consistent, at a step boundary
//   engine.stop();                       // optional: stop at the next step boundary
//   dpactor::run_summary s = engine.wait();
//
// Every member function is thread-safe. An engine can be started again after
// wait() returned. This header includes no CAF.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "train/events.hpp"
#include "config/job_config.hpp"
#include "actors/run_control.hpp"
#include "comms/collective.hpp"
#include "tensors/error.hpp"
#include "tensors/flat_layout.hpp"

namespace dpactor {

// Multi-node: this engine coordinates workers in other processes (See Note
// [Coordinator and workers], actors/coordinator.hpp; needs the Gloo backend).
struct coordinator_options {
  std::string host = "127.0.0.1";  // the address to listen on
  std::uint16_t port = 0;          // 0: the system chooses
  // start() returns once this many devices, here and joined, are ready.
  int wait_devices = 0;
  // ... and this many worker processes have joined (a launcher's world size).
  int wait_workers = 0;
  std::string version;  // workers of another version are refused
  // Told "host:port" once the coordinator listens, before start() waits.
  std::function<void(const std::string& address)> on_listening;
};

struct run_options {
  std::string resume_from;  // checkpoint directory, or a root holding `latest`
  std::string init_from;    // model.safetensors to start from (optimizer fresh)
  // A custom collective backend: the group of each generation, given its
  // member count. Empty: NCCL on GPUs, the in-process `local` backend on CPUs.
  std::function<std::shared_ptr<collective_group>(int members)> collective_backend;
  std::optional<coordinator_options> coordinator;
};

// Parameters of the model at one step boundary, laid out as in a
// checkpoint's model.safetensors.
struct parameter_snapshot {
  std::int64_t step = 0;  // optimizer steps done when it was taken
  flat_layout layout;
  std::vector<float> values;
  std::span<const float> tensor(const std::string& name) const;
};

class Engine {
 public:
  explicit Engine(job_config config, run_options options = {});
  ~Engine();  // stops a running job and waits for it
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Set before start(); called on an engine thread, must not block for long.
  void on_event(event_callback callback);

  // Loads the data and the initial state, spawns the actors and returns.
  // Throws data_error, checkpoint_error or config_error; throws
  // std::logic_error if a run is in progress.
  void start();
  // Blocks until the run ends; returns its summary, or throws the error that
  // ended it (training_error, checkpoint_error). Tears the actors down,
  // waiting at most 10 s for their threads (See Note [Bounded shutdown]).
  run_summary wait();
  // Whether a teardown gave up on a thread that would not end (a device
  // stuck in a driver call): it was logged by name, and the actor system was
  // left running for it. A program should then end with std::_Exit rather
  // than run static destructors under that thread.
  bool left_threads_behind() const noexcept;
  // Asks the run to stop at the next step boundary (a checkpoint is written if
  // train.checkpoint_dir is set). Returns at once; safe from any thread, also
  // before start() (the next start() then returns without training).
  void stop();
  bool running() const;

  // Admits a new CPU device at the next step boundary; returns its name
  // ("cpu:3") once it is a member. Throws std::runtime_error if no run is in
  // progress or it is not admitted within the timeout.
  std::string add_device(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // Removes a device gracefully at the next step boundary (asynchronous; see
  // the membership events).
  void remove_device(const std::string& name);
  // Injects a fault spec (docs/faults.md) into the running job; throws
  // config_error for a malformed spec.
  void inject(const std::string& spec);

  // The current parameters, read between two steps of the first member.
  // Throws std::runtime_error if no run is in progress or on timeout.
  parameter_snapshot snapshot(std::chrono::milliseconds timeout = std::chrono::seconds(10));

  const job_config& config() const noexcept;
  // Number of replicas a run of this config uses.
  int replica_count() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dpactor
