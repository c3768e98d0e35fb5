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
// In stream mode (train.mode = "stream") a service feeds the records to train
// and commits its upstream offset at each checkpoint event:
//
//   engine.start();                          // resumed: replay from committed_sequence() + 1
//   engine.feed(records, std::chrono::seconds(1));
//   engine.on_event(...)  -> checkpoint_event::committed_sequence
//
// Every member function is thread-safe. An engine can be started again after
// wait() returned. Every error it throws is a dpactor::error (error.hpp) whose
// code() says what happened.
//
// Note [What an engine does to its process]
// Nothing process-wide without the host's consent: no signal disposition is
// changed (SIGPIPE is blocked only on the threads that write to sockets,
// while they write), no libssl symbol is replaced, OpenBLAS's thread count is
// set only when the job asks (cluster.blas_threads > 0; the dpactor program
// sets it for its jobs), logs go where set_log_handler (log.hpp) says, and
// nothing calls abort() or exit(). What remains, and why:
//  - the actors run on threads of a CAF actor system of the engine's own,
//    one per run; each device's work on a thread of its own;
//  - with cluster TLS on, CAF's OpenSSL module initialises OpenSSL, and the
//    contexts CAF's threads create while such an engine runs get dpactor's
//    info callback, to log refused peers (See Note [Refused TLS peers are
//    logged], actors/tls.hpp); other contexts are never touched;
//  - a device thread stuck in a driver call cannot be ended: after a run
//    whose teardown gave up on one, left_threads_behind() is true, the thread
//    stays, and start() throws an error of code stuck_thread. Ending the
//    process soon (std::_Exit) is the host's choice to make.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <dpactor/error.hpp>
#include <dpactor/events.hpp>
#include <dpactor/job_config.hpp>
#include <dpactor/snapshot.hpp>
#include <dpactor/stream.hpp>

namespace dpactor {

class collective_group;        // comms/collective.hpp: a custom backend's group
class torch_model;             // tensors/torch_model.hpp
struct torch_model_options;
// A replica's model from the embedder (torch_module.hpp makes one).
using torch_model_factory = std::function<std::unique_ptr<torch_model>(const torch_model_options& options)>;

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
  // sync.mode = "async": the metrics file (JSON Lines) of an earlier run of
  // the same job, whose round_decision records this run follows instead of
  // the clock, to that run's bytes (docs/async.md, "Replay").
  std::string replay_rounds;
  // Lets the run replace checkpoints of the steps it writes that another run
  // left in its checkpoint directory; without it such a directory is refused
  // before anything starts (See Note [A run owns its checkpoints]).
  bool overwrite_checkpoints = false;
  // A custom collective backend: the group of each generation, given its
  // member count. Empty: NCCL on GPUs, the in-process `local` backend on CPUs.
  std::function<std::shared_ptr<collective_group>(int members)> collective_backend;
  std::optional<coordinator_options> coordinator;
  // Stream mode: a source the engine pulls records from on a thread of its
  // own, in place of (or besides) Engine::feed. Its end ends the run.
  std::shared_ptr<record_source> records;
  // A model made by the embedder, one per replica, in place of model.kind's
  // (dpactor/torch_module.hpp makes one from a torch::nn::Module factory;
  // model.input_shape gives one sample's shape). Empty: model.kind's.
  torch_model_factory torch_model;
};

class Engine {
 public:
  explicit Engine(job_config config, run_options options = {});
  ~Engine();  // stops a running job and waits for it
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Adds a callback for the run's events (before start()); every callback
  // added is called, in the order added, on an engine thread, and must not
  // block for long. An exception one throws is logged and dropped.
  void on_event(event_callback callback);

  // Loads the data and the initial state, spawns the actors and returns.
  // Throws data_error, checkpoint_error or config_error; an error of code
  // already_running if a run is in progress, stuck_thread after a run that
  // left a thread behind.
  void start();
  // Blocks until the run ends; returns its summary, or throws the error that
  // ended it (training_error, checkpoint_error); code no_run without a run. Tears the actors down,
  // waiting at most 10 s for their threads (See Note [Bounded shutdown]).
  run_summary wait();
  // Whether a teardown gave up on a thread that would not end (a device
  // stuck in a driver call): it was logged by name, and the actor system was
  // left running for it (See Note [What an engine does to its process]).
  bool left_threads_behind() const noexcept;
  // Asks the run to stop at the next step boundary (a checkpoint is written if
  // train.checkpoint_dir is set). Returns at once; safe from any thread, also
  // before start() (the next start() then returns without training).
  void stop();
  bool running() const;

  // Admits a new CPU device at the next step boundary; returns its name
  // ("cpu:3") once it is a member. Throws an error of code no_run without a
  // run, timeout if it is not admitted within `timeout`, run_ended if the
  // run ends first.
  std::string add_device(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // Removes a member gracefully at the next step boundary (see the membership
  // events); returns once the run has taken the request. Throws an error of
  // code unknown_device if no member has that name (the message lists them),
  // no_run without a run.
  void remove_device(const std::string& name);
  // The current members' names, in rank order. Throws no_run without a run.
  std::vector<std::string> members();
  // Stream mode (train.mode = "stream"; See Note [Exactly-once offsets] in
  // data/record_queue.hpp). Queues records to train, in the order of their
  // sequence numbers, waiting up to `wait` while the queue
  // (train.stream_queue) is full; records not above the last one fed, or
  // already trained before a resume, are skipped. Throws data_error for a
  // malformed record (nothing of the call is queued then), config_error
  // outside stream mode. Without a run in progress: status closed.
  feed_result feed(std::span<const record> records, std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  // The end of the stream: what is queued is trained (the last step with
  // what is left), a checkpoint is written, and the run ends.
  void end_stream();
  // The highest sequence number S such that every record fed up to S is
  // trained and inside a written checkpoint (-1: none). Resumed, the
  // checkpoint's, before start() returns: replay the stream from S + 1.
  std::int64_t committed_sequence() const;

  // Asks for a checkpoint at the next step boundary (after the last step
  // handed out; at once when a stream waits for records); the checkpoint
  // event follows. Throws config_error without train.checkpoint_dir, an
  // error of code no_run if no run is in progress.
  void request_checkpoint();
  // Trains with this learning rate instead of the schedule's from the next
  // step handed out on, on every replica alike; nullopt: the schedule's
  // again. Not kept in checkpoints. Throws an error of code
  // invalid_argument for a rate that is not finite and above 0, no_run if no
  // run is in progress.
  void set_lr(std::optional<double> lr);

  // Injects a fault spec (docs/faults.md) into the running job; throws
  // config_error for a malformed spec, no_run without a run.
  void inject(const std::string& spec);

  // The current parameters, read between two steps of the first member.
  // Throws an error of code no_run if no run is in progress, timeout or
  // run_ended if it gets no answer.
  parameter_snapshot snapshot(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // The newest of the copies the first member makes every
  // service.snapshot_every_s between two of its steps (its `step` is the
  // version): for serving predictions while training. Never waits, never
  // holds training up. Null before the first copy, or with copies off; the
  // last one stays after the run ends.
  std::shared_ptr<const parameter_snapshot> latest_snapshot() const;

  const job_config& config() const noexcept;
  // Number of replicas a run of this config uses.
  int replica_count() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dpactor
