#include "actors/simulated_device.hpp"

#include <algorithm>
#include <span>

#include "train/sample_digest.hpp"

namespace dpactor {
namespace {

using sim_ptr = simulated_device_actor::stateful_pointer<simulated_device_state>;

// The stand-in's loss: one per sample, so a step's loss reads 1.
constexpr double loss_per_sample = 1.0;

// What a member "carries" into a step: its step counter's hash, equal on
// members holding the same state.
std::uint64_t state_checksum(std::int64_t last_step) { return sample_digest(static_cast<std::uint64_t>(last_step + 1)); }

// The indices this member trains of a shard: its slices, or all of its own.
std::span<const std::uint32_t> trained_indices(const step_shard& shard) {
  const std::span<const std::uint32_t> all = shard.all_indices();
  if (!shard.sliced()) return all;
  const std::size_t begin = std::min(all.size(), std::size_t{shard.first_slice} * shard.slice_rows);
  const std::size_t end = std::min(all.size(), std::size_t{shard.last_slice} * shard.slice_rows);
  return all.subspan(begin, end - begin);
}

const fault_spec* fault_at(const simulated_device_setup& setup, fault_kind kind, std::int64_t step) {
  for (const auto& f : setup.faults)
    if (f.kind == kind && f.step == step + 1) return &f;
  return nullptr;
}

double slow_factor(const simulated_device_setup& setup, std::int64_t step) {
  double factor = 1.0;
  for (const auto& f : setup.faults)
    if (f.kind == fault_kind::slow && step + 1 >= f.step) factor = f.factor;
  return factor;
}

void send_report(sim_ptr self) {
  auto& st = self->state;
  if (st.records.empty()) return;
  self->send(st.reducer, steps_done_msg{st.generation, st.rank, std::move(st.records)});
  st.records.clear();
}

// Nothing more of this generation: what is queued belongs to an ended one.
void drop_work(sim_ptr self) {
  auto& st = self->state;
  st.queue.clear();
  st.current.reset();
  st.exchanging = false;
  st.hung = false;
}

// The step in `current` completed in the collective: the member applies it.
void apply_result(sim_ptr self, const simulated_result& result) {
  auto& st = self->state;
  const auto& shard = std::get<step_shard>(st.current->item);
  st.last_step = shard.step;
  device_progress& progress = st.setup->control->progress;
  progress.mark(device_phase::data, shard.step + 1);
  progress.end_warm_up();
  if (st.setup->on_trained)
    st.setup->on_trained(
        trained_event{st.setup->name, shard.step, shard.epoch, st.mine.samples, st.digest, st.carried, st.generation});
  if (st.rank == 0) {
    step_record rec;
    rec.step = shard.step;
    rec.epoch = shard.epoch;
    rec.loss_sum = result.loss_sum;
    rec.correct = result.correct;
    rec.samples = result.samples;
    rec.checksum = st.carried;
    rec.counter = shard.step;
    rec.compute_s = result.compute_s;
    rec.member_samples = result.member_samples;
    rec.member_returned = result.member_returned;
    st.records.push_back(std::move(rec));
  }
  const bool report = st.current->report;
  st.current.reset();
  st.exchanging = false;
  if (report) send_report(self);
}

void evaluate(sim_ptr self, const evaluate_msg& msg) {
  auto& st = self->state;
  st.setup->control->progress.mark(device_phase::data, msg.step + 1);
  const auto samples = static_cast<std::int64_t>(msg.end - msg.begin);
  self->send(st.reducer, evaluated_msg{st.generation, msg.epoch, msg.step, msg.epoch_end, st.rank,
                                       loss_per_sample * static_cast<double>(samples), 0, samples});
}

void start_step(sim_ptr self);

// Takes the next piece of work while none is in progress.
void pump(sim_ptr self) {
  auto& st = self->state;
  while (!st.current && !st.queue.empty()) {
    if (!st.group || st.group->aborted()) {
      st.queue.clear();
      return;
    }
    simulated_device_state::work w = std::move(st.queue.front());
    st.queue.pop_front();
    if (const auto* e = std::get_if<evaluate_msg>(&w.item)) {
      evaluate(self, *e);
      continue;
    }
    st.current = std::move(w);
    start_step(self);
  }
}

void start_step(sim_ptr self) {
  auto& st = self->state;
  const auto& shard = std::get<step_shard>(st.current->item);
  // The generation's broadcast stand-in: every member adopts the state
  // source's, which holds the step before the generation's first.
  if (st.fresh_generation) {
    st.last_step = shard.step - 1;
    st.fresh_generation = false;
  }
  if (fault_at(*st.setup, fault_kind::fail, shard.step)) {
    const std::string what = "injected failure (simulated, step " + std::to_string(shard.step + 1) + ")";
    self->send(st.reducer, device_failed_msg{st.generation, shard.step, st.rank, what, st.last_step, {}});
    self->quit(caf::make_error(caf::sec::runtime_error, what));
    return;
  }
  const std::span<const std::uint32_t> mine = trained_indices(shard);
  st.carried = state_checksum(st.last_step);
  st.digest = sample_digest(mine);
  st.mine = simulated_contribution{static_cast<std::int64_t>(mine.size()),
                                   loss_per_sample * static_cast<double>(mine.size()), 0, 0.0, 0};
  st.setup->control->progress.mark(device_phase::forward, shard.step);
  if (fault_at(*st.setup, fault_kind::hang, shard.step)) {
    st.hung = true;  // until the reducer aborts the generation and asks
    return;
  }
  const auto compute = std::chrono::duration_cast<std::chrono::microseconds>(st.setup->compute *
                                                                            slow_factor(*st.setup, shard.step));
  st.mine.compute_s = std::chrono::duration<double>(compute).count();
  if (compute.count() == 0) self->send(self, computed_atom::value, st.generation, shard.step);
  else self->delayed_send(self, compute, computed_atom::value, st.generation, shard.step);
}

bool is_current(const simulated_device_state& st, std::int64_t generation, std::int64_t step) {
  return generation == st.generation && st.current && std::get<step_shard>(st.current->item).step == step;
}

void on_computed(sim_ptr self, std::int64_t generation, std::int64_t step) {
  auto& st = self->state;
  if (!is_current(st, generation, step) || st.exchanging) return;
  st.setup->control->progress.mark(device_phase::collective, step);
  st.exchanging = true;
  if (!st.group->contribute(step, st.rank, st.mine) && st.group->aborted()) {
    send_report(self);
    self->send(st.reducer, step_aborted_msg{st.generation, step, st.rank, "the simulated collective was aborted"});
    drop_work(self);
  }
}

void on_exchanged(sim_ptr self, std::int64_t generation, std::int64_t step) {
  auto& st = self->state;
  if (!is_current(st, generation, step) || !st.exchanging) return;
  if (auto result = st.group->take(step, st.rank)) apply_result(self, *result);
  pump(self);
}

}  // namespace

simulated_device_actor::behavior_type simulated_device_behavior(sim_ptr self,
                                                                std::shared_ptr<simulated_device_setup> setup) {
  self->set_exception_handler([](std::exception_ptr& x) { return error_of(x); });
  self->state.setup = std::move(setup);
  self->state.setup->control->progress.begin_warm_up(device_phase::data, 0);
  return {
      [self](begin_generation_msg& msg) {
        auto& st = self->state;
        drop_work(self);
        st.generation = msg.generation;
        st.rank = msg.rank;
        st.reducer = msg.reducer;
        st.group = std::dynamic_pointer_cast<simulated_group>(msg.group.local);
        if (!st.group) throw std::logic_error("a simulated device in a generation without a simulated group");
        st.fresh_generation = true;
        st.setup->control->progress.mark(device_phase::data, st.last_step + 1);
        // Told from the last contributor's thread: a message, never a call
        // into this actor's state.
        const std::chrono::microseconds exchange = st.setup->exchange;
        // Weak: the group outlives no member because of it.
        st.group->join(msg.rank, [weak = caf::actor_cast<caf::weak_actor_ptr>(self->ctrl()), generation = msg.generation,
                                  exchange](std::int64_t step) {
          const auto strong = weak.lock();
          if (!strong) return;
          const auto me = caf::actor_cast<caf::actor>(strong);
          if (exchange.count() == 0) caf::anon_send(me, exchanged_atom::value, generation, step);
          else caf::delayed_anon_send(me, exchange, exchanged_atom::value, generation, step);
        });
      },
      [self](shard_msg& msg) {
        auto& st = self->state;
        if (msg.generation != st.generation || !st.group || st.group->aborted()) return;
        for (std::size_t i = 0; i < msg.steps.size(); ++i)
          st.queue.push_back({std::move(msg.steps[i]), i + 1 == msg.steps.size()});
        pump(self);
      },
      [self](const evaluate_msg& msg) {
        auto& st = self->state;
        if (msg.generation != st.generation || !st.group || st.group->aborted()) return;
        st.queue.push_back({msg, false});
        pump(self);
      },
      [self](const snapshot_msg& msg) {
        self->send(self->state.reducer, state_msg{msg.step, {}});  // See the header: no state
      },
      [](const finish_msg&) {},
      [self](computed_atom, std::int64_t generation, std::int64_t step) { on_computed(self, generation, step); },
      [self](exchanged_atom, std::int64_t generation, std::int64_t step) { on_exchanged(self, generation, step); },
      [self](suspend_atom) -> std::int64_t {
        // The reducer aborted the group and asks: a step the collective
        // completed is applied, as a device's returning collective would.
        auto& st = self->state;
        if (st.current && st.exchanging)
          if (auto result = st.group->take(std::get<step_shard>(st.current->item).step, st.rank)) apply_result(self, *result);
        send_report(self);
        drop_work(self);
        return st.last_step;
      },
      [self](state_atom) { return state_msg{self->state.last_step, {}}; },
      [](const replay_msg&) { return std::string("a simulated device runs no logical workers"); },
      [](const move_states_msg& msg) {
        return worker_states_msg{msg.step, {}, {}, "a simulated device runs no logical workers"};
      },
      [self](const inject_msg& msg) { self->state.setup->faults.push_back(parse_fault_spec(msg.spec)); },
      [](const params_request& req) {
        req.reply->set_exception(std::make_exception_ptr(std::logic_error("a simulated device holds no parameters")));
      },
      [](drain_atom, std::int64_t) {},  // its exchanges are not overlapped
  };
}

}  // namespace dpactor
