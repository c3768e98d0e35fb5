// The step book and the loader's issued steps, driven without actors,
// threads or timing through sequences of step records, cuts and failures.
// After every commit the test checks exactly-once with its own evidence: the
// indices it made each member train (the shards minus what a cut returned),
// against what the epoch ledger counts as committed; at the end of an epoch
// every index was trained exactly once and the ledger verifies.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include <dpactor/error.hpp>
#include "train/issued_steps.hpp"
#include "train/step_book.hpp"
#include "train/straggler.hpp"

namespace dpactor {
namespace {

using clock_type = step_book::clock;

// A loader, members and a reducer, as plain calls. Time is a counter.
class harness {
 public:
  harness(std::size_t samples, std::size_t batch, std::size_t members, bool verify = false)
      : issued_(samples, 11, true), batch_(batch), members_(members), book_(setup(verify), sink(), now()) {
    issued_.ledger().start_epoch(0);
    book_.start_generation(0, members, now());
  }

  // The loader hands out step `step`: an even split over the members.
  void issue(std::int64_t step) {
    const auto indices = issued_.issue(step, batch_).indices;
    const std::vector<double> even(members_, 1.0);
    const auto sizes = split_by_weight(indices.size(), even, 0);
    std::vector<std::vector<std::uint32_t>> shards;
    std::size_t begin = 0;
    for (const auto n : sizes) {
      shards.emplace_back(indices.begin() + static_cast<std::ptrdiff_t>(begin),
                          indices.begin() + static_cast<std::ptrdiff_t>(begin + n));
      begin += n;
    }
    shards_[step] = std::move(shards);
  }

  // The members train `step`; member `cut` (if any) stops after `kept`
  // indices of its shard. Rank 0 reports the step; the cut member's report
  // of its untouched indices comes first unless `cut_report_later`.
  void train(std::int64_t step, int cut = -1, std::size_t kept = 0, bool cut_report_later = false) {
    auto& shards = shards_.at(step);
    step_record rec;
    rec.step = step;
    rec.epoch = issued_.ledger().epoch();
    for (std::size_t r = 0; r < members_; ++r) {
      auto& shard = shards[r];
      std::vector<std::uint32_t> back;
      if (static_cast<int>(r) == cut) {
        back.assign(shard.begin() + static_cast<std::ptrdiff_t>(std::min(kept, shard.size())), shard.end());
        shard.resize(std::min(kept, shard.size()));
      }
      rec.samples += static_cast<std::int64_t>(shard.size());
      rec.compute_s.push_back(0.001f);
      rec.member_samples.push_back(static_cast<float>(shard.size()));
      rec.member_returned.push_back(static_cast<float>(back.size()));
      if (!back.empty()) pending_cuts_.push_back({step, static_cast<std::int32_t>(r), std::move(back)});
    }
    if (!cut_report_later) send_cut_reports();
    book_.record(0, std::move(rec));
  }

  // Quiet steps from `step` on until the epoch's samples are all handed out,
  // checking exactly-once after each commit.
  void train_quietly_from(std::int64_t step) {
    for (; issued_.ledger().waiting() > 0; ++step) {
      issue(step);
      train(step);
      commit();
      expect_exactly_once_so_far();
    }
  }

  void send_cut_reports() {
    for (auto& c : pending_cuts_) book_.cut(c.step, c.rank, c.indices);
    pending_cuts_.clear();
  }

  // The reducer commits what is complete and the loader applies it.
  step_commit commit() {
    step_commit c = book_.commit_ready(members_, now());
    apply(c);
    return c;
  }

  // A fault: the state source holds steps up to `through`; later steps in
  // flight are lost and their indices go back to the front.
  void recover(std::int64_t through) {
    step_commit c = book_.commit_through(through, now());
    apply(c);
    issued_.roll_back(through);
    book_.rollback_applied(issued_.committed_samples());
    for (auto it = shards_.upper_bound(through); it != shards_.end();) it = shards_.erase(it);
    book_.start_generation(1, members_, now());
  }

  // The independent evidence: every index the members trained in a
  // committed step, counted.
  void expect_exactly_once_so_far() const {
    std::size_t trained = 0;
    for (const auto& [index, times] : trained_) {
      EXPECT_EQ(times, 1) << "index " << index << " trained " << times << " times";
      trained += static_cast<std::size_t>(times);
    }
    EXPECT_EQ(issued_.ledger().committed(), trained) << "the ledger counts other indices than the members trained";
  }

  void expect_epoch_complete() const {
    expect_exactly_once_so_far();
    EXPECT_EQ(trained_.size(), issued_.ledger().samples()) << "an index was never trained";
    EXPECT_TRUE(issued_.empty());
    EXPECT_NO_THROW(issued_.ledger().verify_complete());
  }

  issued_steps& issued() { return issued_; }
  step_book& book() { return book_; }
  std::vector<event>& events() { return events_; }

 private:
  struct cut_report {
    std::int64_t step;
    std::int32_t rank;
    std::vector<std::uint32_t> indices;
  };

  static step_book_setup setup(bool verify) {
    step_book_setup s;
    s.schedule.base_lr = 0.1;
    s.log_every = 1;
    s.verify_replicas = verify;
    return s;
  }
  step_book::event_sink sink() {
    return [this](const event& e) { events_.push_back(e); };
  }
  clock_type::time_point now() { return clock_type::time_point{} + std::chrono::milliseconds(++ticks_); }

  void apply(const step_commit& c) {
    for (auto it = shards_.begin(); it != shards_.end() && it->first <= c.through;) {
      for (const auto& shard : it->second)
        for (const auto i : shard) ++trained_[i];
      it = shards_.erase(it);
    }
    issued_.commit(c.through, c.returned);
  }

  std::vector<event> events_;
  std::int64_t ticks_ = 0;
  issued_steps issued_;
  std::size_t batch_;
  std::size_t members_;
  step_book book_;
  std::map<std::int64_t, std::vector<std::vector<std::uint32_t>>> shards_;  // steps in flight
  std::vector<cut_report> pending_cuts_;
  std::map<std::uint32_t, int> trained_;
};

// A record of a quiet step of `samples` on two members, as rank 0 sends it.
step_record record_of(std::int64_t step, std::int64_t samples, std::uint64_t checksum = 0) {
  const float half = static_cast<float>(samples) / 2.0f;
  return step_record{step, 0, 0.0, 0, samples, checksum, 0, {0.001f, 0.001f}, {half, half}, {0.0f, 0.0f}};
}

TEST(StepBook, QuietStepsCommitInOrderAndTrainEverySampleOnce) {
  harness h(100, 16, 3);  // 7 steps, the last of 4 samples
  for (std::int64_t s = 0; s < 7; ++s) {
    h.issue(s);
    h.train(s);
    EXPECT_EQ(h.commit().through, s);
    h.expect_exactly_once_so_far();
  }
  h.expect_epoch_complete();
  EXPECT_EQ(h.book().summary().samples, 100);
}

// What the loader is told to do next over an epoch: its steps, then a wait
// for the last ones to commit, then the epoch's end, with every index
// trained once.
TEST(IssuedSteps, AnEpochEndsOnceEveryStepIsCommitted) {
  using next = data_source::next;
  issued_steps steps(10, 3, true);
  steps.start_epoch(0);
  EXPECT_EQ(steps.what_next(4), next::step);
  std::set<std::uint32_t> seen;
  for (std::int64_t s = 0; s < 3; ++s) {
    const auto samples = steps.issue(s, 4);
    EXPECT_EQ(samples.rows, nullptr) << "a training set's steps index the training set";
    seen.insert(samples.indices.begin(), samples.indices.end());
  }
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_EQ(steps.what_next(4), next::wait_commits);
  steps.commit(1, {});
  EXPECT_EQ(steps.what_next(4), next::wait_commits) << "step 2 is in flight";
  steps.commit(2, {});
  ASSERT_EQ(steps.what_next(4), next::epoch_end);
  const auto totals = steps.end_epoch();
  EXPECT_EQ(totals.epoch, 0);
  EXPECT_EQ(totals.committed, 10);
  steps.start_epoch(1);
  EXPECT_EQ(steps.what_next(4), next::step);
  EXPECT_EQ(steps.epoch(), 1);
  EXPECT_THROW(steps.wake_when_ready(4, [] {}), std::logic_error);
}

TEST(StepBook, AStepWaitsForTheOneBeforeIt) {
  harness h(64, 16, 2);
  for (std::int64_t s = 0; s < 4; ++s) h.issue(s);
  h.train(1);
  EXPECT_EQ(h.commit().through, -1) << "step 1 committed before step 0";
  h.train(0);
  EXPECT_EQ(h.commit().through, 1) << "both commit, in order";
  h.expect_exactly_once_so_far();
  h.train(3);
  h.train(2);
  EXPECT_EQ(h.commit().through, 3);
  h.expect_epoch_complete();
}

TEST(StepBook, ACutStepWaitsForTheUntouchedIndicesAndTheyAreTrainedLater) {
  harness h(64, 16, 2);
  h.issue(0);
  h.train(0, /*cut=*/1, /*kept=*/3, /*cut_report_later=*/true);
  EXPECT_EQ(h.commit().through, -1) << "committed before the cut member's untouched indices were in";
  h.send_cut_reports();
  const step_commit c = h.commit();
  ASSERT_EQ(c.through, 0);
  ASSERT_EQ(c.returned.size(), 1u);
  EXPECT_EQ(c.returned[0].indices.size(), 5u) << "8 in the shard, 3 trained";
  h.expect_exactly_once_so_far();
  EXPECT_EQ(h.issued().ledger().waiting(), 64u - 16u + 5u) << "the returned indices are handed out again";
  h.train_quietly_from(1);
  h.expect_epoch_complete();
  EXPECT_EQ(h.book().summary().cuts, 1);
}

TEST(StepBook, AFailureCommitsWhatTheStateSourceHoldsAndRetrainsTheRest) {
  harness h(96, 16, 3);
  for (std::int64_t s = 0; s < 4; ++s) h.issue(s);
  h.train(0);
  h.train(1, /*cut=*/2, /*kept=*/1);
  h.commit();
  h.train(2);  // reported but not committed when the fault comes
  // The state source applied step 2, not 3: step 3 is lost and handed out again.
  h.recover(2);
  EXPECT_EQ(h.book().committed(), 2);
  h.expect_exactly_once_so_far();
  h.train_quietly_from(3);
  h.expect_epoch_complete();
}

// The state source applied a step whose record the fault lost: the summary
// counts its samples by the loader's account, as it counts every other's by
// their records, and a cut member's untouched samples by neither.
TEST(StepBook, AStepCommittedWithoutItsRecordCountsItsSamples) {
  harness h(96, 16, 3);
  for (std::int64_t s = 0; s < 4; ++s) h.issue(s);
  h.train(0);
  h.train(1, /*cut=*/2, /*kept=*/1);
  h.commit();
  const auto committed = [&] { return static_cast<std::int64_t>(h.issued().ledger().committed()); };
  EXPECT_EQ(h.book().summary().samples, committed());
  h.recover(2);  // step 2 applied, its record lost; step 3 lost
  h.expect_exactly_once_so_far();
  EXPECT_EQ(h.book().summary().samples, committed()) << "step 2's 16 samples count";
  h.train_quietly_from(3);
  h.expect_epoch_complete();
  EXPECT_EQ(h.book().summary().samples, 96);
}

TEST(StepBook, ARecoveryBehindTheReportsDropsTheStepsAfterTheStateSource) {
  harness h(64, 16, 2);
  for (std::int64_t s = 0; s < 3; ++s) h.issue(s);
  h.train(0);
  h.commit();
  h.train(1);
  h.train(2);
  // Reports of steps 1 and 2 are in, but the survivors only applied step 0.
  h.recover(0);
  EXPECT_EQ(h.book().committed(), 0);
  h.train_quietly_from(1);
  h.expect_epoch_complete();
}

TEST(StepBook, AReportOfACommittedStepIsNotCommittedTwice) {
  harness h(64, 16, 2);
  h.issue(0);
  h.issue(1);
  h.train(0);
  h.commit();
  // A duplicate record of step 0 (a late report): nothing changes.
  h.book().record(0, record_of(0, 16));
  h.train(1);
  EXPECT_EQ(h.commit().through, 1);
  EXPECT_EQ(h.book().summary().samples, 32);
  h.expect_exactly_once_so_far();
}

TEST(StepBook, DifferentChecksumsStopTheRun) {
  harness h(32, 16, 2, /*verify=*/true);
  h.issue(0);
  h.book().record(0, record_of(0, 16, /*checksum=*/1));
  h.book().record(1, record_of(0, 16, /*checksum=*/2));
  EXPECT_THROW(h.commit(), training_error);
}

TEST(StepBook, StepEventsCommittedTogetherAllReportARate) {
  harness h(64, 16, 2);  // a step event every step
  h.issue(0);
  h.issue(1);
  h.train(0);
  h.train(1);
  h.commit();  // both in one batch, at one time
  std::vector<double> rates;
  for (const auto& e : h.events())
    if (const auto* s = std::get_if<step_event>(&e)) rates.push_back(s->samples_per_s);
  ASSERT_EQ(rates.size(), 2u);
  EXPECT_GT(rates[0], 0.0);
  EXPECT_EQ(rates[1], rates[0]) << "the second has no time of its own";
}

TEST(StepBook, EvaluationCompletesWhenEveryMemberReported) {
  harness h(32, 16, 2);
  const auto t = clock_type::time_point{} + std::chrono::seconds(1);
  h.book().epoch_closed({0, 32, 0, true}, t);
  EXPECT_FALSE(h.book().evaluated(1, true, 0, 2.0, 3, 10, 2, t));
  EXPECT_TRUE(h.book().evaluated(1, true, 0, 4.0, 5, 10, 2, t));
  EXPECT_DOUBLE_EQ(h.book().summary().test_accuracy, 0.4);
  EXPECT_DOUBLE_EQ(h.book().summary().test_loss, 0.3);
  const auto epochs = std::count_if(h.events().begin(), h.events().end(),
                                    [](const event& e) { return std::holds_alternative<epoch_event>(e); });
  EXPECT_EQ(epochs, 1);
}

TEST(StepBook, TheFirstCommitAfterAFaultReportsTheRecovery) {
  harness h(64, 16, 2);
  h.issue(0);
  h.train(0);
  h.commit();
  h.issue(1);
  h.book().fault_detected(clock_type::time_point{});
  h.recover(0);
  h.issue(1);
  h.train(1);
  h.commit();
  std::vector<recovery_event> recoveries;
  for (const auto& e : h.events())
    if (const auto* r = std::get_if<recovery_event>(&e)) recoveries.push_back(*r);
  ASSERT_EQ(recoveries.size(), 1u);
  EXPECT_EQ(recoveries[0].step, 2) << "step 2 (1-based) is the first one after the fault";
}

TEST(StepBook, AFaultWhoseNextStepsCommitOnlyInTheRecoveryFromTheNextFaultIsStillReported) {
  // Step 2's record would come with its batch's last step, which the second
  // fault takes: step 2 commits in that fault's rollback, and the first
  // fault's recovery is reported there; the second's at step 3.
  harness h(64, 16, 2);
  h.issue(0);
  h.train(0);
  h.commit();
  h.issue(1);
  h.book().fault_detected(clock_type::time_point{});
  h.recover(0);
  h.issue(1);  // trained by the next generation, its record lost
  h.book().fault_detected(clock_type::time_point{});
  h.recover(1);
  h.issue(2);
  h.train(2);
  h.commit();
  std::vector<recovery_event> recoveries;
  for (const auto& e : h.events())
    if (const auto* r = std::get_if<recovery_event>(&e)) recoveries.push_back(*r);
  ASSERT_EQ(recoveries.size(), 2u) << "one recovery event a fault";
  EXPECT_EQ(recoveries[0].step, 2);
  EXPECT_EQ(recoveries[1].step, 3);
}

}  // namespace
}  // namespace dpactor
