#pragma once
// Where a step stands in the learning-rate schedule.
//
// Note [Schedule position]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The schedule (tensors/lr_schedule.hpp) is a function of a position that
// counts in whole batches, as PyTorch's schedulers count optimizer steps. A
// step's position is where its epoch starts (epoch * epoch_steps) plus the
// epoch's samples already handed out before it, in batches:
//
//     position = epoch * epoch_steps + handed_out / batch_size
//
// Without cuts every step but an epoch's last takes a full batch, so the
// position is the step's index, to the bit. A cut (train.reproducible =
// false) returns a late member's untouched samples, which later steps train:
// the epoch then takes more steps than epoch_steps, and indexing by step
// would run those extra steps past the schedule's end, at min_lr. By
// position they fall inside their epoch, at the rate its samples were meant
// to get, and no step of a run passes the nominal length (epochs *
// epoch_steps, or max_steps) unless the schedule says so.
//
// A step the loader plans again after a fault gets the position the ledger
// gives it then, which may differ from its first one by the samples that
// were in flight: fine for cuts, which follow timing anyway, but not for
// train.reproducible. That mode has no cuts, so its positions are the step
// indices, and the loader uses the index itself there.

#include <cstddef>
#include <cstdint>

namespace dpactor {

// `handed_out`: samples of the epoch handed out (in flight or committed, not
// returned) before this step takes its own.
inline double schedule_position(std::int64_t epoch, std::int64_t epoch_steps, std::size_t handed_out,
                                std::int64_t batch_size) noexcept {
  return static_cast<double>(epoch * epoch_steps) + static_cast<double>(handed_out) / static_cast<double>(batch_size);
}

}  // namespace dpactor
