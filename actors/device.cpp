#include "actors/device.hpp"

#include "tensors/float_env.hpp"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <chrono>
#include <numeric>
#include <stdexcept>
#include <thread>

#include <caf/scoped_actor.hpp>

#include <dpactor/error.hpp>

namespace dpactor {
namespace {

using device_ptr = device_actor::stateful_pointer<device_state>;

// What a checkpoint after `last_step` holds: the replica's state, and in the
// round modes every logical worker's state at the start of the next round
// (See Note [Logical workers]).
std::vector<float> checkpoint_state(const device_setup& setup, std::int64_t last_step) {
  std::vector<float> state = setup.model->export_state();
  if (setup.workers) {
    const std::vector<float> workers = setup.workers->store().read_all(last_step + 1);
    state.insert(state.end(), workers.begin(), workers.end());
  }
  return state;
}

// Note [A checkpoint's logical workers]
// In the round modes a checkpoint holds every logical worker's state (See
// Note [Logical workers]), and across processes each process holds only its
// node's (See Note [Worker placement]). So no member can send them all:
// every member sends the states after the round of the workers it ran in it
// (written by itself, so read after its own writes, also the ones it stole),
// and each node's first member also those of its node's workers that the
// round gave nobody (a short round's, unwritten in it) or, for a step issued
// in an earlier generation, all of its node's (the loader says which:
// snapshot_msg::workers). The reducer keeps one state a worker and writes the
// checkpoint once it has all of them and the replica's, in worker order.
void send_worker_states(device_ptr self, std::int64_t step, std::span<const std::uint32_t> also) {
  auto& st = self->state;
  worker_states_msg msg{step, {}, {}, {}};
  if (st.runner->computed_step() == step)
    msg.workers.assign(st.runner->computed_slices().begin(), st.runner->computed_slices().end());
  msg.workers.insert(msg.workers.end(), also.begin(), also.end());
  try {
    for (const std::uint32_t k : msg.workers) {
      const std::vector<float> one = st.setup->workers->store().read(k, step + 1);
      msg.states.insert(msg.states.end(), one.begin(), one.end());
    }
  } catch (const std::exception& e) {
    msg.workers.clear();
    msg.states.clear();
    msg.error = st.setup->name + ": " + e.what();
  }
  self->send(st.reducer, std::move(msg));
}

void report_failure(device_ptr self, std::int64_t step, const std::string& what) {
  auto& st = self->state;
  device_failed_msg msg{st.generation, step, st.rank, what, st.last_step, {}};
  try {
    msg.state = checkpoint_state(*st.setup, st.last_step);
  } catch (...) {
  }
  self->send(st.reducer, std::move(msg));
}

// fault spec perturb:R@S: the last bit of the first parameter flips, as a
// corrupted replica's would (a test of train.verify_replicas).
void perturb(replica& model) {
  std::vector<float> state = model.export_state();
  std::uint32_t bits;
  std::memcpy(&bits, state.data(), sizeof bits);
  bits ^= 1u;
  std::memcpy(state.data(), &bits, sizeof bits);
  model.import_state(state);
}

// One step of a shard message; adds its record for the report (first member).
void run_step(device_ptr self, const step_shard& shard) {
  auto& st = self->state;
  replica& model = *st.setup->model;
  // See train.verify_replicas: the state as this member carries it into the
  // step, before the step's gather could make the replicas equal again.
  if (st.runner->perturbs(shard.step)) perturb(model);
  const bool record = st.setup->on_trained || st.setup->trained_to_reducer;
  const std::uint64_t carried = st.setup->verify_replicas || record ? model.state_checksum() : 0;
  const std::int64_t counter = model.optimizer_steps();
  const dataset& rows = shard.rows ? *shard.rows : *st.setup->train;
  const step_runner::computed c =
      shard.sliced() ? st.runner->compute_slices(shard, model, rows, *st.setup->control, *st.group, st.setup->workers.get())
                     : st.runner->compute(shard, model, rows, *st.setup->control, *st.group, st.comm.get());
  // A sliced step returns nothing: what a member did not compute, another did.
  const std::size_t returned = c.sliced ? 0 : shard.indices.size() - c.done;
  if (returned > 0)
    self->send(st.reducer, shard_cut_msg{st.generation, shard.step, st.rank, c.stats.samples,
                                         {shard.indices.begin() + static_cast<std::ptrdiff_t>(c.done), shard.indices.end()}});
  // Note [A remote device's record arrives before its gradients]
  // A step commits with a member's samples once its gradients reached the
  // others. Sent after the exchange, the record of a device in a worker
  // process could be lost with the process (kill -9 between the two): the
  // step committed with its samples, and the devices' own account, which
  // the exactly-once tests hold against the ledger, would miss them. So it
  // is sent before the exchange and the device waits for the reducer's
  // answer (one round trip a step, only with train.record_trained): every
  // committed step's record has arrived. A step rolled back afterwards
  // leaves a record of its generation that a later generation starting at
  // or before its step voids (trained_event::generation).
  if (record && st.setup->trained_to_reducer && !st.halted) {
    trained_event e{st.setup->name, shard.step, shard.epoch, c.stats.samples, c.digest, carried, st.generation};
    bool answered = false;
    std::string why = "no answer within the collective timeout";
    caf::scoped_actor waiter{self->system()};
    waiter->request(st.reducer, st.setup->collective.timeout, std::move(e))
        .receive([&](std::int64_t) { answered = true; }, [&](const caf::error& err) { why = to_string(err); });
    if (!answered)
      throw error(error_kind::internal, "the coordinator did not take the record of step " +
                                            std::to_string(shard.step + 1) + ": " + why);
  }
  st.late.step = shard.step;
  const std::span<const float> header =
      st.runner->synchronize(c, returned, model, *st.comm, st.setup->collective, &st.late, st.setup->schedule);
  // fault spec kill:R@S, in a worker process only (validated at launch):
  // the step's gradients have left, its report has not.
  if (st.setup->remote_group && st.runner->kills_after(shard.step)) ::raise(SIGKILL);
  const bool applied = st.runner->applied();
  // See Note [Non-finite steps]: stopped, this replica keeps the state of
  // the step before, for the final checkpoint.
  if (!applied && st.setup->on_nonfinite == nonfinite_policy::stop) st.halted = true;
  else st.last_step = shard.step;
  st.setup->control->progress.mark(device_phase::data, shard.step + 1);
  st.setup->control->progress.end_warm_up();
  if (st.rank == 0 && st.setup->latest && applied && st.setup->latest->due()) {
    st.latest_scratch.resize(st.setup->latest->parameter_count());
    model.copy_parameters(st.latest_scratch);
    st.setup->latest->publish(model.optimizer_steps(), st.latest_scratch);
  }
  if (record && !st.halted && !st.setup->trained_to_reducer)
    st.setup->on_trained(trained_event{st.setup->name, shard.step, shard.epoch, c.stats.samples, c.digest, carried,
                                       st.generation});
  if (st.rank == 0 || st.setup->verify_replicas) {
    const auto m = static_cast<std::size_t>(st.comm->size());
    step_record rec{shard.step, shard.epoch, static_cast<double>(header[h_loss]),
                    static_cast<std::int64_t>(header[h_correct]), static_cast<std::int64_t>(header[h_samples]), carried,
                    counter, {}, {}, {}};
    const auto times = header.subspan(h_members, m), samples = header.subspan(h_members + m, m),
               back = header.subspan(h_members + 2 * m, m);
    rec.compute_s.assign(times.begin(), times.end());
    rec.member_samples.assign(samples.begin(), samples.end());
    rec.member_returned.assign(back.begin(), back.end());
    rec.lr = st.runner->applied_lr();
    rec.nonfinite = static_cast<std::int64_t>(header[h_nonfinite]);
    rec.applied = applied;
    st.records.push_back(std::move(rec));
  }
}

// See bytes_msg: a device in another process than the reducer's says what
// its collectives sent, after each shard message's steps.
void send_bytes(device_ptr self) {
  auto& st = self->state;
  if (!st.reducer || st.reducer.node() == self->node()) return;
  const bytes_counter& bytes = st.setup->control->bytes;
  self->send(st.reducer,
             bytes_msg{bytes.sent.load(std::memory_order_relaxed), bytes.largest_call.load(std::memory_order_relaxed)});
}

void send_report(device_ptr self) {
  auto& st = self->state;
  send_bytes(self);
  if (st.records.empty()) return;
  self->send(st.reducer, steps_done_msg{st.generation, st.rank, std::move(st.records)});
  st.records.clear();
}

}  // namespace

void late_reporter::on_late(std::span<const int> missing_ranks) {
  auto& st = self->state;
  self->send(st.reducer, late_msg{st.generation, step, st.rank, {missing_ranks.begin(), missing_ranks.end()}});
}

device_actor::behavior_type device_behavior(device_ptr self, std::shared_ptr<device_setup> setup) {
  flush_denormals_to_zero();  // a detached actor is initialised on its own thread
  // Exceptions outside a step (whose own are reported as failures) end the
  // device with their message; the reducer treats that as a failure too.
  self->set_exception_handler([](std::exception_ptr& x) { return error_of(x); });
  self->state.setup = std::move(setup);
  self->state.late.self = self;
  const auto& s = *self->state.setup;
  self->state.runner.emplace(s.id, s.faults, s.fault_seed, s.late_factor, s.late_floor_s, s.buckets);
  self->state.runner->set_nonfinite_policy(s.on_nonfinite);
  self->state.runner->set_gather_gradients(s.workers != nullptr);
  self->state.runner->set_int8_codec(s.workers != nullptr && s.workers->setup().codec == sync_codec::int8);
  self->state.runner->set_bf16_codec(s.workers != nullptr ? s.workers->setup().codec == sync_codec::bf16
                                                          : s.step_codec == sync_codec::bf16);
  if (s.workers != nullptr) self->state.runner->set_fragments(s.workers->setup().fragments);
  // See Note [Progress-based hang detection]: until its first step is done.
  s.control->progress.begin_warm_up(device_phase::data, self->state.last_step + 1);
  self->state.last_step = self->state.setup->model->optimizer_steps() - 1;
  return {
      [self](begin_generation_msg& msg) {
        auto& st = self->state;
        st.generation = msg.generation;
        st.rank = msg.rank;
        st.reducer = msg.reducer;
        st.group = msg.group.local;
        st.halted = false;
        st.setup->control->progress.mark(device_phase::data, st.last_step + 1);
        if (st.setup->workers && !msg.worker_node.empty()) {  // See Note [Worker placement]
          std::vector<std::size_t> mine;
          for (std::size_t k = 0; k < msg.worker_node.size(); ++k)
            if (msg.worker_node[k] == msg.node) mine.push_back(k);
          st.setup->workers->setup().store->hold_only(mine);
        }
        try {
          if (!st.group && st.setup->remote_group) st.group = st.setup->remote_group(msg.group, msg.size);
          if (!st.group) throw std::logic_error("a generation without a collective group (backend " + msg.group.backend + ")");
          st.comm = std::make_unique<counted_collective>(st.group->endpoint(msg.rank), st.setup->control->bytes);
          // Every member adopts the state source's parameters, optimizer state
          // and step counter (See Note [Replica state buffer]). Its first call
          // forms the group across processes (a rendezvous bounded by
          // cluster.rendezvous_timeout_s, seconds with dozens of processes):
          // set-up, so the first-step bound applies to it, not the hang
          // timeout (See Note [Progress-based hang detection]).
          device_progress& progress = st.setup->control->progress;
          const bool warming = progress.read().warming;
          progress.begin_warm_up(device_phase::collective, st.last_step + 1);
          struct warm_up_ends {
            device_progress& progress;
            bool keep;
            ~warm_up_ends() {
              if (!keep) progress.end_warm_up();
            }
          } ends{progress, warming};
          st.comm->broadcast(st.setup->model->state_buffer(), msg.state_source, st.setup->collective);
          progress.mark(device_phase::data, st.last_step + 1);
          st.setup->model->on_state_replaced();
          st.last_step = st.setup->model->optimizer_steps() - 1;
        } catch (const collective_error& e) {
          self->send(st.reducer, step_aborted_msg{st.generation, st.last_step + 1, st.rank, e.what()});
        }
      },
      [self](const shard_msg& msg) {
        auto& st = self->state;
        for (const step_shard& shard : msg.steps) {
          // Planned for an ended generation, or the reducer is ending this one.
          if (msg.generation != st.generation || !st.group || st.group->aborted() || st.halted) break;
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
          const auto slice_at = [&](std::size_t at) {
            return st.setup->test->batch(rows.subspan(at, std::min(micro, rows.size() - at)));
          };
          // See Note [Progress-based hang detection]: each batch is progress,
          // the first one is warm-up.
          device_progress& progress = st.setup->control->progress;
          progress.begin_warm_up(device_phase::evaluation, msg.step);
          if (!rows.empty()) model.prefetch(slice_at(0));
          for (std::size_t b = 0; b < rows.size(); b += micro) {
            if (b + micro < rows.size()) model.prefetch(slice_at(b + micro));
            stats += model.evaluate(slice_at(b));
            progress.end_warm_up();
            progress.mark(device_phase::evaluation, msg.step);
          }
          progress.mark(device_phase::data, msg.step + 1);
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
        if (st.setup->workers) {  // See Note [A checkpoint's logical workers]
          send_worker_states(self, msg.step, msg.workers);
          if (st.rank == 0) self->send(st.reducer, state_msg{msg.step, st.setup->model->export_state()});
          return;
        }
        self->send(st.reducer, state_msg{msg.step, checkpoint_state(*st.setup, msg.step)});
      },
      [](const finish_msg&) {
        // Nothing more will come in this generation; the engine ends the actor.
      },
      [self](suspend_atom) -> std::int64_t { return self->state.last_step; },
      [self](state_atom) -> caf::result<state_msg> {
        try {
          return state_msg{self->state.last_step, checkpoint_state(*self->state.setup, self->state.last_step)};
        } catch (const std::exception& e) {  // across processes another node holds some logical workers
          return caf::make_error(caf::sec::runtime_error, e.what());
        }
      },
      [self](const inject_msg& msg) { self->state.runner->add_fault(parse_fault_spec(msg.spec)); },
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
