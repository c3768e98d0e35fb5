#pragma once
// The process exit codes of the dpactor program (docs/cli.md, "Exit codes";
// the README's troubleshooting). Library code throws errors of a kind
// (dpactor/error.hpp); only the command line turns them into codes.

#include <csignal>

#include <dpactor/error.hpp>

namespace dpactor::cli {

enum exit_code : int {
  exit_success = 0,
  exit_internal = 1,    // a bug or an unexpected system failure
  exit_config = 2,      // usage or configuration error
  exit_data = 3,        // a data file is missing, malformed or inconsistent
  exit_checkpoint = 4,  // a checkpoint or weights file is missing or corrupt, or cannot be written
  exit_training = 5,    // training could not continue (devices lost, diverged)
  exit_fenced = 6,      // a worker lost its coordinator and stopped its devices (See Note [A worker never trains alone])
  exit_refused = 7,     // a worker's join was refused (version, config or data)
};

constexpr int exit_code_for(error_kind kind) noexcept {
  switch (kind) {
    case error_kind::internal: return exit_internal;
    case error_kind::config: return exit_config;
    case error_kind::data: return exit_data;
    case error_kind::checkpoint: return exit_checkpoint;
    case error_kind::training:
    case error_kind::collective: return exit_training;
    // Misuse of the library's Engine: the program never makes these calls so.
    case error_kind::no_run:
    case error_kind::already_running:
    case error_kind::timeout:
    case error_kind::run_ended:
    case error_kind::unknown_device:
    case error_kind::invalid_argument:
    case error_kind::stuck_thread: return exit_internal;
  }
  return exit_internal;
}

// Stopped by a signal after writing a checkpoint: 128 + the signal, as a
// shell reports a process killed by it (130 for SIGINT, 143 for SIGTERM).
constexpr int exit_code_for_signal(int sig) noexcept { return 128 + sig; }

}  // namespace dpactor::cli
