#include "actors/device.hpp"
#include "actors/log.hpp"

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
// (See Note [Logical workers]); with PowerSGD in reproducible mode each
// slice's residual and the basis at the start of the next step (See Note
// [PowerSGD steps]).
std::vector<float> checkpoint_state(const device_setup& setup, std::int64_t last_step) {
  std::vector<float> state = setup.model->export_state();
  if (setup.workers) {
    const std::vector<float> workers = setup.workers->store().read_all(last_step + 1);
    state.insert(state.end(), workers.begin(), workers.end());
  }
  if (setup.powersgd && setup.powersgd->residuals) {
    const std::vector<float> residuals = setup.powersgd->residuals->read_all(last_step + 1);
    const std::vector<float> basis = setup.powersgd->bases->read(0, last_step + 1);
    state.insert(state.end(), residuals.begin(), residuals.end());
    state.insert(state.end(), basis.begin(), basis.end());
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
  const step_runner& runner =
      st.second_runner && st.second_runner->computed_step() == step ? *st.second_runner : *st.runner;
  if (runner.computed_step() == step)
    msg.workers.assign(runner.computed_slices().begin(), runner.computed_slices().end());
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

// Note [Overlapped delayed rounds]
// With sync.delay = 1 a round's update is applied one round late (See Note
// [Delayed rounds]): round r + 1 starts from the global weights with round
// r - 1's update applied, which round r's exchange does not change. So round
// r's exchange runs on a thread of its own while round r + 1 computes (PCCL's
// overlap: communication off the critical path). synchronize(r) updates the
// replica (`model`) on that thread; round r + 1 computes on a shadow replica
// that holds model's state with the update synchronize(r) is about to apply
// already applied (step_runner::preview_update: the same calls of the replica),
// with the other step runner, into the shadow's gradient buffers. Two shadows
// take turns, as round r's exchange reads the buffers round r computed into.
// Once round r + 1 has computed, the device waits for exchange r, makes its
// record, and compares model's parameters with the shadow's, bit for bit: where
// they differ (round r was not finite and skipped), round r + 1 is computed
// again on model, as without the overlap. Its record and its trained event
// (which the reducer acknowledges) are made only then, from model's state, so
// records and bytes are those of the run without the overlap: the same calls on
// the same values. A device may so start round r + 1 while another still
// computes round r, and may steal one of its workers: a worker's round waits
// until its round before is in the store
// (logical_worker_store::read_when_written), as the exchange made it wait
// before. The device's other messages (a snapshot, an evaluation, a new
// generation, the reducer's requests) first wait for the exchange in flight;
// after a shard message the device sends itself drain_atom, which waits for it,
// unless the next shard message, already queued, came first and overlapped it
// (the loader keeps three messages in flight in this mode: a round commits only
// once the next one computed). With a codec, a worker's round r + 1 reads
// its residual of round r, which exchange r writes before its bulk: bf16's
// after the header (the rounding is the worker's own), int8's once the block
// maxima are all-reduced (keep_residual); the round waits for it in the store
// as for a round computed elsewhere, and the rest of the exchange (the sum's
// reduce-scatter and gather) overlaps. A round not finite leaves its workers
// the state they started it from (slice_work::discard), so the next round,
// computed from the states it wrote, is computed again. Overlapped:
// rounds on CPU replicas without module buffers (which the reduced gradient
// would carry), never the run's last round (it flushes) nor a step whose
// fault perturbs the replica.

// Whether this step's exchange may run while the next step computes.
bool overlaps(const device_state& st, const step_shard& shard) {
  return st.setup->shadows[0] && st.second_runner && shard.sliced() && st.setup->workers &&
         !st.setup->workers->flushes(shard.step) && !st.runner->perturbs(shard.step);
}

// Forward and backward of a step on `on`, with `runner`.
computed_step compute_step(device_ptr self, const step_shard& shard, replica& on, step_runner& runner) {
  auto& st = self->state;
  const dataset& rows = shard.rows ? *shard.rows : *st.setup->train;
  computed_step s;
  s.step = shard.step;
  s.epoch = shard.epoch;
  s.runner = &runner;
  s.c = shard.sliced() ? runner.compute_slices(shard, on, rows, *st.setup->control, *st.group, st.setup->workers.get())
                       : runner.compute(shard, on, rows, *st.setup->control, *st.group, st.comm.get());
  // A sliced step returns nothing: what a member did not compute, another did.
  s.returned = s.c.sliced ? 0 : shard.indices.size() - s.c.done;
  return s;
}

// Before a step's exchange: the state it is carried into (for its record)
// and, across processes, its trained record acknowledged by the reducer.
void announce(device_ptr self, computed_step& s) {
  auto& st = self->state;
  replica& model = *st.setup->model;
  // See train.verify_replicas: the state as this member carries it into the
  // step, before the step's gather could make the replicas equal again.
  const bool record = st.setup->on_trained || st.setup->trained_to_reducer;
  s.carried = st.setup->verify_replicas || record ? model.state_checksum() : 0;
  s.counter = model.optimizer_steps();
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
  //
  // Note [A record before the exchange across processes]
  // A device in the reducer's own process has its record at hand, but its
  // group may span processes too (spans_processes), and such a call can end
  // on some ranks and fail on others: a worker killed after sending its part
  // to a peer and before sending its chunk here. The peer applies the step,
  // the reducer adopts the most advanced survivor's state and commits it,
  // and this member's record, made after its failed exchange, never was:
  // found once in five runs of 64 worker processes with 8 killed
  // (docs/scale.md). So in such a group every device's record goes before
  // the exchange, and the generation rule voids it as it voids a remote
  // one's. In a group of one process every rank passes a call's closing
  // barrier or none does (comms/spin_barrier.cpp), and the record still
  // follows the exchange.
  if (record && !st.halted && (st.setup->trained_to_reducer || st.group->spans_processes())) {
    trained_event e{st.setup->name, s.step, s.epoch, s.c.stats.samples, s.c.digest, s.carried, st.generation};
    s.recorded = true;
    if (!st.setup->trained_to_reducer) {
      st.setup->on_trained(e);
      return;
    }
    bool answered = false;
    std::string why = "no answer within the collective timeout";
    caf::scoped_actor waiter{self->system()};
    waiter->request(st.reducer, st.setup->collective.timeout, std::move(e))
        .receive([&](std::int64_t) { answered = true; }, [&](const caf::error& err) { why = to_string(err); });
    if (!answered)
      throw error(error_kind::internal, "the coordinator did not take the record of step " +
                                            std::to_string(s.step + 1) + ": " + why);
  }
}

// After a step's exchange: the state it leaves, and its record for the
// report (first member).
void after_exchange(device_ptr self, const computed_step& s, std::span<const float> header) {
  auto& st = self->state;
  replica& model = *st.setup->model;
  // fault spec kill:R@S, in a worker process only (validated at launch):
  // the step's gradients have left, its report has not.
  if (st.setup->remote_group && s.runner->kills_after(s.step)) ::raise(SIGKILL);
  const bool applied = s.runner->applied();
  // See Note [Non-finite steps]: stopped, this replica keeps the state of
  // the step before, for the final checkpoint.
  if (!applied && st.setup->on_nonfinite == nonfinite_policy::stop) st.halted = true;
  else st.last_step = s.step;
  st.setup->control->progress.mark(device_phase::data, s.step + 1);
  st.setup->control->progress.end_warm_up();
  if (st.rank == 0 && st.setup->latest && applied && st.setup->latest->due()) {
    st.latest_scratch.resize(st.setup->latest->parameter_count());
    model.copy_parameters(st.latest_scratch);
    st.setup->latest->publish(model.optimizer_steps(), st.latest_scratch);
  }
  const bool record = st.setup->on_trained || st.setup->trained_to_reducer;
  if (record && !st.halted && !st.setup->trained_to_reducer && !s.recorded)
    st.setup->on_trained(
        trained_event{st.setup->name, s.step, s.epoch, s.c.stats.samples, s.c.digest, s.carried, st.generation});
  if (st.rank == 0 || st.setup->verify_replicas) {
    const auto m = static_cast<std::size_t>(st.comm->size());
    step_record rec{s.step, s.epoch, static_cast<double>(header[h_loss]),
                    static_cast<std::int64_t>(header[h_correct]), static_cast<std::int64_t>(header[h_samples]), s.carried,
                    s.counter, {}, {}, {}};
    const auto times = header.subspan(h_members, m), samples = header.subspan(h_members + m, m),
               back = header.subspan(h_members + 2 * m, m);
    rec.compute_s.assign(times.begin(), times.end());
    rec.member_samples.assign(samples.begin(), samples.end());
    rec.member_returned.assign(back.begin(), back.end());
    rec.lr = s.runner->applied_lr();
    rec.nonfinite = static_cast<std::int64_t>(header[h_nonfinite]);
    rec.applied = applied;
    st.records.push_back(std::move(rec));
  }
}

// Waits for the exchange in flight, if any, and makes its step's record.
// Throws what the exchange threw, with st.failed_step set to its step.
void drain(device_ptr self) {
  auto& st = self->state;
  if (!st.in_flight) return;
  const std::unique_ptr<exchange_in_flight> f = std::move(st.in_flight);
  // Waiting in the exchange, as a member in the step's collective (See Note
  // [Progress-based hang detection]): a hung member is found as before.
  st.setup->control->progress.mark(device_phase::collective, f->step.step);
  f->thread.join();
  if (f->error) {
    st.failed_step = f->step.step;
    std::rethrow_exception(f->error);
  }
  after_exchange(self, f->step, f->header);
}

// Starts step s's exchange on a thread of its own, after making the next
// step's preview on the shadow that `computed_on` is not.
void launch(device_ptr self, computed_step s, replica& computed_on) {
  auto& st = self->state;
  replica& model = *st.setup->model;
  replica& next = &computed_on == st.setup->shadows[0].get() ? *st.setup->shadows[1] : *st.setup->shadows[0];
  next.import_state(model.state_buffer());
  s.runner->preview_update(s.c, next, st.setup->schedule);
  auto f = std::make_unique<exchange_in_flight>();
  f->step = std::move(s);
  f->next = &next;
  f->late.reducer = st.reducer;
  f->late.generation = st.generation;
  f->late.step = f->step.step;
  f->late.rank = st.rank;
  exchange_in_flight* raw = f.get();
  f->thread = std::thread([raw, &model, comm = st.comm.get(), options = st.setup->collective,
                           schedule = &st.setup->schedule] {
    flush_denormals_to_zero();  // the arithmetic of the actor's thread
    try {
      const std::span<const float> header = raw->step.runner->synchronize(raw->step.c, raw->step.returned, model, *comm,
                                                                          options, &raw->late, *schedule);
      raw->header.assign(header.begin(), header.end());
    } catch (...) {
      raw->error = std::current_exception();
    }
  });
  st.in_flight = std::move(f);
}

// One step of a shard message; adds its record for the report (first member).
void run_step(device_ptr self, const step_shard& shard) {
  auto& st = self->state;
  replica& model = *st.setup->model;
  if (overlaps(st, shard)) {  // See Note [Overlapped delayed rounds]
    const bool busy = st.in_flight != nullptr;
    replica& on = busy ? *st.in_flight->next : model;
    step_runner& runner = busy && st.in_flight->step.runner == &*st.runner ? *st.second_runner : *st.runner;
    computed_step s = compute_step(self, shard, on, runner);
    replica* computed_on = &on;
    if (busy) {
      const step_runner& exchanged = *st.in_flight->step.runner;
      drain(self);
      if (st.halted || st.group->aborted()) return;
      // Kept if the round before applied (else its workers' states, which
      // this round read, were set back: slice_work::discard) and left the
      // parameters the preview made.
      const std::size_t p = model.layout().parameter_size;
      if (exchanged.applied() &&
          std::equal(model.state_buffer().begin(), model.state_buffer().begin() + static_cast<std::ptrdiff_t>(p),
                     on.state_buffer().begin())) {
        st.setup->control->overlapped.fetch_add(1, std::memory_order_relaxed);
      } else {  // the same slices again, from model's parameters (their claims on the board are made)
        step_shard again = shard;
        again.board = nullptr;
        std::vector<std::uint32_t> mine(runner.computed_slices().begin(), runner.computed_slices().end());
        std::sort(mine.begin(), mine.end());
        again.own(mine);
        s = compute_step(self, again, model, runner);
        computed_on = &model;
      }
    }
    announce(self, s);
    launch(self, std::move(s), *computed_on);
    return;
  }
  drain(self);
  // See train.verify_replicas: fault perturb:R@S flips a bit of the state
  // this member carries into the step.
  if (st.runner->perturbs(shard.step)) perturb(model);
  computed_step s = compute_step(self, shard, model, *st.runner);
  if (s.returned > 0)
    self->send(st.reducer, shard_cut_msg{st.generation, shard.step, st.rank, s.c.stats.samples,
                                         {shard.indices.begin() + static_cast<std::ptrdiff_t>(s.c.done), shard.indices.end()}});
  announce(self, s);
  st.late.step = shard.step;
  const std::span<const float> header =
      st.runner->synchronize(s.c, s.returned, model, *st.comm, st.setup->collective, &st.late, st.setup->schedule);
  after_exchange(self, s, header);
}

// See bytes_msg: a device in another process than the reducer's says what
// its collectives sent, after each shard message's steps.
void send_bytes(device_ptr self) {
  auto& st = self->state;
  if (!st.reducer || st.reducer.node() == self->node()) return;
  const bytes_counter& bytes = st.setup->control->bytes;
  self->send(st.reducer, bytes_msg{bytes.sent.load(std::memory_order_relaxed),
                                   bytes.largest_call.load(std::memory_order_relaxed),
                                   st.setup->control->overlapped.load(std::memory_order_relaxed)});
}

void send_report(device_ptr self) {
  auto& st = self->state;
  send_bytes(self);
  if (st.records.empty()) return;
  self->send(st.reducer, steps_done_msg{st.generation, st.rank, std::move(st.records)});
  st.records.clear();
}

enum class outcome { done, aborted, quit };

// Runs `work` (steps of `step`, or the wait for an exchange in flight); a
// collective that failed is reported as the step's abort, anything else as
// the device's failure, which ends it. An exchange still in flight is
// waited for first, and its record kept if it succeeded.
template <class Work>
outcome guarded(device_ptr self, std::int64_t step, Work work) {
  auto& st = self->state;
  const auto settle_quietly = [&] {
    try {
      drain(self);
    } catch (...) {
      st.failed_step.reset();
    }
  };
  try {
    work();
    return outcome::done;
  } catch (const collective_error& e) {
    const std::int64_t at = std::exchange(st.failed_step, std::nullopt).value_or(step);
    settle_quietly();
    send_report(self);
    self->send(st.reducer, step_aborted_msg{st.generation, at, st.rank, e.what()});
    return outcome::aborted;
  } catch (const std::exception& e) {
    const std::int64_t at = std::exchange(st.failed_step, std::nullopt).value_or(step);
    settle_quietly();
    send_report(self);
    report_failure(self, at, e.what());
    self->quit(caf::make_error(caf::sec::runtime_error, e.what()));
    return outcome::quit;
  }
}

// Before any message but the next shard: the exchange in flight is done
// and its record sent (See Note [Overlapped delayed rounds]).
outcome settle(device_ptr self) {
  auto& st = self->state;
  if (!st.in_flight) return outcome::done;
  const outcome o = guarded(self, st.in_flight->step.step, [self] { drain(self); });
  if (o == outcome::done) send_report(self);
  return o;
}

}  // namespace

void late_reporter::on_late(std::span<const int> missing_ranks) {
  auto& st = self->state;
  self->send(st.reducer, late_msg{st.generation, step, st.rank, {missing_ranks.begin(), missing_ranks.end()}});
}

void async_late_reporter::on_late(std::span<const int> missing_ranks) {
  caf::anon_send(reducer, late_msg{generation, step, rank, {missing_ranks.begin(), missing_ranks.end()}});
}

device_actor::behavior_type device_behavior(device_ptr self, std::shared_ptr<device_setup> setup) {
  flush_denormals_to_zero();  // a detached actor is initialised on its own thread
  // Exceptions outside a step (whose own are reported as failures) end the
  // device with their message; the reducer treats that as a failure too.
  self->set_exception_handler([](std::exception_ptr& x) { return error_of(x); });
  self->state.setup = std::move(setup);
  self->state.late.self = self;
  const auto& s = *self->state.setup;
  const auto make_runner = [&s](std::optional<step_runner>& runner) {
    runner.emplace(s.id, s.faults, s.fault_seed, s.late_factor, s.late_floor_s, s.buckets);
    runner->set_nonfinite_policy(s.on_nonfinite);
    runner->set_gather_gradients(s.workers != nullptr);
    runner->set_int8_codec(s.workers != nullptr && s.workers->setup().codec == sync_codec::int8);
    runner->set_bf16_codec(s.workers != nullptr ? s.workers->setup().codec == sync_codec::bf16
                                                : s.step_codec == sync_codec::bf16);
    if (s.workers != nullptr) runner->set_fragments(s.workers->setup().fragments);
    runner->set_powersgd(s.powersgd);
  };
  make_runner(self->state.runner);
  if (s.shadows[0]) {  // See Note [Overlapped delayed rounds]
    make_runner(self->state.second_runner);
    s.workers->wait_for_previous_rounds([self] { return !self->state.group || self->state.group->aborted(); });
  }
  // See Note [Progress-based hang detection]: until its first step is done.
  s.control->progress.begin_warm_up(device_phase::data, self->state.last_step + 1);
  self->state.last_step = self->state.setup->model->optimizer_steps() - 1;
  return {
      [self](begin_generation_msg& msg) {
        auto& st = self->state;
        if (settle(self) == outcome::quit) return;
        st.generation = msg.generation;
        st.rank = msg.rank;
        st.reducer = msg.reducer;
        st.group = msg.group.local;
        st.halted = false;
        st.setup->control->progress.mark(device_phase::data, st.last_step + 1);
        if (st.setup->workers && !msg.worker_node.empty()) {  // See Note [Worker placement]
          // See Note [Moving logical workers]: before anything of the
          // generation runs.
          logical_worker_store& store = *st.setup->workers->setup().store;
          const std::size_t size = msg.moved.workers.empty() ? 0 : msg.moved.states.size() / msg.moved.workers.size();
          for (std::size_t i = 0; i < msg.moved.workers.size(); ++i)
            if (std::find(msg.moved.restart.begin(), msg.moved.restart.end(), msg.moved.workers[i]) ==
                msg.moved.restart.end())
              store.install(msg.moved.workers[i], msg.moved.step + 1,
                            {msg.moved.states.begin() + static_cast<std::ptrdiff_t>(i * size),
                             msg.moved.states.begin() + static_cast<std::ptrdiff_t>((i + 1) * size)});
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
          const auto formed = std::chrono::steady_clock::now();
          st.comm->broadcast(st.setup->model->state_buffer(), msg.state_source, st.setup->collective);
          engine_log()->debug("{}: generation {} formed and its state adopted in {:.1f} ms", st.setup->name, st.generation,
                              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - formed).count());
          progress.mark(device_phase::data, st.last_step + 1);
          st.setup->model->on_state_replaced();
          st.last_step = st.setup->model->optimizer_steps() - 1;
        } catch (const collective_error& e) {
          self->send(st.reducer, step_aborted_msg{st.generation, st.last_step + 1, st.rank, e.what()});
        }
        // See Note [Fast rounds across processes]: from the global
        // parameters just adopted (or, if the generation failed to form,
        // the replica's own: a later generation does not restart it again).
        if (st.setup->workers)
          for (const std::uint32_t k : msg.moved.restart) {
            const auto it = std::find(msg.moved.workers.begin(), msg.moved.workers.end(), k);
            const std::size_t size = msg.moved.workers.empty() ? 0 : msg.moved.states.size() / msg.moved.workers.size();
            const auto i = static_cast<std::size_t>(it - msg.moved.workers.begin());
            std::vector<float> state =
                it == msg.moved.workers.end()
                    ? st.setup->workers->store().first_state()
                    : std::vector<float>(msg.moved.states.begin() + static_cast<std::ptrdiff_t>(i * size),
                                         msg.moved.states.begin() + static_cast<std::ptrdiff_t>((i + 1) * size));
            st.setup->workers->restart(k, msg.moved.step + 1, std::move(state), st.setup->model->state_buffer());
          }
      },
      [self](const shard_msg& msg) {
        auto& st = self->state;
        for (const step_shard& shard : msg.steps) {
          // Planned for an ended generation, or the reducer is ending this one.
          if (msg.generation != st.generation || !st.group || st.group->aborted() || st.halted) break;
          if (guarded(self, shard.step, [&] { run_step(self, shard); }) != outcome::done) return;
        }
        // See Note [Overlapped delayed rounds]: done after the next shard
        // message if one is queued, else now.
        if (st.in_flight) self->send(self, drain_atom::value, st.in_flight->step.step);
        send_report(self);
      },
      [self](drain_atom, std::int64_t step) {
        if (self->state.in_flight && self->state.in_flight->step.step == step) settle(self);
      },
      [self](const evaluate_msg& msg) {
        auto& st = self->state;
        if (settle(self) != outcome::done) return;
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
        if (settle(self) != outcome::done) return;
        if (msg.generation != st.generation || !st.group || st.group->aborted()) return;
        if (st.setup->workers) {  // See Note [A checkpoint's logical workers]
          send_worker_states(self, msg.step, msg.workers);
          // See Note [Replaying a lost worker's rounds].
          if (const auto& history = st.setup->workers->setup().history) history->checkpoint_asked(msg.step);
          if (st.rank == 0) self->send(st.reducer, state_msg{msg.step, st.setup->model->export_state()});
          return;
        }
        self->send(st.reducer, state_msg{msg.step, checkpoint_state(*st.setup, msg.step)});
      },
      [self](const finish_msg&) {
        // Nothing more will come in this generation; the engine ends the actor.
        settle(self);
      },
      [self](suspend_atom) -> std::int64_t {
        settle(self);
        return self->state.last_step;
      },
      [self](const move_states_msg& msg) -> worker_states_msg {
        // See Note [Moving logical workers].
        settle(self);
        worker_states_msg out{msg.step, msg.workers, {}, {}};
        try {
          if (!self->state.setup->workers) throw std::logic_error("this device runs no logical workers");
          for (const std::uint32_t k : msg.workers) {
            const std::vector<float> one = self->state.setup->workers->store().read(k, msg.step + 1);
            out.states.insert(out.states.end(), one.begin(), one.end());
          }
        } catch (const std::exception& e) {
          out.states.clear();
          out.error = self->state.setup->name + ": " + e.what();
        }
        return out;
      },
      [self](replay_msg& msg) -> std::string {
        // See Note [Replaying a lost worker's rounds].
        settle(self);
        auto& st = self->state;
        try {
          if (!st.setup->workers) throw std::logic_error("this device runs no logical workers");
          logical_worker_runner& runner = *st.setup->workers;
          logical_worker_store& store = *runner.setup().store;
          if (msg.from_step < 0) store.install_first(msg.worker);
          else store.install(msg.worker, msg.from_step + 1, std::move(msg.state));
          std::vector<float> scratch(runner.setup().parameters);
          device_progress& progress = st.setup->control->progress;
          for (const step_shard& shard : msg.rounds) {
            runner.replay(msg.worker, shard, *st.setup->train, scratch, progress);
            progress.mark(device_phase::data, st.last_step + 1);
          }
          engine_log()->debug("{}: logical worker {} replayed from step {} through {}", st.setup->name, msg.worker,
                              msg.from_step + 2, msg.rounds.empty() ? msg.from_step + 1 : msg.rounds.back().step + 1);
          return "";
        } catch (const std::exception& e) {
          return st.setup->name + ": " + e.what();
        }
      },
      [self](state_atom) -> caf::result<state_msg> {
        settle(self);
        try {
          return state_msg{self->state.last_step, checkpoint_state(*self->state.setup, self->state.last_step)};
        } catch (const std::exception& e) {  // across processes another node holds some logical workers
          return caf::make_error(caf::sec::runtime_error, e.what());
        }
      },
      [self](const inject_msg& msg) {
        self->state.runner->add_fault(parse_fault_spec(msg.spec));
        if (self->state.second_runner) self->state.second_runner->add_fault(parse_fault_spec(msg.spec));
      },
      [self](const params_request& req) {
        auto& st = self->state;
        settle(self);
        params_reply reply;
        reply.step = st.setup->model->optimizer_steps();
        reply.values.resize(st.setup->model->layout().parameter_size);
        st.setup->model->copy_parameters(reply.values);
        req.reply->set_value(std::move(reply));
      },
  };
}

}  // namespace dpactor
