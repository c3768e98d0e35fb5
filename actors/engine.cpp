#include <dpactor/engine.hpp>

#include <algorithm>
#include <cmath>
#include <future>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <stdexcept>
#include <thread>

#include <caf/all.hpp>

#include "actors/backend.hpp"
#include "actors/coordinator_role.hpp"
#include "actors/launch.hpp"
#include "actors/protocol.hpp"
#include "actors/async_run.hpp"
#include "config/job_identity.hpp"
#include "actors/reducer.hpp"
#include "data/record_puller.hpp"
#include "config/job_config.hpp"
#include "tensors/blas_kernels.hpp"
#include "tensors/gemm.hpp"
#include "actors/log.hpp"

namespace dpactor {
namespace {

// sync.mode = "async": what its first decision records, and with
// run_options::replay_rounds the record it follows, checked against this job
// (See Note [Async replay]).
async_record async_record_of(const job_config& config, const run_options& options, const launch_plan& plan) {
  async_record r;
  // The job with its logical workers as the run has them (sync.workers = 0:
  // one per device), so that a replay on other devices can name them; and
  // without what only records or saves the run (checkpoints, logs,
  // evaluations, audits): a replay may do those its own way.
  job_config effective = config;
  effective.sync.workers = plan.shape.workers;
  const train_config defaults;
  effective.train.checkpoint_every = defaults.checkpoint_every;
  effective.train.checkpoint_every_s = defaults.checkpoint_every_s;
  effective.train.keep_checkpoints = defaults.keep_checkpoints;
  effective.train.log_every = defaults.log_every;
  effective.train.eval_every = defaults.eval_every;
  effective.train.record_trained = defaults.record_trained;
  r.job = job_identity(effective);
  r.data = data_fingerprint(*plan.data.train, *plan.data.test);
  if (options.replay_rounds.empty()) return r;
  const std::string& path = options.replay_rounds;
  std::vector<round_decision_event> decisions;
  try {
    decisions = read_round_decisions(path);
  } catch (const std::exception& e) {
    throw config_error(std::string("--replay-rounds ") + e.what());
  }
  if (decisions.empty())
    throw config_error("--replay-rounds " + path + ": holds no round_decision records (it should be the --metrics file "
                       "of a sync.mode = \"async\" run)");
  const std::string difference = first_difference(r.job, decisions.front().job, "this run", "the recorded run");
  if (!difference.empty())
    throw config_error("--replay-rounds " + path + ": recorded another job: " + difference);
  if (decisions.front().workers != plan.shape.workers)
    throw config_error("--replay-rounds " + path + ": the recorded run had " + std::to_string(decisions.front().workers) +
                       " logical workers, this one has " + std::to_string(plan.shape.workers) +
                       (config.sync.workers == 0 ? " (sync.workers = 0: one per device)" : "") + ": set sync.workers = " +
                       std::to_string(decisions.front().workers));
  if (decisions.front().data != r.data)
    throw data_error("--replay-rounds " + path + ": recorded a run on other data: " + decisions.front().data +
                     " (the recorded run) against " + r.data + " (this run)");
  try {
    r.replay.emplace(std::move(decisions), static_cast<std::size_t>(plan.shape.workers));
  } catch (const std::invalid_argument& e) {
    throw config_error("--replay-rounds " + path + ": " + e.what());
  }
  return r;
}

// A service cannot re-execute itself the way the dpactor command does. See
// Note [OpenBLAS kernels on CPUs newer than the library].
void warn_once_about_blas_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (auto better = better_blas_kernels_here())
      engine_log()->warn("OpenBLAS runs its {} kernels on a CPU that can run its {} kernels, several times faster; "
                   "set OPENBLAS_CORETYPE={} in the environment before the process starts",
                   blas_kernels_in_use(), *better, *better);
  });
}

// service.snapshot_every_s: what the first member publishes for serving
// (null when off): the parameter section of the state.
std::shared_ptr<latest_parameters> published_parameters(const job_config& config, const state_layout& layout) {
  if (config.service.snapshot_every_s <= 0.0) return nullptr;
  return std::make_shared<latest_parameters>(
      layout.parameters(), std::chrono::milliseconds(static_cast<std::int64_t>(config.service.snapshot_every_s * 1000.0)));
}

}  // namespace

// How long a teardown waits for the actors' threads (See Note [Bounded shutdown]).
constexpr auto shutdown_bound = std::chrono::seconds(10);
// How long the network layer may take to close its connections once every
// actor is gone (See Note [A lost peer can hold the network layer's shutdown]).
constexpr auto network_shutdown_bound = std::chrono::seconds(5);

struct Engine::impl {
  job_config config;
  run_options options;
  std::vector<event_callback> callbacks;
  // OpenBLAS's thread count before the run set its own (restored after).
  int host_blas_threads = 0;

  mutable std::shared_mutex system_mutex;  // exclusive: start/teardown; shared: snapshot
  std::mutex run_mutex;                    // one start/wait at a time
  std::unique_ptr<caf::actor_system_config> system_config;  // outlives the system, which refers to it
  std::unique_ptr<caf::actor_system> system;
  std::vector<caf::actor_addr> actors;  // everything spawned, for teardown
  reducer_actor reducer;
  caf::actor async_reducer;  // sync.mode = "async" (See Note [Async rounds]) instead of the reducer
  // When coordinating (run_options::coordinator).
  std::unique_ptr<coordinator_role> role;
  std::shared_ptr<run_control> control;
  std::optional<std::future<run_summary>> outcome;
  std::atomic<bool> stop_requested{false};
  std::atomic<bool> running{false};
  std::chrono::steady_clock::time_point started;
  state_layout layout;

  // Stream mode: the run's queue, and what pulls from options.records into it.
  mutable std::mutex stream_mutex;
  std::shared_ptr<record_queue> stream;
  std::atomic<std::int64_t> committed_sequence{-1};
  record_puller puller;
  // service.snapshot_every_s: what the first member publishes for serving.
  std::shared_ptr<latest_parameters> latest;

  std::shared_ptr<record_queue> current_stream() const {
    std::lock_guard lock(stream_mutex);
    return stream;
  }

  // Sends `message` to the run's reducer; throws when there is no run
  // (`method` names the caller).
  template <class Message>
  void tell_reducer(const char* method, Message&& message) {
    std::shared_lock lock(system_mutex);
    if (system && async_reducer)
      throw error(error_kind::config, std::string(method) + ": a run in sync.mode = \"async\" does not take it in "
                                      "this version (docs/async.md, \"Asynchronous rounds\")");
    if (!system || !reducer) throw error(error_kind::no_run, std::string(method) + ": no run in progress");
    caf::anon_send(reducer, std::forward<Message>(message));
  }
  // Sends the reducer a request whose promise it fulfils, and waits up to
  // `timeout` for the reply.
  template <class Reply, class Request, class... Args>
  Reply ask_reducer(const char* method, std::chrono::milliseconds timeout, const char* late, const char* ended,
                    Args&&... args) {
    auto promise = std::make_shared<std::promise<Reply>>();
    std::future<Reply> reply = promise->get_future();
    tell_reducer(method, Request{std::move(promise), std::forward<Args>(args)...});
    if (reply.wait_for(timeout) != std::future_status::ready)
      throw error(error_kind::timeout,
                  std::string(method) + ": " + late + " within " + std::to_string(timeout.count()) + " ms");
    try {
      return reply.get();
    } catch (const std::future_error&) {
      throw error(error_kind::run_ended, std::string(method) + ": the run ended before " + ended);
    }
  }

  // Spawns device `id` in `system`, at the start and for joins (the reducer
  // calls it), and keeps it for the shutdown's report.
  std::function<member_handle(int id)> device_spawner(caf::actor_system& system,
                                                      std::shared_ptr<const launch_plan> plan,
                                                      std::shared_ptr<latest_parameters> latest) {
    return [&config = config, plan, control = control, sys = &system, spawned = spawned, spawned_mutex = spawned_mutex,
            latest](int id) {
      std::shared_ptr<device_setup> setup = make_device_setup(config, *plan, id);
      setup->latest = latest;
      if (config.train.record_trained) setup->on_trained = [control](const trained_event& e) { control->emit(e); };
      {
        std::lock_guard lock(*spawned_mutex);
        spawned->push_back({setup->name, setup->control});
      }
      member_handle h{{}, id, setup->name, setup->control};
      h.actor = sys->spawn<caf::detached>(device_behavior, std::move(setup));
      return h;
    };
  }

  // Every device ever spawned (joins too), for the shutdown's report.
  struct spawned_device {
    std::string name;
    std::shared_ptr<device_control> control;
  };
  std::shared_ptr<std::mutex> spawned_mutex = std::make_shared<std::mutex>();
  std::shared_ptr<std::vector<spawned_device>> spawned = std::make_shared<std::vector<spawned_device>>();
  std::atomic<bool> left_behind{false};

  // sync.mode = "async": its own reducer and devices (See Note [Async rounds]).
  // With options.coordinator, the workers' devices join it (See Note
  // [Async rounds across processes]).
  void start_async(std::shared_ptr<const launch_plan> plan, async_record record,
                   std::shared_ptr<const checkpoint_writer_setup> writer_setup) {
    auto cfg = options.coordinator ? coordinator_role::system_config(config, *options.coordinator) : make_system_config();
    auto sys = std::make_unique<caf::actor_system>(*cfg);
    const async_run run = spawn_async_run(*sys, config, plan, control, started, std::move(record), std::move(writer_setup));
    std::unique_ptr<coordinator_role> coordinating;
    if (options.coordinator) {
      try {
        coordinating = std::make_unique<coordinator_role>(*sys, *options.coordinator, config, *plan, stop_requested);
      } catch (...) {
        for (const auto& d : run.devices) caf::anon_send_exit(d, caf::exit_reason::user_shutdown);
        caf::anon_send_exit(run.reducer, caf::exit_reason::user_shutdown);
        if (run.writer) caf::anon_send_exit(run.writer, caf::exit_reason::user_shutdown);
        caf::logger::set_current_actor_system(nullptr);
        throw;
      }
      coordinating->attach_async(run.reducer);
    }
    caf::logger::set_current_actor_system(nullptr);  // as start() does: see there
    std::unique_lock lock(system_mutex);
    system_config = std::move(cfg);
    system = std::move(sys);
    actors.clear();
    for (const auto& d : run.devices) actors.push_back(d.address());
    actors.push_back(run.reducer.address());
    if (run.writer) actors.push_back(run.writer.address());
    if (coordinating) actors.push_back(coordinating->actor().address());
    role = std::move(coordinating);
    async_reducer = run.reducer;
    running = true;
    if (stop_requested) caf::anon_send(run.reducer, stop_atom::value);
    caf::anon_send(run.reducer, start_atom::value);
  }

  // Note [Bounded shutdown]
  // ~actor_system waits for every actor to finish, and a detached actor
  // finishes only when its thread returns. A device thread stuck for good (a
  // hung driver call; the fault spec stuck:R@S) would hold the teardown, and
  // with it Engine::wait() and the program, forever. The teardown asks every
  // actor to exit and waits up to shutdown_bound for them; past it, it logs
  // the devices still inside a step (by their last phase) and leaves the
  // actor system running for them instead of destroying it: its memory is
  // leaked, and left_threads_behind() tells the program to _Exit.
  void teardown() {
    std::unique_lock lock(system_mutex);
    if (!system) return;
    for (const auto& a : actors) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    actors.clear();
    reducer = reducer_actor{};
    async_reducer = caf::actor{};
    const auto deadline = std::chrono::steady_clock::now() + shutdown_bound;
    while (system->registry().running() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (const std::size_t left = system->registry().running(); left > 0) {
      engine_log()->error("shutdown: {} actor{} still running after {} s, left behind: {}", left, left == 1 ? "" : "s",
                    std::chrono::duration_cast<std::chrono::seconds>(shutdown_bound).count(), stuck_devices());
      left_behind = true;
      (void)system.release();         // never destroyed: its threads still run
      (void)system_config.release();  // which it refers to
      return;
    }
    if (!destroy_within(std::move(system), std::move(system_config), network_shutdown_bound)) {
      engine_log()->error("shutdown: CAF's network layer did not stop within {} s: a connection to a peer that no longer "
                    "answers still holds unsent data (a partitioned node); left behind",
                    std::chrono::duration_cast<std::chrono::seconds>(network_shutdown_bound).count());
      left_behind = true;
    }
  }

  // "cpu:1 (last seen in forward of step 7, 31.2 s ago)", for each device not
  // between steps.
  std::string stuck_devices() const {
    std::lock_guard lock(*spawned_mutex);
    std::string out;
    const auto now = device_progress::clock::now();
    for (const auto& d : *spawned) {
      const auto p = d.control->progress.read();
      if (p.phase == device_phase::data) continue;
      char text[160];
      std::snprintf(text, sizeof text, "%s (last seen in %s of step %lld, %.1f s ago)", d.name.c_str(),
                    std::string(phase_name(p.phase)).c_str(), static_cast<long long>(p.step + 1),
                    std::chrono::duration<double>(now - p.since).count());
      out += (out.empty() ? "" : ", ") + std::string(text);
    }
    return out.empty() ? "no device inside a step (the loader, reducer or checkpoint writer)" : out;
  }
};

Engine::Engine(job_config config, run_options options) : impl_(std::make_unique<impl>()) {
  validate_job_config(config);
  warn_once_about_blas_kernels();
  impl_->config = std::move(config);
  impl_->options = std::move(options);
}

Engine::~Engine() {
  if (impl_->running) {
    stop();
    try {
      wait();
    } catch (...) {
    }
  }
}

void Engine::on_event(event_callback callback) {
  if (callback) impl_->callbacks.push_back(std::move(callback));
}

const job_config& Engine::config() const noexcept { return impl_->config; }

int Engine::replica_count() const noexcept {
  const auto& cluster = impl_->config.cluster;
  if (!cluster.gpus.empty()) return static_cast<int>(cluster.gpus.size());
  return cluster.cpus > 0 ? static_cast<int>(cluster.cpus) : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

bool Engine::running() const { return impl_->running; }

bool Engine::left_threads_behind() const noexcept { return impl_->left_behind; }

void Engine::stop() {
  impl_->stop_requested = true;
  // What is queued stays untrained: the run stops at a step boundary, and a
  // resumed run gets those records again from the replay.
  if (const auto queue = impl_->current_stream()) queue->shut();
  std::shared_lock lock(impl_->system_mutex);
  if (impl_->system && impl_->reducer) caf::anon_send(impl_->reducer, stop_atom::value);
  if (impl_->system && impl_->async_reducer) caf::anon_send(impl_->async_reducer, stop_atom::value);
}

void Engine::start() {
  auto& m = *impl_;
  std::unique_lock run_lock(m.run_mutex);
  if (m.running) throw error(error_kind::already_running, "Engine::start: a run is already in progress");
  if (m.left_behind)
    throw error(error_kind::stuck_thread, "Engine::start: the last run left a stuck device thread behind (see its log); "
                                          "this engine cannot start again, and the process should end");
  const job_config& config = m.config;
  m.started = std::chrono::steady_clock::now();

  if (config.train.mode == train_mode::stream && m.options.coordinator)
    throw config_error(config.source + ": train.mode = \"stream\" trains in one process in this version: records are "
                       "fed to its engine, and a coordinator's workers read their data from files");
  if (config.sync.mode == sync_mode::async && !m.options.resume_from.empty() && !m.options.replay_rounds.empty())
    throw config_error("--replay-rounds " + m.options.replay_rounds + " with --resume " + m.options.resume_from +
                       ": a replay follows a run's decisions from its start, and a resumed run's rounds start from "
                       "the checkpoint; replay the whole run without --resume");
  const auto plan = std::make_shared<const launch_plan>(prepare_launch(config, m.options, replica_count()));
  if (plan->rounds && m.options.coordinator && config.sync.mode != sync_mode::async && config.train.reproducible)
    plan->rounds->history->keep(round_history_bytes);
  if (!m.options.replay_rounds.empty() && config.sync.mode != sync_mode::async)
    throw config_error("--replay-rounds " + m.options.replay_rounds + ": replays the decisions of a sync.mode = \"async\" "
                       "run; this job's sync.mode is \"" + sync_mode_name(config.sync.mode) + "\"");
  async_record record;
  if (config.sync.mode == sync_mode::async) record = async_record_of(config, m.options, *plan);
  if (config.sync.mode == sync_mode::async)
    for (const fault_spec& f : plan->faults) {
      if (f.kind != fault_kind::slow && f.kind != fault_kind::fail && f.kind != fault_kind::hang &&
          f.kind != fault_kind::join && f.kind != fault_kind::leave && f.kind != fault_kind::kill)
        throw config_error(config.source + ": faults.inject = \"" + f.text + "\": sync.mode = \"async\" takes "
                           "slow, fail, hang, join, leave and kill faults in this version (docs/async.md, "
                           "\"Asynchronous rounds\")");
    }
  const auto latest = published_parameters(config, plan->layout);
  {
    std::lock_guard lock(m.stream_mutex);
    m.latest = latest;
    m.stream = plan->stream;
  }
  // See Note [What an engine does to its process]: OpenBLAS 0.3.21 has one
  // thread count per process, and the same count on every replica is part of
  // the reproducible bytes; the host's is restored when the run ends.
  m.host_blas_threads = blas_threads();
  set_blas_threads(plan->blas_threads);
  m.layout = plan->layout;
  // Takes the checkpoint directory's lock before anything starts (throws).
  const auto writer_setup = config.train.checkpoint_dir.empty() ? nullptr : make_writer_setup(config, *plan);
  m.committed_sequence = plan->resume_position ? plan->resume_position->stream.committed : -1;
  // The committed sequence number follows the checkpoints written.
  std::vector<event_callback> callbacks{[&m](const event& e) {
    if (const auto* c = std::get_if<checkpoint_event>(&e); c && c->committed_sequence >= 0)
      m.committed_sequence = c->committed_sequence;
  }};
  callbacks.insert(callbacks.end(), m.callbacks.begin(), m.callbacks.end());
  m.control = std::make_shared<run_control>(std::move(callbacks));
  m.outcome = m.control->outcome();

  if (config.sync.mode == sync_mode::async) {
    m.start_async(plan, std::move(record), writer_setup);
    return;
  }
  auto cfg = m.options.coordinator ? coordinator_role::system_config(config, *m.options.coordinator)
                                   : make_system_config();
  auto system = std::make_unique<caf::actor_system>(*cfg);
  checkpoint_writer_actor writer;
  if (writer_setup) writer = system->spawn<caf::detached>(checkpoint_writer_behavior, writer_setup);
  {
    std::lock_guard lock(*m.spawned_mutex);
    m.spawned->clear();
  }
  const auto spawn_device = m.device_spawner(*system, plan, latest);
  std::vector<member_handle> devices;
  for (int r = 0; r < plan->replicas; ++r) devices.push_back(spawn_device(r));
  // See Note [Coordinator and workers].
  std::unique_ptr<coordinator_role> role;
  if (m.options.coordinator) {
    try {
      role = std::make_unique<coordinator_role>(*system, *m.options.coordinator, config, *plan, m.stop_requested);
    } catch (...) {
      for (const auto& d : devices) caf::anon_send_exit(d.actor, caf::exit_reason::user_shutdown);
      if (writer) caf::anon_send_exit(writer, caf::exit_reason::user_shutdown);
      caf::logger::set_current_actor_system(nullptr);
      throw;
    }
    devices.insert(devices.end(), role->members().begin(), role->members().end());
  }
  loader_setup ls = make_loader_setup(config, *plan);
  reducer_setup rs = make_reducer_setup(config, *plan);
  rs.make_group = in_process_groups(config, m.options.collective_backend);
  if (role) role->steer(ls, rs, *plan);
  const loader_actor loader = system->spawn(loader_behavior, std::move(ls));
  rs.control = m.control;
  rs.devices = devices;
  rs.spawn_device = spawn_device;
  rs.loader = loader;
  rs.writer = writer;
  rs.started = m.started;
  const reducer_actor reducer = system->spawn(reducer_behavior, std::move(rs));
  if (role) role->attach(reducer, *plan);
  // Every spawn made this thread hold the system's logger in a CAF 0.17
  // thread-local, and ~actor_system waits until the logger is gone: wait() or
  // ~Engine in another thread (a service's) would wait forever. The
  // destroying thread drops its own; this one drops it here.
  caf::logger::set_current_actor_system(nullptr);

  {
    std::unique_lock lock(m.system_mutex);
    m.system_config = std::move(cfg);
    m.system = std::move(system);
    m.actors.clear();
    for (const auto& d : devices) m.actors.push_back(d.actor.address());
    m.actors.push_back(loader.address());
    m.actors.push_back(reducer.address());
    if (writer) m.actors.push_back(writer.address());
    if (role) m.actors.push_back(role->actor().address());
    m.role = std::move(role);
    m.reducer = reducer;
    m.running = true;
  }
  // A stop asked for before start() goes first: the loader then learns of it
  // before the first generation's plan, and issues nothing.
  if (m.stop_requested) caf::anon_send(reducer, stop_atom::value);
  caf::anon_send(reducer, start_atom::value);
  if (m.options.records && plan->stream)
    m.puller.start(m.options.records, plan->stream, static_cast<std::size_t>(config.train.batch_size),
                   m.committed_sequence, [](const std::string& why) {
                     engine_log()->error("the record source failed: {}; the stream ends here", why);
                   });
}

feed_result Engine::feed(std::span<const record> records, std::chrono::milliseconds wait) {
  if (impl_->config.train.mode != train_mode::stream)
    throw config_error("Engine::feed: the job trains from files (train.mode = \"epochs\"); feeding needs "
                       "train.mode = \"stream\"");
  const auto queue = impl_->current_stream();
  if (!queue) return feed_result{0, 0, feed_result::outcome::closed};
  return queue->push(records, wait);
}

void Engine::end_stream() {
  if (const auto queue = impl_->current_stream()) queue->close();
}

std::int64_t Engine::committed_sequence() const { return impl_->committed_sequence; }

std::shared_ptr<const parameter_snapshot> Engine::latest_snapshot() const {
  std::shared_ptr<latest_parameters> latest;
  {
    std::lock_guard lock(impl_->stream_mutex);
    latest = impl_->latest;
  }
  return latest ? latest->get() : nullptr;
}

run_summary Engine::wait() {
  auto& m = *impl_;
  std::unique_lock run_lock(m.run_mutex);
  if (!m.running || !m.outcome) throw error(error_kind::no_run, "Engine::wait: no run in progress");
  std::optional<run_summary> summary;
  std::exception_ptr error;
  try {
    summary = m.outcome->get();
  } catch (...) {
    error = std::current_exception();
  }
  m.outcome.reset();
  m.puller.stop();
  {
    std::lock_guard lock(m.stream_mutex);
    m.stream.reset();
  }
  // The workers end their devices and exit (See Note [A worker never trains alone]).
  if (m.role) {
    std::string what;
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
        what = "the run failed";
      }
    }
    m.role->end_run(what);
    m.role.reset();
  }
  m.teardown();
  if (m.host_blas_threads > 0) set_blas_threads(m.host_blas_threads);
  m.running = false;
  m.stop_requested = false;
  if (error) std::rethrow_exception(error);
  return *summary;
}

std::string Engine::add_device(std::chrono::milliseconds timeout) {
  return impl_->ask_reducer<std::string, add_device_msg>("Engine::add_device", timeout, "not admitted",
                                                         "the device was admitted");
}

void Engine::remove_device(const std::string& name) {
  const leave_reply reply = impl_->ask_reducer<leave_reply, leave_request>(
      "Engine::remove_device", std::chrono::seconds(30), "no answer", "it answered", name);
  if (reply.member) return;  // it leaves at the next step boundary
  std::string list;
  for (const auto& n : reply.members) list += (list.empty() ? "" : ", ") + n;
  throw error(error_kind::unknown_device, "Engine::remove_device: no member is named \"" + name +
                                              "\"; the members are " + (list.empty() ? "none" : list));
}

std::vector<std::string> Engine::members() {
  return impl_->ask_reducer<std::vector<std::string>, members_request>("Engine::members", std::chrono::seconds(30),
                                                                      "no answer", "it answered");
}

void Engine::request_checkpoint() {
  if (impl_->config.train.checkpoint_dir.empty())
    throw config_error("Engine::request_checkpoint: the job writes no checkpoints (train.checkpoint_dir is empty)");
  impl_->tell_reducer("Engine::request_checkpoint", checkpoint_atom::value);
}

void Engine::set_lr(std::optional<double> lr) {
  if (lr && !(std::isfinite(*lr) && *lr > 0.0))
    throw error(error_kind::invalid_argument,
                "Engine::set_lr: the learning rate must be finite and above 0, not " + std::to_string(*lr));
  impl_->tell_reducer("Engine::set_lr", lr_msg{lr.value_or(0.0)});
}

void Engine::inject(const std::string& spec) {
  parse_fault_spec(spec);  // throws config_error for a bad spec
  impl_->tell_reducer("Engine::inject", inject_msg{spec});
}

parameter_snapshot Engine::snapshot(std::chrono::milliseconds timeout) {
  params_reply values = impl_->ask_reducer<params_reply, params_request>("Engine::snapshot", timeout, "no answer",
                                                                         "the snapshot was taken");
  parameter_snapshot snap;
  snap.step = values.step;
  snap.values = std::move(values.values);
  snap.layout = impl_->layout.parameters();
  return snap;
}

}  // namespace dpactor
