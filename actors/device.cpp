#include "actors/device.hpp"

#include "tensors/float_env.hpp"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <stdexcept>
#include <thread>

namespace dpactor {
namespace {

using clock_type = std::chrono::steady_clock;
using device_ptr = caf::stateful_actor<device_state>*;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// Granularity of injected delays: they end early when the step is cut.
constexpr auto delay_slice = std::chrono::microseconds(50);
// A sleep on this kind of machine overshoots by about this much even with a
// 1 ns timer slack: the end of a delay is waited out by yielding instead.
constexpr auto sleep_overshoot = std::chrono::microseconds(60);

bool cut_requested(const device_state& st, std::int64_t step) {
  return st.setup->control->cut_step.load(std::memory_order_acquire) == step;
}

// Sleeps for `seconds`, or until the step is cut. Precise to a few
// microseconds, so that an injected slow-down factor is the factor asked for.
void injected_delay(const device_state& st, std::int64_t step, double seconds) {
  thread_local const bool precise_timers = ::prctl(PR_SET_TIMERSLACK, 1UL) == 0;
  (void)precise_timers;
  const auto until = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
  for (auto now = clock_type::now(); now < until && !cut_requested(st, step); now = clock_type::now()) {
    const auto left = until - now;
    if (left > sleep_overshoot) std::this_thread::sleep_for(std::min<clock_type::duration>(delay_slice, left - sleep_overshoot));
    else std::this_thread::yield();
  }
}

const fault_spec* find_fault(const device_state& st, fault_kind kind, std::int64_t step) {
  for (const auto& f : st.setup->faults)
    if (f.kind == kind && (kind == fault_kind::jitter || (kind == fault_kind::slow ? step >= f.step : step == f.step)))
      return &f;
  return nullptr;
}

struct injected_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Forward and backward over the shard in micro-batches, honouring cuts and
// injected faults. Returns the stats and how many indices it processed.
std::pair<batch_stats, std::size_t> compute_shard(device_state& st, const step_shard& shard) {
  replica& model = *st.setup->model;
  const std::int64_t step_number = shard.step + 1;  // faults count steps from 1
  if (const fault_spec* f = find_fault(st, fault_kind::jitter, step_number)) {
    if (!st.jitter_rng) st.jitter_rng.emplace(st.setup->fault_seed, static_cast<std::uint64_t>(st.setup->id));
    if (st.jitter_rng->uniform() < f->probability) injected_delay(st, shard.step, f->delay_ms / 1000.0);
  }
  if (find_fault(st, fault_kind::fail, step_number))
    throw injected_failure("injected failure (fault spec fail:" + std::to_string(st.setup->id) + "@" +
                           std::to_string(step_number) + ")");
  if (find_fault(st, fault_kind::hang, step_number)) {
    // Blocks until the reducer gives up on this member and aborts the group.
    while (!st.group->aborted()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const fault_spec* slow = find_fault(st, fault_kind::slow, step_number);
  batch_stats stats;
  const std::size_t micro = model.max_rows();
  const std::span<const std::uint32_t> rows(shard.indices);
  std::size_t done = 0;
  while (done < rows.size() && !cut_requested(st, shard.step)) {
    const auto slice = rows.subspan(done, std::min(micro, rows.size() - done));
    const auto start = clock_type::now();
    stats += model.accumulate(st.setup->train->batch(slice));
    done += slice.size();
    if (slow != nullptr) injected_delay(st, shard.step, (slow->factor - 1.0) * seconds_since(start));
  }
  return {stats, done};
}

void report_failure(device_ptr self, std::int64_t step, const std::string& what) {
  auto& st = self->state;
  device_failed_msg msg{st.generation, step, st.rank, what, st.last_step, {}};
  try {
    msg.state = st.setup->model->export_state();
  } catch (...) {
  }
  self->send(st.reducer, std::move(msg));
}

// The step header all-reduced before the gradients: samples, loss sum and
// correct count summed over members, then each member's compute time, sample
// count and returned count in its own slot. See Note [One step report].
enum header_slot : std::size_t { h_samples = 0, h_loss = 1, h_correct = 2, h_members = 3 };

// One step of a shard message; adds its record for the report (first member).
void run_step(device_ptr self, const step_shard& shard) {
  auto& st = self->state;
  replica& model = *st.setup->model;
  const auto start = clock_type::now();
  model.zero_grad();
  const auto [stats, done] = compute_shard(st, shard);
  const double compute_s = seconds_since(start);
  const std::size_t returned = shard.indices.size() - done;
  if (returned > 0)
    self->send(st.reducer, shard_cut_msg{st.generation, shard.step, st.rank, stats.samples,
                                         {shard.indices.begin() + static_cast<std::ptrdiff_t>(done), shard.indices.end()}});
  const auto members = static_cast<std::size_t>(st.comm->size());
  const auto rank = static_cast<std::size_t>(st.rank);
  st.header.assign(h_members + 3 * members, 0.0f);
  st.header[h_samples] = static_cast<float>(stats.samples);
  st.header[h_loss] = static_cast<float>(stats.loss_sum);
  st.header[h_correct] = static_cast<float>(stats.correct);
  st.header[h_members + rank] = static_cast<float>(compute_s);
  st.header[h_members + members + rank] = static_cast<float>(stats.samples);
  st.header[h_members + 2 * members + rank] = static_cast<float>(returned);
  // Waiting here past the deadline, tell the reducer who is late.
  collective_options header_options = st.setup->collective;
  st.late.step = shard.step;
  header_options.observer = &st.late;
  const double allowed = std::max(st.setup->late_floor_s, st.setup->late_factor * st.compute_times.median());
  header_options.late_at = start + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(allowed));
  st.comm->all_reduce_sum(st.header, header_options);
  // See Note [Sharded optimizer step].
  const std::span<float> grads = model.gradients();
  st.comm->reduce_scatter_sum(grads, st.setup->collective);
  const auto [begin, end] = st.comm->chunk(grads.size(), st.rank);
  model.apply_update(st.setup->schedule.at(model.optimizer_steps()), st.header[h_samples], begin, end);
  st.comm->all_gather(model.state_sections(), st.setup->collective);
  model.finish_step();
  st.last_step = shard.step;
  for (std::size_t r = 0; r < members; ++r)
    if (st.header[h_members + 2 * members + r] == 0.0f && st.header[h_members + members + r] > 0.0f)
      st.compute_times.push(st.header[h_members + r]);
  if (st.rank == 0 || st.setup->verify_replicas) {
    step_record rec{shard.step, shard.epoch, static_cast<double>(st.header[h_loss]),
                    static_cast<std::int64_t>(st.header[h_correct]), static_cast<std::int64_t>(st.header[h_samples]), 0,
                    {}, {}, {}};
    if (st.setup->verify_replicas) rec.checksum = model.parameter_checksum();
    const auto first = st.header.begin() + static_cast<std::ptrdiff_t>(h_members);
    const auto m = static_cast<std::ptrdiff_t>(members);
    rec.compute_s.assign(first, first + m);
    rec.member_samples.assign(first + m, first + 2 * m);
    rec.member_returned.assign(first + 2 * m, first + 3 * m);
    st.records.push_back(std::move(rec));
  }
}

void send_report(device_ptr self) {
  auto& st = self->state;
  if (st.records.empty()) return;
  self->send(st.reducer, steps_done_msg{st.generation, st.rank, std::move(st.records)});
  st.records.clear();
}

}  // namespace

void late_reporter::on_late(std::span<const int> missing_ranks) {
  auto& st = self->state;
  self->send(st.reducer, late_msg{st.generation, step, st.rank, {missing_ranks.begin(), missing_ranks.end()}});
}

caf::behavior device_actor(caf::stateful_actor<device_state>* self, std::shared_ptr<device_setup> setup) {
  flush_denormals_to_zero();  // a detached actor is initialised on its own thread
  self->state.setup = std::move(setup);
  self->state.late.self = self;
  self->state.last_step = self->state.setup->model->optimizer_steps() - 1;
  return {
      [self](begin_generation_msg& msg) {
        auto& st = self->state;
        st.generation = msg.generation;
        st.rank = msg.rank;
        st.reducer = msg.reducer;
        st.group = msg.group.local;
        try {
          st.comm = st.group->endpoint(msg.rank);
          // Every member adopts the state source's parameters, optimizer state
          // and step counter (See Note [Replica state buffer]).
          st.comm->broadcast(st.setup->model->state_buffer(), msg.state_source, st.setup->collective);
          st.last_step = st.setup->model->optimizer_steps() - 1;
        } catch (const collective_error& e) {
          self->send(st.reducer, step_aborted_msg{st.generation, st.last_step + 1, st.rank, e.what()});
        }
      },
      [self](const shard_msg& msg) {
        auto& st = self->state;
        for (const step_shard& shard : msg.steps) {
          // Planned for an ended generation, or the reducer is ending this one.
          if (msg.generation != st.generation || !st.group || st.group->aborted()) break;
          try {
            run_step(self, shard);
          } catch (const collective_error& e) {
            send_report(self);
            self->send(st.reducer, step_aborted_msg{st.generation, shard.step, st.rank, e.what()});
            return;
          } catch (const std::exception& e) {
            send_report(self);
            report_failure(self, shard.step, e.what());
            self->quit(caf::make_error(caf::sec::runtime_error, e.what()));
            return;
          }
        }
        send_report(self);
      },
      [self](const evaluate_msg& msg) {
        auto& st = self->state;
        if (msg.generation != st.generation || !st.group || st.group->aborted()) return;
        st.eval_rows.resize(msg.end - msg.begin);
        std::iota(st.eval_rows.begin(), st.eval_rows.end(), msg.begin);
        try {
          replica& model = *st.setup->model;
          batch_stats stats;
          const std::size_t micro = model.max_rows();
          const std::span<const std::uint32_t> rows(st.eval_rows);
          for (std::size_t b = 0; b < rows.size(); b += micro)
            stats += model.evaluate(st.setup->test->batch(rows.subspan(b, std::min(micro, rows.size() - b))));
          self->send(st.reducer, evaluated_msg{st.generation, msg.epoch, msg.step, msg.epoch_end, st.rank,
                                               stats.loss_sum, stats.correct, stats.samples});
        } catch (const std::exception& e) {
          report_failure(self, msg.step, std::string("evaluation failed: ") + e.what());
          self->quit(caf::make_error(caf::sec::runtime_error, e.what()));
        }
      },
      [self](const snapshot_msg& msg) {
        auto& st = self->state;
        if (msg.generation != st.generation || !st.group || st.group->aborted()) return;
        self->send(st.reducer, state_msg{msg.step, st.setup->model->export_state()});
      },
      [](const finish_msg&) {
        // Nothing more will come in this generation; the engine ends the actor.
      },
      [self](suspend_atom) -> std::int64_t { return self->state.last_step; },
      [self](state_atom) { return state_msg{self->state.last_step, self->state.setup->model->export_state()}; },
      [self](const inject_msg& msg) { self->state.setup->faults.push_back(parse_fault_spec(msg.spec)); },
      [self](const params_request& req) {
        auto& st = self->state;
        params_reply reply;
        reply.step = st.setup->model->optimizer_steps();
        reply.values.resize(st.setup->model->layout().parameter_size);
        st.setup->model->copy_parameters(reply.values);
        req.reply->set_value(std::move(reply));
      },
  };
}

}  // namespace dpactor
