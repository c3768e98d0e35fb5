// dpactor: the command-line client of dpactor::Engine.
//
// Exit codes: cli/exit_codes.hpp and docs/cli.md.

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <dpactor/engine.hpp>
#include <dpactor/error.hpp>
#include <dpactor/http.hpp>
#include "actors/worker.hpp"
#include "cli/exit_codes.hpp"
#include "cli/gpu_discovery.hpp"
#include "cli/metrics_file.hpp"
#include "cli/options.hpp"
#include "cli/progress.hpp"
#include "cli/signal_watch.hpp"
#include "cli/version.hpp"
#include "config/config_file.hpp"
#include "config/launcher_env.hpp"
#include "tensors/blas_kernels.hpp"
#include "train/event_json.hpp"
#include "train/fault_plan.hpp"

namespace {

// Set when the engine's teardown left a stuck device thread running (See Note
// [Bounded shutdown]): main then ends the process with _Exit.
bool threads_left_behind = false;


using namespace dpactor;

void setup_logging(const cli::options& opts) {
  auto logger = spdlog::stderr_color_mt("dpactor");
  const auto level = opts.quiet ? spdlog::level::warn : spdlog::level::from_str(opts.log_level);
  // Debug and trace lines say when (what a slow recovery is read from).
  logger->set_pattern(level <= spdlog::level::debug ? "dpactor: %H:%M:%S.%e %^%l%$: %v" : "dpactor: %^%l%$: %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(level);
}

// The tables of docs/config.md.
void print_config_reference() {
  std::string section;
  for (const auto& k : config_keys()) {
    const std::string s = k.name.substr(0, k.name.find('.'));
    if (s != section) {
      section = s;
      std::printf("\n## [%s]\n\n| key | type | default | meaning |\n| --- | --- | --- | --- |\n", s.c_str());
    }
    std::printf("| `%s` | %s | `%s` | %s |\n", k.name.c_str(), k.type.c_str(), k.default_value.c_str(), k.doc.c_str());
  }
}

int fail(const std::string& message, int code) {
  spdlog::error("{}", message);
  return code;
}

// dpactor --join: a worker (See Note [A worker never trains alone]).
int run_worker_node(const cli::options& opts, cli::signal_watch& signals) {
  worker_options w;
  try {
    std::tie(w.host, w.port) = split_host_port(opts.join, "--join");
  } catch (const std::invalid_argument& e) {
    return fail(e.what(), cli::exit_config);
  }
  if (opts.model_unread) spdlog::info("the job's config is the coordinator's: --model {} is not read here", opts.model);
  w.node = opts.node;
  w.cpus = opts.cpus;
  w.sets = opts.sets;
  try {
    // Used only when the job trains on GPUs (See run_worker).
    const cli::gpu_selection gpus = cli::select_gpus(opts.gpus);
    w.gpus = gpus.devices;
    w.gpu_note = gpus.note;
    // The worker's own --set values of the keys it needs before it connects.
    const job_config own = parse_job_config("", "--set", opts.sets);
    w.heartbeat = std::chrono::milliseconds(own.cluster.heartbeat_ms);
    w.connection_timeout = std::chrono::milliseconds(own.cluster.connection_timeout_ms);
    w.tls = own.cluster.tls;
  } catch (const std::invalid_argument& e) {
    return fail(e.what(), cli::exit_config);
  }
  w.version = cli::version;
  w.rejoin_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(opts.rejoin_timeout_s * 1000));
  w.on_rejoin = [t = opts.rejoin_timeout_s](const std::string& why) {
    spdlog::warn("fenced: {}; this worker's devices stopped; joining again as a new member (--rejoin-timeout {} s)",
                 why, t);
  };
  // A signal ends a worker at once, as a lost node: the coordinator goes on
  // without its devices.
  signals.start([](int sig) {
    spdlog::warn("received signal {}: leaving the job", sig);
    spdlog::default_logger()->flush();
    std::_Exit(cli::exit_code_for_signal(sig));
  });
  const worker_result r = run_worker(w);
  threads_left_behind = r.left_system_running;
  switch (r.outcome) {
    case worker_result::kind::finished: spdlog::info("the run is over"); return cli::exit_success;
    case worker_result::kind::failed: return fail("the coordinator's run failed: " + r.message, cli::exit_training);
    case worker_result::kind::fenced:
      return fail("fenced: " + r.message + "; this worker's devices stopped and never train alone", cli::exit_fenced);
    case worker_result::kind::refused: return fail("the coordinator refused this worker: " + r.message, cli::exit_refused);
  }
  return cli::exit_internal;
}

int run(int argc, char** argv, cli::signal_watch& signals) {
  cli::options opts;
  if (auto code = parse_options(argc, argv, opts)) return *code;
  setup_logging(opts);
  if (auto note = blas_kernels_note()) spdlog::info("{}", *note);
  if (opts.config_reference) {
    print_config_reference();
    return 0;
  }
  if (!opts.coordinator && opts.join.empty() && !opts.print_config) {
    // See Note [Roles from the launcher].
    std::optional<launcher_role> role;
    try {
      role = role_from_environment(process_environment());
    } catch (const config_error& e) {
      return fail(e.what(), cli::exit_config);
    }
    if (role) {
      const std::string address = role->host + ":" + std::to_string(role->port);
      if (role->coordinator) {
        spdlog::info("coordinating on {}, waiting for {} worker{} (from the environment: {})", address, role->workers,
                     role->workers == 1 ? "" : "s", role->source);
        opts.coordinator = true;
        opts.listen = address;
        opts.wait_workers = role->workers;
      } else {
        spdlog::info("joining {} (from the environment: {})", address, role->source);
        opts.join = address;
        opts.model_unread = true;
      }
      if (role->local_processes > 1 && opts.gpus != "0" && !cli::select_gpus(opts.gpus).devices.empty())
        return fail("the launcher starts " + std::to_string(role->local_processes) +
                        " processes on this machine (LOCAL_WORLD_SIZE) and each would drive every GPU: start one "
                        "dpactor per machine (torchrun --nproc-per-node 1), or give each its GPUs with --gpus",
                    cli::exit_config);
    }
  }
  if (!opts.join.empty()) return run_worker_node(opts, signals);

  job_config config;
  cli::gpu_selection gpus;
  try {
    gpus = cli::select_gpus(opts.gpus);
    if (opts.cpus) opts.sets.push_back("cluster.cpus=" + std::to_string(*opts.cpus));
    config = load_job_config(opts.model, opts.sets);
    if (!gpus.devices.empty()) config.cluster.gpus = gpus.devices;
    parse_fault_specs(opts.inject);  // a bad spec is a usage error naming it
    config.faults.inject.insert(config.faults.inject.end(), opts.inject.begin(), opts.inject.end());
  } catch (const std::invalid_argument& e) {
    return fail(e.what(), 2);
  }
  if (opts.print_config) {
    std::fputs(dump_job_config(config, dumped_keys::read_by_the_job).c_str(), stdout);
    return 0;
  }

  // Stream mode trains on records a program feeds the engine; this command
  // has nothing to feed it and would wait for ever.
  if (config.train.mode == train_mode::stream)
    return fail(config.source + ": train.mode = \"stream\" trains on records that a program embedding the engine "
                "feeds it (Engine::feed or a record_source; examples/embed_service is such a program, "
                "docs/service.md); the dpactor command trains from the files of [data]: set train.mode = \"epochs\"",
                cli::exit_config);
  // --resume latest: the newest checkpoint of the run's own checkpoint
  // directory (a directory named "latest" is ./latest).
  if (opts.resume == "latest") {
    if (config.train.checkpoint_dir.empty())
      return fail("--resume latest: this run has no checkpoint directory (--checkpoint-dir, train.checkpoint_dir)",
                  cli::exit_config);
    opts.resume = config.train.checkpoint_dir;
  }
  // Before anything is opened for writing: the metrics file would truncate an input it names.
  if (!opts.metrics.empty()) cli::refuse_metrics_on_inputs(opts.metrics, cli::run_inputs(opts, config));

  run_options run;
  run.resume_from = opts.resume;
  run.init_from = opts.init_from;
  run.replay_rounds = opts.replay_rounds;
  run.overwrite_checkpoints = opts.overwrite_checkpoints;
  if (opts.coordinator) {
    // (A build without Gloo refuses it as the engine starts.)
    coordinator_options c;
    try {
      std::tie(c.host, c.port) = split_host_port(opts.listen, "--listen");
    } catch (const std::invalid_argument& e) {
      return fail(e.what(), cli::exit_config);
    }
    c.wait_devices = opts.wait_devices;
    c.wait_workers = opts.wait_workers;
    c.version = cli::version;
    // The first line of the output (docs/distributed.md).
    c.on_listening = [](const std::string& address) {
      std::printf("listening on %s\n", address.c_str());
      std::fflush(stdout);
    };
    run.coordinator = c;
  }
  Engine engine(config, run);
  if (gpus.devices.empty() && opts.gpus != "0" && config.cluster.gpus.empty())
    spdlog::warn("no usable GPU ({}); training on {} CPU replica{} (--cpus {})", gpus.note, engine.replica_count(),
                 engine.replica_count() == 1 ? "" : "s", engine.replica_count());

  const bool terminal = ::isatty(STDOUT_FILENO) == 1;
  cli::progress_printer progress(stdout, terminal && !opts.quiet, config.train.epochs);
  // A metrics write that fails (a full disk, an I/O error) stops the run as
  // a signal does, with a checkpoint, and ends it with exit_internal.
  std::atomic<bool> metrics_failed{false};
  // service.listen / --serve: the run over HTTP.
  std::unique_ptr<http_face> http;
  if (!config.service.listen.empty()) {
    try {
      http = std::make_unique<http_face>(engine);
      spdlog::info("serving HTTP on {}:{} (dashboard at /; /metrics, /status, /events, /healthz, /readyz, POST "
                         "/predict; control {})",
                         http->address(), http->port(),
                         http->control() ? "on, with the bearer token" : "off: no DPACTOR_SERVICE_TOKEN or service.token_file");
    } catch (const std::exception& e) {
      return fail(e.what(), cli::exit_config);
    }
  }
  std::unique_ptr<cli::metrics_file> metrics;
  if (!opts.metrics.empty()) {
    try {
      metrics = std::make_unique<cli::metrics_file>(opts.metrics);
    } catch (const std::exception& e) {
      return fail(e.what(), 2);
    }
  }
  // Note [The summary record is last]: every metrics file ends with a
  // summary record saying how the run ended (finished, stopped, by which
  // signal, failed with which error and exit code), however it ends short of
  // SIGKILL; after a failure it names the last checkpoint written.
  std::mutex last_checkpoint_mutex;  // the event thread writes it, the signal thread may read it
  std::string last_checkpoint;
  const auto newest_checkpoint = [&] {
    std::lock_guard lock(last_checkpoint_mutex);
    return last_checkpoint;
  };
  std::atomic<bool> summary_written{false};  // one summary, the first way the run ends
  const auto write_summary = [&](json record, const char* ended, int code) {
    if (summary_written.exchange(true)) return;
    record["ended"] = ended;
    record["exit_code"] = code;
    if (metrics && !(metrics->write(record) && metrics->close()) && !metrics_failed.exchange(true))
      spdlog::error("{}", metrics->error().value_or(""));
  };
  engine.on_event([&](const event& e) {
    if (const auto* c = std::get_if<checkpoint_event>(&e)) {
      std::lock_guard lock(last_checkpoint_mutex);
      last_checkpoint = c->path;
    }
    if (metrics && !metrics->write(to_json(e)) && !metrics_failed.exchange(true)) {
      spdlog::error("{}; stopping at the next step boundary and writing a checkpoint", metrics->error().value_or(""));
      engine.stop();
    }
    if (!opts.quiet) progress.on_event(e);
  });
  const auto signal_name = [](int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "SIGTERM"; };
  signals.start(
      [&engine, signal_name, checkpoints = !config.train.checkpoint_dir.empty()](int sig) {
        spdlog::warn("received {}: stopping at the next step boundary{} (again to abort)", signal_name(sig),
                     checkpoints ? " and writing a checkpoint" : "");
        engine.stop();
      },
      [&](int sig) {
        write_summary({{"event", "summary"}, {"checkpoint", newest_checkpoint()}},
                      "aborted by a second signal, without a checkpoint", 128 + sig);
      });

  const run_summary summary = [&] {
    try {
      engine.start();
      return engine.wait();
    } catch (const std::exception& e) {
      threads_left_behind = engine.left_threads_behind();
      const auto* known = dynamic_cast<const dpactor::error*>(&e);
      const int code = known ? cli::exit_code_for(known->kind()) : cli::exit_internal;
      write_summary({{"event", "summary"}, {"error", e.what()}, {"checkpoint", newest_checkpoint()}}, "failed", code);
      throw;
    }
  }();
  threads_left_behind = engine.left_threads_behind();
  const int sig = signals.received();
  const int code = metrics_failed ? cli::exit_internal : sig != 0 ? cli::exit_code_for_signal(sig) : cli::exit_success;
  write_summary(to_json(summary),
                metrics_failed   ? "stopped: the metrics file could not be written"
                : sig == SIGINT  ? "stopped by SIGINT"
                : sig == SIGTERM ? "stopped by SIGTERM"
                : sig == SIGHUP  ? "stopped by SIGHUP"
                : summary.stopped ? "stopped"
                                  : "finished",
                code);
  progress.print_summary(summary);
  if (metrics_failed) {
    if (summary.stopped && !summary.checkpoint.empty())
      spdlog::error("stopped because the metrics file could not be written; resume with --resume {}",
                    summary.checkpoint);
    return cli::exit_internal;
  }
  if (sig != 0) {
    if (!summary.checkpoint.empty())
      spdlog::warn("stopped by signal; resume with --resume {}", summary.checkpoint);
    return code;
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread: it may replace this process. See Note [OpenBLAS kernels on CPUs newer than the library].
  dpactor::reexec_with_better_blas_kernels(argv);
  cli::signal_watch signals;
  int code = cli::exit_internal;
  try {
    code = run(argc, argv, signals);
  } catch (const dpactor::error& e) {
    code = fail(e.what(), cli::exit_code_for(e.kind()));
  } catch (const std::exception& e) {
    code = fail(std::string("internal error: ") + e.what(), cli::exit_internal);
  }
  // See Note [Bounded shutdown]: static destructors must not run under a
  // thread that is still inside a step.
  if (threads_left_behind) {
    spdlog::default_logger()->flush();
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }
  return code;
}
