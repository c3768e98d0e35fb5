#include "actors/reducer.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "comms/local.hpp"
#include "tensors/error.hpp"

namespace dpactor {
namespace {

using reducer_ptr = caf::stateful_actor<reducer_state>*;
using clock_type = reducer_state::clock;

double seconds(clock_type::duration d) { return std::chrono::duration<double>(d).count(); }

double ratio(double num, double den) { return den > 0.0 ? num / den : 0.0; }

void fail_run(reducer_ptr self, std::exception_ptr error) {
  auto& st = self->state;
  if (st.failed) return;
  st.failed = true;
  if (st.plan.group.local) st.plan.group.local->abort();
  st.setup.control->fail(std::move(error));
}

void maybe_finish(reducer_ptr self) {
  auto& st = self->state;
  if (st.failed || !st.work || st.committed < st.work->last_step) return;
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
  if (it == st.checkpoints.end() || !it->second.state || !it->second.position || !st.setup.writer) return;
  write_checkpoint_msg msg;
  msg.step = step;
  msg.epoch = it->second.position->epoch;
  msg.state = std::move(*it->second.state);
  msg.position = std::move(*it->second.position);
  it->second.state.reset();  // marks "sent": the entry stays until written
  self->send(st.setup.writer, std::move(msg));
}

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
  st.setup.control->emit(e);
  st.interval = {0.0, 0, 0, 0, now};
}

void commit(reducer_ptr self, std::int64_t step) {
  auto& st = self->state;
  auto node = st.steps.extract(step);
  const auto& tally = node.mapped();
  if (st.setup.verify_replicas && !tally.checksum) {
    fail_run(self, std::make_exception_ptr(training_error(
                       "replicas diverged after step " + std::to_string(step + 1) +
                       ": parameter checksums differ between members (train.verify_replicas)")));
    return;
  }
  st.committed = step;
  st.last_commit = clock_type::now();
  self->send(st.setup.loader, committed_msg{st.plan.generation, step});
  for (auto* s : {&st.interval, &st.epoch}) {
    s->loss_sum += tally.loss_sum;
    s->correct += tally.correct;
    s->samples += tally.samples;
    s->steps += 1;
  }
  st.summary.samples += tally.samples;
  ++st.epoch_step;
  if ((step + 1) % st.setup.log_every == 0) emit_step_event(self, step, tally.epoch);
  maybe_finish(self);
}

void on_evaluation_complete(reducer_ptr self, std::int64_t step, bool epoch_end, const reducer_state::eval_tally& t) {
  auto& st = self->state;
  const double test_loss = ratio(t.loss_sum, static_cast<double>(t.samples));
  const double test_accuracy = ratio(static_cast<double>(t.correct), static_cast<double>(t.samples));
  st.summary.test_loss = test_loss;
  st.summary.test_accuracy = test_accuracy;
  st.final_eval_step = step;
  if (epoch_end) {
    const auto now = clock_type::now();
    epoch_event e;
    e.epoch = t.epoch;
    e.step = step + 1;
    e.train_loss = ratio(st.epoch.loss_sum, static_cast<double>(st.epoch.samples));
    e.train_accuracy = ratio(static_cast<double>(st.epoch.correct), static_cast<double>(st.epoch.samples));
    e.test_loss = test_loss;
    e.test_accuracy = test_accuracy;
    e.seconds = seconds(st.last_commit - st.epoch.since);
    e.samples = st.epoch.samples;
    e.samples_per_s = ratio(static_cast<double>(st.epoch.samples), e.seconds);
    if (auto it = st.epoch_ledgers.find(t.epoch); it != st.epoch_ledgers.end()) e.requeued = it->second.requeued;
    st.summary.epochs = t.epoch + 1;
    st.setup.control->emit(e);
    st.epoch = {0.0, 0, 0, 0, now};
    st.epoch_step = 0;
  }
  maybe_finish(self);
}

void start_generation(reducer_ptr self) {
  auto& st = self->state;
  st.plan.generation = 0;
  st.plan.reducer = self;
  st.plan.members = st.setup.devices;
  st.plan.state_source = 0;
  st.plan.group.backend = "local";
  st.plan.group.generation = 0;
  st.plan.group.local = make_local_group(static_cast<int>(st.plan.members.size()));
  for (const auto& d : st.plan.members) self->monitor(d);
  st.train_start = st.last_commit = clock_type::now();
  st.interval.since = st.epoch.since = st.train_start;
  spdlog::info("generation 0: {} members ({})", st.plan.members.size(), fmt::join(st.setup.device_names, ", "));
  st.setup.control->emit(membership_event{0, st.setup.start_step, st.setup.device_names, "start"});
  self->send(st.setup.loader, st.plan);
}

}  // namespace

caf::behavior reducer_actor(caf::stateful_actor<reducer_state>* self, reducer_setup setup) {
  self->state.setup = std::move(setup);
  self->state.committed = self->state.setup.start_step - 1;
  self->set_down_handler([self](const caf::down_msg& msg) {
    auto& st = self->state;
    if (st.failed || st.setup.control->done()) return;
    const auto it = std::find(st.plan.members.begin(), st.plan.members.end(), msg.source);
    if (it == st.plan.members.end()) return;
    const auto rank = static_cast<std::size_t>(it - st.plan.members.begin());
    fail_run(self, std::make_exception_ptr(training_error("device " + st.setup.device_names.at(rank) +
                                                           " exited unexpectedly: " + caf::to_string(msg.reason))));
  });
  return {
      [self](start_atom) { start_generation(self); },
      [](const step_planned_msg&) {},
      [](const computed_msg&) {},
      [self](const step_done_msg& msg) {
        auto& st = self->state;
        if (msg.generation != st.plan.generation || st.failed) return;
        auto& tally = st.steps[msg.step];
        tally.epoch = msg.epoch;
        tally.loss_sum += msg.loss_sum;
        tally.correct += msg.correct;
        tally.samples += msg.samples;
        if (tally.reported == 0) tally.checksum = msg.checksum;
        else if (tally.checksum && *tally.checksum != msg.checksum) tally.checksum.reset();
        if (++tally.reported == static_cast<std::int32_t>(st.plan.members.size())) {
          // Members finish steps in order, so commits go out in order too.
          while (!st.steps.empty() && st.steps.begin()->second.reported == static_cast<std::int32_t>(st.plan.members.size()) &&
                 st.steps.begin()->first == st.committed + 1 && !st.failed)
            commit(self, st.steps.begin()->first);
        }
      },
      [self](const evaluated_msg& msg) {
        auto& st = self->state;
        if (msg.generation != st.plan.generation || st.failed) return;
        const auto key = std::pair{msg.step, msg.epoch_end};
        auto& t = st.evals[key];
        t.epoch = msg.epoch;
        t.loss_sum += msg.loss_sum;
        t.correct += msg.correct;
        t.samples += msg.samples;
        if (++t.reported == static_cast<std::int32_t>(st.plan.members.size())) {
          const auto done = t;
          st.evals.erase(key);
          on_evaluation_complete(self, msg.step, msg.epoch_end, done);
        }
      },
      [self](const epoch_ledger_msg& msg) { self->state.epoch_ledgers[msg.epoch] = msg; },
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
        st.setup.control->emit(checkpoint_event{msg.step + 1, msg.path});
        maybe_finish(self);
      },
      [self](const work_done_msg& msg) {
        self->state.work = msg;
        maybe_finish(self);
      },
      [self](const device_failed_msg& msg) {
        auto& st = self->state;
        if (msg.generation != st.plan.generation) return;
        fail_run(self, std::make_exception_ptr(training_error("step " + std::to_string(msg.step + 1) + ": " + msg.what)));
      },
      [self](stop_atom) {
        auto& st = self->state;
        if (st.stop_requested) return;
        st.stop_requested = true;
        self->send(st.setup.loader, stop_atom::value);
      },
      [self](params_request& req) {
        auto& st = self->state;
        if (st.plan.members.empty()) {
          req.reply->set_exception(std::make_exception_ptr(std::runtime_error("the generation has no members")));
          return;
        }
        // High priority: answered at the member's next step boundary, ahead of
        // the shards already queued for it.
        self->send<caf::message_priority::high>(st.plan.members.front(), std::move(req));
      },
  };
}

}  // namespace dpactor
