#pragma once
// The command line of `dpactor`, parsed into plain values.

#include <optional>
#include <string>
#include <vector>

namespace dpactor {
struct job_config;
}

namespace dpactor::cli {

struct options {
  std::string model;             // --model FILE
  std::string gpus = "all";      // --gpus all|N|LIST
  std::optional<int> cpus;       // --cpus N
  std::vector<std::string> sets; // --set and the dedicated flags, as section.key=value
  std::vector<std::string> inject; // --inject fault specs, added to faults.inject
  std::string resume;            // --resume DIR
  std::string init_from;         // --init-from FILE
  std::string replay_rounds;     // --replay-rounds FILE
  bool overwrite_checkpoints = false;  // --overwrite-checkpoints
  std::string metrics;           // --metrics FILE
  std::string log_level = "info";
  bool quiet = false;
  bool print_config = false;
  bool config_reference = false;
  // Multi-node (docs/distributed.md)
  bool coordinator = false;               // --coordinator
  std::string listen = "127.0.0.1:29500"; // --listen HOST:PORT
  int wait_devices = 0;                   // --wait-devices N
  std::string join;                       // --join HOST:PORT: run as a worker
  std::string node;                       // --node NAME
  int wait_workers = 0;                   // from the launcher's environment
  bool model_unread = false;              // a worker from the environment: --model is the coordinator's
  double rejoin_timeout_s = 0;            // --rejoin-timeout SECONDS: 0, fenced for good
};

// Parses argv. Returns the exit code to end with when parsing ends the program
// (--help, --version, a usage error, which it reports), or nullopt to run.
std::optional<int> parse_options(int argc, char** argv, options& out);

// A path a run reads, or a directory of checkpoints it reads or writes, that
// an output file (--metrics) must not overwrite.
struct run_input {
  std::string what;    // for messages: "the config file", "a data file"
  std::string source;  // the option or key that names it: "--model", "data.train_images"
  std::string path;    // as given: relative paths are relative to the working directory
  bool directory = false;  // a directory: nothing inside it may be named either
};

// The config file, every data file `config` names, the --init-from weights,
// the --replay-rounds record,
// train.checkpoint_dir and the --resume checkpoint; those not set are left out.
std::vector<run_input> run_inputs(const options& opts, const job_config& config);

}  // namespace dpactor::cli
