#include "train/slice_board.hpp"

namespace dpactor {

slice_board::slice_board(std::size_t slices, bool stealing)
    : slices_(slices), stealing_(stealing), claimed_(std::make_unique<std::atomic<std::uint8_t>[]>(slices)) {
  for (std::size_t s = 0; s < slices; ++s) claimed_[s].store(0, std::memory_order_relaxed);
}

bool slice_board::claim(std::size_t s) noexcept {
  if (s >= slices_) return false;
  return claimed_[s].exchange(1, std::memory_order_acq_rel) == 0;
}

std::optional<std::size_t> slice_board::steal() noexcept {
  for (std::size_t s = slices_; s-- > 0;)
    if (claimed_[s].load(std::memory_order_relaxed) == 0 && claim(s)) return s;
  return std::nullopt;
}

}  // namespace dpactor
