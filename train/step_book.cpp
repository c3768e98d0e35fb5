#include "train/step_book.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <dpactor/error.hpp>

namespace dpactor {
namespace {

// Skipped steps in a row after which "skip" gives up: the state itself is
// beyond repair, and skipping forever would only burn the data.
constexpr std::int64_t max_consecutive_skips = 100;

double seconds(step_book::clock::duration d) { return std::chrono::duration<double>(d).count(); }
double ratio(double num, double den) { return den > 0.0 ? num / den : 0.0; }
double mean_loss(const batch_stats& s) { return ratio(s.loss_sum, static_cast<double>(s.samples)); }
double accuracy(const batch_stats& s) { return ratio(static_cast<double>(s.correct), static_cast<double>(s.samples)); }

// "step 12: the loss is nan and 310 gradient values are not finite"
std::string nonfinite_text(std::int64_t step, double loss_sum, std::int64_t nonfinite) {
  std::string text = "step " + std::to_string(step + 1) + ": ";
  if (!std::isfinite(loss_sum)) text += "the loss is " + std::string(std::isnan(loss_sum) ? "nan" : "inf");
  if (nonfinite > 0)
    text += std::string(std::isfinite(loss_sum) ? "" : " and ") + std::to_string(nonfinite) + " gradient value" +
            (nonfinite == 1 ? " is" : "s are") + " not finite";
  return text;
}

}  // namespace

step_book::step_book(step_book_setup setup, event_sink emit, clock::time_point now)
    : setup_(std::move(setup)),
      emit_(std::move(emit)),
      committed_(setup_.start_step - 1),
      throughput_(setup_.smoothing, 0),
      started_(now),
      last_commit_(now),
      last_progress_(now) {
  interval_.since = epoch_stats_.since = now;
}

void step_book::fault_detected(clock::time_point now) {
  if (!recoveries_.empty() && !recoveries_.back().from) recoveries_.back() = pending_recovery{now, std::nullopt, 0};
  else recoveries_.push_back(pending_recovery{now, std::nullopt, 0});
}

void step_book::requeued_by_fault(std::int64_t indices) {
  if (!recoveries_.empty()) recoveries_.back().requeued = indices;
}

void step_book::start_generation(std::int64_t generation, std::size_t members, clock::time_point now) {
  for (auto& r : recoveries_)
    if (!r.from) r.from = committed_ + 1;
  generation_ = generation;
  throughput_.reset(members);
  steps_.clear();
  evals_.clear();
  last_progress_ = now;
}

void step_book::record(std::int32_t rank, step_record&& rec) {
  if (rec.step <= committed_) return;  // committed already: never twice
  auto& t = steps_[rec.step];
  if (rank == 0) {
    t.stats_known = true;
    t.epoch = rec.epoch;
    t.stats = {rec.loss_sum, rec.correct, rec.samples};
    t.compute_s = std::move(rec.compute_s);
    t.member_samples = std::move(rec.member_samples);
    t.member_returned = std::move(rec.member_returned);
    t.lr = rec.lr;
    t.nonfinite = rec.nonfinite;
    t.applied = rec.applied;
  }
  if (setup_.verify_replicas) {
    if (!t.checksum) {
      t.checksum = rec.checksum;
      t.counter = rec.counter;
      t.first_rank = rank;
    } else if (!t.differs && (*t.checksum != rec.checksum || t.counter != rec.counter)) {
      t.differs = rank;
    }
  }
  ++t.reported;
}

void step_book::cut(std::int64_t step, std::int32_t rank, std::span<const std::uint32_t> returned) {
  if (step <= committed_) return;
  ++interval_cuts_;
  ++summary_.cuts;
  auto& t = steps_[step];
  t.cut.insert(rank);
  t.returned.insert(t.returned.end(), returned.begin(), returned.end());
}

// A step is complete when its report is in (rank 0's; every member's checksum
// with verify_replicas) and so are the untouched indices of every member
// that was cut. See Note [One step report].
bool step_book::complete(const step_tally& t, std::size_t members) const {
  if (!t.stats_known || (setup_.verify_replicas && t.reported != static_cast<std::int32_t>(members))) return false;
  for (std::size_t r = 0; r < t.member_returned.size(); ++r)
    if (t.member_returned[r] > 0.0f && !t.cut.count(static_cast<std::int32_t>(r))) return false;
  return true;
}

step_commit step_book::commit_ready(std::size_t members, clock::time_point now) {
  step_commit commit{committed_, {}, {}};
  const std::int64_t before = committed_;
  const auto previous_commit = last_commit_;
  while (!steps_.empty() && steps_.begin()->first == committed_ + 1 && complete(steps_.begin()->second, members)) {
    auto node = steps_.extract(steps_.begin());
    step_tally& t = node.mapped();
    for (std::size_t r = 0; r < members && r < t.compute_s.size(); ++r)
      throughput_.record(r, static_cast<std::int64_t>(t.member_samples[r]), t.compute_s[r]);
    // See Note [Non-finite steps]: nobody applied this step.
    if (!t.applied || !std::isfinite(t.stats.loss_sum)) {
      const std::string what = nonfinite_text(node.key(), t.stats.loss_sum, t.nonfinite);
      if (!setup_.skip_nonfinite || t.applied) throw nonfinite_step(node.key(), what);
      if (++consecutive_skips_ >= max_consecutive_skips)
        throw nonfinite_step(node.key(), what + "; the last " + std::to_string(max_consecutive_skips) +
                                             " steps were all skipped (train.on_nonfinite = \"skip\")");
      commit.skipped.push_back(what + "; skipped (train.on_nonfinite = \"skip\")");
      ++summary_.skipped_steps;
      ++interval_skipped_;
      skipped_samples_ += t.stats.samples;
      t.stats = {};  // nothing was trained: the averages and counts leave it out
    }
    if (setup_.verify_replicas && t.differs)
      throw replicas_diverged(node.key(), t.first_rank, *t.differs,
                              "replicas diverged: ranks " + std::to_string(t.first_rank) + " and " +
                                  std::to_string(*t.differs) + " carried different state into step " +
                                  std::to_string(node.key() + 1) + " (train.verify_replicas)");
    if (t.applied && std::isfinite(t.stats.loss_sum)) consecutive_skips_ = 0;
    account(node.key(), std::move(node.mapped()), commit, now);
  }
  // Steps arrive in batches (See Note [One step report]): the time per step
  // is the time since the last commit over the steps committed now.
  if (committed_ > before && before >= 0)
    step_intervals_.push(seconds(last_commit_ - previous_commit) / static_cast<double>(committed_ - before));
  return commit;
}

step_commit step_book::commit_through(std::int64_t through, clock::time_point now) {
  step_commit commit{committed_, {}, {}};
  for (std::int64_t s = committed_ + 1; s <= through; ++s) {
    auto it = steps_.find(s);
    step_tally t = it == steps_.end() ? step_tally{} : std::move(it->second);
    account(s, std::move(t), commit, now);
  }
  commit.through = std::max(commit.through, through);
  steps_.clear();
  evals_.clear();
  booked_at_rollback_.push_back(summary_.samples + skipped_samples_);
  return commit;
}

void step_book::rollback_applied(std::int64_t committed_samples) {
  if (booked_at_rollback_.empty()) return;
  // The records and the loader count the same trained samples of every step
  // both saw (cut ones left out), so the difference is the lost records'.
  const std::int64_t unrecorded = committed_samples - booked_at_rollback_.front();
  booked_at_rollback_.pop_front();
  summary_.samples += std::max<std::int64_t>(unrecorded, 0);
  rate_samples_ += std::max<std::int64_t>(unrecorded, 0);
}

void step_book::account(std::int64_t step, step_tally&& t, step_commit& commit, clock::time_point now) {
  interval_.stats += t.stats;
  epoch_stats_.stats += t.stats;
  summary_.samples += t.stats.samples;
  rate_samples_ += t.stats.samples;
  ++epoch_step_;
  committed_ = step;
  last_commit_ = last_progress_ = now;
  commit.through = step;
  if (t.stats_known) epoch_ = t.epoch;
  lr_ = t.lr;
  if (!t.returned.empty()) commit.returned.push_back(step_returned{step, std::move(t.returned)});
  if ((step + 1) % setup_.log_every == 0) emit_step(step, now);
  // The first step trained after a fault (See fault_detected).
  while (!recoveries_.empty() && recoveries_.front().from && step >= *recoveries_.front().from) {
    const pending_recovery& r = recoveries_.front();
    const double ms = seconds(now - r.detected) * 1000.0;
    summary_.max_recovery_ms = std::max(summary_.max_recovery_ms, ms);
    emit_(recovery_event{generation_, step + 1, ms, r.requeued});
    recoveries_.pop_front();
  }
}

void step_book::log_last_step(clock::time_point now) {
  if (committed_ > logged_ && committed_ >= setup_.start_step) emit_step(committed_, now);
}

void step_book::emit_step(std::int64_t step, clock::time_point now) {
  logged_ = step;
  step_event e;
  e.step = step + 1;
  e.epoch = epoch_;
  e.epoch_step = epoch_step_;
  e.epoch_steps = setup_.epoch_steps;
  e.total_steps = setup_.total_steps;
  e.loss = mean_loss(interval_.stats);
  e.accuracy = accuracy(interval_.stats);
  // What the devices applied (See Note [Schedule position]); a step committed
  // without a report (after a rollback) shows the rate of its index.
  e.lr = lr_.value_or(setup_.schedule.at(step));
  // Steps arrive in batches: a second event of the same batch has no time of
  // its own, so it repeats the last rate and its samples count in the next.
  const double dt = seconds(now - interval_.since);
  e.samples_per_s = dt > 0.0 ? static_cast<double>(rate_samples_) / dt : last_rate_;
  e.generation = generation_;
  e.cuts = interval_cuts_;
  e.skipped = interval_skipped_;
  e.shares = throughput_.shares();
  for (std::size_t r = 0; r < e.shares.size(); ++r) e.throughput.push_back(throughput_.throughput(r));
  if (setup_.bytes) e.bytes_sent = static_cast<std::int64_t>(setup_.bytes().sent);
  e.samples = summary_.samples;
  emit_(e);
  interval_cuts_ = 0;
  interval_skipped_ = 0;
  const auto since = interval_.since;
  interval_ = {{}, dt > 0.0 ? now : since};
  if (dt <= 0.0) return;
  last_rate_ = e.samples_per_s;
  rate_samples_ = 0;
}

bool step_book::evaluated(std::int64_t step, bool epoch_end, std::int64_t epoch, double loss_sum, std::int64_t correct,
                          std::int64_t samples, std::size_t members, clock::time_point now) {
  const auto key = std::pair{step, epoch_end};
  auto& t = evals_[key];
  t.epoch = epoch;
  t.stats += batch_stats{loss_sum, correct, samples};
  last_progress_ = now;
  if (++t.reported != static_cast<std::int32_t>(members)) return false;
  const eval_tally done = t;
  evals_.erase(key);
  summary_.test_loss = mean_loss(done.stats);
  summary_.test_accuracy = accuracy(done.stats);
  if (epoch_end) emit_epoch(done.epoch, step, summary_.test_loss, summary_.test_accuracy, now);
  return true;
}

void step_book::epoch_closed(const epoch_close& e, clock::time_point now) {
  epoch_closes_[e.epoch] = e;
  if (e.evaluated) return;
  const double none = std::numeric_limits<double>::quiet_NaN();
  emit_epoch(e.epoch, committed_, none, none, now);
}

// The epoch's record; test results are NaN (null in JSON) when the epoch was
// not evaluated (train.eval_every).
void step_book::emit_epoch(std::int64_t epoch, std::int64_t step, double test_loss, double test_accuracy,
                           clock::time_point now) {
  log_last_step(now);  // the epoch's last step, before its epoch
  epoch_event e;
  e.epoch = epoch;
  e.step = step + 1;
  e.train_loss = mean_loss(epoch_stats_.stats);
  e.train_accuracy = accuracy(epoch_stats_.stats);
  e.test_loss = test_loss;
  e.test_accuracy = test_accuracy;
  e.seconds = seconds(last_commit_ - epoch_stats_.since);
  // The ledger's count is exact even when a lost member never reported.
  e.samples = epoch_stats_.stats.samples;
  if (auto it = epoch_closes_.find(epoch); it != epoch_closes_.end()) {
    e.samples = it->second.committed;
    e.requeued = it->second.requeued;
  }
  e.samples_per_s = ratio(static_cast<double>(e.samples), e.seconds);
  summary_.epochs = epoch + 1;
  emit_(e);
  epoch_ = epoch + 1;  // the epoch of a step committed without its record from now on
  epoch_stats_ = {{}, now};
  epoch_step_ = 0;
}

}  // namespace dpactor
