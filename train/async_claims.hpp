#pragma once
// The data of bounded-staleness asynchronous rounds (sync.mode = "async"):
// which samples a logical worker's round trains, and how many. Pure logic,
// tested without actors (tests/async_claims_test.cpp).
//
// Note [Async claims]
// In `diloco` a round's data is fixed shares of H global batches (Note
// [Round data]); in `async` rounds do not line up, so a worker's round
// *claims* the next samples of the epoch's order when it starts: n_k =
// H_k x (train.batch_size / K) indices, where H_k = max(1, round(H x
// throughput_k / the fastest worker's)) (async_inner_steps): a worker three
// times slower claims a third as much, and its round takes as long as the
// others'. A claim never spans two epochs: a claim at an epoch's end is
// shorter, and once an epoch's order is handed out, claims come from the
// next epoch's (the workers do not wait for the epoch's last rounds).
// - A claim whose contribution a round merges is committed: its samples are
//   trained.
// - A claim whose contribution is dropped (staleness past the bound, Note
//   [Async commit]) is given back: its samples go to the front of its epoch's
//   queue, and the next claims take them first, as a cut slice's samples go
//   back in fast mode. So they are trained later in the same epoch.
// - An epoch ends when every one of its samples is committed, once; the
//   claims of the next epoch may already be training.
// A claim records where it starts in its epoch's order (`first`): with the
// epoch, that fixes its place on the inner learning-rate schedule.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "data/async_position.hpp"

namespace dpactor {

struct async_claim {
  std::int64_t epoch = 0;
  std::int64_t first = 0;  // where rows[0] is in the epoch's order; the rows follow it there
  std::vector<std::uint32_t> rows;
};

class async_claims {
 public:
  // `samples` training samples, epochs 0 .. epochs - 1 in the order of
  // epoch_order(samples, seed, epoch, shuffle) (data/sampler.hpp).
  async_claims(std::size_t samples, std::uint64_t seed, bool shuffle, std::int64_t epochs);
  // Resumed from a checkpoint's position. Throws std::invalid_argument
  // naming what does not fit the data (an epoch past `epochs`, a range past
  // the samples, counts that do not add up).
  async_claims(std::size_t samples, std::uint64_t seed, bool shuffle, std::int64_t epochs, const async_position& at);

  // Where the claims stand, for a checkpoint, with `outstanding` (claims
  // handed out and neither committed nor given back: rounds in flight or
  // waiting) given back first: a resumed run trains them again, and
  // everything committed stays committed.
  async_position position(std::span<const async_claim> outstanding) const;

  // The next at most `n` (>= 1) samples: the oldest epoch's given-back
  // samples first, then its order where it was left; nullopt once every
  // epoch is handed out.
  std::optional<async_claim> claim(std::size_t n);
  // The claim positions [first, first + n) of epoch e's order make, as a
  // run's record names it (See Note [Async replay]): handed out by the run
  // being replayed, so nothing here hands it out again.
  async_claim claim_at(std::int64_t epoch, std::int64_t first, std::size_t n);
  // The claim's samples are trained (a round merged its contribution).
  void commit(const async_claim& c);
  // The claim's samples were not trained: they go back to the front of
  // their epoch's queue.
  void give_back(async_claim c);

  std::size_t samples() const noexcept { return samples_; }
  std::int64_t epochs() const noexcept { return epochs_; }
  // Samples of epoch e committed so far, and given back.
  std::int64_t committed(std::int64_t e) const;
  std::int64_t requeued(std::int64_t e) const;
  // Every sample of epoch e is committed.
  bool epoch_done(std::int64_t e) const { return committed(e) == static_cast<std::int64_t>(samples_); }
  // Every sample of every epoch is committed (the last epoch's may be while
  // an earlier one's given-back samples still train).
  bool all_done() const { return done_ >= epochs_; }

 private:
  struct epoch_state {
    std::vector<std::uint32_t> order;
    std::size_t next = 0;             // the first position not handed out
    std::deque<async_claim> returned; // given back, the last given back first
    std::int64_t committed = 0;
  };
  epoch_state& at(std::int64_t e);

  std::size_t samples_;
  std::uint64_t seed_;
  bool shuffle_;
  std::int64_t epochs_;
  std::map<std::int64_t, epoch_state> open_;  // epochs handed out, not all committed
  std::int64_t done_ = 0;                      // epochs before this one are all committed
  std::vector<std::int64_t> requeued_;         // by epoch
};

// H_k: the inner steps of a worker whose measured throughput is `throughput`
// when the fastest worker's is `fastest` (samples/s; 0: not measured yet,
// H).
std::int64_t async_inner_steps(std::int64_t every, double throughput, double fastest);

}  // namespace dpactor
