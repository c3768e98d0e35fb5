#pragma once
// One member's part of one step. Across processes only the indices travel;
// each node reads its own copy of the data (DESIGN.md, "The actors").
//
// Without train.reproducible, `indices` are the member's own samples. In
// reproducible mode they are the whole step's, cut into slices of
// `slice_rows`; the member owns slices [first_slice, last_slice), or the
// ones `own_slices` lists, and may steal others through the step's board
// (See Note [Stealing slices]).

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "data/dataset.hpp"
#include "train/slice_board.hpp"

namespace dpactor {

struct step_shard {
  std::int64_t step = 0;   // 0-based optimizer step
  std::int64_t epoch = 0;  // 0-based
  std::vector<std::uint32_t> indices;
  // Reproducible mode only (slice_rows > 0):
  std::uint32_t slice_rows = 0;
  std::uint32_t first_slice = 0;
  std::uint32_t last_slice = 0;
  std::shared_ptr<slice_board> board;  // in-process only, not serialised
  double schedule_position = 0.0;      // the learning rate's (See Note [Schedule position])
  double lr_override = 0.0;            // > 0: this rate instead of the schedule's (Engine::set_lr)
  // Stream mode: the step's records, which `indices` address (in-process
  // only, not serialised). Null: the training set's rows.
  std::shared_ptr<const dataset> rows;
  // The step's slices; 0: as many as the indices fill. A round with
  // fragments has a slice for every logical worker, rows or not
  // (round_shape::slices); the ones past the indices are empty.
  std::uint32_t slice_count = 0;
  // In-process, reproducible mode: the whole step's indices, one copy that
  // every member of the loader's process shares (not serialised), in place
  // of `indices`: copying them to each member would cost members x batch a
  // step (docs/scale.md). A member in another process gets `indices`.
  std::shared_ptr<const std::vector<std::uint32_t>> shared_indices = nullptr;
  // A round's logical workers when they are not one run (their node's, See
  // Note [Worker placement]), in order, in place of [first_slice,
  // last_slice); empty: that range.
  std::vector<std::uint32_t> own_slices;

  // The indices the shard addresses: the shared ones, or its own.
  std::span<const std::uint32_t> all_indices() const noexcept {
    return shared_indices ? std::span<const std::uint32_t>(*shared_indices) : std::span<const std::uint32_t>(indices);
  }
  bool sliced() const noexcept { return slice_rows > 0; }
  // Calls f(slice) for each slice the member owns, in order.
  template <class F>
  void for_each_owned(F&& f) const {
    if (!own_slices.empty())
      for (const std::uint32_t s : own_slices) f(s);
    else
      for (std::uint32_t s = first_slice; s < last_slice; ++s) f(s);
  }
  // Owns `list` (in order): a run as the range, otherwise the list.
  void own(std::span<const std::uint32_t> list) {
    own_slices.clear();
    first_slice = list.empty() ? 0 : list.front();
    last_slice = first_slice + static_cast<std::uint32_t>(list.size());
    if (!list.empty() && list.back() - list.front() + 1 != list.size()) {
      own_slices.assign(list.begin(), list.end());
      first_slice = last_slice = 0;
    }
  }
  std::size_t slices() const noexcept {
    if (!sliced()) return 0;
    return slice_count > 0 ? slice_count : (all_indices().size() + slice_rows - 1) / slice_rows;
  }
};

}  // namespace dpactor
