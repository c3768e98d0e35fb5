#pragma once
// The epoch ledger: which sample indices of the current epoch were handed out,
// committed (trained into the parameters), or are waiting to be handed out,
// re-queued ones first. Every transition is checked, and the end of an epoch
// proves that each index was committed exactly once (see DESIGN.md, "Exactly
// once"); a violation throws, in every build.

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/async_position.hpp"
#include "data/stream_position.hpp"

namespace dpactor {

struct ledger_error : std::logic_error {
  using std::logic_error::logic_error;
};

// Where an epoch stands, as a checkpoint stores it: hand out `front` first,
// then order[cursor:]; everything else in the epoch is committed. A stream
// run has no epochs: its position is `stream` (active), the rest unused. An
// async run's is `async` (active) and `epoch` its first open epoch.
struct ledger_position {
  std::int64_t epoch = 0;
  std::uint64_t cursor = 0;
  std::vector<std::uint32_t> front;
  stream_position stream;
  async_position async;  // sync.mode = "async": its claims instead of this epoch's order
};

class epoch_ledger {
 public:
  epoch_ledger(std::size_t samples, std::uint64_t seed, bool shuffle);

  void start_epoch(std::int64_t epoch);
  // Resumes an epoch part-way; throws ledger_error if the position is invalid.
  void restore(const ledger_position& position);

  std::int64_t epoch() const noexcept { return epoch_; }
  std::size_t samples() const noexcept { return state_.size(); }
  // Indices not yet handed out (re-queued and fresh).
  std::size_t waiting() const noexcept { return front_.size() + (order_.size() - cursor_); }
  std::size_t committed() const noexcept { return committed_; }
  // Indices re-queued in this epoch.
  std::uint64_t requeued_total() const noexcept { return requeued_total_; }
  bool epoch_complete() const noexcept { return committed_ == state_.size(); }

  // Hands out up to n indices, re-queued ones first, into `out` (appended).
  void take(std::size_t n, std::vector<std::uint32_t>& out);
  // Returns handed-out indices to be handed out again later this epoch,
  // after those already waiting to be handed out again.
  void requeue(std::span<const std::uint32_t> indices);
  // The same, but ahead of every other re-queued index, in the given order.
  void requeue_front(std::span<const std::uint32_t> indices);
  // Marks handed-out indices as trained. Throws ledger_error if one was not
  // handed out or is already committed.
  void commit(std::span<const std::uint32_t> indices);
  // Throws ledger_error naming the first index not committed exactly once.
  void verify_complete() const;

  // The position a checkpoint stores, as if `in_flight` (handed out, not
  // committed, in the order they were handed out) had not been handed out.
  ledger_position position(std::span<const std::uint32_t> in_flight) const;

 private:
  enum class index_state : std::uint8_t { waiting, handed_out, committed };

  std::uint64_t seed_;
  bool shuffle_;
  std::int64_t epoch_ = 0;
  std::vector<std::uint32_t> order_;
  std::size_t cursor_ = 0;
  std::vector<std::uint32_t> front_;  // re-queued, handed out before order_[cursor_:]
  std::size_t front_head_ = 0;
  std::vector<index_state> state_;
  std::size_t committed_ = 0;
  std::uint64_t requeued_total_ = 0;
};

}  // namespace dpactor
