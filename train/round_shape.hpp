#pragma once
// The arithmetic of rounds (sync.mode = "local_sgd" or "diloco"), with no
// state: how many samples a round trains, how they split over the logical
// workers, and where each inner step falls on the inner learning-rate
// schedule. The loader, the device and the tests all use it.
//
// Note [Round data]
// A round trains the samples of H global batches: the next H x B indices of
// the epoch's order (B = train.batch_size, H = sync.every), fewer in the
// epoch's last round. Worker k's share is the k-th contiguous run of
// ceil(n / K) of the round's n indices (the last share may be shorter, and
// with a short last round some workers may have none); the worker takes
// inner steps over its share in batches of B / K, in order. A round never
// spans two epochs. So the data of a round and of each of its workers is a
// function of the epoch order alone: never of the devices that run them.
//
// The inner schedule counts inner steps: every round of an epoch but the last
// has H of them, the last as many as its longest share needs, and a round's
// first inner step is at position epoch x (inner steps of an epoch) + (round
// within the epoch) x H.

#include <algorithm>
#include <cstdint>

namespace dpactor {

struct round_shape {
  std::int64_t every = 1;    // H
  std::int64_t workers = 1;  // K
  std::int64_t batch = 1;    // B: one inner step of every worker together
  std::int64_t rows = 0;     // samples of an epoch
  std::int64_t fragments = 1;  // sync.fragments (See Note [Fragments])

  static std::int64_t ceil_div(std::int64_t a, std::int64_t b) noexcept { return (a + b - 1) / b; }

  std::int64_t round_samples() const noexcept { return every * batch; }
  std::int64_t worker_batch() const noexcept { return batch / workers; }
  std::int64_t rounds_per_epoch() const noexcept { return std::max<std::int64_t>(1, ceil_div(rows, round_samples())); }
  // Samples of the epoch's round `r` (0-based within the epoch).
  std::int64_t round_rows(std::int64_t r) const noexcept {
    return std::clamp<std::int64_t>(rows - r * round_samples(), 0, round_samples());
  }
  // The rows of each worker's share of a round of n samples.
  std::int64_t share_rows(std::int64_t n) const noexcept { return std::max<std::int64_t>(1, ceil_div(n, workers)); }
  // The slices of a round of n samples, a worker's round each: every worker
  // with rows; with fragments every worker, rows or not, because one with
  // none still contributes what it trained since its fragment's last
  // exchange (See Note [Fragments]).
  std::int64_t slices(std::int64_t n) const noexcept { return fragments > 1 ? workers : ceil_div(n, share_rows(n)); }
  // Inner steps over a share of m rows.
  std::int64_t inner_steps(std::int64_t m) const noexcept { return ceil_div(m, worker_batch()); }
  std::int64_t inner_steps_per_epoch() const noexcept {
    const std::int64_t r = rounds_per_epoch();
    return (r - 1) * every + inner_steps(share_rows(round_rows(r - 1)));
  }
  // The inner schedule's position of round `round`'s first inner step (rounds
  // counted from the run's start, epochs of rounds_per_epoch() rounds).
  double first_inner_position(std::int64_t round, std::int64_t epoch) const noexcept {
    return static_cast<double>(epoch * inner_steps_per_epoch() + (round - epoch * rounds_per_epoch()) * every);
  }
};

}  // namespace dpactor
