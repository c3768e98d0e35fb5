// The key table: every config key, one statement each, with its type, range,
// default (the job_config's) and documentation (See config/schema_builder.hpp).

#include "config/schema_builder.hpp"

#include <limits>

#include "config/key_table.hpp"
#include <dpactor/error.hpp>
#include "train/fault_plan.hpp"

namespace dpactor::config_schema {
namespace {

// Upper bounds of the keys that have no natural one: far beyond any real
// job, low enough that no count, product or clock conversion overflows.
constexpr double max_wait_s = 7.0 * 24 * 3600;            // timeouts: a week
constexpr std::int64_t max_steps_count = std::int64_t{1} << 40;  // step and epoch counts
constexpr std::int64_t max_rows = std::numeric_limits<std::int32_t>::max();  // a batch's rows
constexpr std::int64_t max_samples = std::numeric_limits<std::uint32_t>::max();  // sample indices are 32-bit
constexpr double max_bucket_mb = 65536.0;                   // 64 GiB

}  // namespace

const std::vector<key_spec>& keys() {
  static const std::vector<key_spec> keys = [] {
    schema_builder b;
    b.section = "model";
    b.keys.push_back({"model", "layers", "array of integers",
                      "Layer widths: input features, hidden layers..., classes. Linear layers between them.",
                      [](job_config& c, const toml::node& n, const std::string& key) {
                        const toml::array* a = n.as_array();
                        if (a == nullptr) fail_at(n, key, "expected an array of integers, found " + type_name(n));
                        if (a->size() < 2) fail_at(n, key, "needs at least two entries (inputs and classes)");
                        std::vector<int> sizes;
                        for (const auto& e : *a)
                          sizes.push_back(static_cast<int>(read_int(e, key + "[" + std::to_string(sizes.size()) + "]", 1, 1 << 24)));
                        c.model.sizes = std::move(sizes);
                      },
                      [](const job_config& c) { return array_text(c.model.sizes); }});
    b.choice<activation>("activation", [](job_config& c) -> activation& { return c.model.hidden_activation; },
                         {{"relu", activation::relu}, {"gelu", activation::gelu}, {"tanh", activation::tanh},
                          {"sigmoid", activation::sigmoid}},
                         "Activation after every hidden layer (gelu is the exact, erf-based one).");
    b.choice<loss_kind>("loss", [](job_config& c) -> loss_kind& { return c.model.loss; },
                        {{"cross_entropy", loss_kind::cross_entropy}, {"mse", loss_kind::mse}},
                        "Loss: softmax cross-entropy, or mean squared error against one-hot labels.");
    b.choice<model_kind>("kind", [](job_config& c) -> model_kind& { return c.module.kind; },
                         {{"mlp", model_kind::mlp}, {"torchscript", model_kind::torchscript}},
                         "The model: dpactor's native MLP (model.layers), or a TorchScript module (model.path) "
                         "trained by the libtorch replica, a plugin loaded on demand (docs/torch.md).");
    b.keys.push_back({"model", "path", "string",
                      "torchscript: the module's file, saved by torch.jit.script(model).save(path); a relative path "
                      "is relative to the config file.",
                      [](job_config& c, const toml::node& n, const std::string& key) {
                        std::string path = read_string(n, key);
                        const auto& src = n.source();
                        if (!path.empty() && path.front() != '/' && src.path && src.path->rfind("--set ", 0) != 0) {
                          const std::string& file = *src.path;
                          const auto slash = file.rfind('/');
                          if (slash != std::string::npos) path = file.substr(0, slash + 1) + path;
                        }
                        c.module.path = std::move(path);
                      },
                      [](const job_config& c) { return quote(c.module.path); }});
    b.keys.push_back({"model", "input_shape", "array of integers",
                      "torchscript: one sample's shape as the module's forward takes it, e.g. [1, 28, 28]; the "
                      "data's features per sample are reshaped to it. Empty: [features].",
                      [](job_config& c, const toml::node& n, const std::string& key) {
                        const toml::array* a = n.as_array();
                        if (a == nullptr) fail_at(n, key, "expected an array of integers, found " + type_name(n));
                        std::vector<std::int64_t> shape;
                        for (const auto& e : *a)
                          shape.push_back(read_int(e, key + "[" + std::to_string(shape.size()) + "]", 1, 1 << 24));
                        c.module.input_shape = std::move(shape);
                      },
                      [](const job_config& c) { return array_text(c.module.input_shape); }});

    b.section = "data";
    b.choice<data_format>("format", [](job_config& c) -> data_format& { return c.data.format; },
                          {{"idx", data_format::idx}, {"csv", data_format::csv}, {"synthetic", data_format::synthetic}},
                          "Dataset format: IDX files (plain or .gz), CSV files, or generated Gaussian blobs.");
    b.string("train_images", [](job_config& c) -> std::string& { return c.data.train_images; }, "IDX: training images.");
    b.string("train_labels", [](job_config& c) -> std::string& { return c.data.train_labels; }, "IDX: training labels.");
    b.string("test_images", [](job_config& c) -> std::string& { return c.data.test_images; }, "IDX: test images.");
    b.string("test_labels", [](job_config& c) -> std::string& { return c.data.test_labels; }, "IDX: test labels.");
    b.string("train_file", [](job_config& c) -> std::string& { return c.data.train_file; }, "CSV: training set.");
    b.string("test_file", [](job_config& c) -> std::string& { return c.data.test_file; }, "CSV: test set.");
    b.boolean("header", [](job_config& c) -> bool& { return c.data.header; }, "CSV: the first line is a header.");
    b.integer("label_column", [](job_config& c) -> std::int64_t& { return c.data.label_column; }, -1024,
              "CSV: 0-based column of the label; negative counts from the end (-1 = last).", 1 << 20);
    b.integer("synthetic_train", [](job_config& c) -> std::int64_t& { return c.data.synthetic_train; }, 1,
              "Synthetic: training samples.", max_samples);
    b.integer("synthetic_test", [](job_config& c) -> std::int64_t& { return c.data.synthetic_test; }, 1,
              "Synthetic: test samples.", max_samples);
    b.floating("synthetic_noise", [](job_config& c) -> double& { return c.data.synthetic_noise; }, 0.0, false,
               "Synthetic: standard deviation of each class blob.", 1e6);
    b.integer("synthetic_seed", [](job_config& c) -> std::int64_t& { return c.data.synthetic_seed; }, 0,
              "Synthetic: seed of the class centres and samples.");
    b.choice<feature_scaling>("scale", [](job_config& c) -> feature_scaling& { return c.data.scale; },
                              {{"none", feature_scaling::none}, {"max", feature_scaling::max},
                               {"standardize", feature_scaling::standardize}},
                              "Feature scaling from training-set statistics: none, divide by the largest |x| "
                              "(255 for 8-bit images), or per-feature mean 0 and variance 1.");

    b.section = "optimizer";
    b.choice<optimizer_kind>("name", [](job_config& c) -> optimizer_kind& { return c.optimizer.kind; },
                             {{"sgd", optimizer_kind::sgd}, {"adamw", optimizer_kind::adamw}},
                             "Optimizer, with torch.optim's update formulas.");
    b.floating("lr", [](job_config& c) -> double& { return c.optimizer.lr; }, 0.0, true,
               "Base learning rate (the schedule scales it).");
    b.floating("momentum", [](job_config& c) -> double& { return c.optimizer.momentum; }, 0.0, false,
               "SGD momentum (0 = none).", 1.0);
    b.floating("dampening", [](job_config& c) -> double& { return c.optimizer.dampening; }, 0.0, false,
               "SGD dampening of the momentum.", 1.0);
    b.boolean("nesterov", [](job_config& c) -> bool& { return c.optimizer.nesterov; },
              "SGD Nesterov momentum (needs momentum > 0 and dampening = 0).");
    b.floating("weight_decay", [](job_config& c) -> double& { return c.optimizer.weight_decay; }, 0.0, false,
               "Weight decay: L2 added to the gradient (SGD), decoupled (AdamW).");
    b.floating("beta1", [](job_config& c) -> double& { return c.optimizer.beta1; }, 0.0, false,
               "AdamW: decay of the first moment.", 0.999999);
    b.floating("beta2", [](job_config& c) -> double& { return c.optimizer.beta2; }, 0.0, false,
               "AdamW: decay of the second moment.", 0.999999);
    b.floating("eps", [](job_config& c) -> double& { return c.optimizer.eps; }, 0.0, true,
               "AdamW: term added to the denominator.");
    b.choice<schedule_kind>("schedule", [](job_config& c) -> schedule_kind& { return c.schedule.kind; },
                            {{"constant", schedule_kind::constant}, {"step", schedule_kind::step},
                             {"cosine", schedule_kind::cosine}},
                            "Learning-rate schedule over optimizer steps (after warmup).");
    b.integer("warmup_steps", [](job_config& c) -> std::int64_t& { return c.schedule.warmup_steps; }, 0,
              "Linear warmup from lr / warmup_steps to lr over this many steps.", max_steps_count);
    b.integer("step_size", [](job_config& c) -> std::int64_t& { return c.schedule.step_size; }, 1,
              "schedule = \"step\": multiply the rate by gamma every step_size steps.", max_steps_count);
    b.floating("gamma", [](job_config& c) -> double& { return c.schedule.gamma; }, 0.0, true,
               "schedule = \"step\": decay factor.", 1.0);
    b.floating("min_lr", [](job_config& c) -> double& { return c.schedule.min_lr; }, 0.0, false,
               "schedule = \"cosine\": final learning rate.");
    b.integer("total_steps", [](job_config& c) -> std::int64_t& { return c.schedule.total_steps; }, 0,
              "schedule = \"cosine\": steps until min_lr; 0 = the run's nominal length (epochs or max_steps). "
              "Steps that cuts add (without train.reproducible) stay inside their epoch's part of the schedule.", max_steps_count);

    b.section = "train";
    b.choice<train_mode>("mode", [](job_config& c) -> train_mode& { return c.train.mode; },
                         {{"epochs", train_mode::epochs}, {"stream", train_mode::stream}},
                         "epochs: train train.epochs passes over the [data] training set. stream: train on records "
                         "that a program embedding the engine feeds it (Engine::feed, or a record_source), in global "
                         "batches in the order of their sequence numbers, until it is stopped or the stream ends; "
                         "[data] is not read and nothing is evaluated. Checkpoints record the highest sequence number "
                         "trained, for exactly-once offsets (docs/service.md).");
    b.integer("epochs", [](job_config& c) -> std::int64_t& { return c.train.epochs; }, 1, "Passes over the training set.", max_steps_count);
    b.integer("batch_size", [](job_config& c) -> std::int64_t& { return c.train.batch_size; }, 1,
              "Global batch: samples per optimizer step, summed over all replicas. The last batch of an "
              "epoch may be smaller; it is trained, not dropped.", max_rows);
    b.integer("max_steps", [](job_config& c) -> std::int64_t& { return c.train.max_steps; }, 0,
              "Stop after this many optimizer steps in total (0 = no limit).", max_steps_count);
    b.boolean("shuffle", [](job_config& c) -> bool& { return c.train.shuffle; },
              "Visit the training set in a seeded random order each epoch.");
    b.integer("seed", [](job_config& c) -> std::int64_t& { return c.train.seed; }, 0,
              "Seed of the initial weights and of the epoch orders.");
    b.integer("micro_batch", [](job_config& c) -> std::int64_t& { return c.train.micro_batch; }, 1,
              "Rows per forward/backward pass on a device. With train.reproducible, the fixed slice of the global "
              "batch: slices are the unit that members share and steal, and their gradients are added in one "
              "fixed tree, so at most batch_size / micro_batch members work on a step. Without, a shard is "
              "processed in micro-batches of this size (a memory bound, not a change of arithmetic).", max_rows);
    b.boolean("reproducible", [](job_config& c) -> bool& { return c.train.reproducible; },
              "Same bytes whatever happens: the final parameters and optimizer state depend on the config, the "
              "seed and the data only, not on the number of replicas, the shard split, stragglers, faults, joins, "
              "leaves or resumes (CPU replicas; docs/reproducibility.md). Stragglers are handled by stealing "
              "slices within the step instead of cutting them into later steps, each replica uses one BLAS "
              "thread, and GPU gradient buckets do not overlap backward. false: the faster paths, not "
              "reproducible.");
    b.integer("prefetch", [](job_config& c) -> std::int64_t& { return c.train.prefetch; }, 1,
              "Shard messages queued ahead at each device.", 1024);
    b.integer("steps_per_message", [](job_config& c) -> std::int64_t& { return c.train.steps_per_message; }, 0,
              "Consecutive steps the loader sends a device in one message (0 = automatic: about 2 ms of work "
              "per message). A stop takes effect within prefetch x this many steps.", 4096);
    b.integer("log_every", [](job_config& c) -> std::int64_t& { return c.train.log_every; }, 1,
              "Steps between step records (metrics file, event callback, progress line).", max_steps_count);
    b.integer("eval_every", [](job_config& c) -> std::int64_t& { return c.train.eval_every; }, 0,
              "Evaluate on the test set every this many epochs (0 = only at the end of the run, which is "
              "always evaluated).", max_steps_count);
    b.string("checkpoint_dir", [](job_config& c) -> std::string& { return c.train.checkpoint_dir; },
             "Directory for checkpoints (\"\" = none). One is always written at the end of training and on "
             "SIGINT/SIGTERM.");
    b.integer("checkpoint_every", [](job_config& c) -> std::int64_t& { return c.train.checkpoint_every; }, 0,
              "Also write a checkpoint every this many steps (0 = only at the end).", max_steps_count);
    b.floating("checkpoint_every_s", [](job_config& c) -> double& { return c.train.checkpoint_every_s; }, 0.0, false,
               "Also write a checkpoint when this many seconds passed since the last one (0 = off); in stream "
               "mode this bounds how much a crash loses and how old the committed offset is.");
    b.integer("stream_queue", [](job_config& c) -> std::int64_t& { return c.train.stream_queue; }, 1,
              "Stream mode: records queued at most, waiting to be trained; a feed waits (or reports the queue "
              "full) beyond it. At least train.batch_size.", max_rows);
    b.integer("keep_checkpoints", [](job_config& c) -> std::int64_t& { return c.train.keep_checkpoints; }, 0,
              "Keep the newest this many checkpoints of this run, delete its older ones (0 = keep all); "
              "never another run's or anything else in the directory.", 1 << 20);
    b.boolean("verify_replicas", [](job_config& c) -> bool& { return c.train.verify_replicas; },
              "Check at every step that all replicas carried bitwise identical state (parameters and optimizer "
              "state) and step counters into it: a checksum of the state per replica and step; a mismatch "
              "stops training with an error naming the replica and the step.");
    b.choice<nonfinite_policy>("on_nonfinite", [](job_config& c) -> nonfinite_policy& { return c.train.on_nonfinite; },
                               {{"stop", nonfinite_policy::stop}, {"skip", nonfinite_policy::skip}},
                               "A step whose loss or gradients hold NaN or infinite values is applied by no replica. "
                               "stop: the run ends with an error naming the step and the values, after writing the "
                               "state of the step before as a checkpoint. skip: the step's update is dropped with a "
                               "warning and training goes on (its samples are not trained again; the step counter, "
                               "which AdamW's bias correction reads, moves on).");
    b.boolean("resume_other_data", [](job_config& c) -> bool& { return c.train.resume_other_data; },
              "A checkpoint records the fingerprint of the data it was trained on, and a resume on other data "
              "is refused naming both; true allows it (fine-tuning a checkpoint on new data), with a warning.");
    b.boolean("record_trained", [](job_config& c) -> bool& { return c.train.record_trained; },
              "Audit: every device reports, for every step it applied, how many samples it trained and a digest "
              "of their indices, with a checksum of the state it carried into the step (\"trained\" events and "
              "metrics records), so that exactly-once and identical replicas can be checked from outside the "
              "engine. In sync.mode = \"async\": every round it ran, naming the logical worker and its round, which "
              "counts if a round_decision merged it.");

    b.section = "cluster";
    b.keys.push_back({"cluster", "gpus", "array of integers",
                      "CUDA devices to train on, one replica each (the CLI's --gpus sets it); empty: CPU replicas.",
                      [](job_config& c, const toml::node& n, const std::string& key) {
                        const toml::array* a = n.as_array();
                        if (a == nullptr) fail_at(n, key, "expected an array of integers, found " + type_name(n));
                        std::vector<int> gpus;
                        for (const auto& e : *a)
                          gpus.push_back(static_cast<int>(read_int(e, key + "[" + std::to_string(gpus.size()) + "]", 0, 1023)));
                        c.cluster.gpus = std::move(gpus);
                      },
                      [](const job_config& c) { return array_text(c.cluster.gpus); }});
    b.integer("cpus", [](job_config& c) -> std::int64_t& { return c.cluster.cpus; }, 0,
              "CPU replicas when no GPU is used (0 = one per core).", 1024);
    b.integer("blas_threads", [](job_config& c) -> std::int64_t& { return c.cluster.blas_threads; }, 0,
              "OpenBLAS threads per CPU replica (0 = cores / replicas, at least 1; always 1 with "
              "train.reproducible).", 1024);
    b.integer("min_devices", [](job_config& c) -> std::int64_t& { return c.cluster.min_devices; }, 1,
              "Fewest replicas to train on: a run that starts with fewer is refused, and one that falls below it "
              "checkpoints and stops with an error.", 1024);
    b.floating("hang_timeout_s", [](job_config& c) -> double& { return c.cluster.hang_timeout_s; }, 0.0, false,
               "A member that shows no progress (a phase change or a micro-batch done) for this long while it "
               "has work is declared hung and removed; when no member can be blamed (a single device, or all "
               "stuck) the run ends with a checkpoint and an error naming each device and its phase "
               "(0 = max(5 s, 20 x the median step time)).", max_wait_s);
    b.floating("first_step_timeout_s", [](job_config& c) -> double& { return c.cluster.first_step_timeout_s; },
               0.0, true,
               "The hang timeout of a device's first step (of the run, or after it joins) and of an evaluation's "
               "first batch, where devices set up (CUDA contexts, buffers); at least cluster.hang_timeout_s.",
               max_wait_s);
    b.floating("collective_timeout_s", [](job_config& c) -> double& { return c.cluster.collective_timeout_s; }, 0.0,
               true, "Timeout of one collective call, in seconds: a backstop for a member that never arrives.",
               max_wait_s);
    b.floating("rendezvous_timeout_s", [](job_config& c) -> double& { return c.cluster.rendezvous_timeout_s; }, 0.0,
               true,
               "Several processes: how long forming a generation's collective group (its keys in the "
               "coordinator's store, the connections) may take, in seconds; dozens of processes on few cores "
               "need more than the default (docs/scale.md).",
               max_wait_s);
    b.integer("heartbeat_ms", [](job_config& c) -> std::int64_t& { return c.cluster.heartbeat_ms; }, 10,
              "Several processes: the interval of the heartbeats every process sends the others over CAF "
              "(a worker takes its own --set value, since it connects before it reads the job's config).",
              60'000);
    b.integer("connection_timeout_ms", [](job_config& c) -> std::int64_t& { return c.cluster.connection_timeout_ms; },
              50,
              "Several processes: a peer silent this long is dropped: the coordinator removes a silent worker's "
              "devices, a worker that no longer hears the coordinator is fenced. Several heartbeats long; keep it "
              "above 1 s on real networks.",
              3'600'000);
    b.boolean("shared_memory", [](job_config& c) -> bool& { return c.cluster.shared_memory; },
              "Several processes: ranks in processes of the same machine exchange gradients through shared "
              "memory instead of TCP on loopback (a process's own --set). The TCP connection stays, for failure "
              "detection; ranks on other machines always use TCP.");
    b.choice<tls_mode>("tls.mode", [](job_config& c) -> tls_mode& { return c.cluster.tls.mode; },
                       {{"auto", tls_mode::automatic}, {"on", tls_mode::on}, {"off", tls_mode::off}},
                       "Several processes: mutual TLS on the control plane (CAF's OpenSSL module). auto: on whenever "
                       "the coordinator's address is not loopback. on needs cluster.tls.ca, .certificate and .key "
                       "on every process; a peer without a certificate from that CA is refused. Gloo's gradient "
                       "traffic is never encrypted: it needs a trusted network. Each process takes its own --set "
                       "values of cluster.tls.*.");
    b.string("tls.ca", [](job_config& c) -> std::string& { return c.cluster.tls.ca; },
             "Several processes, TLS: the CA certificate (PEM) that signed every process's certificate.");
    b.string("tls.certificate", [](job_config& c) -> std::string& { return c.cluster.tls.certificate; },
             "Several processes, TLS: this process's certificate (PEM, with its chain).");
    b.string("tls.key", [](job_config& c) -> std::string& { return c.cluster.tls.key; },
             "Several processes, TLS: this process's private key (PEM, unencrypted).");
    b.floating("bucket_cap_mb", [](job_config& c) -> double& { return c.cluster.bucket_cap_mb; }, 0.0, true,
               "GPUs: gradient bucket size in MiB; buckets are reduced while backward still runs (DDP's "
               "bucket_cap_mb).", max_bucket_mb);
    b.floating("first_bucket_mb", [](job_config& c) -> double& { return c.cluster.first_bucket_mb; }, 0.0, true,
               "GPUs: size of the first gradient bucket (the last layers) in MiB, small so that communication "
               "starts early.", max_bucket_mb);
    b.choice<gpu_data_placement>(
        "gpu_data", [](job_config& c) -> gpu_data_placement& { return c.cluster.gpu_data; },
        {{"auto", gpu_data_placement::automatic}, {"resident", gpu_data_placement::resident},
         {"streamed", gpu_data_placement::streamed}},
        "GPUs: resident copies the dataset to the device once and gathers batches there; streamed gathers "
        "them in pinned host memory and copies them on a copy stream that overlaps compute; auto is resident "
        "when the dataset takes at most half of the free device memory.");

    b.section = "straggler";
    b.choice<straggler_policy>("policy", [](job_config& c) -> straggler_policy& { return c.straggler.policy; },
                               {{"none", straggler_policy::none}, {"balance", straggler_policy::balance},
                                {"cut", straggler_policy::cut}, {"balance+cut", straggler_policy::balance_cut}},
                               "balance: shard sizes follow each member's measured throughput (in sync.mode = \"async\", each "
                               "logical worker's inner steps per round). cut: with "
                               "train.reproducible, members that are done steal the slices a late one has not started, "
                               "within the step; without, a member late past its deadline contributes what it has "
                               "computed and returns the rest of its shard, which later steps train.");
    b.floating("deadline_factor", [](job_config& c) -> double& { return c.straggler.deadline_factor; }, 1.0, false,
               "A late member is cut this many median compute times after its step started ...", 1e6);
    b.floating("deadline_floor_ms", [](job_config& c) -> double& { return c.straggler.deadline_floor_ms; }, 0.0, false,
               "... but not sooner than this many milliseconds.", max_wait_s * 1000.0);
    b.floating("smoothing", [](job_config& c) -> double& { return c.straggler.smoothing; }, 0.0, true,
               "Weight of the newest measurement in each member's throughput average (balance).", 1.0);

    b.section = "sync";
    b.choice<sync_mode>("mode", [](job_config& c) -> sync_mode& { return c.sync.mode; },
                        {{"every_step", sync_mode::every_step}, {"local_sgd", sync_mode::local_sgd},
                         {"diloco", sync_mode::diloco}, {"async", sync_mode::async}},
                        "every_step: the gradients are all-reduced every step (data-parallel SGD). local_sgd: each "
                        "logical worker takes sync.every inner steps on its own share of the data, then the "
                        "workers' weights are averaged. diloco: the same rounds, but the workers' weight changes "
                        "(pseudo-gradients) are averaged and applied by the outer optimizer (docs/async.md). async: "
                        "diloco's rounds without waiting for the slowest: a round commits when sync.quorum workers "
                        "have contributed or at an adaptive deadline, stale contributions merge with less weight "
                        "(not reproducible). In the round modes train.max_steps, train.checkpoint_every and "
                        "train.log_every count rounds.");
    b.integer("every", [](job_config& c) -> std::int64_t& { return c.sync.every; }, 1,
              "H: inner steps each logical worker takes per round, each on train.batch_size / sync.workers "
              "samples, so that a round trains the samples of H global batches.");
    b.choice<outer_optimizer_kind>(
        "outer_optimizer", [](job_config& c) -> outer_optimizer_kind& { return c.sync.outer_optimizer; },
        {{"nesterov", outer_optimizer_kind::nesterov}, {"sgd", outer_optimizer_kind::sgd}},
        "diloco: the optimizer that applies the averaged pseudo-gradient to the global weights: SGD with "
        "Nesterov momentum (sync.outer_momentum), or plain SGD. The job's [optimizer] is the inner one.");
    b.floating("outer_lr", [](job_config& c) -> double& { return c.sync.outer_lr; }, 0.0, false,
               "diloco: the outer optimizer's learning rate (constant). 0: 0.7 (DiLoCo's) times min(1, "
               "sync.every / 16), halved with sync.delay = 1.", 100.0);
    b.floating("outer_momentum", [](job_config& c) -> double& { return c.sync.outer_momentum; }, 0.0, false,
               "diloco with outer_optimizer = \"nesterov\": the outer momentum.", 0.999999);
    b.integer("fragments", [](job_config& c) -> std::int64_t& { return c.sync.fragments; }, 1,
              "P: streaming, the parameters are exchanged in P fragments of about equal size, each at its own "
              "point of the round, so one exchange sends about 1/P of the bytes.");
    b.integer("delay", [](job_config& c) -> std::int64_t& { return c.sync.delay; }, 0,
              "1: the exchange of round r is applied one round late: each worker starts round r+1 from the "
              "global weights plus its own last round, and the exchange runs while round r+1's inner steps run "
              "(sync.overlap; docs/async.md).", 1);
    b.boolean("overlap", [](job_config& c) -> bool& { return c.sync.overlap; },
              "With sync.delay = 1: round r's exchange runs on a thread of its own while round r+1's inner steps "
              "run (on CPU replicas without module buffers; elsewhere between the rounds). false: "
              "always between the rounds. The same bytes either way.");
    b.choice<sync_codec>("codec", [](job_config& c) -> sync_codec& { return c.sync.codec; },
                         {{"fp32", sync_codec::fp32}, {"bf16", sync_codec::bf16}, {"int8", sync_codec::int8},
                          {"powersgd", sync_codec::powersgd}},
                         "What the pseudo-gradients travel as: int8 sends one byte a value (a quarter of fp32's), "
                         "with scales every member agrees on so that the sum is exact and the same bytes on any "
                         "number of devices; bf16 sends each worker's value rounded to bf16 (two bytes, half of "
                         "fp32's where a device runs one worker) and gathers the sum in bf16. Each worker keeps what "
                         "the codec dropped and adds it to its next pseudo-gradient (error feedback). In every_step: "
                         "\"bf16\" sends the gradients in bf16 (as DDP's bf16 hook, no error feedback; "
                         "docs/async.md); \"powersgd\" sends each weight matrix's gradient as two rank-r factors "
                         "(sync.powersgd_rank), with error feedback and a warm start, as DDP's PowerSGD hook "
                         "(every_step only; across processes with train.reproducible = false); \"int8\" needs a round mode.");
    b.integer("powersgd_rank", [](job_config& c) -> std::int64_t& { return c.sync.powersgd_rank; }, 1,
              "sync.codec = \"powersgd\": the rank r of the factors (DDP's matrix_approximation_rank, whose "
              "default is 1). A rows x cols matrix sends r (rows + cols) floats a step; matrices where that is not "
              "at least half fewer, and biases, travel whole.", 1024);
    b.integer("powersgd_start_step", [](job_config& c) -> std::int64_t& { return c.sync.powersgd_start_step; }, 0,
              "sync.codec = \"powersgd\": the steps before this one are plain fp32 steps (DDP's "
              "start_powerSGD_iter): the first gradients change too fast for the warm start.");
    b.integer("workers", [](job_config& c) -> std::int64_t& { return c.sync.workers; }, 0,
              "K logical workers (the unit of the round algorithm: inner model, inner optimizer state and share "
              "of each round's data). 0: one per device at the start. Devices run them, several one after the "
              "other where there are fewer devices, so the result does not depend on the number of devices.",
              4096);
    b.integer("quorum", [](job_config& c) -> std::int64_t& { return c.sync.quorum; }, 0,
              "async: a round commits as soon as this many logical workers have sent contributions within "
              "sync.max_staleness (all the alive ones when fewer are alive), or at its deadline. 0: three "
              "quarters of the workers, rounded up.", 4096);
    b.integer("max_staleness", [](job_config& c) -> std::int64_t& { return c.sync.max_staleness; }, 0,
              "async: a contribution computed from the global weights of at most this many rounds ago is merged, "
              "weighted by its samples / (1 + its age); an older one is dropped and its samples are trained later "
              "in the epoch.", 1000);
    b.floating("grace_ms", [](job_config& c) -> double& { return c.sync.grace_ms; }, 0.0, false,
               "async: the floor of a round's deadline, which is otherwise the median of the recent contributions' "
               "arrival times (from the round's opening) plus 3 times their median absolute deviation.", 3600000.0);
    b.boolean("scale_inner_lr", [](job_config& c) -> bool& { return c.sync.scale_inner_lr; },
              "The inner steps' learning rate (and optimizer.min_lr) is optimizer.lr x (train.batch_size / "
              "sync.workers) / train.batch_size, the linear scaling rule for an inner batch K times smaller than "
              "the global batch, so that a job keeps its [optimizer] when it switches from every_step. false: "
              "optimizer.lr as it is.");

    b.section = "precision";
    b.choice<matmul_precision>("matmul", [](job_config& c) -> matmul_precision& { return c.precision.matmul; },
                               {{"fp32", matmul_precision::fp32}, {"tf32", matmul_precision::tf32}},
                               "GPU matrix products: fp32, or TF32 tensor cores (faster, about 1e-3 relative error).");

    b.section = "service";
    b.string("listen", [](job_config& c) -> std::string& { return c.service.listen; },
             "Serve the run over HTTP at ADDR:PORT (port 0: the system chooses; the address is printed): "
             "GET /metrics (Prometheus), /status (JSON), /healthz, /readyz. Empty: no endpoint. Also --serve. Bind to a loopback "
             "address unless the network is trusted.");
    b.floating("snapshot_every_s", [](job_config& c) -> double& { return c.service.snapshot_every_s; }, 0.0, false,
               "How often the first replica copies its parameters, between two of its steps, for serving "
               "predictions while training (Engine::latest_snapshot; the copy's step is its version). 0 = no "
               "copies. A copy costs about as much as reading the parameters once.");
    b.integer("thread_nice", [](job_config& c) -> std::int64_t& { return c.service.thread_nice; }, 0,
              "The nice value of the HTTP server's threads. On a machine the replicas fill, a request that preempts "
              "a replica holds up the whole step; 10 prefers the replicas mildly; 20 runs the server only on CPU "
              "the replicas leave idle (SCHED_IDLE: training is never preempted, requests may wait); 0: as the "
              "process (docs/service.md).", 20);
    b.string("token_file", [](job_config& c) -> std::string& { return c.service.token_file; },
             "A file holding the bearer token that the control endpoints (POST /checkpoint, /stop, /devices, "
             "DELETE /devices/{name}, PUT /lr) require as \"Authorization: Bearer <token>\". Empty: the "
             "environment variable DPACTOR_SERVICE_TOKEN; with neither, the control endpoints are off (403).");

    b.section = "faults";
    b.keys.push_back({"faults", "inject", "array of strings",
                      "Fault injection specs: fail:R@S, hang:R@S, slow:R:F[@S], jitter:R:P:MS, leave:R@S, "
                      "join:cpu@S, perturb:R@S, crash:loader@S, crash:reducer@S (docs/faults.md).",
                      [](job_config& c, const toml::node& n, const std::string& key) {
                        const toml::array* a = n.as_array();
                        if (a == nullptr) fail_at(n, key, "expected an array of strings, found " + type_name(n));
                        std::vector<std::string> specs;
                        for (const auto& e : *a) {
                          const std::string& text = read_string(e, key + "[" + std::to_string(specs.size()) + "]");
                          try {
                            parse_fault_spec(text);
                          } catch (const config_error& err) {
                            fail_at(e, key, err.what());
                          }
                          specs.push_back(text);
                        }
                        c.faults.inject = std::move(specs);
                      },
                      [](const job_config& c) { return array_text(c.faults.inject); }});
    b.integer("seed", [](job_config& c) -> std::int64_t& { return c.faults.seed; }, 0, "Seed of the jitter draws.");
    return std::move(b.keys);
  }();
  return keys;
}

}  // namespace dpactor::config_schema

namespace dpactor {

namespace {

// The model keys of the other model kind are not read (their defaults stay).
bool read_by_the_job(const job_config& config, const config_schema::key_spec& k) {
  if (k.section != "model") return true;
  if (k.name == "layers" || k.name == "activation") return config.module.kind == model_kind::mlp;
  if (k.name == "path" || k.name == "input_shape") return config.module.kind == model_kind::torchscript;
  return true;
}

}  // namespace

std::string dump_job_config(const job_config& config, dumped_keys which) {
  std::string out;
  std::string section;
  for (const auto& k : config_schema::keys()) {
    if (which == dumped_keys::read_by_the_job && !read_by_the_job(config, k)) continue;
    if (k.section != section) {
      section = k.section;
      out += (out.empty() ? "[" : "\n[") + section + "]\n";
    }
    out += k.name + " = " + k.print(config) + "\n";
  }
  return out;
}

std::string toml_string(const std::string& text) { return config_schema::quote(text); }

std::vector<config_key_doc> config_keys() {
  std::vector<config_key_doc> docs;
  const job_config defaults;
  for (const auto& k : config_schema::keys()) docs.push_back({k.section + "." + k.name, k.type, k.print(defaults), k.doc});
  return docs;
}

}  // namespace dpactor
