#pragma once
// dpactor::data_source: what the loader draws each step's samples from, and
// the book of the steps it handed out, against which exactly-once holds. Two
// implementations: issued_steps, the epochs of a file-backed training set
// over the epoch ledger, and issued_records, a stream of records fed by the
// caller (See Note [Exactly-once offsets], data/record_queue.hpp). The loader
// (actors/loader.cpp) asks a source what may happen next and never which
// kind it is; both are tested without actors (tests/step_book_test.cpp,
// tests/stream_book_test.cpp).
//
// The life of a step is the same for both: issue() hands it out, commit()
// books it as trained once the reducer has applied it (the samples a cut
// returned go out again later), roll_back() sends back the steps a failure
// undid, in order, to be planned again under the same step numbers, and
// position_after() is what a checkpoint taken after a step records.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "data/dataset.hpp"
#include "data/epoch_ledger.hpp"
#include "train/step_record.hpp"

namespace dpactor {

class data_source {
 public:
  virtual ~data_source() = default;

  // What the loader may do next, for a step of `batch` samples.
  enum class next {
    step,           // issue a step
    wait_commits,   // nothing more until the steps in flight are committed
    epoch_end,      // every sample of the epoch is trained: end it (epochs only)
    wait_records,   // too few records are queued: wait for more (streams only)
    end,            // the stream has ended and all of it is committed (streams only)
  };
  virtual next what_next(std::size_t batch) const = 0;

  // A step's samples: `indices` into `rows`, or into the training set when
  // `rows` is null. Valid until the step is committed or rolled back.
  struct step_samples {
    std::span<const std::uint32_t> indices;
    std::shared_ptr<const dataset> rows;
  };
  // Hands out up to `batch` samples for `step`: those sent back by cuts and
  // rollbacks first.
  virtual step_samples issue(std::int64_t step, std::size_t batch) = 0;

  bool empty() const { return steps_in_flight() == 0; }
  virtual std::size_t steps_in_flight() const = 0;
  virtual bool in_flight(std::int64_t step) const = 0;
  // A checkpoint is taken after `step`: commit() reports its position.
  virtual void mark_snapshot(std::int64_t step) = 0;
  virtual bool snapshot_marked(std::int64_t step) const = 0;

  struct snapshot {
    std::int64_t step = 0;
    ledger_position position;
  };
  // Commits every step up to `through`, in order; each step's `returned`
  // samples (cut, never trained) go out again later. Returns the positions
  // of the committed steps marked for a snapshot, each taken right after its
  // step (later steps still in flight). Throws ledger_error if a sample
  // would be trained twice.
  virtual std::vector<snapshot> commit(std::int64_t through, std::span<const step_returned> returned) = 0;
  // Steps after `through` are not in the next generation's state: their
  // samples go back ahead of all others, in order. Returns how many.
  virtual std::size_t roll_back(std::int64_t through) = 0;
  // What a checkpoint after `step` records: the samples of later steps in
  // flight, and those waiting to go out again, count as not trained.
  virtual ledger_position position_after(std::int64_t step) const = 0;

  // The epoch the next step belongs to (a stream: 0).
  virtual std::int64_t epoch() const = 0;
  // Where the next step stands in the learning-rate schedule (See Note
  // [Schedule position]): a fraction of epochs, or for a stream the step.
  virtual double schedule_position(std::int64_t step, std::int64_t epoch_steps, std::int64_t batch) const = 0;
  // Samples a cut returned in this epoch, trained later.
  virtual std::int64_t requeued() const = 0;
  // Samples committed since this source was made (this run), cut samples
  // left out: what the run trained, by the ledger's account.
  virtual std::int64_t committed_samples() const = 0;

  // Epochs: ends the epoch once what_next() said epoch_end (checking that
  // every sample was trained exactly once) and reports it.
  struct epoch_totals {
    std::int64_t epoch = 0;
    std::int64_t committed = 0;
    std::int64_t requeued = 0;
  };
  virtual epoch_totals end_epoch() = 0;
  virtual void start_epoch(std::int64_t epoch) = 0;

  // Streams: after what_next() said wait_records, calls `wake` once enough
  // records for `batch` are queued or the stream ends; returns true instead
  // when they came meanwhile. `wake` may run on any thread.
  virtual bool wake_when_ready(std::size_t batch, std::function<void()> wake) = 0;
};

}  // namespace dpactor
