// The stream's queue and the loader's book of streamed steps, without actors
// (See Note [Exactly-once offsets], data/record_queue.hpp): backpressure,
// skips on replay, what a checkpoint commits after cuts and rollbacks, and a
// crash-and-replay simulation checked against the test's own count of what
// each record's steps trained.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <thread>

#include "data/epoch_ledger.hpp"
#include "data/record_queue.hpp"
#include <dpactor/error.hpp>
#include "train/issued_records.hpp"

namespace dpactor {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t features = 3;
constexpr int classes = 4;

record make_record(std::int64_t sequence) {
  return record{sequence, static_cast<std::int32_t>(sequence % classes),
                {static_cast<float>(sequence), 1.0f, -1.0f}};
}

std::vector<record> records(std::int64_t first, std::int64_t count) {
  std::vector<record> out;
  for (std::int64_t s = first; s < first + count; ++s) out.push_back(make_record(s));
  return out;
}

std::vector<std::int64_t> sequences_of(const dataset& chunk) { return chunk.sequences; }

TEST(RecordQueue, AFullQueueWaitsThenReportsFullAndTakesWhatFits) {
  record_queue q(4, features, classes);
  const auto six = records(0, 6);
  const auto start = std::chrono::steady_clock::now();
  const feed_result r = q.push(six, 20ms);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 20ms);
  EXPECT_EQ(r.status, feed_result::outcome::full);
  EXPECT_EQ(r.taken, 4u);
  EXPECT_EQ(q.size(), 4u);
  // The rest goes in once there is room.
  std::vector<record> out;
  EXPECT_EQ(q.take(2, out), 2u);
  const feed_result rest = q.push(std::span(six).subspan(r.taken), 0ms);
  EXPECT_EQ(rest.status, feed_result::outcome::done);
  EXPECT_EQ(rest.taken, 2u);
  q.take(10, out);
  ASSERT_EQ(out.size(), 6u);
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i].sequence, static_cast<std::int64_t>(i));
}

TEST(RecordQueue, ABlockedFeedWakesWhenRoomIsMade) {
  record_queue q(2, features, classes);
  ASSERT_EQ(q.push(records(0, 2), 0ms).taken, 2u);
  std::thread taker([&] {
    std::this_thread::sleep_for(20ms);
    std::vector<record> out;
    q.take(1, out);
  });
  const feed_result r = q.push(records(2, 1), 10s);
  taker.join();
  EXPECT_EQ(r.status, feed_result::outcome::done);
  EXPECT_EQ(q.size(), 2u);
}

TEST(RecordQueue, SkipsSequencesNotAboveTheLastAndThoseTrainedBeforeAResume) {
  stream_position resume{true, 9, {12, 13}};
  record_queue q(100, features, classes, resume);
  // A replay from 5: up to 9 and 12, 13 were trained.
  const feed_result r = q.push(records(5, 10), 0ms);  // 5..14
  EXPECT_EQ(r.taken, 10u);
  EXPECT_EQ(r.skipped, 7u);  // 5..9, 12, 13
  std::vector<record> out;
  q.take(10, out);
  std::vector<std::int64_t> got;
  for (const auto& x : out) got.push_back(x.sequence);
  EXPECT_EQ(got, (std::vector<std::int64_t>{10, 11, 14}));
  // A redelivered record is a duplicate.
  EXPECT_EQ(q.push(records(14, 1), 0ms).skipped, 1u);
}

TEST(RecordQueue, RefusesMalformedRecordsNamingThemAndQueuesNone) {
  record_queue q(100, features, classes);
  auto batch = records(0, 3);
  batch[2].features.push_back(0.0f);
  try {
    q.push(batch, 0ms);
    FAIL() << "a record of 4 features was queued";
  } catch (const data_error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence number 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("4 features"), std::string::npos) << e.what();
  }
  EXPECT_EQ(q.size(), 0u);
  batch = records(0, 1);
  batch[0].label = classes;
  EXPECT_THROW(q.push(batch, 0ms), data_error);
  batch = records(0, 1);
  batch[0].features[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(q.push(batch, 0ms), data_error);
  batch = records(-1, 1);
  EXPECT_THROW(q.push(batch, 0ms), data_error);
  EXPECT_EQ(q.size(), 0u);
}

TEST(RecordQueue, ShutAndClosedQueuesRefuseFeedsAndNotifyWaitsForEnough) {
  record_queue q(100, features, classes);
  int woken = 0;
  EXPECT_FALSE(q.notify_when(3, [&] { ++woken; }));
  q.push(records(0, 2), 0ms);
  EXPECT_EQ(woken, 0);
  q.push(records(2, 1), 0ms);
  EXPECT_EQ(woken, 1);
  q.push(records(3, 5), 0ms);
  EXPECT_EQ(woken, 1) << "one request, one call";
  EXPECT_TRUE(q.notify_when(3, [&] { ++woken; }));
  q.shut();
  EXPECT_EQ(q.push(records(8, 1), 0ms).status, feed_result::outcome::closed);
  EXPECT_FALSE(q.closed()) << "a stop is not the end of the stream";
  record_queue ended(100, features, classes);
  EXPECT_FALSE(ended.notify_when(5, [&] { ++woken; }));
  ended.close();
  EXPECT_EQ(woken, 2) << "the end of the stream wakes the loader for the last, partial batch";
}

TEST(IssuedRecords, StepsTakeTheNextRecordsInOrderAndCommitAdvancesTheOffset) {
  record_queue q(100, features, classes);
  q.push(records(100, 10), 0ms);
  issued_records book(q, {});
  const auto a = book.issue(0, 4);
  const auto b = book.issue(1, 4);
  EXPECT_EQ(sequences_of(*a.rows), (std::vector<std::int64_t>{100, 101, 102, 103}));
  EXPECT_EQ(sequences_of(*b.rows), (std::vector<std::int64_t>{104, 105, 106, 107}));
  EXPECT_EQ(a.rows->features[1 * features], 101.0f);
  EXPECT_EQ(a.rows->labels[1], 101 % classes);
  // Nothing below 100 was fed: every record fed up to 99 is trained.
  EXPECT_EQ(book.position_after(-1).stream.committed, 99);
  book.mark_snapshot(0);
  const auto snaps = book.commit(0, {});
  ASSERT_EQ(snaps.size(), 1u);
  EXPECT_EQ(snaps[0].position.stream.committed, 103);
  EXPECT_TRUE(snaps[0].position.stream.trained_above.empty());
  book.commit(1, {});
  EXPECT_EQ(book.committed(), 107);
}

TEST(IssuedRecords, ACutsRecordsGoOutFirstAndHoldTheOffsetBelowThem) {
  record_queue q(100, features, classes);
  q.push(records(0, 12), 0ms);
  issued_records book(q, {});
  book.issue(0, 4);  // 0..3
  book.issue(1, 4);  // 4..7
  // Step 0's rows 1 and 2 (sequences 1, 2) were cut.
  const std::vector<step_returned> cut{{0, {1, 2}}};
  book.mark_snapshot(0);
  auto snaps = book.commit(0, cut);
  ASSERT_EQ(snaps.size(), 1u);
  EXPECT_EQ(snaps[0].position.stream.committed, 0);
  EXPECT_EQ(snaps[0].position.stream.trained_above, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(book.sent_back(), 2u);
  EXPECT_EQ(book.committed_samples(), 2) << "the cut rows are not trained yet";
  const auto c = book.issue(2, 4);
  EXPECT_EQ(sequences_of(*c.rows), (std::vector<std::int64_t>{1, 2, 8, 9}));
  book.mark_snapshot(1);
  snaps = book.commit(1, {});
  EXPECT_EQ(snaps.at(0).position.stream.committed, 0);
  EXPECT_EQ(snaps.at(0).position.stream.trained_above, (std::vector<std::int64_t>{3, 4, 5, 6, 7}));
  book.commit(2, {});
  EXPECT_EQ(book.committed(), 9);
  EXPECT_EQ(book.committed_samples(), 2 + 4 + 4);
  EXPECT_TRUE(book.position_after(2).stream.trained_above.empty());
}

TEST(IssuedRecords, ARollbackSendsLaterStepsBackInOrderUnderTheSameSteps) {
  record_queue q(100, features, classes);
  q.push(records(0, 12), 0ms);
  issued_records book(q, {});
  book.issue(0, 4);
  book.issue(1, 4);
  book.issue(2, 4);
  book.commit(0, {});
  EXPECT_EQ(book.roll_back(0), 8u);
  EXPECT_EQ(book.position_after(0).stream.committed, 3);
  EXPECT_EQ(sequences_of(*book.issue(1, 4).rows), (std::vector<std::int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(sequences_of(*book.issue(2, 4).rows), (std::vector<std::int64_t>{8, 9, 10, 11}));
}

TEST(IssuedRecords, CommittingARecordTwiceIsRefused) {
  record_queue q(100, features, classes, stream_position{true, 5, {}});
  // A record at or below the resumed offset cannot reach a step through the
  // queue; a book resumed past what its queue hands out must refuse it.
  record_queue raw(100, features, classes);
  raw.push(records(4, 4), 0ms);
  issued_records book(raw, stream_position{true, 5, {}});
  book.issue(0, 4);
  EXPECT_THROW(book.commit(0, {}), ledger_error);
}

// What the loader is told to do next, as records come and the stream ends.
TEST(IssuedRecords, AStepWaitsForAWholeBatchUntilTheStreamEnds) {
  using next = data_source::next;
  record_queue q(100, features, classes);
  issued_records book(q, {});
  EXPECT_EQ(book.what_next(4), next::wait_records);
  int woken = 0;
  EXPECT_FALSE(book.wake_when_ready(4, [&] { ++woken; }));
  q.push(records(0, 3), 0ms);
  EXPECT_EQ(woken, 0) << "woken before a whole batch is queued";
  EXPECT_EQ(book.what_next(4), next::wait_records);
  q.push(records(3, 3), 0ms);
  EXPECT_EQ(woken, 1);
  EXPECT_EQ(book.what_next(4), next::step);
  book.issue(0, 4);
  book.commit(0, std::vector<step_returned>{{0, {3}}});  // sequence 3 was cut
  EXPECT_EQ(book.requeued(), 1);
  EXPECT_EQ(book.what_next(4), next::wait_records) << "2 queued and 1 sent back are not a batch";
  EXPECT_FALSE(book.wake_when_ready(4, [&] { ++woken; }));
  q.push(records(6, 1), 0ms);
  EXPECT_EQ(woken, 2) << "the record sent back counts toward the batch";
  EXPECT_EQ(book.what_next(4), next::step);
  EXPECT_EQ(sequences_of(*book.issue(1, 4).rows), (std::vector<std::int64_t>{3, 4, 5, 6}));
  q.close();
  EXPECT_EQ(book.what_next(4), next::wait_commits) << "a rollback could still send step 1's records back";
  book.commit(1, {});
  EXPECT_EQ(book.what_next(4), next::end);
  EXPECT_THROW(book.end_epoch(), std::logic_error);
}

TEST(IssuedRecords, TheEndOfTheStreamGivesAPartialLastStep) {
  record_queue q(100, features, classes);
  q.push(records(0, 6), 0ms);
  q.close();
  issued_records book(q, {});
  EXPECT_EQ(book.issue(0, 4).rows->rows, 4u);
  EXPECT_EQ(book.issue(1, 4).rows->rows, 2u);
  EXPECT_TRUE(book.drained());
}

// A run that checkpoints, cuts and crashes, and a replay from its committed
// offset: each record must end up trained exactly once across the
// checkpointed part of the first run and the second run. The count comes
// from the rows each step trained (what devices would report), not from the
// book.
TEST(IssuedRecords, CrashAndReplayFromTheCommittedOffsetTrainsEveryRecordOnce) {
  constexpr std::int64_t total = 200, batch = 8;
  for (int crash_after = 3; crash_after < 20; crash_after += 4) {
    std::map<std::int64_t, int> trained;  // sequence -> times, in the surviving history
    stream_position checkpoint;  // the last one written by run 1
    std::map<std::int64_t, int> run1_since_checkpoint;
    {
      record_queue q(1000, features, classes);
      q.push(records(0, total), 0ms);
      issued_records book(q, {});
      std::map<std::int64_t, std::shared_ptr<const dataset>> chunks;
      std::int64_t step = 0;
      for (; step < crash_after; ++step) {
        chunks[step] = book.issue(step, batch).rows;
        // Every third step has a cut: its first two rows go back.
        std::vector<step_returned> cut;
        if (step % 3 == 1) cut.push_back({step, {0, 1}});
        const auto& chunk = *chunks[step];
        for (std::size_t row = 0; row < chunk.rows; ++row)
          if (cut.empty() || row > 1) ++run1_since_checkpoint[chunk.sequences[row]];
        if (step % 2 == 0) book.mark_snapshot(step);
        for (auto& snap : book.commit(step, cut)) {
          checkpoint = snap.position.stream;
          for (auto& [s, n] : run1_since_checkpoint) trained[s] += n;
          run1_since_checkpoint.clear();
        }
      }
      // crash: what run 1 trained after its last checkpoint is lost
    }
    record_queue q(1000, features, classes, checkpoint);
    q.push(records(checkpoint.committed + 1, total - checkpoint.committed - 1), 0ms);
    q.close();
    issued_records book(q, checkpoint);
    for (std::int64_t step = 0; !book.drained(); ++step) {
      const auto chunk = book.issue(step, batch).rows;
      for (const auto s : chunk->sequences) ++trained[s];
      book.commit(step, {});
    }
    EXPECT_EQ(book.committed(), total - 1);
    for (std::int64_t s = 0; s < total; ++s)
      ASSERT_EQ(trained[s], 1) << "record " << s << ", crash after step " << crash_after;
  }
}

}  // namespace
}  // namespace dpactor
