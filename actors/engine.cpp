#include "actors/engine.hpp"

#include <algorithm>
#include <cmath>
#include <future>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <stdexcept>
#include <thread>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/backend.hpp"
#if DPACTOR_HAS_GLOO
#include "actors/coordinator.hpp"
#include "config/job_identity.hpp"
#include "actors/network.hpp"
#include "actors/tls.hpp"
#endif
#include "actors/launch.hpp"
#include "actors/protocol.hpp"
#include "actors/reducer.hpp"
#include "config/job_config.hpp"
#include "tensors/blas_kernels.hpp"
#include "tensors/gemm.hpp"

namespace dpactor {
namespace {

// A service cannot re-execute itself the way the dpactor command does. See
// Note [OpenBLAS kernels on CPUs newer than the library].
void warn_once_about_blas_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (auto better = better_blas_kernels_here())
      spdlog::warn("OpenBLAS runs its {} kernels on a CPU that can run its {} kernels, several times faster; "
                   "set OPENBLAS_CORETYPE={} in the environment before the process starts",
                   blas_kernels_in_use(), *better, *better);
  });
}

}  // namespace

// Shard messages queued ahead at each device when some devices are in other
// processes (see Engine::start).
constexpr std::int64_t remote_prefetch = 32;

// How long a teardown waits for the actors' threads (See Note [Bounded shutdown]).
constexpr auto shutdown_bound = std::chrono::seconds(10);
// How long the network layer may take to close its connections once every
// actor is gone (See Note [A lost peer can hold the network layer's shutdown]).
constexpr auto network_shutdown_bound = std::chrono::seconds(5);

struct Engine::impl {
  job_config config;
  run_options options;
  event_callback callback;

  mutable std::shared_mutex system_mutex;  // exclusive: start/teardown; shared: snapshot
  std::mutex run_mutex;                    // one start/wait at a time
  std::unique_ptr<caf::actor_system_config> system_config;  // outlives the system, which refers to it
  std::unique_ptr<caf::actor_system> system;
  std::vector<caf::actor_addr> actors;  // everything spawned, for teardown
  reducer_actor reducer;
  // When coordinating: closes the list of workers' node actors and returns it.
  std::function<std::vector<caf::actor>()> close_nodes;
  std::shared_ptr<run_control> control;
  std::optional<std::future<run_summary>> outcome;
  std::atomic<bool> stop_requested{false};
  std::atomic<bool> running{false};
  std::chrono::steady_clock::time_point started;
  state_layout layout;

  // Stream mode: the run's queue, and the thread that pulls from
  // options.records into it.
  mutable std::mutex stream_mutex;
  std::shared_ptr<record_queue> stream;
  std::atomic<std::int64_t> committed_sequence{-1};
  std::atomic<bool> pulling{false};
  std::thread puller;
  // service.snapshot_every_s: what the first member publishes for serving.
  std::shared_ptr<latest_parameters> latest;

  std::shared_ptr<record_queue> current_stream() const {
    std::lock_guard lock(stream_mutex);
    return stream;
  }

  // Pulls records from the source into the queue until the stream ends or
  // the run does (See record_source).
  void pull_records(std::shared_ptr<record_source> source, std::shared_ptr<record_queue> queue, std::size_t batch) {
    try {
      source->seek(committed_sequence.load());
      std::vector<record> got;
      while (pulling) {
        got.clear();
        const bool more = source->pull(got, batch);
        std::span<const record> rest(got);
        while (!rest.empty() && pulling) {
          const feed_result r = queue->push(rest, std::chrono::milliseconds(100));
          rest = rest.subspan(r.taken);
          if (r.status == feed_result::outcome::closed) return;
        }
        if (!more) {
          queue->close();
          return;
        }
      }
    } catch (const std::exception& e) {
      // A source that fails ends the stream: what it gave is trained.
      spdlog::error("the record source failed: {}; the stream ends here", e.what());
      queue->close();
    }
  }

  void stop_pulling() {
    pulling = false;
    if (auto q = current_stream()) q->shut();
    if (puller.joinable()) puller.join();
  }

  // Every device ever spawned (joins too), for the shutdown's report.
  struct spawned_device {
    std::string name;
    std::shared_ptr<device_control> control;
  };
  std::shared_ptr<std::mutex> spawned_mutex = std::make_shared<std::mutex>();
  std::shared_ptr<std::vector<spawned_device>> spawned = std::make_shared<std::vector<spawned_device>>();
  std::atomic<bool> left_behind{false};

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
    const auto deadline = std::chrono::steady_clock::now() + shutdown_bound;
    while (system->registry().running() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (const std::size_t left = system->registry().running(); left > 0) {
      spdlog::error("shutdown: {} actor{} still running after {} s, left behind: {}", left, left == 1 ? "" : "s",
                    std::chrono::duration_cast<std::chrono::seconds>(shutdown_bound).count(), stuck_devices());
      left_behind = true;
      (void)system.release();         // never destroyed: its threads still run
      (void)system_config.release();  // which it refers to
      return;
    }
    if (!destroy_within(std::move(system), std::move(system_config), network_shutdown_bound)) {
      spdlog::error("shutdown: CAF's network layer did not stop within {} s: a connection to a peer that no longer "
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
  if (config.train.reproducible && !config.cluster.gpus.empty()) {
    // See docs/reproducibility.md: the CUDA replica computes no slices yet.
    spdlog::warn("train.reproducible: not available on GPUs in this version; this run is not reproducible "
                 "(set train.reproducible = false to silence this)");
    config.train.reproducible = false;
  }
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

void Engine::on_event(event_callback callback) { impl_->callback = std::move(callback); }

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
}

void Engine::start() {
  auto& m = *impl_;
  std::unique_lock run_lock(m.run_mutex);
  if (m.running) throw std::logic_error("Engine::start: a run is already in progress");
  const job_config& config = m.config;
  m.started = std::chrono::steady_clock::now();

  if (config.train.mode == train_mode::stream && m.options.coordinator)
    throw config_error(config.source + ": train.mode = \"stream\" trains in one process in this version: records are "
                       "fed to its engine, and a coordinator's workers read their data from files");
  const auto plan = std::make_shared<const launch_plan>(prepare_launch(config, m.options, replica_count()));
  std::shared_ptr<latest_parameters> latest;
  if (config.service.snapshot_every_s > 0.0) {
    flat_layout params;
    for (std::size_t i = 0; i < plan->layout.parameter_tensors; ++i) {
      const auto& t = plan->layout.layout.tensors()[i];
      params.add(t.name, t.shape);
    }
    latest = std::make_shared<latest_parameters>(
        std::move(params), std::chrono::milliseconds(static_cast<std::int64_t>(config.service.snapshot_every_s * 1000.0)));
  }
  {
    std::lock_guard lock(m.stream_mutex);
    m.latest = latest;
  }
  set_blas_threads(plan->blas_threads);
  m.layout = plan->layout;
  // Takes the checkpoint directory's lock before anything starts (throws).
  const auto writer_setup = config.train.checkpoint_dir.empty() ? nullptr : make_writer_setup(config, *plan);
  m.committed_sequence = plan->resume_position ? plan->resume_position->stream.committed : -1;
  {
    std::lock_guard lock(m.stream_mutex);
    m.stream = plan->stream;
  }
  // The committed sequence number follows the checkpoints written.
  m.control = std::make_shared<run_control>([&m, callback = m.callback](const event& e) {
    if (const auto* c = std::get_if<checkpoint_event>(&e); c && c->committed_sequence >= 0)
      m.committed_sequence = c->committed_sequence;
    if (callback) callback(e);
  });
  m.outcome = m.control->outcome();

  std::unique_ptr<caf::actor_system_config> cfg;
  if (m.options.coordinator) {
#if DPACTOR_HAS_GLOO
    cfg = make_network_config(std::chrono::milliseconds(config.cluster.heartbeat_ms),
                              std::chrono::milliseconds(config.cluster.connection_timeout_ms));
    if (const std::string& host = m.options.coordinator->host; tls_enabled(config.cluster.tls, host)) {
      check_tls_files(config.cluster.tls, config.cluster.tls.mode == tls_mode::on
                                              ? "cluster.tls.mode = \"on\""
                                              : "the coordinator listens on " + host +
                                                    ", not a loopback address, so TLS is on (cluster.tls.mode = \"auto\")");
      use_tls(*cfg, config.cluster.tls);
    }
#else
    throw config_error("this build of dpactor has no Gloo backend, which a coordinator needs (apt-get install "
                       "libgloo-dev, then build again)");
#endif
  } else {
    cfg = make_system_config();
  }
  auto system = std::make_unique<caf::actor_system>(*cfg);
  checkpoint_writer_actor writer;
  if (writer_setup) writer = system->spawn<caf::detached>(checkpoint_writer_behavior, writer_setup);
  // Spawns device `id`, at the start and for joins (the reducer calls it).
  {
    std::lock_guard lock(*m.spawned_mutex);
    m.spawned->clear();
  }
  auto spawn_device = [&config, plan, control = m.control, sys = system.get(), spawned = m.spawned,
                       spawned_mutex = m.spawned_mutex, latest](int id) {
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
  std::vector<member_handle> devices;
  for (int r = 0; r < plan->replicas; ++r) devices.push_back(spawn_device(r));
  loader_setup ls = make_loader_setup(config, *plan);
  reducer_setup rs;
#if DPACTOR_HAS_GLOO
  // See Note [Coordinator and workers].
  coordinator_start cs;
  caf::actor coordinator;
  if (m.options.coordinator) {
    try {
      cs = start_coordinator(*system, *m.options.coordinator, config,
                             data_fingerprint(*plan->data.train, *plan->data.test), plan->replicas, plan->replicas,
                             m.stop_requested);
    } catch (...) {
      for (const auto& d : devices) caf::anon_send_exit(d.actor, caf::exit_reason::user_shutdown);
      if (writer) caf::anon_send_exit(writer, caf::exit_reason::user_shutdown);
      caf::logger::set_current_actor_system(nullptr);
      throw;
    }
    devices.insert(devices.end(), cs.members.begin(), cs.members.end());
    coordinator = cs.actor;
    rs.make_group = [store = cs.store, address = m.options.coordinator->host, shared = config.cluster.shared_memory,
                     gpus = config.cluster.gpus](const std::vector<int>& ids, std::int64_t generation) {
      if (!gpus.empty()) return nccl_ticket(store, gpus, ids, generation);
      return gloo_ticket(store, address, shared, static_cast<int>(ids.size()), generation);
    };
    rs.abort_remote = [nodes = cs.nodes](std::int64_t generation, const std::string& why) {
      for (const auto& n : nodes->list()) caf::anon_send(n, abort_msg{generation, why});
    };
    // Devices in other processes get their fault specs by message.
    for (const auto& f : plan->faults)
      if (is_device_fault(f)) rs.remote_device_faults.push_back(f);
    // A step's slice board and a cut live in one process's memory: across
    // processes every member computes its own range, and shard sizes still
    // follow throughput.
    ls.steal_slices = false;
    // A shard reaches a worker through CAF's network layer, a round trip of
    // a few steps: a deeper queue keeps its devices busy (2 -> 32 took 2
    // processes of 1 replica from 19,300 to 27,200 samples/s, PERFORMANCE.md).
    ls.prefetch = std::max<std::int64_t>(ls.prefetch, remote_prefetch);
  }
#endif
  const loader_actor loader = system->spawn(loader_behavior, std::move(ls));

  rs.control = m.control;
  rs.devices = devices;
  rs.spawn_device = spawn_device;
  if (rs.make_group) {
    // coordinating: set above
  } else if (m.options.collective_backend)
    rs.make_group = [backend = m.options.collective_backend](const std::vector<int>& ids, std::int64_t generation) {
      return group_ticket{"custom", generation, "", backend(static_cast<int>(ids.size()))};
    };
  else
    rs.make_group = [&config](const std::vector<int>& ids, std::int64_t generation) {
      return group_ticket{"local", generation, "", make_group(config, ids)};
    };
  rs.loader = loader;
  rs.writer = writer;
  rs.book.schedule = plan->schedule;
  rs.book.start_step = plan->start_step;
  rs.book.epoch_steps = plan->epoch_steps;
  rs.book.total_steps = plan->run_steps;
  rs.book.log_every = config.train.log_every;
  rs.book.verify_replicas = config.train.verify_replicas;
  rs.book.skip_nonfinite = config.train.on_nonfinite == nonfinite_policy::skip;
  rs.book.smoothing = config.straggler.smoothing;
  rs.straggler = config.straggler;
  rs.cuts = cuts_enabled(config) && !m.options.coordinator;
  rs.min_devices = config.cluster.min_devices;
  rs.hang_timeout_s = config.cluster.hang_timeout_s;
  rs.first_step_timeout_s = config.cluster.first_step_timeout_s;
  for (const auto& f : plan->faults) {
    if (f.kind == fault_kind::join || f.kind == fault_kind::leave) rs.membership_faults.push_back(f);
    if (f.kind == fault_kind::crash && f.target == crash_target::reducer) rs.crash_at = f.step - 1;
  }
  rs.started = m.started;
  const reducer_actor reducer = system->spawn(reducer_behavior, std::move(rs));
#if DPACTOR_HAS_GLOO
  if (coordinator) {
    for (const auto& h : cs.members)
      for (const auto& f : plan->faults)
        if (is_device_fault(f) && f.device == h.id) caf::anon_send(h.actor, inject_msg{f.text});
    cs.attach_reducer(reducer);
  }
#endif
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
#if DPACTOR_HAS_GLOO
    if (coordinator) m.actors.push_back(coordinator.address());
    if (coordinator) m.close_nodes = [nodes = cs.nodes] { return nodes->close(); };
#endif
    m.reducer = reducer;
    m.running = true;
  }
  // A stop asked for before start() goes first: the loader then learns of it
  // before the first generation's plan, and issues nothing.
  if (m.stop_requested) caf::anon_send(reducer, stop_atom::value);
  caf::anon_send(reducer, start_atom::value);
  if (m.options.records && plan->stream) {
    m.pulling = true;
    m.puller = std::thread(&impl::pull_records, &m, m.options.records, plan->stream,
                           static_cast<std::size_t>(config.train.batch_size));
  }
}

feed_result Engine::feed(std::span<const record> records, std::chrono::milliseconds wait) {
  if (impl_->config.train.mode != train_mode::stream)
    throw std::logic_error("Engine::feed: the job trains from files (train.mode = \"epochs\"); feeding needs "
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
  if (!m.running || !m.outcome) throw std::logic_error("Engine::wait: no run in progress");
  std::optional<run_summary> summary;
  std::exception_ptr error;
  try {
    summary = m.outcome->get();
  } catch (...) {
    error = std::current_exception();
  }
  m.outcome.reset();
  m.stop_pulling();
  {
    std::lock_guard lock(m.stream_mutex);
    m.stream.reset();
  }
  // The workers end their devices and exit (See Note [A worker never trains alone]).
  for (const auto& node : m.close_nodes ? m.close_nodes() : std::vector<caf::actor>{}) {
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
    caf::anon_send(node, run_over_msg{what});
  }
  m.close_nodes = nullptr;
  m.teardown();
  m.running = false;
  m.stop_requested = false;
  if (error) std::rethrow_exception(error);
  return *summary;
}

std::string Engine::add_device(std::chrono::milliseconds timeout) {
  auto& m = *impl_;
  std::shared_lock lock(m.system_mutex);
  if (!m.system || !m.reducer) throw std::runtime_error("Engine::add_device: no run in progress");
  auto promise = std::make_shared<std::promise<std::string>>();
  std::future<std::string> name = promise->get_future();
  caf::anon_send(m.reducer, add_device_msg{std::move(promise)});
  lock.unlock();
  if (name.wait_for(timeout) != std::future_status::ready)
    throw std::runtime_error("Engine::add_device: not admitted within " + std::to_string(timeout.count()) + " ms");
  try {
    return name.get();
  } catch (const std::future_error&) {
    throw std::runtime_error("Engine::add_device: the run ended before the device was admitted");
  }
}

void Engine::remove_device(const std::string& name) {
  auto& m = *impl_;
  std::shared_lock lock(m.system_mutex);
  if (!m.system || !m.reducer) throw std::runtime_error("Engine::remove_device: no run in progress");
  caf::anon_send(m.reducer, remove_device_msg{name, "removed"});
}

void Engine::request_checkpoint() {
  auto& m = *impl_;
  if (m.config.train.checkpoint_dir.empty())
    throw std::logic_error("Engine::request_checkpoint: the job writes no checkpoints (train.checkpoint_dir is empty)");
  std::shared_lock lock(m.system_mutex);
  if (!m.system || !m.reducer) throw std::runtime_error("Engine::request_checkpoint: no run in progress");
  caf::anon_send(m.reducer, checkpoint_atom::value);
}

void Engine::set_lr(std::optional<double> lr) {
  if (lr && !(std::isfinite(*lr) && *lr > 0.0))
    throw std::invalid_argument("Engine::set_lr: the learning rate must be finite and above 0, not " + std::to_string(*lr));
  auto& m = *impl_;
  std::shared_lock lock(m.system_mutex);
  if (!m.system || !m.reducer) throw std::runtime_error("Engine::set_lr: no run in progress");
  caf::anon_send(m.reducer, lr_msg{lr.value_or(0.0)});
}

void Engine::inject(const std::string& spec) {
  parse_fault_spec(spec);  // throws config_error for a bad spec
  auto& m = *impl_;
  std::shared_lock lock(m.system_mutex);
  if (!m.system || !m.reducer) throw std::runtime_error("Engine::inject: no run in progress");
  caf::anon_send(m.reducer, inject_msg{spec});
}

parameter_snapshot Engine::snapshot(std::chrono::milliseconds timeout) {
  auto& m = *impl_;
  std::shared_lock lock(m.system_mutex);
  if (!m.system || !m.reducer) throw std::runtime_error("Engine::snapshot: no run in progress");
  auto promise = std::make_shared<std::promise<params_reply>>();
  std::future<params_reply> reply = promise->get_future();
  caf::anon_send(m.reducer, params_request{std::move(promise)});
  lock.unlock();
  if (reply.wait_for(timeout) != std::future_status::ready)
    throw std::runtime_error("Engine::snapshot: no answer within " + std::to_string(timeout.count()) + " ms");
  params_reply values;
  try {
    values = reply.get();
  } catch (const std::future_error&) {
    throw std::runtime_error("Engine::snapshot: the run ended before the snapshot was taken");
  }
  parameter_snapshot snap;
  snap.step = values.step;
  snap.values = std::move(values.values);
  flat_layout params;
  for (std::size_t i = 0; i < m.layout.parameter_tensors; ++i) {
    const auto& t = m.layout.layout.tensors()[i];
    params.add(t.name, t.shape);
  }
  snap.layout = std::move(params);
  return snap;
}

}  // namespace dpactor
