#include "actors/engine.hpp"

#include <algorithm>
#include <future>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <stdexcept>
#include <thread>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "train/checkpoint.hpp"
#include "actors/checkpoint_writer.hpp"
#include "config/config_file.hpp"
#include "actors/device.hpp"
#include "train/fault_plan.hpp"
#include "actors/loader.hpp"
#include "actors/messages.hpp"
#include "actors/reducer.hpp"
#include "comms/local.hpp"
#if DPACTOR_HAS_CUDA
#include "comms/nccl.hpp"
#include "cuda/cuda_replica.hpp"
#endif
#include "data/loading.hpp"
#include "tensors/cpu_replica.hpp"
#include "tensors/error.hpp"
#include "tensors/gemm.hpp"

namespace dpactor {
namespace {

// Scheduler threads for the event-based actors (loader, reducer). Devices and
// the checkpoint writer are detached and bring their own threads.
constexpr std::size_t scheduler_threads = 1;

// Without cuts, a member reports who it waits for only after this long: the
// report then serves to name the suspects if the step hangs.
constexpr double late_factor_without_cuts = 20.0;
constexpr double late_floor_without_cuts_s = 0.05;

int hardware_cores() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

// The replica state every member starts from: fresh, from weights, or resumed.
struct initial_state {
  std::vector<float> state;
  std::int64_t start_step = 0;
  std::optional<ledger_position> position;
};

// The replica of device `id`: on GPU config.cluster.gpus[id], or a CPU one.
std::unique_ptr<replica> make_replica(const job_config& config, const optimizer_config& opt, std::size_t micro_batch,
                                      int id) {
  if (config.cluster.gpus.empty()) return std::make_unique<cpu_replica>(config.model, opt, micro_batch);
#if DPACTOR_HAS_CUDA
  cuda_replica_options options;
  options.device = config.cluster.gpus.at(static_cast<std::size_t>(id));
  options.tf32 = config.precision.matmul == matmul_precision::tf32;
  switch (config.cluster.gpu_data) {
    case gpu_data_placement::automatic: options.data = cuda_data_placement::automatic; break;
    case gpu_data_placement::resident: options.data = cuda_data_placement::resident; break;
    case gpu_data_placement::streamed: options.data = cuda_data_placement::streamed; break;
  }
  return std::make_unique<cuda_replica>(config.model, opt, micro_batch, options);
#else
  (void)id;
  throw config_error("cluster.gpus is set but this build of dpactor has no CUDA support");
#endif
}

// A generation's collective group for the members with these device ids:
// NCCL on GPUs, the in-process `local` backend on CPU replicas.
std::shared_ptr<collective_group> make_group(const job_config& config, const std::vector<int>& ids) {
  if (!config.cluster.gpus.empty()) {
#if DPACTOR_HAS_CUDA
    std::vector<int> devices;
    for (const int id : ids) devices.push_back(config.cluster.gpus.at(static_cast<std::size_t>(id)));
    return make_nccl_group(std::move(devices));
#endif
  }
  local_group_options options;
  options.oversubscribed = ids.size() > std::max(1u, std::thread::hardware_concurrency());
  return make_local_group(static_cast<int>(ids.size()), options);
}

initial_state make_initial_state(const job_config& config, const run_options& options, const state_layout& layout,
                                 std::size_t train_rows) {
  initial_state init;
  if (!options.resume_from.empty()) {
    loaded_checkpoint ckpt = read_checkpoint(options.resume_from, layout);
    const trainer_record& r = ckpt.record;
    const std::string where = ckpt.directory.string() + ": ";
    if (r.train_samples != train_rows)
      throw checkpoint_error(where + "the checkpoint was trained on " + std::to_string(r.train_samples) +
                             " samples, the configured training set has " + std::to_string(train_rows));
    if (r.seed != static_cast<std::uint64_t>(config.train.seed) || r.shuffle != config.train.shuffle)
      throw config_error(where + "the checkpoint was trained with train.seed = " + std::to_string(r.seed) +
                         " and train.shuffle = " + (r.shuffle ? "true" : "false") +
                         "; resuming needs the same values (they define the epoch order)");
    init.state = std::move(ckpt.state);
    init.start_step = r.step;
    init.position = r.position;
    spdlog::info("resuming from {} at step {}, epoch {}", ckpt.directory.string(), r.step, r.position.epoch + 1);
    return init;
  }
  init.state.assign(layout.total_size(), 0.0f);
  if (!options.init_from.empty()) {
    const std::vector<float> params = read_model_weights(options.init_from, layout);
    std::copy(params.begin(), params.end(), init.state.begin());
  } else {
    init_mlp_parameters(config.model, std::span<float>(init.state).first(layout.parameter_size),
                        static_cast<std::uint64_t>(config.train.seed));
  }
  return init;
}

}  // namespace

std::span<const float> parameter_snapshot::tensor(const std::string& name) const {
  const tensor_spec* t = layout.find(name);
  if (t == nullptr) throw std::out_of_range("no tensor named " + name);
  return std::span<const float>(values).subspan(t->offset, t->numel());
}

struct Engine::impl {
  job_config config;
  run_options options;
  event_callback callback;

  mutable std::shared_mutex system_mutex;  // exclusive: start/teardown; shared: snapshot
  std::mutex run_mutex;                    // one start/wait at a time
  std::unique_ptr<caf::actor_system_config> system_config;  // outlives the system, which refers to it
  std::unique_ptr<caf::actor_system> system;
  std::vector<caf::actor> actors;  // everything spawned, for teardown
  caf::actor reducer;
  std::shared_ptr<run_control> control;
  std::optional<std::future<run_summary>> outcome;
  std::atomic<bool> stop_requested{false};
  std::atomic<bool> running{false};
  std::chrono::steady_clock::time_point started;
  state_layout layout;

  void teardown() {
    std::unique_lock lock(system_mutex);
    if (!system) return;
    for (const auto& a : actors) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    actors.clear();
    reducer = nullptr;
    system.reset();  // waits for every actor to finish
    system_config.reset();
  }
};

Engine::Engine(job_config config, run_options options) : impl_(std::make_unique<impl>()) {
  validate_job_config(config);
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
  return cluster.cpus > 0 ? static_cast<int>(cluster.cpus) : hardware_cores();
}

bool Engine::running() const { return impl_->running; }

void Engine::stop() {
  impl_->stop_requested = true;
  std::shared_lock lock(impl_->system_mutex);
  if (impl_->system && impl_->reducer) caf::anon_send(impl_->reducer, stop_atom::value);
}

void Engine::start() {
  auto& m = *impl_;
  std::unique_lock run_lock(m.run_mutex);
  if (m.running) throw std::logic_error("Engine::start: a run is already in progress");
  const job_config& config = m.config;
  m.started = std::chrono::steady_clock::now();

  train_test_data data = load_data(config.data, config.model.inputs(), config.model.outputs());
  const int replicas = replica_count();
  const int blas = config.cluster.blas_threads > 0 ? static_cast<int>(config.cluster.blas_threads)
                                                   : std::max(1, hardware_cores() / replicas);
  set_blas_threads(blas);

  optimizer_config opt = config.optimizer;
  m.layout = make_state_layout(config.model, opt);
  initial_state init = make_initial_state(config, m.options, m.layout, data.train->rows);

  const auto rows = static_cast<std::int64_t>(data.train->rows);
  const std::int64_t epoch_steps = (rows + config.train.batch_size - 1) / config.train.batch_size;
  std::int64_t run_steps = epoch_steps * config.train.epochs;
  if (config.train.max_steps > 0) run_steps = std::min(run_steps, config.train.max_steps);
  const lr_schedule schedule = make_lr_schedule(config, run_steps);

  m.control = std::make_shared<run_control>(m.callback);
  m.outcome = m.control->outcome();

  auto cfg = std::make_unique<caf::actor_system_config>();
  register_message_types(*cfg);
  cfg->set("scheduler.max-threads", scheduler_threads);
  // Workers that sleep until a message arrives: the work-stealing default
  // polls, and its polling took a fifth of the throughput from the devices'
  // cores on a 2-core machine (docs/PERFORMANCE.md).
  cfg->set("scheduler.policy", caf::atom("sharing"));
  auto system = std::make_unique<caf::actor_system>(*cfg);

  const bool checkpoints = !config.train.checkpoint_dir.empty();
  caf::actor writer;
  if (checkpoints) {
    auto setup = std::make_shared<checkpoint_writer_setup>();
    setup->root = config.train.checkpoint_dir;
    setup->layout = m.layout;
    setup->seed = static_cast<std::uint64_t>(config.train.seed);
    setup->shuffle = config.train.shuffle;
    setup->train_samples = data.train->rows;
    setup->config_toml = dump_job_config(config);
    setup->keep = config.train.keep_checkpoints;
    writer = system->spawn<caf::detached>(checkpoint_writer_actor, std::shared_ptr<const checkpoint_writer_setup>(setup));
  }

  const std::vector<fault_spec> faults = parse_fault_specs(config.faults.inject);
  if (!config.cluster.gpus.empty())
    for (const auto& f : faults)
      if (f.kind == fault_kind::join)
        throw config_error(f.text + ": a CPU device cannot join a job on GPUs (NCCL groups GPU ranks only)");
  const auto micro_batch = static_cast<std::size_t>(config.train.micro_batch);
  const auto collective_timeout =
      std::chrono::milliseconds(static_cast<std::int64_t>(config.cluster.collective_timeout_s * 1000.0));
  const bool gpus = !config.cluster.gpus.empty();
  // Spawns device `id`, at the start and for joins (the reducer calls it).
  caf::actor_system* sys = system.get();
  auto spawn_device = [=, train = data.train, test = data.test, state = std::make_shared<const std::vector<float>>(init.state)](int id) {
    auto setup = std::make_shared<device_setup>();
    setup->id = id;
    setup->name = (gpus ? "gpu:" : "cpu:") + std::to_string(id);
    setup->model = make_replica(config, opt, micro_batch, id);
    setup->model->import_state(*state);  // a newcomer is overwritten by the generation's broadcast
    setup->train = train;
    setup->test = test;
    setup->schedule = schedule;
    setup->collective.timeout = collective_timeout;
    setup->verify_replicas = config.train.verify_replicas;
    const bool cuts =
        config.straggler.policy == straggler_policy::cut || config.straggler.policy == straggler_policy::balance_cut;
    // Without cuts, lateness is reported only to name suspects of a hang.
    setup->late_factor = cuts ? config.straggler.deadline_factor : late_factor_without_cuts;
    setup->late_floor_s = cuts ? config.straggler.deadline_floor_ms / 1000.0 : late_floor_without_cuts_s;
    setup->control = std::make_shared<device_control>();
    for (const auto& f : faults)
      if (is_device_fault(f) && f.device == id) setup->faults.push_back(f);
    setup->fault_seed = static_cast<std::uint64_t>(config.faults.seed);
    setup->buckets.cap_bytes = std::max<std::size_t>(1, static_cast<std::size_t>(config.cluster.bucket_cap_mb * (1 << 20)));
    setup->buckets.first_bytes = std::max<std::size_t>(1, static_cast<std::size_t>(config.cluster.first_bucket_mb * (1 << 20)));
    member_handle h;
    h.id = id;
    h.name = setup->name;
    h.control = setup->control;
    h.actor = sys->spawn<caf::detached>(device_actor, std::move(setup));
    return h;
  };
  std::vector<member_handle> devices;
  for (int r = 0; r < replicas; ++r) devices.push_back(spawn_device(r));

  loader_setup ls;
  ls.train_rows = data.train->rows;
  ls.test_rows = data.test->rows;
  ls.batch_size = config.train.batch_size;
  ls.epochs = config.train.epochs;
  ls.eval_every = config.train.eval_every;
  ls.max_steps = config.train.max_steps;
  ls.prefetch = config.train.prefetch;
  ls.steps_per_message = config.train.steps_per_message;
  ls.seed = static_cast<std::uint64_t>(config.train.seed);
  ls.shuffle = config.train.shuffle;
  ls.checkpoints = checkpoints;
  ls.checkpoint_every = config.train.checkpoint_every;
  ls.start_step = init.start_step;
  ls.resume_position = init.position;
  caf::actor loader = system->spawn(loader_actor, std::move(ls));

  reducer_setup rs;
  rs.control = m.control;
  rs.devices = devices;
  rs.spawn_device = spawn_device;
  if (m.options.collective_backend)
    rs.make_group = [backend = m.options.collective_backend](const std::vector<int>& ids) {
      return backend(static_cast<int>(ids.size()));
    };
  else
    rs.make_group = [config](const std::vector<int>& ids) { return make_group(config, ids); };
  rs.loader = loader;
  rs.writer = writer;
  rs.book.schedule = schedule;
  rs.book.start_step = init.start_step;
  rs.book.epoch_steps = epoch_steps;
  rs.book.total_steps = run_steps;
  rs.book.log_every = config.train.log_every;
  rs.book.verify_replicas = config.train.verify_replicas;
  rs.book.smoothing = config.straggler.smoothing;
  rs.straggler = config.straggler;
  rs.min_devices = config.cluster.min_devices;
  rs.hang_timeout_s = config.cluster.hang_timeout_s;
  for (const auto& f : faults)
    if (!is_device_fault(f)) rs.membership_faults.push_back(f);
  rs.started = m.started;
  caf::actor reducer = system->spawn(reducer_actor, std::move(rs));

  {
    std::unique_lock lock(m.system_mutex);
    m.system_config = std::move(cfg);
    m.system = std::move(system);
    m.actors.clear();
    for (const auto& d : devices) m.actors.push_back(d.actor);
    m.actors.push_back(loader);
    m.actors.push_back(reducer);
    if (writer) m.actors.push_back(writer);
    m.reducer = reducer;
    m.running = true;
  }
  caf::anon_send(reducer, start_atom::value);
  if (m.stop_requested) caf::anon_send(reducer, stop_atom::value);
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
