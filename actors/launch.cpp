#include "actors/launch.hpp"

#include <algorithm>
#include <future>
#include <optional>
#include <string>
#include <thread>


#include "actors/backend.hpp"
#include "train/async_claims.hpp"
#include "config/config_file.hpp"
#include "config/job_identity.hpp"
#include <dpactor/error.hpp>
#include "tensors/visible_text.hpp"
#include "train/checkpoint.hpp"
#include "config/memory_needs.hpp"
#include "actors/log.hpp"

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

// The torch model, for messages.
std::string model_name(const job_config& config, const run_options& options) {
  return options.torch_model ? std::string("the C++ module (run_options::torch_model)") : config.module.path;
}

// The text after "name = " on its line in the [sync] section a
// checkpoint's run was configured with (its trainer record's config), or
// nothing where the section or key is not there.
std::optional<std::string> checkpoint_sync_text(const std::string& config_toml, const std::string& name) {
  const auto section = config_toml.find("[sync]\n");
  if (section == std::string::npos) return std::nullopt;
  const auto end = config_toml.find("\n[", section + 1);
  const std::string body = config_toml.substr(section, end == std::string::npos ? std::string::npos : end - section);
  const std::string key = "\n" + name + " = ";
  const auto at = body.find(key);
  if (at == std::string::npos) return std::nullopt;
  const auto value = at + key.size();
  return body.substr(value, body.find('\n', value) - value);
}

// A string key of it, or `fallback` (sync.mode "every_step" and sync.codec
// "fp32" before they existed).
std::string checkpoint_sync_value(const std::string& config_toml, const std::string& name, const std::string& fallback) {
  const auto text = checkpoint_sync_text(config_toml, name);
  if (!text || text->size() < 2 || text->front() != '"') return fallback;
  return text->substr(1, text->find('"', 1) - 1);
}

// An integer key of it, or `fallback` (sync.fragments 1 before it existed).
std::int64_t checkpoint_sync_integer(const std::string& config_toml, const std::string& name, std::int64_t fallback) {
  const auto text = checkpoint_sync_text(config_toml, name);
  if (!text) return fallback;
  try {
    return std::stoll(*text);
  } catch (const std::exception&) {
    return fallback;
  }
}

// The logical workers of a resumed round mode: K is the checkpoint's.
void resume_workers(const job_config& config, loaded_checkpoint& ckpt, launch_plan& plan) {
  const std::size_t per = worker_floats(plan.inner_layout, config.sync.codec != sync_codec::fp32,
                                       static_cast<std::size_t>(config.sync.fragments), config.sync.delay > 0);
  const auto workers = static_cast<std::int64_t>(ckpt.workers.size() / per);
  const std::string where = ckpt.directory.string() + ": ";
  if (config.sync.workers > 0 && config.sync.workers != workers)
    throw config_error(where + "the checkpoint has " + std::to_string(workers) + " logical workers, this config has "
                       "sync.workers = " + std::to_string(config.sync.workers) +
                       ": a run keeps its logical workers (set sync.workers = 0 to take the checkpoint's)");
  if (config.train.batch_size % workers != 0)
    throw config_error(where + "the checkpoint's " + std::to_string(workers) + " logical workers do not split "
                       "train.batch_size = " + std::to_string(config.train.batch_size) + " evenly");
  plan.shape.workers = workers;
  plan.resumed_workers = std::move(ckpt.workers);
}

// The state every member starts from: fresh, from weights, or resumed.
void load_initial_state(const job_config& config, const run_options& options, launch_plan& plan) {
  if (!options.resume_from.empty()) {
    const std::string ckpt_config = read_trainer_record(options.resume_from).config;
    const std::string mode = checkpoint_sync_value(ckpt_config, "mode", "every_step");
    const std::string wanted = sync_mode_name(config.sync.mode);
    if (mode != wanted)
      throw config_error(visible(options.resume_from) + ": the checkpoint is of a run with sync.mode = \"" + mode +
                         "\", this config has sync.mode = \"" + wanted + "\": " +
                         (mode == "every_step" || wanted == "every_step"
                              ? "the optimizer file holds another optimizer's state"
                              : "the outer optimizer's state differs") +
                         " (a run keeps its mode from start to end)");
    if (plan.rounds) {
      const std::string codec = checkpoint_sync_value(ckpt_config, "codec", "fp32");
      const std::string wanted_codec = sync_codec_name(config.sync.codec);
      if (codec != wanted_codec)
        throw config_error(visible(options.resume_from) + ": the checkpoint is of a run with sync.codec = \"" + codec +
                           "\", this config has sync.codec = \"" + wanted_codec +
                           "\": the logical workers' error-feedback residuals are the codec's (a run keeps its codec "
                           "from start to end)");
      const std::int64_t fragments = checkpoint_sync_integer(ckpt_config, "fragments", 1);
      if (fragments != config.sync.fragments)
        throw config_error(visible(options.resume_from) + ": the checkpoint is of a run with sync.fragments = " +
                           std::to_string(fragments) + ", this config has sync.fragments = " +
                           std::to_string(config.sync.fragments) +
                           ": its steps and the logical workers' parameters are the fragments' (a run keeps its "
                           "fragments from start to end)");
      const std::int64_t delay = checkpoint_sync_integer(ckpt_config, "delay", 0);
      if (delay != config.sync.delay)
        throw config_error(visible(options.resume_from) + ": the checkpoint is of a run with sync.delay = " +
                           std::to_string(delay) + ", this config has sync.delay = " +
                           std::to_string(config.sync.delay) +
                           ": its outer optimizer holds " + (delay > 0 ? "an exchange not yet applied" : "none") +
                           " and its logical workers' states are the delay's (a run keeps its delay from start to "
                           "end)");
    }
    loaded_checkpoint ckpt = read_checkpoint(options.resume_from, plan.layout, plan.rounds ? &plan.inner_layout : nullptr,
                                             config.sync.codec != sync_codec::fp32,
                                             static_cast<std::size_t>(config.sync.fragments), config.sync.delay > 0);
    const trainer_record& r = ckpt.record;
    const std::string where = ckpt.directory.string() + ": ";
    if (plan.rounds) resume_workers(config, ckpt, plan);
    const bool stream = config.train.mode == train_mode::stream;
    if (r.position.stream.active != stream)
      throw config_error(where + "the checkpoint is of a run with train.mode = \"" +
                         (r.position.stream.active ? "stream" : "epochs") + "\"; this config has train.mode = \"" +
                         (stream ? "stream" : "epochs") + "\"");
    // See Note [Async checkpoints]: the claims where the checkpoint left them.
    if (config.sync.mode == sync_mode::async) {
      if (!r.position.async.active)
        throw checkpoint_error(where + "trainer.json holds no \"async\" claims, which a sync.mode = \"async\" "
                               "checkpoint has: the file was edited or damaged");
      try {
        async_claims(plan.data.train->rows, r.seed, r.shuffle, config.train.epochs, r.position.async);
      } catch (const std::invalid_argument& e) {
        throw checkpoint_error(where + "trainer.json: " + e.what());
      }
    }
    if (!stream && r.train_samples != plan.data.train->rows)
      throw checkpoint_error(where + "the checkpoint was trained on " + std::to_string(r.train_samples) +
                             " samples, the configured training set has " + std::to_string(plan.data.train->rows));
    // See Note [A checkpoint knows its data].
    if (!r.data_fingerprint.empty() && r.data_fingerprint != plan.data_fingerprint) {
      const std::string both = "the checkpoint was trained on data with fingerprint " + r.data_fingerprint +
                               ", this run's data has " + plan.data_fingerprint;
      if (!config.train.resume_other_data)
        throw checkpoint_error(where + both + ": resuming on other data would mix two runs; to fine-tune on this "
                               "data from the checkpoint, set train.resume_other_data = true (or start from its "
                               "weights: --init-from)");
      engine_log()->warn("{}{} (train.resume_other_data = true: resuming on this data)", where, both);
    }
    if (r.seed != static_cast<std::uint64_t>(config.train.seed) || r.shuffle != config.train.shuffle)
      throw config_error(where + "the checkpoint was trained with train.seed = " + std::to_string(r.seed) +
                         " and train.shuffle = " + (r.shuffle ? "true" : "false") +
                         "; resuming needs the same values (they define the epoch order)");
    plan.initial_state = std::make_shared<const std::vector<float>>(std::move(ckpt.state));
    plan.start_step = r.step;
    // Resumed from its own directory, the run continues that directory's run.
    std::error_code ec;
    if (!config.train.checkpoint_dir.empty() &&
        std::filesystem::equivalent(ckpt.directory.parent_path(), config.train.checkpoint_dir, ec))
      plan.claim.resumed_step = r.step;
    plan.resume_position = r.position;
    if (stream)
      engine_log()->info("resuming from {} at step {}: every record up to sequence number {} is trained; replay the stream "
                   "from {}", ckpt.directory.string(), r.step, r.position.stream.committed, r.position.stream.committed + 1);
    else
      engine_log()->info("resuming from {} at step {}, epoch {}", ckpt.directory.string(), r.step, r.position.epoch + 1);
    return;
  }
  std::vector<float> state(plan.layout.total_size(), 0.0f);
  if (!options.init_from.empty()) {
    const std::vector<float> params = read_model_weights(options.init_from, plan.layout);
    std::copy(params.begin(), params.end(), state.begin());
  } else if (plan.module) {
    plan.module->initial_parameters(std::span<float>(state).first(plan.layout.parameter_size));
  } else {
    init_mlp_parameters(config.model, std::span<float>(state).first(plan.layout.parameter_size),
                        static_cast<std::uint64_t>(config.train.seed));
  }
  plan.initial_state = std::make_shared<const std::vector<float>>(std::move(state));
}

// See Note [PowerSGD steps]: the residuals and the basis the devices share.
void plan_powersgd(const job_config& config, const run_options& options, launch_plan& plan) {
  const sync_config& s = config.sync;
  if (options.coordinator && config.train.reproducible)
    throw config_error(config.source + ": sync.codec = \"powersgd\" with train.reproducible = true runs in one "
                       "process in this version (a slice's error-feedback residual is shared by the devices of one "
                       "process, and slices move between processes); across processes set train.reproducible = "
                       "false (each member keeps its own residual), or use sync.codec = \"bf16\" (docs/async.md)");
  const auto slices = static_cast<std::size_t>((config.train.batch_size + config.train.micro_batch - 1) /
                                               config.train.micro_batch);
  const auto rank = static_cast<std::size_t>(s.powersgd_rank);
  auto setup = make_powersgd_setup(plan.layout, rank, s.powersgd_start_step, static_cast<std::uint64_t>(config.train.seed),
                                   config.train.reproducible, slices);
  // Resumed after the first compressed step: the checkpoint's residuals and
  // basis, which a reproducible run's checkpoints hold. Fast mode's members
  // start again from zero residuals and the first basis (their residuals are
  // their own, and fast mode is not reproducible).
  if (!options.resume_from.empty() && plan.start_step > s.powersgd_start_step && setup->residuals) {
    const powersgd_plan layout_plan(plan.layout, rank);
    const loaded_checkpoint ckpt = read_checkpoint(options.resume_from, plan.layout, nullptr, false, 1, false, &layout_plan);
    const std::size_t n = plan.layout.parameter_size;
    const std::size_t saved = (ckpt.powersgd.size() - layout_plan.q_floats()) / n;
    if (saved != slices)
      throw config_error(visible(options.resume_from) + ": the checkpoint holds PowerSGD residuals of " +
                         std::to_string(saved) + " slices, this config has " + std::to_string(slices) +
                         " (train.batch_size / train.micro_batch): a run keeps its slices from start to end");
    const std::span<const float> loaded(ckpt.powersgd);
    setup->residuals = std::make_shared<logical_worker_store>(slices, loaded.first(slices * n), plan.start_step);
    setup->bases = std::make_shared<logical_worker_store>(1, loaded.subspan(slices * n), plan.start_step);
  }
  plan.powersgd = std::move(setup);
}

// The round modes' plan, before the state layout (See Note [Logical
// workers]); `devices`: the devices the run starts with (a coordinator's
// include the ones it waits for), one logical worker each by default.
void plan_rounds(const job_config& config, const run_options& options, int devices, launch_plan& plan) {
  const sync_config& s = config.sync;
  const std::string mode = sync_mode_name(s.mode);
  if (options.torch_model)
    throw config_error("run_options::torch_model: sync.mode = \"" + mode + "\" runs on native MLP replicas only in "
                       "this version");
  plan.shape.every = s.every / s.fragments;  // with fragments a step is 1/P of a round (See Note [Fragments])
  plan.shape.workers = s.workers > 0 ? s.workers : devices;
  plan.shape.batch = config.train.batch_size;
  plan.shape.fragments = s.fragments;
  if (config.train.batch_size % plan.shape.workers != 0)
    throw config_error(config.source + ": train.batch_size = " + std::to_string(config.train.batch_size) +
                       " does not split evenly over " + std::to_string(plan.shape.workers) +
                       " logical workers (sync.workers = 0: one per device the run starts with): each worker's inner step takes "
                       "train.batch_size / sync.workers samples; set sync.workers");
  // local_sgd averages the workers' weights: the outer step global - 1 x the
  // mean pseudo-gradient.
  optimizer_config& o = plan.outer_optimizer;
  o = optimizer_config{};
  o.kind = optimizer_kind::sgd;
  o.weight_decay = 0.0;
  const bool nesterov = s.outer_step() && s.outer_optimizer == outer_optimizer_kind::nesterov;
  o.lr = s.outer_step() ? s.outer_rate() : 1.0;
  o.momentum = nesterov ? s.outer_momentum : 0.0;
  o.nesterov = nesterov;
  o.delayed = s.delay > 0;  // See Note [Delayed rounds]
  plan.rounds = std::make_shared<round_setup>();
  plan.inner_layout = make_state_layout(config.model, config.optimizer);
}

// The outer schedule (constant), the inner one, and the workers' first state.
void finish_round_plan(const job_config& config, launch_plan& plan) {
  auto rounds = std::make_shared<round_setup>(*plan.rounds);
  rounds->worker_batch = plan.shape.worker_batch();
  rounds->codec = config.sync.codec;
  rounds->fragments = config.sync.fragments;
  rounds->parameters = plan.inner_layout.parameter_size;
  rounds->delayed = config.sync.delay > 0;
  rounds->last_step = plan.run_steps - 1;
  plan.schedule = lr_schedule{};
  plan.schedule.kind = schedule_kind::constant;
  plan.schedule.base_lr = plan.outer_optimizer.lr;
  std::int64_t inner_steps = plan.shape.inner_steps_per_epoch() * config.train.epochs;
  if (config.train.max_steps > 0) inner_steps = std::min(inner_steps, config.train.max_steps * plan.shape.every);
  rounds->inner_schedule = make_lr_schedule(config, inner_steps);
  if (config.sync.scale_inner_lr) {
    const double scale = static_cast<double>(plan.shape.worker_batch()) / static_cast<double>(plan.shape.batch);
    rounds->inner_schedule.base_lr *= scale;
    rounds->inner_schedule.min_lr *= scale;
  }
  const state_layout& inner = plan.inner_layout;
  const auto workers = static_cast<std::size_t>(plan.shape.workers);
  if (!plan.resumed_workers.empty()) {
    rounds->store = std::make_shared<logical_worker_store>(workers, plan.resumed_workers, plan.start_step);
    plan.resumed_workers.clear();
  } else {
    std::vector<float> first(inner.total_size(), 0.0f);
    write_step_counter(first, inner, 0);
    // See Note [A logical worker's state]: nothing dropped yet; with
    // fragments, the worker's own parameters are the global ones, no samples.
    const worker_state_shape shape = rounds->state_shape(inner);
    std::vector<float> state(shape.size(), 0.0f);
    std::copy(first.begin() + static_cast<std::ptrdiff_t>(inner.parameter_size), first.end(), state.begin());
    if (shape.own_parameters())
      std::copy_n(plan.initial_state->begin(), shape.parameters,
                  state.begin() + static_cast<std::ptrdiff_t>(shape.parameters_at()));
    rounds->store = std::make_shared<logical_worker_store>(workers, std::move(state));
  }
  rounds->history = std::make_shared<round_history>();  // kept across processes only (keep_round_history)
  plan.rounds = std::move(rounds);
}

}  // namespace

launch_plan prepare_launch(const job_config& config, const run_options& options, int replicas) {
  launch_plan plan;
  if (!options.resume_from.empty() && !options.init_from.empty())
    throw config_error("both resume_from (" + visible(options.resume_from) + ") and init_from (" +
                       visible(options.init_from) + ") say where the run starts: resuming continues a run (weights, "
                       "optimizer state, position in the data), init_from starts a new one from weights; give one");
  plan.claim.overwrite = options.overwrite_checkpoints;
  plan.faults = parse_fault_specs(config.faults.inject);
  for (const auto& f : plan.faults)
    if (f.kind == fault_kind::kill && (!options.coordinator || f.device < replicas))
      throw config_error(f.text + ": kill ends the process of the device it names, so it names a device of a worker "
                         "process (a coordinator's devices are numbered first, 0 to " + std::to_string(replicas - 1) +
                         "; workers' follow as they join)");
  if (!config.cluster.gpus.empty())
    for (const auto& f : plan.faults)
      if (f.kind == fault_kind::join)
        throw config_error(f.text + ": a CPU device cannot join a job on GPUs (NCCL groups GPU ranks only)");
  // Devices are numbered from 0 in start order; joining ones take the next numbers.
  const auto joins = std::count_if(plan.faults.begin(), plan.faults.end(),
                                   [](const fault_spec& f) { return f.kind == fault_kind::join; });
  // A coordinator's devices include the workers', numbered as they are
  // admitted: any number may name one.
  for (const auto& f : plan.faults)
    if (!options.coordinator && f.device >= replicas + joins)
      throw config_error(f.text + ": there is no device " + std::to_string(f.device) + ": the run has devices 0 to " +
                         std::to_string(replicas - 1) +
                         (joins > 0 ? " and " + std::to_string(joins) + " joining (" + std::to_string(replicas) +
                                          (joins > 1 ? " to " + std::to_string(replicas + joins - 1) : "") + ")"
                                    : "") +
                         " (--cpus, --gpus, cluster.cpus)");
  // A coordinator starts with at least the devices it waits for.
  const int starting = options.coordinator ? std::max({replicas, options.coordinator->wait_devices,
                                                       replicas + options.coordinator->wait_workers})
                                           : replicas;
  if (config.cluster.min_devices > starting)
    throw config_error(config.source + ": cluster.min_devices = " + std::to_string(config.cluster.min_devices) +
                       " but the run starts with " + std::to_string(starting) + (options.coordinator ? " device" : " replica") +
                       (starting == 1 ? "" : "s") +
                       (options.coordinator ? " (its own and --wait-devices)" : " (--cpus, --gpus, cluster.cpus)") +
                       ": it could never train");
  const bool stream = config.train.mode == train_mode::stream;
  // The model's widths: model.layers', or a TorchScript module's, which is
  // opened once here to check it against the data and lay out its state.
  int inputs = config.model.inputs(), classes = config.model.outputs();
  if (options.torch_model) {
    if (config.module.input_shape.empty())
      throw config_error("run_options::torch_model: set model.input_shape, one sample's shape as the module's "
                         "forward takes it (e.g. {784} or {1, 28, 28})");
    plan.torch_factory = options.torch_model;
  } else if (config.module.kind == model_kind::torchscript) {
    plan.torch_factory = open_torch_model;
  }
  if (plan.torch_factory) {
    plan.module = plan.torch_factory(torch_options(config, replica_shape{}));
    inputs = static_cast<int>(plan.module->inputs());
    classes = static_cast<int>(plan.module->outputs());
  }
  // See Note [Memory before allocating]: the replicas' needs and a synthetic
  // set's, before the data; again with the data loaded, before any replica.
  const memory_limit limit = available_memory();
  const auto check = [&](double data_bytes) {
    check_memory(memory_needs(config, plan.module ? static_cast<double>(plan.module->layout().size()) : 0.0, replicas,
                              data_bytes),
                 limit);
  };
  if (config.data.format == data_format::synthetic && !stream)
    check(static_cast<double>(config.data.synthetic_train + config.data.synthetic_test) *
          (static_cast<double>(inputs) + 3.0) * 4.0);
  else
    check(0.0);
  if (stream) {
    // See Note [Exactly-once offsets]: the records come from the feed, each
    // step's in a chunk of its own; there is no test set.
    const auto features = static_cast<std::size_t>(inputs);
    plan.data.train = std::make_shared<const dataset>("stream", 0, features, classes);
    plan.data.test = std::make_shared<const dataset>("stream (no test set)", 0, features, classes);
  } else if (plan.module) {
    std::string shape;
    for (const auto d : config.module.input_shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    const std::string key = "model.input_shape = [" + shape + "] of " + model_name(config, options);
    try {
      plan.data = load_data(config.data, inputs, classes, key);
    } catch (const data_error& e) {
      throw data_error(std::string(e.what()) + " (" + model_name(config, options) + " outputs " + std::to_string(classes) +
                       " class scores per sample)");
    }
  } else {
    plan.data = load_data(config.data, inputs, classes);
  }
  check(static_cast<double>(plan.data.train->features.size() + plan.data.test->features.size()) * 4.0 +
        static_cast<double>(plan.data.train->rows + plan.data.test->rows) * 12.0);
  plan.replicas = replicas;
  // A reproducible run pins one thread per replica (See Note [Summation tree]).
  plan.blas_threads = config.cluster.blas_threads > 0 ? static_cast<int>(config.cluster.blas_threads)
                      : config.train.reproducible     ? 1
                                                      : std::max(1, hardware_cores() / replicas);
  if (config.sync.rounds()) plan_rounds(config, options, starting, plan);
  else if (options.torch_model && config.sync.codec == sync_codec::bf16)
    throw config_error("run_options::torch_model: sync.codec = \"bf16\" runs on native MLP replicas only in this "
                       "version (a torch model's buffers travel with its gradients)");
  plan.layout = plan.module ? make_state_layout(plan.module->layout(), config.optimizer, plan.module->buffer_begin())
                            : make_state_layout(config.model, config.sync.rounds() ? plan.outer_optimizer : config.optimizer);
  // Note [A checkpoint knows its data]: a checkpoint records the fingerprint
  // of the data it was trained on (the one a worker proves at join), and a
  // resume on data of another fingerprint is refused naming both, unless
  // train.resume_other_data says the user means it (fine-tuning). Computed
  // only where a checkpoint is read or written: it reads every byte.
  if (!stream && (!config.train.checkpoint_dir.empty() || !options.resume_from.empty()))
    plan.data_fingerprint = data_fingerprint(*plan.data.train, *plan.data.test);
  load_initial_state(config, options, plan);
  if (config.sync.codec == sync_codec::powersgd && !config.sync.rounds()) plan_powersgd(config, options, plan);
  const auto rows = static_cast<std::int64_t>(plan.data.train->rows);
  plan.epoch_steps = std::max<std::int64_t>(1, (rows + config.train.batch_size - 1) / config.train.batch_size);
  if (plan.rounds) {
    plan.shape.rows = rows;
    plan.epoch_steps = plan.shape.rounds_per_epoch();
  }
  plan.run_steps = plan.epoch_steps * config.train.epochs;
  if (stream) plan.run_steps = config.train.max_steps > 0 ? config.train.max_steps : config.schedule.total_steps;
  else if (config.train.max_steps > 0) plan.run_steps = std::min(plan.run_steps, config.train.max_steps);
  if (stream)
    plan.stream = std::make_shared<record_queue>(
        static_cast<std::size_t>(config.train.stream_queue), static_cast<std::size_t>(inputs), classes,
        plan.resume_position ? plan.resume_position->stream : stream_position{});
  plan.schedule = make_lr_schedule(config, plan.run_steps);
  if (plan.rounds) finish_round_plan(config, plan);
  if (plan.rounds && plan.shape.workers < replicas)
    engine_log()->warn("sync.workers = {}: only {} of the {} replicas run logical workers in a round", plan.shape.workers,
                       plan.shape.workers, replicas);
  if (config.train.reproducible && !plan.rounds) {
    const std::int64_t slices = (config.train.batch_size + config.train.micro_batch - 1) / config.train.micro_batch;
    if (slices < replicas)
      engine_log()->warn("train.reproducible: a step of {} samples has {} slice{} of train.micro_batch = {}, so only {} of "
                   "the {} replicas work on it; a smaller train.micro_batch gives the others slices too",
                   config.train.batch_size, slices, slices == 1 ? "" : "s", config.train.micro_batch, slices, replicas);
  }
  return plan;
}

std::unique_ptr<caf::actor_system_config> make_system_config() {
  auto cfg = std::make_unique<caf::actor_system_config>();
  register_message_types(*cfg);
  cfg->set("scheduler.max-threads", scheduler_threads);
  // Workers that sleep until a message arrives: the work-stealing default
  // polls, and its polling took a fifth of the throughput from the devices'
  // cores on a 2-core machine (docs/PERFORMANCE.md).
  cfg->set("scheduler.policy", caf::atom("sharing"));
  return cfg;
}

bool destroy_within(std::unique_ptr<caf::actor_system> system, std::unique_ptr<caf::actor_system_config> config,
                    std::chrono::milliseconds bound) {
  // ~actor_system waits until no thread holds its logger, and the thread
  // that made the system holds it (thread-local): this one lets go.
  caf::logger::set_current_actor_system(nullptr);
  std::promise<void> done;
  std::future<void> destroyed = done.get_future();
  std::thread([system = std::move(system), config = std::move(config), done = std::move(done)]() mutable {
    system.reset();
    config.reset();
    done.set_value();
  }).detach();
  return destroyed.wait_for(bound) == std::future_status::ready;
}

std::shared_ptr<device_setup> make_device_setup(const job_config& config, const launch_plan& plan, int id) {
  auto setup = std::make_shared<device_setup>();
  setup->id = id;
  setup->name = device_name(config, id);
  const replica_shape shape{static_cast<std::size_t>(config.train.micro_batch), plan.data.train->feature_count,
                            plan.blas_threads};
  if (plan.rounds) {
    // The replica holds the global weights and the outer state; the inner
    // replica runs the logical workers' rounds (See Note [Logical workers]).
    job_config outer = config;
    outer.optimizer = plan.outer_optimizer;
    setup->model = make_replica(outer, shape, id, plan.torch_factory);
    setup->workers = std::make_shared<logical_worker_runner>(make_replica(config, shape, id, plan.torch_factory), plan.rounds);
    // See Note [Overlapped delayed rounds]: the replicas the next round
    // computes on while a round's exchange runs.
    const state_layout& l = setup->model->layout();
    if (plan.rounds->delayed && config.sync.overlap && setup->model->native_stream() == nullptr && l.buffer_begin == l.parameter_size)
      for (auto& shadow : setup->shadows) shadow = make_replica(outer, shape, id, plan.torch_factory);
  } else {
    setup->model = make_replica(config, shape, id, plan.torch_factory);
    setup->step_codec = config.sync.codec;  // See Note [Bf16 steps]
    setup->powersgd = plan.powersgd;        // See Note [PowerSGD steps]
  }
  setup->model->import_state(*plan.initial_state);  // a newcomer is overwritten by the generation's broadcast
  setup->train = plan.data.train;
  setup->test = plan.data.test;
  setup->schedule = plan.schedule;
  setup->collective.timeout =
      std::chrono::milliseconds(static_cast<std::int64_t>(config.cluster.collective_timeout_s * 1000.0));
  setup->verify_replicas = config.train.verify_replicas;
  setup->on_nonfinite = config.train.on_nonfinite;
  const bool cuts = cuts_enabled(config);
  // Without cuts, lateness is reported only to name suspects of a hang.
  setup->late_factor = cuts ? config.straggler.deadline_factor : late_factor_without_cuts;
  setup->late_floor_s = cuts ? config.straggler.deadline_floor_ms / 1000.0 : late_floor_without_cuts_s;
  setup->control = std::make_shared<device_control>();
  for (const auto& f : plan.faults)
    if (is_device_fault(f) && f.device == id) setup->faults.push_back(f);
  setup->fault_seed = static_cast<std::uint64_t>(config.faults.seed);
  setup->buckets.cap_bytes = std::max<std::size_t>(1, static_cast<std::size_t>(config.cluster.bucket_cap_mb * (1 << 20)));
  setup->buckets.first_bytes = std::max<std::size_t>(1, static_cast<std::size_t>(config.cluster.first_bucket_mb * (1 << 20)));
  return setup;
}

loader_setup make_loader_setup(const job_config& config, const launch_plan& plan) {
  loader_setup ls;
  ls.train_rows = plan.data.train->rows;
  ls.test_rows = plan.data.test->rows;
  ls.batch_size = config.train.batch_size;
  ls.epoch_steps = plan.epoch_steps;
  ls.epochs = config.train.epochs;
  ls.eval_every = config.train.eval_every;
  ls.max_steps = config.train.max_steps;
  ls.prefetch = config.train.prefetch;
  // See Note [Overlapped delayed rounds]: a round's record leaves once its
  // exchange is done, after the next round computed; for the round after
  // that to be queued by then, three messages are in flight.
  if (plan.rounds && plan.rounds->delayed && config.sync.overlap) ls.prefetch = std::max<std::int64_t>(ls.prefetch, 3);
  ls.steps_per_message = config.train.steps_per_message;
  ls.seed = static_cast<std::uint64_t>(config.train.seed);
  ls.shuffle = config.train.shuffle;
  ls.checkpoints = !config.train.checkpoint_dir.empty();
  ls.checkpoint_every = config.train.checkpoint_every;
  if (plan.rounds) {
    ls.batch_size = plan.shape.round_samples();
    ls.rounds = plan.shape;
  }
  // A round's slices are its logical workers' shares, in fast mode too.
  if (config.train.reproducible || plan.rounds) {
    ls.slice_rows = static_cast<std::uint32_t>(config.train.micro_batch);
    const auto policy = config.straggler.policy;
    ls.steal_slices = policy == straggler_policy::cut || policy == straggler_policy::balance_cut;
  }
  ls.start_step = plan.start_step;
  for (const auto& f : plan.faults)
    if (f.kind == fault_kind::crash && f.target == crash_target::loader) ls.crash_at = f.step - 1;
  ls.resume_position = plan.resume_position;
  ls.checkpoint_every_s = config.train.checkpoint_every_s;
  ls.stream = plan.stream;
  return ls;
}

reducer_setup make_reducer_setup(const job_config& config, const launch_plan& plan) {
  reducer_setup rs;
  rs.book.schedule = plan.schedule;
  rs.book.start_step = plan.start_step;
  rs.book.epoch_steps = plan.epoch_steps;
  rs.book.total_steps = plan.run_steps;
  rs.book.log_every = config.train.log_every;
  rs.book.verify_replicas = config.train.verify_replicas;
  rs.book.skip_nonfinite = config.train.on_nonfinite == nonfinite_policy::skip;
  rs.book.smoothing = config.straggler.smoothing;
  rs.straggler = config.straggler;
  rs.cuts = cuts_enabled(config);
  rs.replay_lost_workers = config.train.reproducible;
  if (plan.rounds && plan.start_step > 0) rs.resumed_workers = plan.rounds->store->read_all(plan.start_step);
  rs.min_devices = config.cluster.min_devices;
  rs.hang_timeout_s = config.cluster.hang_timeout_s;
  rs.first_step_timeout_s = config.cluster.first_step_timeout_s;
  for (const auto& f : plan.faults) {
    if (f.kind == fault_kind::join || f.kind == fault_kind::leave) rs.membership_faults.push_back(f);
    if (f.kind == fault_kind::crash && f.target == crash_target::reducer) rs.crash_at = f.step - 1;
  }
  if (plan.rounds) rs.logical_workers = static_cast<std::size_t>(plan.shape.workers);
  return rs;
}

std::shared_ptr<const checkpoint_writer_setup> make_writer_setup(const job_config& config, const launch_plan& plan) {
  auto setup = std::make_shared<checkpoint_writer_setup>();
  // Locks the directory, or throws: a second run, or one that cannot write
  // there, stops here, before anything trains.
  setup->directory = std::make_shared<checkpoint_directory>(config.train.checkpoint_dir, plan.claim);
  if (setup->directory->stale_removed() > 0)
    engine_log()->info("removed {} temporary folder{} of an earlier run from {}", setup->directory->stale_removed(),
                 setup->directory->stale_removed() == 1 ? "" : "s", config.train.checkpoint_dir);
  setup->layout = plan.layout;
  setup->seed = static_cast<std::uint64_t>(config.train.seed);
  setup->shuffle = config.train.shuffle;
  setup->train_samples = plan.data.train->rows;
  setup->data_fingerprint = plan.data_fingerprint;
  setup->config_toml = dump_job_config(config);
  setup->keep = config.train.keep_checkpoints;
  if (plan.rounds) {
    setup->inner = plan.inner_layout;
    setup->residual = plan.rounds->residual();
    setup->fragments = static_cast<std::size_t>(plan.rounds->fragments);
    setup->delayed = plan.rounds->delayed;
  }
  if (plan.powersgd && plan.powersgd->residuals)  // See Note [PowerSGD steps]
    setup->powersgd.emplace(plan.layout, plan.powersgd->rank);
  return setup;
}

}  // namespace dpactor
