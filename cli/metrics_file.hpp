#pragma once
// --metrics FILE: one JSON object per line for every event, and a last
// {"event": "summary", ...} record.
//
// The file is an output, so it may not name an input of the run (the config,
// a data file, the weights, anything inside a checkpoint directory): opening
// it would truncate that input. And it is checked: a write, flush or close
// that fails (a full disk: ENOSPC; EIO) is kept as an error naming the file and
// the system's reason, never ignored; cli/main.cpp stops the run on it
// (docs/cli.md, "Metrics file").

#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cli/options.hpp"
#include <dpactor/events.hpp>
#include "tensors/json.hpp"

namespace dpactor::cli {

// Throws config_error naming --metrics, its path and the input when `metrics`
// is the same file as one of `inputs` (std::filesystem::equivalent when both
// exist, else the same weakly canonical path) or lies inside one that is a
// directory. Call it before the file is opened: opening truncates.
void refuse_metrics_on_inputs(const std::string& metrics, const std::vector<run_input>& inputs);

class metrics_file {
 public:
  // Throws std::runtime_error naming the path if it cannot be created.
  explicit metrics_file(const std::string& path);
  ~metrics_file();  // closes the file if close() was not called, unchecked
  metrics_file(const metrics_file&) = delete;
  metrics_file& operator=(const metrics_file&) = delete;

  // One line, flushed. Returns false when the write or the flush failed, or an
  // earlier one did; after the first failure nothing more is written.
  bool write(const json& record);
  // Closes the file, checking the close. Returns false if it or any write failed.
  bool close();
  // The first failure: "--metrics PATH: cannot write: <strerror>"; nullopt if none.
  std::optional<std::string> error() const;

 private:
  void fail(const char* doing, int err);  // keeps the first failure; mutex_ held

  mutable std::mutex mutex_;
  std::string path_;
  std::FILE* file_ = nullptr;
  std::optional<std::string> error_;
};

}  // namespace dpactor::cli
