#pragma once
// --metrics FILE: one JSON object per line for every event, and a last
// {"event": "summary", ...} record.

#include <cstdio>
#include <mutex>
#include <string>

#include "train/events.hpp"

namespace dpactor::cli {

class metrics_file {
 public:
  // Throws std::runtime_error naming the path if it cannot be created.
  explicit metrics_file(const std::string& path);
  ~metrics_file();
  metrics_file(const metrics_file&) = delete;
  metrics_file& operator=(const metrics_file&) = delete;

  void write(const json& record);  // one line, flushed

 private:
  std::mutex mutex_;
  std::FILE* file_ = nullptr;
};

}  // namespace dpactor::cli
