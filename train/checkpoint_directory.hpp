#pragma once
// One run's checkpoint directory: held under an exclusive lock for the run,
// checked writable before any training, cleared of the temporary folders of
// dead runs, and pruned only of checkpoints this run wrote.
//
// Without the lock, two runs started on one directory overwrote each other's
// checkpoints and pruned each other's; without the record of what this run
// wrote, `train.keep_checkpoints` deleted an earlier run's checkpoints and
// any folder of the user's named step-*. The lock is flock(2) on DIR/.lock,
// which holds the holder's pid for the error message; the kernel releases it
// when the process dies, so a crashed run never leaves the directory locked.

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "train/checkpoint.hpp"

namespace dpactor {

class checkpoint_directory {
 public:
  // Creates `root` if needed and takes its lock. Throws checkpoint_error when
  // it cannot be created or written, or when another run holds it (naming
  // that run's pid).
  explicit checkpoint_directory(std::filesystem::path root);
  ~checkpoint_directory();
  checkpoint_directory(const checkpoint_directory&) = delete;
  checkpoint_directory& operator=(const checkpoint_directory&) = delete;

  const std::filesystem::path& root() const noexcept { return root_; }

  // write_checkpoint, then deletes the oldest checkpoints this run wrote
  // beyond the newest `keep` (0 = keep all). Never one it did not write, and
  // never the one just written.
  std::filesystem::path write(const state_layout& layout, std::span<const float> state, const trainer_record& record,
                              std::int64_t keep);

  // The temporary folders of dead runs removed when the lock was taken.
  std::size_t stale_removed() const noexcept { return stale_removed_; }

 private:
  std::filesystem::path root_;
  int lock_fd_ = -1;
  std::vector<std::filesystem::path> written_;  // oldest first
  std::size_t stale_removed_ = 0;
};

}  // namespace dpactor
