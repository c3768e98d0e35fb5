#include "config/job_config.hpp"

#include <algorithm>

#include <dpactor/error.hpp>

namespace dpactor {

std::string sync_mode_name(sync_mode m) {
  switch (m) {
    case sync_mode::every_step: return "every_step";
    case sync_mode::local_sgd: return "local_sgd";
    case sync_mode::diloco: return "diloco";
    case sync_mode::async: return "async";
  }
  return "?";
}

std::string sync_codec_name(sync_codec c) {
  switch (c) {
    case sync_codec::fp32: return "fp32";
    case sync_codec::bf16: return "bf16";
    case sync_codec::int8: return "int8";
    case sync_codec::powersgd: return "powersgd";
  }
  return "?";
}

namespace {

// sync.mode = "async" against the rest of the job: what this version runs
// (docs/async.md, "Asynchronous rounds").
void validate_async(const job_config& c, const std::string& where) {
  const sync_config& s = c.sync;
  const std::string mode = "sync.mode = \"async\"";
  if (s.fragments > 1 || s.delay > 0)
    throw config_error(where + mode + " takes neither sync.fragments nor sync.delay: its rounds commit one by one, "
                       "each from the contributions that have arrived");
  if (s.codec != sync_codec::fp32)
    throw config_error(where + mode + " sends fp32 pseudo-gradients in this version, not sync.codec = \"" +
                       sync_codec_name(s.codec) + "\"");
  if (c.train.checkpoint_every_s > 0.0)
    throw config_error(where + mode + " writes checkpoints every train.checkpoint_every rounds, not on a clock, "
                       "in this version: set train.checkpoint_every_s = 0");
}

// The [sync] section against the rest of the job (docs/async.md).
void validate_sync(const job_config& c, const std::string& where) {
  const sync_config& s = c.sync;
  if (!s.rounds()) {
    // See Note [Bf16 steps]: every_step's codec.
    if (s.codec == sync_codec::int8)
      throw config_error(where + "sync.codec = \"int8\" needs a round mode (sync.mode = \"local_sgd\" or "
                         "\"diloco\"): its error feedback lives in the logical workers' state; sync.mode = "
                         "\"every_step\" takes \"fp32\" or \"bf16\"");
    const bool compressed = s.codec == sync_codec::bf16 || s.codec == sync_codec::powersgd;
    const std::string codec = "sync.codec = \"" + sync_codec_name(s.codec) + "\"";
    if (s.codec == sync_codec::bf16 && c.module.kind == model_kind::torchscript)
      throw config_error(where + codec + " runs on native MLP replicas only in this version: a torch "
                         "model's buffers (BatchNorm's statistics) travel with its gradients");
    if (compressed && !c.cluster.gpus.empty())
      throw config_error(where + codec + " runs on CPU replicas only in this version (use --cpus)");
    if (s.delay > 0)
      throw config_error(where + "sync.delay = " + std::to_string(s.delay) + " needs a round mode (sync.mode = "
                         "\"local_sgd\" or \"diloco\"): sync.mode = \"every_step\" applies each step's exchange "
                         "in that step");
    return;
  }
  const std::string mode = "sync.mode = \"" + sync_mode_name(s.mode) + "\"";
  if (s.codec == sync_codec::powersgd)  // See Note [PowerSGD steps]
    throw config_error(where + "sync.codec = \"powersgd\" compresses the gradients of sync.mode = \"every_step\"; " +
                       mode + " sends pseudo-gradients once a round: use sync.codec = \"int8\" or \"bf16\" there");
  if (s.workers > 0 && c.train.batch_size % s.workers != 0)
    throw config_error(where + "train.batch_size = " + std::to_string(c.train.batch_size) +
                       " does not split evenly over sync.workers = " + std::to_string(s.workers) +
                       " logical workers: each worker's inner step takes train.batch_size / sync.workers samples");
  if (c.module.kind == model_kind::mlp) {
    std::int64_t parameters = 0;
    for (std::size_t l = 0; l + 1 < c.model.sizes.size(); ++l)
      parameters += static_cast<std::int64_t>(c.model.sizes[l] + 1) * c.model.sizes[l + 1];
    if (s.fragments > parameters)
      throw config_error(where + "sync.fragments = " + std::to_string(s.fragments) + " is more than the model's " +
                         std::to_string(parameters) + " parameters: a fragment would be empty");
  }
  if (c.module.kind == model_kind::torchscript)
    throw config_error(where + mode + " runs on native MLP replicas only in this version: a torch model "
                       "(model.kind = \"torchscript\") trains with sync.mode = \"every_step\"");
  if (!c.cluster.gpus.empty())
    throw config_error(where + mode + " runs on CPU replicas only in this version: the CUDA replica trains with "
                       "sync.mode = \"every_step\" (use --cpus)");
  if (c.train.mode == train_mode::stream)
    throw config_error(where + mode + " needs train.mode = \"epochs\": a round's data is fixed by the epoch's "
                       "order, which a stream does not have");
  if (s.mode == sync_mode::async) {
    validate_async(c, where);
    return;
  }
  if (s.every % s.fragments != 0)
    throw config_error(where + "sync.every = " + std::to_string(s.every) + " does not split into sync.fragments = " +
                       std::to_string(s.fragments) + " equal parts: each fragment is exchanged every sync.every inner "
                       "steps, at its own offset of sync.every / sync.fragments");
  if (s.delay > 0 && s.fragments > 1)
    throw config_error(where + "sync.delay = 1 with sync.fragments = " + std::to_string(s.fragments) +
                       " is not built yet in this version: the delay applies a whole round's exchange one round "
                       "late (docs/async.md); use one or the other");
}

}  // namespace

void validate_job_config(const job_config& c) {
  const std::string where = c.source + ": ";
  if (c.optimizer.nesterov && (c.optimizer.momentum <= 0.0 || c.optimizer.dampening != 0.0))
    throw config_error(where + "optimizer.nesterov = true needs optimizer.momentum > 0 and optimizer.dampening = 0");
  if (c.data.format == data_format::csv && (c.data.train_file.empty() || c.data.test_file.empty()))
    throw config_error(where + "data.format = \"csv\" needs data.train_file and data.test_file");
  if (c.data.format == data_format::idx &&
      (c.data.train_images.empty() || c.data.train_labels.empty() || c.data.test_images.empty() || c.data.test_labels.empty()))
    throw config_error(where + "data.format = \"idx\" needs data.train_images, data.train_labels, data.test_images and data.test_labels");
  // Replicas share a GPU only all of them on one (the same_device backend);
  // NCCL, which joins the others, refuses two ranks on one GPU.
  const bool one_shared_gpu =
      c.cluster.gpus.size() > 1 &&
      std::all_of(c.cluster.gpus.begin(), c.cluster.gpus.end(), [&](int g) { return g == c.cluster.gpus[0]; });
  for (std::size_t i = 0; i < c.cluster.gpus.size() && !one_shared_gpu; ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (c.cluster.gpus[i] == c.cluster.gpus[j])
        throw config_error(where + "cluster.gpus lists GPU " + std::to_string(c.cluster.gpus[i]) +
                           " twice among other GPUs: replicas share a GPU only when all of them are on it "
                           "(--gpus 0,0); NCCL refuses two ranks on one GPU");
  if (c.train.reproducible && c.cluster.blas_threads > 1)
    throw config_error(where + "cluster.blas_threads = " + std::to_string(c.cluster.blas_threads) +
                       " with train.reproducible = true: a reproducible run uses one BLAS thread per replica, so "
                       "that a slice's gradient does not depend on how the BLAS splits its work; set "
                       "cluster.blas_threads = 1 (or 0), or train.reproducible = false");
  if (c.train.mode == train_mode::stream) {
    if (c.train.stream_queue < c.train.batch_size)
      throw config_error(where + "train.stream_queue = " + std::to_string(c.train.stream_queue) +
                         " is smaller than train.batch_size = " + std::to_string(c.train.batch_size) +
                         ": a global batch could never form");
    if (c.schedule.kind == schedule_kind::cosine && c.schedule.total_steps == 0 && c.train.max_steps == 0)
      throw config_error(where + "train.mode = \"stream\" has no nominal length for the cosine schedule: set "
                         "optimizer.schedule = \"constant\" (or \"step\"), or optimizer.total_steps, or "
                         "train.max_steps");
  }
  validate_sync(c, where);
  if (c.module.kind == model_kind::torchscript) {
    if (c.module.path.empty())
      throw config_error(where + "model.kind = \"torchscript\" needs model.path, the module's file (saved by "
                         "torch.jit.script(model).save(path))");
    if (c.module.input_shape.empty())
      throw config_error(where + "model.kind = \"torchscript\" needs model.input_shape, one sample's shape as the "
                         "module's forward takes it: e.g. [784] for a flat input, [1, 28, 28] for an image");
    if (!c.cluster.gpus.empty())
      throw config_error(where + "model.kind = \"torchscript\" runs on CPU replicas only in this version (Debian's "
                         "libtorch is CPU-only): use --cpus instead of --gpus");
  } else if (c.model.outputs() < 2 && c.model.loss == loss_kind::cross_entropy)
    throw config_error(where + "model.layers: cross_entropy needs at least 2 classes in the last layer");
}

bool cuts_enabled(const job_config& config) noexcept {
  const auto policy = config.straggler.policy;
  // A round is a logical worker's H inner steps: not cut (docs/async.md).
  return !config.train.reproducible && !config.sync.rounds() &&
         (policy == straggler_policy::cut || policy == straggler_policy::balance_cut);
}

lr_schedule make_lr_schedule(const job_config& config, std::int64_t run_steps) {
  lr_schedule s;
  s.kind = config.schedule.kind;
  s.base_lr = config.optimizer.lr;
  s.warmup_steps = config.schedule.warmup_steps;
  s.step_size = config.schedule.step_size;
  s.gamma = config.schedule.gamma;
  s.min_lr = config.schedule.min_lr;
  s.total_steps = config.schedule.total_steps > 0 ? config.schedule.total_steps : run_steps;
  return s;
}

}  // namespace dpactor
