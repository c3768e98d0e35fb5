#include "actors/reducer.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <spdlog/spdlog.h>

#include "tensors/error.hpp"

namespace dpactor {
namespace {

using clock_type = reducer_state::clock;

// How often the reducer looks for hung members.
constexpr auto tick_interval = std::chrono::milliseconds(20);
// Shares are re-sent to the loader when one moves by more than this.
constexpr double share_resend_threshold = 0.01;

double seconds(clock_type::duration d) { return std::chrono::duration<double>(d).count(); }
double ratio(double num, double den) { return den > 0.0 ? num / den : 0.0; }

std::optional<std::size_t> rank_of(const reducer_state& st, const caf::actor_addr& who) {
  for (std::size_t r = 0; r < st.members.size(); ++r)
    if (!st.members[r].gone && st.members[r].handle.actor.address() == who) return r;
  return std::nullopt;
}

bool accepting_reports(const reducer_state& st, std::int64_t generation) {
  return generation == st.plan.generation && !st.failed &&
         (st.current == reducer_state::phase::running || st.current == reducer_state::phase::pausing);
}

}  // namespace

void maybe_finish(reducer_ptr self) {
  auto& st = self->state;
  if (st.failed || st.current != reducer_state::phase::running || !st.work || st.committed < st.work->last_step) return;
  if (!st.final_eval_step || *st.final_eval_step != st.work->last_step) return;
  if (st.work->snapshot && st.last_checkpoint != st.work->last_step) return;
  const auto now = clock_type::now();
  st.summary.wall_s = seconds(now - st.setup.started);
  st.summary.train_s = seconds(st.last_commit - st.train_start);
  st.summary.samples_per_s = ratio(static_cast<double>(st.summary.samples), st.summary.train_s);
  st.summary.steps = st.committed + 1;
  st.summary.stopped = st.stop_requested;
  st.setup.control->finish(st.summary);
}

void try_write_checkpoint(reducer_ptr self, std::int64_t step) {
  auto& st = self->state;
  auto it = st.checkpoints.find(step);
  if (it == st.checkpoints.end() || it->second.sent || !it->second.state || !it->second.position || !st.setup.writer) return;
  write_checkpoint_msg msg;
  msg.step = step;
  msg.epoch = it->second.position->epoch;
  msg.state = std::move(*it->second.state);
  msg.position = *it->second.position;
  it->second.sent = true;
  self->send(st.setup.writer, std::move(msg));
}

namespace {

void emit_step_event(reducer_ptr self, std::int64_t step, std::int64_t epoch) {
  auto& st = self->state;
  const auto now = clock_type::now();
  step_event e;
  e.step = step + 1;
  e.epoch = epoch;
  e.epoch_step = st.epoch_step;
  e.epoch_steps = st.setup.epoch_steps;
  e.total_steps = st.setup.total_steps;
  e.loss = ratio(st.interval.loss_sum, static_cast<double>(st.interval.samples));
  e.accuracy = ratio(static_cast<double>(st.interval.correct), static_cast<double>(st.interval.samples));
  e.lr = st.setup.schedule.at(step);
  e.samples_per_s = ratio(static_cast<double>(st.interval.samples), seconds(now - st.interval.since));
  e.generation = st.plan.generation;
  e.cuts = st.interval_cuts;
  e.shares = st.throughput.shares();
  for (std::size_t r = 0; r < st.members.size(); ++r) e.throughput.push_back(st.throughput.throughput(r));
  st.setup.control->emit(e);
  st.interval = {0.0, 0, 0, now};
  st.interval_cuts = 0;
}

void update_shares(reducer_ptr self) {
  auto& st = self->state;
  const auto policy = st.setup.straggler.policy;
  if (policy != straggler_policy::balance && policy != straggler_policy::balance_cut) return;
  std::vector<double> shares = st.throughput.shares();
  bool changed = st.sent_shares.size() != shares.size();
  for (std::size_t r = 0; !changed && r < shares.size(); ++r)
    changed = std::abs(shares[r] - st.sent_shares[r]) > share_resend_threshold;
  if (!changed) return;
  st.sent_shares = shares;
  self->send(st.setup.loader, shares_msg{st.plan.generation, std::move(shares)});
}

}  // namespace

void account_step(reducer_ptr self, std::int64_t step, reducer_state::step_tally&& tally, committed_msg& commit) {
  auto& st = self->state;
  for (auto* s : {&st.interval, &st.epoch}) {
    s->loss_sum += tally.loss_sum;
    s->correct += tally.correct;
    s->samples += tally.samples;
  }
  st.summary.samples += tally.samples;
  ++st.epoch_step;
  st.committed = step;
  st.last_commit = st.last_progress = clock_type::now();
  commit.through = step;
  if (!tally.returned.empty()) commit.returned.push_back(step_returned{step, std::move(tally.returned)});
  if ((step + 1) % st.setup.log_every == 0) emit_step_event(self, step, tally.epoch);
}

namespace {

// A step is complete when its report is in (rank 0's; every member's checksum
// with train.verify_replicas) and so are the untouched indices of every member
// that was cut. See Note [One step report].
bool step_complete(const reducer_state& st, const reducer_state::step_tally& t) {
  if (!t.stats_known || (st.setup.verify_replicas && t.reported != static_cast<std::int32_t>(st.members.size())))
    return false;
  for (std::size_t r = 0; r < t.member_returned.size(); ++r)
    if (t.member_returned[r] > 0.0f && !t.cut.count(static_cast<std::int32_t>(r))) return false;
  return true;
}

void commit_ready_steps(reducer_ptr self) {
  auto& st = self->state;
  committed_msg commit{st.plan.generation, st.committed, {}};
  const std::int64_t before = st.committed;
  const auto previous_commit = st.last_commit;
  while (!st.failed && !st.steps.empty() && st.steps.begin()->first == st.committed + 1 &&
         step_complete(st, st.steps.begin()->second)) {
    auto node = st.steps.extract(st.steps.begin());
    // The collective needed every member: all were alive through this step.
    const auto now = clock_type::now();
    const auto& t = node.mapped();
    for (std::size_t r = 0; r < st.members.size(); ++r) {
      auto& m = st.members[r];
      m.last_done = node.key();
      m.last_heard = m.step_started = now;
      if (r < t.compute_s.size())
        st.throughput.record(r, static_cast<std::int64_t>(t.member_samples[r]), t.compute_s[r], t.member_returned[r] == 0.0f);
    }
    if (st.setup.verify_replicas && node.mapped().checksums_differ) {
      fail_run(self, std::make_exception_ptr(training_error(
                         "replicas diverged after step " + std::to_string(node.key() + 1) +
                         ": parameter checksums differ between members (train.verify_replicas)")));
      return;
    }
    account_step(self, node.key(), std::move(node.mapped()), commit);
    if (st.fault_time) {
      const double ms = seconds(st.last_commit - *st.fault_time) * 1000.0;
      st.summary.max_recovery_ms = std::max(st.summary.max_recovery_ms, ms);
      spdlog::info("recovered: step {} committed {:.1f} ms after the fault", st.committed + 1, ms);
      st.setup.control->emit(recovery_event{st.plan.generation, st.committed + 1, ms, st.requeued_by_fault});
      st.fault_time.reset();
    }
  }
  if (st.committed > before) {
    // Steps arrive in batches (See Note [One step report]): the time per step
    // is the time since the last commit over the steps committed now.
    if (before >= 0)
      st.step_intervals.push(seconds(st.last_commit - previous_commit) / static_cast<double>(st.committed - before));
    self->send(st.setup.loader, std::move(commit));
  }
  update_shares(self);
  check_pause_complete(self);
  maybe_finish(self);
}

// The epoch's record; test results are NaN (null in JSON) when the epoch was
// not evaluated (train.eval_every).
void emit_epoch_event(reducer_ptr self, std::int64_t epoch, std::int64_t step, double test_loss, double test_accuracy) {
  auto& st = self->state;
  const auto now = clock_type::now();
  epoch_event e;
  e.epoch = epoch;
  e.step = step + 1;
  e.train_loss = ratio(st.epoch.loss_sum, static_cast<double>(st.epoch.samples));
  e.train_accuracy = ratio(static_cast<double>(st.epoch.correct), static_cast<double>(st.epoch.samples));
  e.test_loss = test_loss;
  e.test_accuracy = test_accuracy;
  e.seconds = seconds(st.last_commit - st.epoch.since);
  // The ledger's count is exact even when a lost member never reported.
  e.samples = st.epoch.samples;
  if (auto it = st.epoch_ledgers.find(epoch); it != st.epoch_ledgers.end()) {
    e.samples = it->second.committed;
    e.requeued = it->second.requeued;
  }
  e.samples_per_s = ratio(static_cast<double>(e.samples), e.seconds);
  st.summary.epochs = epoch + 1;
  st.setup.control->emit(e);
  st.epoch = {0.0, 0, 0, now};
  st.epoch_step = 0;
}

void on_evaluation_complete(reducer_ptr self, std::int64_t step, bool epoch_end, const reducer_state::eval_tally& t) {
  auto& st = self->state;
  self->send(st.setup.loader, eval_done_msg{step, epoch_end});
  st.eval_outstanding = false;
  const double test_loss = ratio(t.loss_sum, static_cast<double>(t.samples));
  const double test_accuracy = ratio(static_cast<double>(t.correct), static_cast<double>(t.samples));
  st.summary.test_loss = test_loss;
  st.summary.test_accuracy = test_accuracy;
  st.final_eval_step = step;
  if (epoch_end) emit_epoch_event(self, t.epoch, step, test_loss, test_accuracy);
  maybe_finish(self);
}

void start(reducer_ptr self) {
  auto& st = self->state;
  for (const auto& d : st.setup.devices) {
    st.members.push_back({d, st.setup.start_step - 1, clock_type::now(), clock_type::now()});
    st.every_device.push_back(d.actor);
    self->monitor(d.actor);
    st.next_device_id = std::max(st.next_device_id, d.id + 1);
  }
  st.train_start = st.last_commit = st.last_progress = clock_type::now();
  st.interval.since = st.epoch.since = st.train_start;
  st.change_reasons = {"start"};
  st.plan.generation = -1;
  form_generation(self, 0);
  request_graceful_change(self);  // planned joins and leaves, if any
  self->send(self, tick_atom::value);
}

}  // namespace

void fail_run(reducer_ptr self, std::exception_ptr error) {
  auto& st = self->state;
  if (st.failed) return;
  st.failed = true;
  if (st.plan.group.local) st.plan.group.local->abort();
  st.setup.control->fail(std::move(error));
}

caf::behavior reducer_actor(caf::stateful_actor<reducer_state>* self, reducer_setup setup) {
  auto& st = self->state;
  st.setup = std::move(setup);
  st.committed = st.setup.start_step - 1;
  st.throughput = throughput_tracker(st.setup.straggler.smoothing, st.setup.devices.size());
  st.planned_changes = st.setup.membership_faults;
  std::sort(st.planned_changes.begin(), st.planned_changes.end(),
            [](const fault_spec& a, const fault_spec& b) { return a.step < b.step; });
  self->set_down_handler([self](const caf::down_msg& msg) {
    auto& st = self->state;
    if (st.failed || st.setup.control->done()) return;
    if (const auto rank = rank_of(st, msg.source))
      handle_fault(self, rank, "exited: " + caf::to_string(msg.reason));
  });
  self->set_exit_handler([self](const caf::exit_msg& msg) {
    // Shutdown: take every device ever spawned along, joined ones included.
    for (const auto& d : self->state.every_device) self->send_exit(d, msg.reason);
    self->quit(msg.reason);
  });
  return {
      [self](start_atom) { start(self); },
      [self](shard_cut_msg& msg) {
        auto& st = self->state;
        // Also while recovering: a step the state source applied commits
        // without the indices this member returned, which it never trained.
        if (msg.generation != st.plan.generation || st.failed ||
            (!accepting_reports(st, msg.generation) && st.current != reducer_state::phase::recovering))
          return;
        ++st.interval_cuts;
        ++st.summary.cuts;
        auto& tally = st.steps[msg.step];
        tally.cut.insert(msg.rank);
        tally.returned.insert(tally.returned.end(), msg.returned.begin(), msg.returned.end());
        if (st.current != reducer_state::phase::recovering) commit_ready_steps(self);
      },
      [self](const late_msg& msg) {
        if (accepting_reports(self->state, msg.generation)) on_late(self, msg);
      },
      [self](steps_done_msg& msg) {
        auto& st = self->state;
        if (!accepting_reports(st, msg.generation)) return;
        for (auto& rec : msg.steps) {
          auto& tally = st.steps[rec.step];
          if (msg.rank == 0) {
            tally.stats_known = true;
            tally.epoch = rec.epoch;
            tally.loss_sum = rec.loss_sum;
            tally.correct = rec.correct;
            tally.samples = rec.samples;
            tally.compute_s = std::move(rec.compute_s);
            tally.member_samples = std::move(rec.member_samples);
            tally.member_returned = std::move(rec.member_returned);
          }
          if (st.setup.verify_replicas) {
            if (tally.reported == 0) tally.checksum = rec.checksum;
            else if (*tally.checksum != rec.checksum) tally.checksums_differ = true;
          }
          ++tally.reported;
        }
        commit_ready_steps(self);
      },
      [self](const evaluated_msg& msg) {
        auto& st = self->state;
        if (!accepting_reports(st, msg.generation)) return;
        st.members.at(static_cast<std::size_t>(msg.rank)).last_heard = clock_type::now();
        const auto key = std::pair{msg.step, msg.epoch_end};
        auto& t = st.evals[key];
        t.epoch = msg.epoch;
        t.loss_sum += msg.loss_sum;
        t.correct += msg.correct;
        t.samples += msg.samples;
        st.last_progress = clock_type::now();
        if (++t.reported == static_cast<std::int32_t>(st.members.size())) {
          const auto done = t;
          st.evals.erase(key);
          on_evaluation_complete(self, msg.step, msg.epoch_end, done);
        }
      },
      [self](const epoch_ledger_msg& msg) {
        auto& st = self->state;
        st.epoch_ledgers[msg.epoch] = msg;
        if (msg.evaluated) {
          st.eval_outstanding = true;
        } else {
          const double none = std::numeric_limits<double>::quiet_NaN();
          emit_epoch_event(self, msg.epoch, st.committed, none, none);
        }
      },
      [self](state_msg& msg) {
        auto& st = self->state;
        st.checkpoints[msg.step].state = std::move(msg.state);
        try_write_checkpoint(self, msg.step);
      },
      [self](ledger_snapshot_msg& msg) {
        auto& st = self->state;
        st.checkpoints[msg.step].position = std::move(msg.position);
        try_write_checkpoint(self, msg.step);
      },
      [self](const checkpoint_written_msg& msg) {
        auto& st = self->state;
        st.checkpoints.erase(msg.step);
        if (!msg.error.empty()) {
          fail_run(self, std::make_exception_ptr(checkpoint_error(msg.error)));
          return;
        }
        spdlog::info("checkpoint written: {}", msg.path);
        st.summary.checkpoint = msg.path;
        st.last_checkpoint = msg.step;
        if (st.current == reducer_state::phase::stopping) {
          fail_run(self, std::make_exception_ptr(training_error(st.stop_message + "; checkpoint written to " + msg.path)));
          return;
        }
        st.setup.control->emit(checkpoint_event{msg.step + 1, msg.path});
        maybe_finish(self);
      },
      [self](const work_done_msg& msg) {
        self->state.work = msg;
        self->state.summary.requeued = msg.requeued;
        self->state.eval_outstanding = true;
        maybe_finish(self);
      },
      [self](device_failed_msg& msg) {
        auto& st = self->state;
        if (!st.rescue_state || st.rescue_state->first < msg.last_step)
          if (!msg.state.empty()) st.rescue_state.emplace(msg.last_step, std::move(msg.state));
        if (msg.generation != st.plan.generation || st.members.at(static_cast<std::size_t>(msg.rank)).gone) return;
        handle_fault(self, static_cast<std::size_t>(msg.rank), "failed: " + msg.what);
      },
      [self](const step_aborted_msg& msg) {
        auto& st = self->state;
        // After the reducer's own abort, survivors' failed collectives are expected.
        if (!accepting_reports(st, msg.generation)) return;
        handle_fault(self, std::nullopt, "collective failed at step " + std::to_string(msg.step + 1) + ": " + msg.what);
      },
      [self](const rollback_done_msg& msg) { self->state.requeued_by_fault = msg.requeued; },
      [self](const paused_msg& msg) {
        auto& st = self->state;
        if (st.current != reducer_state::phase::pausing || msg.generation != st.plan.generation) return;
        st.pause_point = msg.last_step;
        check_pause_complete(self);
      },
      [self](tick_atom) {
        check_hangs(self);
        if (!self->state.failed) self->delayed_send(self, tick_interval, tick_atom::value);
      },
      [self](const add_device_msg& msg) {
        auto& st = self->state;
        ++st.pending_joins;
        st.join_replies.push_back(msg.reply);
        request_graceful_change(self);
      },
      [self](const remove_device_msg& msg) {
        auto& st = self->state;
        const bool known = std::any_of(st.members.begin(), st.members.end(),
                                       [&](const auto& m) { return m.handle.name == msg.name; });
        if (!known) {
          spdlog::warn("remove_device: {} is not a member", msg.name);
          return;
        }
        st.pending_leaves.push_back(msg.name);
        request_graceful_change(self);
      },
      [self](const inject_msg& msg) {
        auto& st = self->state;
        const fault_spec f = parse_fault_spec(msg.spec);
        if (!is_device_fault(f)) {
          st.planned_changes.push_back(f);
          request_graceful_change(self);
          return;
        }
        for (const auto& m : st.members)
          if (m.handle.id == f.device) self->send(m.handle.actor, msg);
      },
      [self](stop_atom) {
        auto& st = self->state;
        if (st.stop_requested) return;
        st.stop_requested = true;
        self->send(st.setup.loader, stop_atom::value);
      },
      [self](params_request& req) {
        auto& st = self->state;
        if (st.members.empty()) {
          req.reply->set_exception(std::make_exception_ptr(std::runtime_error("the generation has no members")));
          return;
        }
        // High priority: answered at the member's next step boundary, ahead of
        // the shards already queued for it.
        self->send<caf::message_priority::high>(st.members.front().handle.actor, std::move(req));
      },
  };
}

}  // namespace dpactor
