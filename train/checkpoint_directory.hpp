#pragma once
// One run's checkpoint directory: held under an exclusive lock for the run,
// checked writable before any training, cleared of the temporary folders of
// dead runs, and pruned only of checkpoints this run wrote.
//
// Note [A run owns its checkpoints]
// A run writes only where it replaces nothing it did not write: a new run
// refuses a directory that holds another run's checkpoints, and a resumed
// run one that holds checkpoints after the one it resumed from (its own
// checkpoints of those steps would replace them). Both refusals name the
// directory, the newest checkpoint there and the ways on: continue it
// (--resume latest), another directory, or the user's explicit consent
// (--overwrite-checkpoints, run_options::overwrite_checkpoints), which lets
// the run replace checkpoints of the steps it writes; nothing else is ever
// deleted. A running job cannot otherwise tell an hour of someone's training
// from its own.
//
// Without the lock, two runs started on one directory overwrote each other's
// checkpoints and pruned each other's; without the record of what this run
// wrote, `train.keep_checkpoints` deleted an earlier run's checkpoints and
// any folder of the user's named step-*. The lock is flock(2) on DIR/.lock,
// which holds the holder's pid for the error message; the kernel releases it
// when the process dies, so a crashed run never leaves the directory locked.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <vector>

#include "train/checkpoint.hpp"

namespace dpactor {

// What a run may write into its checkpoint directory (See Note [A run owns
// its checkpoints]).
struct checkpoint_claim {
  // The run resumed from a checkpoint of this directory at this step: the
  // checkpoints up to it are the run's own history.
  std::optional<std::int64_t> resumed_step;
  // The user lets the run replace checkpoints of the steps it writes.
  bool overwrite = false;
};

class checkpoint_directory {
 public:
  // Creates `root` if needed and takes its lock. Throws checkpoint_error when
  // it cannot be created or written, when another run holds it (naming that
  // run's pid), or when it holds checkpoints the claim does not cover.
  explicit checkpoint_directory(std::filesystem::path root, checkpoint_claim claim = {});
  ~checkpoint_directory();
  checkpoint_directory(const checkpoint_directory&) = delete;
  checkpoint_directory& operator=(const checkpoint_directory&) = delete;

  const std::filesystem::path& root() const noexcept { return root_; }

  // write_checkpoint, then deletes the oldest checkpoints this run wrote
  // beyond the newest `keep` (0 = keep all). Never one it did not write, and
  // never the one just written.
  std::filesystem::path write(const state_layout& layout, std::span<const float> state, const trainer_record& record,
                              std::int64_t keep, worker_states workers = {}, powersgd_states powersgd = {});

  // The temporary folders of dead runs removed when the lock was taken.
  std::size_t stale_removed() const noexcept { return stale_removed_; }

 private:
  std::filesystem::path root_;
  int lock_fd_ = -1;
  std::vector<std::filesystem::path> written_;  // oldest first
  std::size_t stale_removed_ = 0;
};

}  // namespace dpactor
