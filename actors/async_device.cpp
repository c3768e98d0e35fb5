#include "actors/async_device.hpp"

#include <csignal>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "actors/async_messages.hpp"
#include "actors/device_messages.hpp"
#include "train/fault_plan.hpp"
#include "train/sample_digest.hpp"

namespace dpactor {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// slow:R:F from fault_plan: the round takes F times as long,
// as a slowed device's steps do.
double slow_factor(const device_setup& setup, std::int64_t round) {
  double factor = 1.0;
  for (const fault_spec& f : setup.faults)
    if (f.kind == fault_kind::slow && round + 1 >= f.step) factor *= f.factor;
  return factor;
}

// What a round came to on a device: its stats and seconds, or the device
// ends (an injected failure or hang) or reports an error.
struct round_outcome {
  bool ended = false;
  batch_stats stats;
  double seconds = 0.0;
  std::string error;
};

// Worker `m`'s round on the device: the faults that act before it, the
// round (logical_worker_runner::run, which writes the worker's new state to
// the device's store), the device's own record of it, and a slowed
// device's extra time (See Note [Async faults]).
round_outcome run_round(caf::stateful_actor<async_device_state>* self, std::size_t worker, std::int64_t worker_round,
                        std::int64_t base_round, const async_claim& claim, double first_position,
                        std::span<const float> global, std::span<float> values) {
  auto& st = self->state;
  round_outcome out;
  // fail:R@S: the device fails at its first round from S - 1 or more
  // committed rounds (steps count from 1), before it trains: the reducer
  // sees it end. kill:R@S (a device in another process, See Note [Async
  // rounds across processes]): its process kills itself there.
  for (const fault_spec& f : st.setup->faults) {
    if (f.kind == fault_kind::kill && base_round + 1 >= f.step) ::raise(SIGKILL);
    if (f.kind == fault_kind::fail && base_round + 1 >= f.step) {
      self->quit(caf::make_error(caf::sec::runtime_error, "injected failure (fault spec " + f.text + ")"));
      out.ended = true;
      return out;
    }
  }
  device_progress& progress = st.watch->progress;
  if (std::exchange(st.first_round, false)) progress.begin_warm_up(device_phase::forward, worker_round);
  else progress.mark(device_phase::forward, worker_round);
  // hang:R@S: the round blocks in its own work until the reducer gives
  // the device up; nothing is sent.
  for (const fault_spec& f : st.setup->faults)
    if (f.kind == fault_kind::hang && base_round + 1 >= f.step) {
      while (!st.watch->released.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      self->quit();
      out.ended = true;
      return out;
    }
  const auto start = clock_type::now();
  try {
    out.stats = st.setup->workers->run(worker, worker_round, first_position, claim.rows, *st.setup->train, global,
                                       values, progress);
    progress.end_warm_up();
    // train.record_trained: what it trained, by its own account.
    if (st.setup->on_trained || (st.remote && st.setup->trained_to_reducer)) {
      trained_event t;
      t.device = st.setup->name;
      t.step = worker_round;
      t.epoch = claim.epoch;
      t.samples = static_cast<std::int64_t>(claim.rows.size());
      t.digest = sample_digest(claim.rows);
      t.worker = static_cast<std::int64_t>(worker);
      t.worker_round = worker_round;
      if (st.setup->on_trained) st.setup->on_trained(t);
      else self->send(caf::actor_cast<caf::actor>(self->current_sender()), std::move(t));
    }
    // A slowed device is slow in its own work: it marks progress as it goes.
    const double factor = slow_factor(*st.setup, base_round);
    const auto slow_until =
        clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(
                                (factor - 1.0) * seconds_between(start, clock_type::now())));
    while (factor > 1.0 && clock_type::now() < slow_until) {
      std::this_thread::sleep_for(std::min<clock_type::duration>(std::chrono::milliseconds(20), slow_until - clock_type::now()));
      progress.mark(device_phase::forward, worker_round);
    }
  } catch (const std::exception& e) {
    out.error = st.setup->name + ": " + e.what();
  }
  out.seconds = seconds_between(start, clock_type::now());
  progress.mark(device_phase::data, worker_round);  // waiting for its next round
  return out;
}

}  // namespace

caf::behavior async_device(caf::stateful_actor<async_device_state>* self, std::shared_ptr<device_setup> setup,
                           caf::actor reducer, std::shared_ptr<async_device_watch> watch) {
  self->state.setup = std::move(setup);
  self->state.reducer = std::move(reducer);
  self->state.watch = std::move(watch);
  self->state.remote = !self->state.reducer;
  return {
      [self](async_round_msg& m) {
        auto& st = self->state;
        auto values = std::make_shared<std::vector<float>>(m.global->size());
        round_outcome r = run_round(self, m.worker, m.worker_round, m.base_round, m.claim, m.first_position, *m.global, *values);
        if (r.ended) return;
        async_contribution_msg out;
        out.device = static_cast<std::size_t>(st.setup->id);
        out.worker = m.worker;
        out.worker_round = m.worker_round;
        out.base_round = m.base_round;
        if (r.error.empty()) out.values = std::move(values);
        out.stats = r.stats;
        out.seconds = r.seconds;
        out.error = std::move(r.error);
        out.claim = std::move(m.claim);
        self->send(st.reducer, std::move(out));
      },
      // See Note [Async rounds across processes]: the worker's state comes
      // with its round and goes back with its contribution; this process
      // keeps none.
      [self](async_remote_round_msg& m) {
        auto& st = self->state;
        const auto sender = caf::actor_cast<caf::actor>(self->current_sender());
        {  // for its progress relay
          const std::lock_guard lock(st.watch->mutex);
          st.watch->reducer = sender;
          st.watch->number = m.device;
        }
        logical_worker_store& store = *st.setup->workers->setup().store;
        store.reset(m.worker, m.worker_round, std::move(m.state));
        const async_claim claim{m.epoch, m.first, std::move(m.rows)};
        async_remote_contribution_msg out;
        out.values.resize(m.global.size());
        round_outcome r = run_round(self, m.worker, m.worker_round, m.base_round, claim, m.first_position, m.global, out.values);
        if (r.ended) return;
        out.device = m.device;
        out.worker = m.worker;
        out.worker_round = m.worker_round;
        out.base_round = m.base_round;
        if (r.error.empty()) {
          try {
            out.state = store.read(m.worker, m.worker_round + 1);
          } catch (const std::exception& e) {
            r.error = st.setup->name + ": " + e.what();
          }
        }
        if (!r.error.empty()) out.values.clear();
        out.loss_sum = r.stats.loss_sum;
        out.correct = r.stats.correct;
        out.samples = r.stats.samples;
        out.seconds = r.seconds;
        out.error = std::move(r.error);
        self->send(sender, std::move(out));
      },
      // Fault specs for a device in another process (the coordinator's
      // faults.inject): fail, kill and slow.
      [self](const inject_msg& m) { self->state.setup->faults.push_back(parse_fault_spec(m.spec)); },
  };
}

caf::behavior async_progress_relay(caf::event_based_actor* self, caf::actor device,
                                   std::shared_ptr<async_device_watch> watch) {
  self->link_to(device);
  auto last = std::make_shared<device_progress::clock::time_point>();
  self->send(self, async_relay_tick_msg{});
  return {
      [self, watch, last](async_relay_tick_msg) {
        const device_progress::snapshot p = watch->progress.read();
        if (p.since != *last) {
          caf::actor reducer;
          async_progress_msg m;
          {
            const std::lock_guard lock(watch->mutex);
            reducer = watch->reducer;
            m.device = watch->number;
          }
          if (reducer) {
            m.phase = static_cast<std::int32_t>(p.phase);
            m.step = p.step;
            m.warming = p.warming;
            self->send(reducer, m);
            *last = p.since;
          }
        }
        self->delayed_send(self, std::chrono::milliseconds(100), async_relay_tick_msg{});
      },
  };
}

}  // namespace dpactor
