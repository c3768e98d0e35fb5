#pragma once
// Everything a training job is configured by (public API): the sections of a
// .cfg file, as plain values (docs/config.md documents every key and its
// default). load_job_config reads a file; the keys are config/key_table.cpp.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <dpactor/data_config.hpp>
#include <dpactor/model_spec.hpp>
#include <dpactor/optimizer_config.hpp>
#include <dpactor/sync_config.hpp>

namespace dpactor {

// What a step whose loss or gradients hold NaN or infinite values does
// (train.on_nonfinite). See Note [Non-finite steps].
enum class nonfinite_policy { stop, skip };

// epochs: passes over a file's training set. stream: records fed to the
// engine until it is stopped (See Note [Exactly-once offsets]).
enum class train_mode { epochs, stream };

struct train_config {
  train_mode mode = train_mode::epochs;
  std::int64_t epochs = 15;
  std::int64_t batch_size = 128;  // global: summed over all replicas
  std::int64_t max_steps = 0;     // 0 = no limit
  bool shuffle = true;
  std::int64_t seed = 42;
  // Rows per forward/backward call on a device; in reproducible mode the
  // fixed slice of the global batch (See Note [Summation tree]).
  std::int64_t micro_batch = 64;
  // The final state is a function of the config, the seed and the data only
  // (See Note [Summation tree] and Note [Stealing slices]).
  bool reproducible = true;
  std::int64_t prefetch = 2;       // shard messages queued ahead at each device
  std::int64_t steps_per_message = 0;  // consecutive steps per shard message; 0 = automatic
  std::int64_t log_every = 50;     // steps between step records
  std::int64_t eval_every = 1;     // epochs between test evaluations; 0 = only at the end
  std::string checkpoint_dir = "checkpoints";  // "" = no checkpoints
  std::int64_t checkpoint_every = 0;           // steps; 0 = only at the end
  double checkpoint_every_s = 0.0;             // seconds; 0 = off
  std::int64_t stream_queue = 8192;            // stream mode: records queued at most
  std::int64_t keep_checkpoints = 3;           // newest kept; 0 = keep all
  bool verify_replicas = false;  // compare the state checksums of all replicas every step
  nonfinite_policy on_nonfinite = nonfinite_policy::stop;  // See Note [Non-finite steps]
  bool record_trained = false;   // every device reports what it trained (trained_event)
  bool resume_other_data = false;  // a resume on data of another fingerprint is allowed (fine-tuning)
};

struct schedule_config {
  schedule_kind kind = schedule_kind::cosine;
  std::int64_t warmup_steps = 0;
  std::int64_t step_size = 1000;
  double gamma = 0.1;
  double min_lr = 0.0;
  std::int64_t total_steps = 0;  // cosine; 0 = the run's total steps
};

// Where a GPU replica keeps the training data: on the device when it fits
// (resident), or in host memory, copied per micro-batch (streamed).
enum class gpu_data_placement { automatic, resident, streamed };

// Mutual TLS for the control plane between processes (docs/distributed.md,
// "TLS"): every process proves itself with a certificate signed by the CA.
enum class tls_mode { automatic, on, off };  // automatic: on unless the coordinator's address is loopback
struct tls_config {
  tls_mode mode = tls_mode::automatic;
  std::string ca;           // PEM file: the CA that signs every process's certificate
  std::string certificate;  // PEM file: this process's certificate (chain)
  std::string key;          // PEM file: its private key
};

struct cluster_config {
  std::vector<int> gpus;         // CUDA devices, one replica each; empty = CPU replicas
  std::int64_t cpus = 0;         // CPU replicas; 0 = number of cores
  std::int64_t blas_threads = 0; // per replica; 0 = cores / replicas, at least 1
  std::int64_t min_devices = 1;
  double hang_timeout_s = 0.0;   // 0 = max(5 s, 20 x median step time)
  double first_step_timeout_s = 300.0;  // the same, for a generation's first step or an evaluation's first batch
  double collective_timeout_s = 600.0;
  // Several processes: how long forming a generation's group (the store's
  // keys and the connections) may take before the generation fails.
  double rendezvous_timeout_s = 10.0;
  // Multi-node (docs/distributed.md): CAF heartbeats between processes, and
  // how long a silent peer is kept before it is dropped (a lost node).
  std::int64_t heartbeat_ms = 500;
  std::int64_t connection_timeout_ms = 5000;
  tls_config tls;
  bool shared_memory = true;      // processes of one machine exchange gradients through shared memory
  double bucket_cap_mb = 25.0;    // gradient buckets on GPUs (See Note [Gradient buckets])
  double first_bucket_mb = 1.0;
  gpu_data_placement gpu_data = gpu_data_placement::automatic;
};

enum class straggler_policy { none, balance, cut, balance_cut };

struct straggler_config {
  straggler_policy policy = straggler_policy::balance_cut;
  double deadline_factor = 1.5;    // a late member is cut at factor x median compute time ...
  double deadline_floor_ms = 0.5;  // ... but never sooner than this after its step started
  double smoothing = 0.3;          // weight of the newest sample in the throughput average
};

enum class matmul_precision { fp32, tf32 };

struct precision_config {
  matmul_precision matmul = matmul_precision::fp32;  // GPU GEMMs; TF32 tensor cores only when asked
};

struct faults_config {
  std::vector<std::string> inject;  // fault specs, see actors/fault_plan.hpp
  std::int64_t seed = 1;            // of jitter draws
};

// The run's HTTP face (service/http_service.hpp).
struct service_config {
  std::string listen;  // "ADDR:PORT"; empty: no HTTP endpoint
  std::string token_file;  // the control endpoints' bearer token; empty: DPACTOR_SERVICE_TOKEN
  double snapshot_every_s = 1.0;  // parameter copies for Engine::latest_snapshot; 0 = off
  std::int64_t thread_nice = 10;  // the HTTP server's threads (20: SCHED_IDLE)
};

// Which model the replicas train (model.kind).
enum class model_kind { mlp, torchscript };

// model.kind = "torchscript": a TorchScript module, trained by the libtorch
// replica (tensors/torch_model.hpp); model.layers is then not read, the
// module's input and output widths take its place.
struct module_config {
  model_kind kind = model_kind::mlp;
  std::string path;                       // resolved against the config file's directory
  std::vector<std::int64_t> input_shape;  // one sample's; empty: [features]
};

struct job_config {
  std::string source = "<defaults>";  // the file it came from, for messages
  mlp_spec model{{784, 256, 128, 10}, activation::relu, loss_kind::cross_entropy};
  module_config module;
  data_config data;
  optimizer_config optimizer;
  schedule_config schedule;
  train_config train;
  cluster_config cluster;
  straggler_config straggler;
  sync_config sync;
  precision_config precision;
  faults_config faults;
  service_config service;
};

// Reads a job config: TOML syntax in a .cfg file, checked against the key
// table. `overrides` are "section.key=value" (value a TOML value; a bare word
// is a string), applied with the same checks. Throws config_error naming the
// file, line and column, and the key; a missing file is one too.
job_config load_job_config(const std::filesystem::path& path, const std::vector<std::string>& overrides = {});

}  // namespace dpactor
