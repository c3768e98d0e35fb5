#pragma once
// A worker node (dpactor --join HOST:PORT): joins a coordinator (See Note
// [Coordinator and workers], actors/coordinator.hpp) with this machine's
// device actors, and serves them until the run is over.
//
// Note [A worker never trains alone]
// A worker's devices are members of the coordinator's generations; the
// worker itself decides nothing. When it loses the coordinator (the
// connection breaks, or stays silent past the connection timeout) it aborts
// its devices' collective groups, so that no device goes on with a partial
// group, ends them, and reports itself fenced: the program exits with its own
// code (docs/cli.md).

#include <chrono>
#include <cstdint>
#include <functional>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/job_config.hpp"

namespace dpactor {

struct worker_options {
  std::string host;
  std::uint16_t port = 0;
  std::string node;                 // this node's name in messages (default: host name and pid)
  std::optional<int> cpus;          // CPU replicas (default: the coordinator's cluster.cpus)
  // This machine's usable GPUs (--gpus): one replica each when the job trains
  // on GPUs (the coordinator's cluster.gpus is set); `gpu_note` says why
  // there are none.
  std::vector<int> gpus;
  std::string gpu_note;
  std::vector<std::string> sets;    // overrides of the coordinator's config, data.* in particular
  std::string version;              // this program's, checked by the coordinator
  std::chrono::milliseconds connect_timeout{10'000};
  // A fenced worker joins again, trying for this long; zero: it stays fenced.
  std::chrono::milliseconds rejoin_timeout{0};
  // Told each time the worker is fenced and tries to join again (the CLI logs it).
  std::function<void(const std::string& why)> on_rejoin;
  // cluster.heartbeat_ms and cluster.connection_timeout_ms: the worker's own,
  // since it connects before it reads the job's config.
  std::chrono::milliseconds heartbeat{500};
  std::chrono::milliseconds connection_timeout{5'000};
  tls_config tls;  // cluster.tls.*, the worker's own
};

struct worker_result {
  enum class kind { finished, failed, fenced, refused };
  kind outcome = kind::finished;
  std::string message;  // the coordinator's error, the refusal, or why it is fenced
  // Its actor system could not be shut down (a device still referenced from
  // the coordinator): the process must end with _Exit, skipping static
  // destructors that would run under its threads.
  bool left_system_running = false;
};

// Joins and serves until the run is over. A worker's devices are of the
// job's kind: GPUs when the coordinator's are (config_error when this machine
// has none), else CPU replicas. Throws config_error, data_error
// (its own copy of the data) or std::runtime_error (cannot reach the
// coordinator).
worker_result run_worker(const worker_options& options);

}  // namespace dpactor
