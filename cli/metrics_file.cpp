#include "cli/metrics_file.hpp"

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace dpactor::cli {

metrics_file::metrics_file(const std::string& path) : file_(std::fopen(path.c_str(), "w")) {
  if (file_ == nullptr) throw std::runtime_error("--metrics " + path + ": cannot create: " + std::strerror(errno));
}

metrics_file::~metrics_file() {
  if (file_ != nullptr) std::fclose(file_);
}

void metrics_file::write(const json& record) {
  const std::string line = record.dump() + "\n";
  std::lock_guard lock(mutex_);
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

}  // namespace dpactor::cli
