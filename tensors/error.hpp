#pragma once
// Error types shared by every layer. Each carries the process exit code the
// command line uses for it (docs/cli.md, "Exit codes"), so a library caller and
// the CLI classify a failure the same way.

#include <stdexcept>
#include <string>

namespace dpactor {

enum class error_kind : int {
  internal = 1,    // a bug or an unexpected system failure
  config = 2,      // usage or configuration error
  data = 3,        // a data file is missing, malformed or inconsistent
  checkpoint = 4,  // a checkpoint or weights file is missing or corrupt
  training = 5,    // training could not continue (devices lost, diverged)
};

class error : public std::runtime_error {
 public:
  error(error_kind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  error_kind kind() const noexcept { return kind_; }
  int exit_code() const noexcept { return static_cast<int>(kind_); }

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
