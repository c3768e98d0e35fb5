#pragma once
// Who computes which slice of one step, in reproducible mode.
//
// Note [Stealing slices]
// A step's slices (See Note [Summation tree]) are handed to the members in
// contiguous ranges sized by throughput, as shards were. A member claims its
// own slices in order, one at a time, just before it computes each; a member
// that has finished its own range steals the highest slice nobody has
// claimed yet, until none is left. So a straggler stops after the slice it is
// computing, the slices it had not started are computed in the same step by
// members that would otherwise wait, no sample changes step, and the sum does
// not depend on who computed what. This is what straggler.policy "cut" does
// in reproducible mode; without it ("none", "balance") every member computes
// exactly its own range. In-process the board is shared memory
// (one per step, made by the loader); a claim is one atomic exchange.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

namespace dpactor {

class slice_board {
 public:
  // `stealing`: whether members may take slices beyond their own range
  // (straggler.policy "cut" or "balance+cut").
  slice_board(std::size_t slices, bool stealing);

  std::size_t slices() const noexcept { return slices_; }
  bool stealing() const noexcept { return stealing_; }
  // Claims slice `s`; false if another member claimed it first.
  bool claim(std::size_t s) noexcept;
  // Claims the highest slice nobody has claimed; none when all are taken.
  std::optional<std::size_t> steal() noexcept;

 private:
  std::size_t slices_;
  bool stealing_;
  std::unique_ptr<std::atomic<std::uint8_t>[]> claimed_;
};

}  // namespace dpactor
