#include "cli/options.hpp"

#include <utility>

#include <CLI/CLI.hpp>

#include "config/job_config.hpp"
#include "config/key_table.hpp"
#include "cli/exit_codes.hpp"
#include "cli/version.hpp"

namespace dpactor::cli {

std::optional<int> parse_options(int argc, char** argv, options& out) {
  CLI::App app{"dpactor: data-parallel training on the actor model.\n"
               "Trains the model a config describes on every local GPU, or on CPU replicas without one.",
               "dpactor"};
  app.get_formatter()->column_width(34);
  std::optional<long long> epochs, batch_size, checkpoint_every;
  std::optional<std::string> checkpoint_dir;
  std::optional<std::string> serve;
  auto* model = app.add_option("--model", out.model, "Job config (.cfg, TOML): model, data, optimizer, train, cluster")
                    ->type_name("FILE");
  app.add_flag("--config-reference", out.config_reference,
               "Print every config key with its type, default and meaning (Markdown) and exit");
  app.add_option("--gpus", out.gpus, "GPUs to use: all, a count N, or a list like 0,2 (default: all)")
      ->type_name("all|N|LIST");
  app.add_option("--cpus", out.cpus, "CPU replicas when no GPU is used (default: one per core)")
      ->type_name("N")
      ->check(CLI::Range(1, 1024));
  app.add_option("--epochs", epochs, "Override train.epochs")->type_name("N");
  app.add_option("--batch-size", batch_size, "Override train.batch_size (global batch)")->type_name("N");
  app.add_option("--set", out.sets, "Override any config key, e.g. --set optimizer.lr=0.05 (repeatable)")
      ->type_name("SECTION.KEY=VALUE")
      ->take_all();
  app.add_option("--inject", out.inject,
                 "Inject a fault (repeatable): fail:R@S, hang:R@S, slow:R:F[@S], jitter:R:P:MS, leave:R@S, join:cpu@S")
      ->type_name("SPEC")
      ->take_all();
  app.add_option("--checkpoint-dir", checkpoint_dir, "Override train.checkpoint_dir")->type_name("DIR");
  app.add_option("--checkpoint-every", checkpoint_every, "Override train.checkpoint_every")->type_name("STEPS");
  auto* resume = app.add_option("--resume", out.resume,
                 "Continue from a checkpoint directory (or a root holding 'latest'); 'latest': the newest checkpoint "
                 "of this run's checkpoint directory")
      ->type_name("DIR");
  auto* init_from =
      app.add_option("--init-from", out.init_from, "Start from the weights in a model.safetensors file")->type_name("FILE");
  app.add_option("--replay-rounds", out.replay_rounds,
                 "sync.mode = \"async\": run the job again following the round decisions in an earlier run's "
                 "--metrics FILE instead of the clock, to that run's bytes")
      ->type_name("FILE");
  app.add_flag("--overwrite-checkpoints", out.overwrite_checkpoints,
               "Let this run replace checkpoints of the steps it writes that another run left in its checkpoint "
               "directory (without it, such a directory is refused before training)");
  app.add_option("--serve", serve,
                 "Serve the run over HTTP at ADDR:PORT (service.listen): the dashboard at /, /metrics, /status, "
                 "/events, /healthz, /readyz, and the control endpoints with DPACTOR_SERVICE_TOKEN (docs/service.md)")
      ->type_name("ADDR:PORT");
  app.add_option("--metrics", out.metrics, "Write step, epoch, membership and summary records as JSON Lines")
      ->type_name("FILE");
  app.add_option("--log-level", out.log_level, "trace, debug, info, warn, error or off (default: info)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.add_flag("--quiet,-q", out.quiet, "Print only errors and the final summary");
  app.add_flag("--print-config", out.print_config, "Print the effective config (file plus overrides) and exit");
  auto* coordinator =
      app.add_flag("--coordinator", out.coordinator,
                   "Coordinate workers in other processes or on other machines (docs/distributed.md)");
  app.add_option("--listen", out.listen, "With --coordinator: the address to listen on (default 127.0.0.1:29500; "
                                         "port 0: any free one)")
      ->type_name("HOST:PORT");
  app.add_option("--wait-devices", out.wait_devices,
                 "With --coordinator: start training once this many devices, here and joined, are ready")
      ->type_name("N")
      ->check(CLI::Range(0, 1 << 20));
  auto* join = app.add_option("--join", out.join, "Run as a worker of the coordinator at HOST:PORT with this "
                                                  "machine's devices (the job's config comes from the coordinator)")
                   ->type_name("HOST:PORT");
  app.add_option("--node", out.node, "With --join: this node's name in messages (default: host name and pid)")
      ->type_name("NAME");
  app.add_option("--rejoin-timeout", out.rejoin_timeout_s,
                 "With --join: a fenced worker (the coordinator lost, or this worker removed) joins again as a new "
                 "member, trying for up to this many seconds, instead of exiting (default 0: it exits)")
      ->type_name("SECONDS")
      ->check(CLI::Range(0.0, 7.0 * 24 * 3600));
  join->excludes(coordinator);
  app.set_version_flag("--version", std::string("dpactor ") + version);
  try {
    app.parse(argc, argv);
    if (!out.config_reference && out.join.empty() && model->count() == 0) throw CLI::RequiredError("--model");
    // Both say where the run starts: which one won would be a guess.
    if (resume->count() > 0 && init_from->count() > 0)
      throw CLI::ValidationError("--resume and --init-from",
                                 "both say where the run starts: --resume " + out.resume +
                                     " continues a run (weights, optimizer state, position in the data), --init-from " +
                                     out.init_from + " starts a new one from weights; give one");
    if (!out.join.empty() && model->count() > 0)
      throw CLI::ValidationError("--model", "a worker (--join) takes the job's config from the coordinator; "
                                            "use --set to change its data paths");
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? exit_success : exit_config;
  }
  auto add = [&](const char* key, const auto& value) {
    if (value) out.sets.push_back(std::string(key) + "=" + [&] {
      if constexpr (std::is_same_v<std::decay_t<decltype(*value)>, std::string>) return toml_string(*value);
      else return std::to_string(*value);
    }());
  };
  add("train.epochs", epochs);
  add("train.batch_size", batch_size);
  add("train.checkpoint_dir", checkpoint_dir);
  add("service.listen", serve);
  add("train.checkpoint_every", checkpoint_every);
  return std::nullopt;
}

std::vector<run_input> run_inputs(const options& opts, const job_config& config) {
  std::vector<run_input> inputs;
  auto add = [&](const char* what, std::string source, const std::string& path, bool directory = false) {
    if (!path.empty()) inputs.push_back({what, std::move(source), path, directory});
  };
  add("the config file", "--model", opts.model);
  // Every data key that is set, whatever data.format uses: none is an output.
  const data_config& d = config.data;
  const std::pair<const char*, const std::string*> data_keys[] = {
      {"train_images", &d.train_images}, {"train_labels", &d.train_labels}, {"test_images", &d.test_images},
      {"test_labels", &d.test_labels},   {"train_file", &d.train_file},     {"test_file", &d.test_file}};
  for (const auto& [key, path] : data_keys) add("a data file", std::string("data.") + key, *path);
  add("the weights to start from", "--init-from", opts.init_from);
  add("the decisions to replay", "--replay-rounds", opts.replay_rounds);
  add("the checkpoint directory", "train.checkpoint_dir", config.train.checkpoint_dir, true);
  add("the checkpoint to resume from", "--resume", opts.resume, true);
  return inputs;
}

}  // namespace dpactor::cli
