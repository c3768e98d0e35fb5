#pragma once
// The data_source of a stream, the counterpart of issued_steps: the
// loader's book of a stream's steps. Each step takes the next records, oldest first (records a
// cut or a rollback sent back come first), into a chunk that its shards
// address by row; a commit keeps track of what is trained, and a checkpoint
// records where the stream stands (See Note [Exactly-once offsets],
// data/record_queue.hpp). Tested without actors (tests/issued_records_test.cpp).

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <vector>

#include "data/dataset.hpp"
#include "data/record_queue.hpp"
#include "data/stream_position.hpp"
#include "train/data_source.hpp"
#include "train/in_flight_steps.hpp"
#include "train/step_record.hpp"

namespace dpactor {

class issued_records final : public booked_source<std::shared_ptr<const dataset>> {
 public:
  // `resume`: the stream position of the checkpoint the run resumes from.
  issued_records(record_queue& queue, const stream_position& resume);

  // Records ready to go out: sent back ones and queued ones.
  std::size_t available() const { return front_.size() + queue_.size(); }
  // Records sent back by cuts and rollbacks, going out first.
  std::size_t sent_back() const noexcept { return front_.size(); }
  // The stream has ended and every record went out.
  bool drained() const { return queue_.closed() && available() == 0; }
  record_queue& queue() noexcept { return queue_; }
  const record_queue& queue() const noexcept { return queue_; }

  // A step goes out with a whole batch, or with what is left once the
  // stream has ended.
  next what_next(std::size_t batch) const override;
  // The next `batch` records (fewer only at the end of the stream) as the
  // rows of `step`'s chunk, in sequence order of their going out; the
  // indices address the chunk's rows.
  step_samples issue(std::int64_t step, std::size_t batch) override;
  // The rows a cut returned (`returned`, chunk rows) go out again before any
  // other record. Throws ledger_error if a record would be trained twice.
  std::vector<snapshot> commit(std::int64_t through, std::span<const step_returned> returned) override;
  // Every record of a later step goes back ahead of all others, in order.
  std::size_t roll_back(std::int64_t through) override;
  // Where the stream stands once `step` is committed (`.stream`): the
  // records of later steps in flight, and those waiting to go out again, are
  // not trained.
  ledger_position position_after(std::int64_t step) const override;
  // The committed sequence of the position after the last commit.
  std::int64_t committed() const noexcept { return base_; }

  std::int64_t epoch() const override { return 0; }
  // A stream has no epochs: the position is the step.
  double schedule_position(std::int64_t step, std::int64_t, std::int64_t) const override {
    return static_cast<double>(step);
  }
  // Records a cut returned, trained later.
  std::int64_t requeued() const override { return requeued_; }
  // A stream has no epochs: these throw std::logic_error.
  epoch_totals end_epoch() override;
  void start_epoch(std::int64_t epoch) override;
  bool wake_when_ready(std::size_t batch, std::function<void()> wake) override;

 private:
  // In flight: each step's chunk.
  // The lowest sequence number not trained at `step`: of the records sent
  // back and of steps after it in flight. INT64_MAX: none.
  std::int64_t lowest_untrained(std::int64_t step) const;
  void advance_base(std::int64_t step);

  record_queue& queue_;
  std::deque<record> front_;  // sent back by cuts and rollbacks, going out first
  std::int64_t base_;        // every record up to it is trained
  std::int64_t max_taken_;   // the highest sequence number that went out
  std::set<std::int64_t> trained_above_;  // trained records above base_
  std::int64_t requeued_ = 0;
  std::vector<record> scratch_;
  std::vector<std::uint32_t> rows_;  // 0 .. rows - 1: a chunk's indices
};

}  // namespace dpactor
