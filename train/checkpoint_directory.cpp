#include "train/checkpoint_directory.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include <dpactor/error.hpp>
#include "tensors/visible_text.hpp"

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

// The step of every checkpoint under `root` (a folder step-NNNNNNNN holding a
// trainer.json), in no order.
std::vector<std::int64_t> checkpoint_steps(const fs::path& root) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= 5 || name.rfind("step-", 0) != 0 || !entry.is_directory(ec)) continue;
    if (!std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    if (!fs::exists(entry.path() / "trainer.json", ec)) continue;
    steps.push_back(std::stoll(name.substr(5)));
  }
  return steps;
}

// See Note [A run owns its checkpoints].
void check_claim(const fs::path& root, const checkpoint_claim& claim) {
  if (claim.overwrite) return;
  const std::vector<std::int64_t> steps = checkpoint_steps(root);
  if (steps.empty()) return;
  const std::int64_t newest = *std::max_element(steps.begin(), steps.end());
  char newest_name[32];
  std::snprintf(newest_name, sizeof newest_name, "step-%08lld", static_cast<long long>(newest));
  const std::string ways = "continue it from its newest checkpoint (--resume latest, or --resume " +
                           visible((root / newest_name).string()) +
                           "), give this run another checkpoint directory (--checkpoint-dir, train.checkpoint_dir), or "
                           "let this run replace the checkpoints of the steps it writes with --overwrite-checkpoints "
                           "(run_options::overwrite_checkpoints)";
  const std::string where = "checkpoint directory " + visible(root.string());
  if (!claim.resumed_step)
    throw checkpoint_error(where + " holds the checkpoints of another run (" + std::to_string(steps.size()) +
                           ", the newest of step " + std::to_string(newest) + "), which a new run does not replace: " +
                           ways);
  if (newest > *claim.resumed_step)
    throw checkpoint_error(where + " holds checkpoints after the one this run resumes from (step " +
                           std::to_string(*claim.resumed_step) + "; the newest is of step " + std::to_string(newest) +
                           "), which the resumed run would replace: " + ways);
}

}  // namespace

checkpoint_directory::checkpoint_directory(fs::path root, checkpoint_claim claim) : root_(std::move(root)) {
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
  // Before the lock file takes this run's pid: a refused run changes nothing.
  try {
    check_claim(root_, claim);
  } catch (...) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw;
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
                                     const trainer_record& record, std::int64_t keep, worker_states workers,
                                     powersgd_states powersgd) {
  const fs::path written = write_checkpoint(root_, layout, state, record, workers, powersgd);
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
