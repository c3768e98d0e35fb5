#pragma once
// The stream data source: records that a service feeds (Engine::feed) or
// that the engine pulls from a record_source wait in a bounded queue until
// the loader takes them into global batches, in the order of their sequence
// numbers.
//
// Note [Exactly-once offsets]
// Every record carries a sequence number chosen by the caller (a Kafka
// offset, a log position), increasing in feed order. A global batch is the
// next batch_size records in that order: in reproducible mode the batches,
// and so the bytes, are a function of the stream alone, whatever the timing
// of the feed. A checkpoint stores a stream_position: `committed`, the
// highest sequence number S such that every record fed up to S is trained
// into the checkpoint's parameters, and `trained_above`, the records above S
// also trained (a cut sends its untouched records out again, behind later
// ones). S is what a service commits upstream once the checkpoint is
// written (the checkpoint event, Engine::committed_sequence()). After a
// crash the service resumes from the checkpoint and replays from S + 1; the
// queue skips every record it is given that is not above the last one it
// saw or that `trained_above` lists. So each record is trained into the
// final parameters exactly once: those up to S and in trained_above by the
// run that checkpointed them, every other one by the replay. The loader's
// book of records in flight (train/issued_records.hpp) computes S.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <vector>

#include <dpactor/stream.hpp>
#include "data/stream_position.hpp"

namespace dpactor {

class record_queue {
 public:
  // Holds at most `capacity` records of `feature_count` features and labels
  // below `classes`; `resume`: where a resumed run's stream stood.
  record_queue(std::size_t capacity, std::size_t feature_count, int classes, const stream_position& resume = {});

  // Queues the records in order, waiting up to `wait` while the queue is
  // full. Checks every record before queuing any: throws data_error naming
  // the sequence number of the first one with the wrong number of features,
  // a label out of range, a value that is not finite or a negative sequence
  // number.
  feed_result push(std::span<const record> records, std::chrono::milliseconds wait);
  // Moves up to n records, oldest first, to `out`. Returns how many.
  std::size_t take(std::size_t n, std::vector<record>& out);
  // The end of the stream: pushes are refused; what is queued is trained,
  // the last batch with what is left.
  void close();
  // The run stops or ended: pushes are refused, and what is queued stays
  // untrained (a partial batch is not formed), to be replayed.
  void shut();

  std::size_t size() const;
  bool closed() const;
  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t feature_count() const noexcept { return feature_count_; }
  int classes() const noexcept { return classes_; }
  std::int64_t fed_total() const;     // records queued since construction
  std::int64_t skipped_total() const;

  // Calls `notify` once, from a push or close, when at least n records are
  // queued or the queue is closed; returns true instead (and never calls it)
  // when that already holds. A new request replaces an older one.
  bool notify_when(std::size_t n, std::function<void()> notify);

 private:
  void check(std::span<const record> records) const;
  void fire_locked(std::unique_lock<std::mutex>& lock);

  const std::size_t capacity_;
  const std::size_t feature_count_;
  const int classes_;
  const std::vector<std::int64_t> trained_above_;  // from the resumed checkpoint
  mutable std::mutex mutex_;
  std::condition_variable space_;
  std::deque<record> records_;
  std::int64_t last_seen_;  // the highest sequence number fed
  bool closed_ = false;
  bool shut_ = false;
  std::int64_t fed_ = 0;
  std::int64_t skipped_ = 0;
  std::size_t notify_at_ = 0;  // 0: nobody waits
  std::function<void()> notify_;
};

}  // namespace dpactor
