#include "train/checkpoint_directory.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "tensors/error.hpp"

namespace dpactor {
namespace fs = std::filesystem;
namespace {

constexpr const char* lock_name = ".lock";

// The pid a holder wrote into the lock file, or "unknown".
std::string holder_of(int fd) {
  char buffer[32] = {};
  const ssize_t n = ::pread(fd, buffer, sizeof buffer - 1, 0);
  std::string pid = n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : std::string();
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid.empty() ? "unknown" : pid;
}

}  // namespace

checkpoint_directory::checkpoint_directory(fs::path root) : root_(std::move(root)) {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) throw checkpoint_error("cannot create checkpoint directory " + root_.string() + ": " + ec.message());
  const fs::path lock_path = root_ / lock_name;
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0)
    throw checkpoint_error("cannot write to checkpoint directory " + root_.string() + ": " + std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = holder_of(lock_fd_);
    ::close(lock_fd_);
    lock_fd_ = -1;
    if (err == EWOULDBLOCK)
      throw checkpoint_error("checkpoint directory " + root_.string() + " is in use by another run (pid " + holder +
                             "); give this run its own train.checkpoint_dir, or wait for that run to end");
    throw checkpoint_error("cannot lock checkpoint directory " + root_.string() + ": " + std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int err = errno;
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw checkpoint_error("cannot write to checkpoint directory " + root_.string() + ": " + std::strerror(err));
  }
  // Holding the lock, every temporary folder here is a dead run's.
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind(checkpoint_tmp_prefix, 0) == 0) {
      fs::remove_all(entry.path(), ec);
      ++stale_removed_;
    }
  }
}

checkpoint_directory::~checkpoint_directory() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock; the file stays, harmless
}

fs::path checkpoint_directory::write(const state_layout& layout, std::span<const float> state,
                                     const trainer_record& record, std::int64_t keep) {
  const fs::path written = write_checkpoint(root_, layout, state, record);
  std::erase(written_, written);  // a step written again counts once, as the newest
  written_.push_back(written);
  while (keep > 0 && static_cast<std::int64_t>(written_.size()) > keep) {
    std::error_code ec;
    fs::remove_all(written_.front(), ec);
    written_.erase(written_.begin());
  }
  return written;
}

}  // namespace dpactor
