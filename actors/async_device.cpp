#include "actors/async_device.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "actors/async_messages.hpp"
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

}  // namespace

caf::behavior async_device(caf::stateful_actor<async_device_state>* self, std::shared_ptr<device_setup> setup,
                           caf::actor reducer, std::shared_ptr<async_device_watch> watch) {
  self->state.setup = std::move(setup);
  self->state.reducer = std::move(reducer);
  self->state.watch = std::move(watch);
  return {
      [self](async_round_msg& m) {
        auto& st = self->state;
        // fail:R@S: the device fails at its first round from S - 1 or more
        // committed rounds (steps count from 1), before it trains: the
        // reducer sees it end (See Note [Async faults]).
        for (const fault_spec& f : st.setup->faults)
          if (f.kind == fault_kind::fail && m.base_round + 1 >= f.step) {
            self->quit(caf::make_error(caf::sec::runtime_error, "injected failure (fault spec " + f.text + ")"));
            return;
          }
        device_progress& progress = st.watch->progress;
        if (std::exchange(st.first_round, false)) progress.begin_warm_up(device_phase::forward, m.worker_round);
        else progress.mark(device_phase::forward, m.worker_round);
        // hang:R@S: the round blocks in its own work until the reducer gives
        // the device up (See Note [Async faults]); nothing is sent.
        for (const fault_spec& f : st.setup->faults)
          if (f.kind == fault_kind::hang && m.base_round + 1 >= f.step) {
            while (!st.watch->released.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            self->quit();
            return;
          }
        async_contribution_msg out;
        out.device = static_cast<std::size_t>(st.setup->id);
        out.worker = m.worker;
        out.worker_round = m.worker_round;
        out.base_round = m.base_round;
        const auto start = clock_type::now();
        try {
          auto values = std::make_shared<std::vector<float>>(m.global->size());
          out.stats = st.setup->workers->run(m.worker, m.worker_round, m.first_position, m.claim.rows,
                                             *st.setup->train, *m.global, *values, progress);
          progress.end_warm_up();
          out.values = std::move(values);
          // train.record_trained: what it trained, by its own account.
          if (st.setup->on_trained) {
            trained_event t;
            t.device = st.setup->name;
            t.step = m.worker_round;
            t.epoch = m.claim.epoch;
            t.samples = static_cast<std::int64_t>(m.claim.rows.size());
            t.digest = sample_digest(m.claim.rows);
            t.worker = static_cast<std::int64_t>(m.worker);
            t.worker_round = m.worker_round;
            st.setup->on_trained(t);
          }
          // A slowed device is slow in its own work: it marks progress as it goes.
          const double factor = slow_factor(*st.setup, m.base_round);
          const auto slow_until =
              clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(
                                      (factor - 1.0) * seconds_between(start, clock_type::now())));
          while (factor > 1.0 && clock_type::now() < slow_until) {
            std::this_thread::sleep_for(std::min<clock_type::duration>(std::chrono::milliseconds(20), slow_until - clock_type::now()));
            progress.mark(device_phase::forward, m.worker_round);
          }
        } catch (const std::exception& e) {
          out.error = st.setup->name + ": " + e.what();
        }
        out.seconds = seconds_between(start, clock_type::now());
        progress.mark(device_phase::data, m.worker_round);  // waiting for its next round
        out.claim = std::move(m.claim);
        self->send(st.reducer, std::move(out));
      },
  };
}

}  // namespace dpactor
