#pragma once
// Checkpoint directories (DESIGN.md, "Checkpoints"):
//   DIR/step-00000470/model.safetensors      parameters, PyTorch nn.Sequential names
//   DIR/step-00000470/optimizer.safetensors  slots "<param>.<slot>", step in metadata
//   DIR/step-00000470/trainer.json           step, epoch, ledger position, seed, config; in
//                                            sync.mode = "async" the claims ("async")
//   DIR/step-00000470/decisions.jsonl        sync.mode = "async": the run's round_decision records
//                                            up to the checkpoint (what --replay-rounds reads)
//   DIR/step-00000470/workers.safetensors    round modes: each logical worker's inner optimizer
//                                            state "worker.<k>.<param>.<slot>", steps in metadata,
//                                            with a codec its residual "worker.<k>.residual.<param>",
//                                            with fragments its parameters "worker.<k>.inner.<param>",
//                                            with sync.delay its progress "worker.<k>.progress.<param>"
//                                            and samples since each fragment's exchange in metadata
//   DIR/step-00000470/powersgd.safetensors   every_step with sync.codec = "powersgd" in reproducible
//                                            mode: each slice's residual "slice.<k>.residual.<param>"
//                                            and the basis "basis.<param>" (its compressed matrices)
//   DIR/latest                               the name of the newest one
// Each is written under a temporary name, flushed, then renamed, so a reader
// never sees a partial checkpoint.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/epoch_ledger.hpp"
#include "tensors/replica.hpp"
#include "train/powersgd.hpp"
#include "train/worker_state.hpp"

namespace dpactor {

struct trainer_record {
  std::int64_t step = 0;   // optimizer steps done; the next step has this index
  ledger_position position;  // its epoch is also trainer.json's top-level "epoch"
  std::uint64_t seed = 0;
  bool shuffle = true;
  std::uint64_t train_samples = 0;
  // The data's fingerprint (config/job_identity.hpp): a resume on other data
  // is refused. Empty in checkpoints written before it was recorded.
  std::string data_fingerprint;
  std::string config;  // the effective config, TOML
  bool checksummed = true;  // read: the checkpoint's format carries checksums (See train/checkpoint_checksum.hpp)
  // sync.mode = "async": the run's round_decision records up to the
  // checkpoint, JSON Lines, written as decisions.jsonl (See Note [Async
  // checkpoints]); not read back with the record.
  std::string decisions;
};

// The round modes' logical workers (See Note [Logical workers]): each one's
// inner optimizer state as an inner replica lays it out from the end of its
// parameter section on (its slots, then the tail with its step counter),
// worker after worker.
// With a codec, fragments or the delay, more follows (See Note [A logical worker's
// state]).
struct worker_states {
  const state_layout* inner = nullptr;  // null: none (sync.mode = "every_step")
  std::span<const float> states;        // workers x worker_floats(*inner, residual, fragments)
  bool residual = false;
  std::size_t fragments = 1;
  bool delayed = false;
};
inline std::size_t worker_floats(const state_layout& inner, bool residual = false, std::size_t fragments = 1,
                                 bool delayed = false) noexcept {
  return worker_state_shape::of(inner, residual, fragments, delayed).size();
}

// sync.codec = "powersgd" in reproducible mode (See Note [PowerSGD steps]):
// at the checkpoint's step, each slice's residual (the parameter section),
// slice after slice, then the basis (plan->q_floats()).
struct powersgd_states {
  const powersgd_plan* plan = nullptr;  // null: none
  std::span<const float> states;
};

// Writes a checkpoint of `state` (laid out by `layout`) under `root` and
// points DIR/latest at it. Returns the checkpoint's directory. Throws
// checkpoint_error; leaves no partial directory. The order on disk: every
// file fsynced, the directory fsynced, renamed into place (swapped with a
// checkpoint of the same step, never deleted first), then `latest` written,
// fsynced and renamed, then the root fsynced; a crash at any point leaves
// `latest` naming a complete checkpoint (tests/checkpoint_durability_test.cpp).
// Deletes nothing else: pruning is checkpoint_directory's, which knows what
// its run wrote.
// With `workers`, also workers.safetensors; with `powersgd`, also
// powersgd.safetensors.
std::filesystem::path write_checkpoint(const std::filesystem::path& root, const state_layout& layout,
                                       std::span<const float> state, const trainer_record& record,
                                       worker_states workers = {}, powersgd_states powersgd = {});

// Temporary directories are named "<prefix><checkpoint>-<pid>".
inline constexpr const char* checkpoint_tmp_prefix = ".tmp-";

// Test-only: called at each point of write_checkpoint between two writes
// ("model written", "optimizer written", "trainer written", "directory
// synced", "renamed", "latest written", "latest renamed"), so that a test can
// end the process there as a crash would. Empty: nothing is called.
void set_checkpoint_crash_hook(std::function<void(std::string_view)> hook);

struct loaded_checkpoint {
  std::filesystem::path directory;
  std::vector<float> state;  // laid out by the layout it was loaded against
  trainer_record record;
  std::vector<float> workers;  // with an inner layout: worker_states::states
  std::vector<float> powersgd;  // with a PowerSGD plan: powersgd_states::states
};

// `path` is a checkpoint directory, or a root: then its newest checkpoint
// (the highest step-* folder with a trainer.json; `latest` names the same
// one except in the moment between a checkpoint's rename and `latest`'s).
// Checks every tensor against `layout`; throws checkpoint_error naming the
// file and tensor.
// The trainer record of the checkpoint `path` names (as read_checkpoint),
// without reading its tensors.
trainer_record read_trainer_record(const std::filesystem::path& path);

// With `inner` (the round modes), also the logical workers' states, which
// must be there, with their residuals if `residual` and their own
// parameters and sample counts if `fragments` > 1, their progress if
// `delayed`.
// With `powersgd`, also PowerSGD's residuals and basis, which must be there.
loaded_checkpoint read_checkpoint(const std::filesystem::path& path, const state_layout& layout,
                                  const state_layout* inner = nullptr, bool residual = false,
                                  std::size_t fragments = 1, bool delayed = false,
                                  const powersgd_plan* powersgd = nullptr);

// Loads model weights only (e.g. --init-from): every parameter of `layout` must
// be present as F32 with the same shape. Returns the parameter section.
std::vector<float> read_model_weights(const std::filesystem::path& file, const state_layout& layout);

}  // namespace dpactor
