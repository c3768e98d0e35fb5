#pragma once
// dpactor's errors (public API). Every layer throws these, each of a kind, so
// that a library caller and the command line classify a failure the same way
// (the command line maps kinds to exit codes: cli/exit_codes.hpp).

#include <stdexcept>
#include <string>

namespace dpactor {

enum class error_kind {
  internal,    // a bug or an unexpected system failure
  config,      // usage or configuration error
  data,        // a data file is missing, malformed or inconsistent
  checkpoint,  // a checkpoint or weights file is missing or corrupt
  training,    // training could not continue (devices lost, diverged)
  // A call on dpactor::Engine that cannot be carried out now:
  no_run,           // it needs a run in progress, and there is none
  already_running,  // it needs no run in progress, and there is one
  timeout,          // the run did not answer within the call's timeout
  run_ended,        // the run ended before it answered
  unknown_device,   // no member has the name it was given
  invalid_argument, // an argument out of its range (a learning rate of 0)
  // A thread the engine started is stuck (a device in a driver call) and was
  // left running when the run was torn down: the engine cannot start again,
  // and the process should end soon (with std::_Exit: static destructors
  // would run under that thread). See Note [Bounded shutdown].
  stuck_thread,
  collective,       // a collective failed: a peer was lost, it timed out or was aborted
};

// Every error dpactor throws to a caller is this one, or one of the kinds
// below derived from it; code() says which, so a caller never parses what().
class error : public std::runtime_error {
 public:
  error(error_kind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  error_kind kind() const noexcept { return kind_; }
  error_kind code() const noexcept { return kind_; }

 private:
  error_kind kind_;
};

struct config_error : error {
  explicit config_error(const std::string& what) : error(error_kind::config, what) {}
};
struct data_error : error {
  explicit data_error(const std::string& what) : error(error_kind::data, what) {}
};
struct checkpoint_error : error {
  explicit checkpoint_error(const std::string& what) : error(error_kind::checkpoint, what) {}
};
struct training_error : error {
  explicit training_error(const std::string& what) : error(error_kind::training, what) {}
};

}  // namespace dpactor
