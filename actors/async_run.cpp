#include "actors/async_run.hpp"
#include "actors/async_device.hpp"
#include "actors/async_messages.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <utility>

#include <dpactor/error.hpp>

#include "actors/actor_interfaces.hpp"
#include "actors/backend.hpp"
#include "actors/log.hpp"
#include "actors/protocol.hpp"
#include "actors/writer_messages.hpp"
#include "train/async_claims.hpp"
#include "train/async_commit.hpp"
#include "train/async_merge.hpp"
#include "train/async_replay.hpp"
#include "train/event_json.hpp"
#include "train/fault_plan.hpp"
#include "train/hang_check.hpp"

namespace dpactor {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double mean_loss(const batch_stats& s) { return s.samples > 0 ? s.loss_sum / static_cast<double>(s.samples) : 0.0; }
double accuracy(const batch_stats& s) {
  return s.samples > 0 ? static_cast<double>(s.correct) / static_cast<double>(s.samples) : 0.0;
}

struct async_worker {
  std::int64_t rounds = 0;     // rounds run: the next one's key in the store
  int device = -1;             // running on it, or -1
  bool waiting = false;        // its contribution waits in the open round
  int last_device = -1;
  double throughput = 0.0;     // smoothed samples/s
  std::int64_t inner_steps = 0;  // of its last claim
  // Its account (worker_account).
  std::int64_t contributed = 0, dropped = 0, staleness = 0;
};

struct pending_contribution {
  std::size_t worker = 0;
  std::int64_t worker_round = 0;
  std::int64_t base_round = 0;
  async_claim claim;
  std::shared_ptr<const std::vector<float>> values;
  batch_stats stats;
};

struct async_reducer_state {
  job_config config;
  std::shared_ptr<const launch_plan> plan;
  std::shared_ptr<run_control> control;
  clock_type::time_point started;
  std::unique_ptr<replica> global;      // the global model and the outer optimizer's state
  std::shared_ptr<const std::vector<float>> published;  // its parameters after `round` commits
  std::optional<async_commit> rule;
  std::optional<async_claims> claims;
  std::vector<async_worker> workers;
  std::vector<caf::actor> devices;      // every device the run has had, by number
  std::vector<int> device_worker;       // the worker each device runs, or -1
  // See Note [Async faults]: a device's round in flight (its claim, to give
  // back if the device is lost), whether it is a member still, and whether
  // it leaves once its round is in.
  std::vector<std::optional<pending_contribution>> in_flight;
  std::vector<bool> live, leaving;
  // See Note [Async rounds across processes]: the devices in other
  // processes, and every device's name.
  std::vector<bool> remote;
  std::vector<std::string> names;
  std::vector<std::shared_ptr<async_device_watch>> watches;  // by device: its progress
  std::deque<double> inner_step_s;  // recent rounds' seconds per inner step, for the automatic hang timeout
  std::vector<fault_spec> membership_faults;  // join and leave, not yet applied
  std::int64_t lost_rounds = 0;
  checkpoint_writer_actor writer;  // none without train.checkpoint_dir
  bool ending = false;             // the last checkpoint is being written; the run ends after it
  std::string last_checkpoint;
  std::string decisions;  // every round_decision record so far, JSON Lines: checkpoints hold them
  std::int64_t generation = 0;  // membership changes, for membership events
  std::vector<pending_contribution> arrived;  // in arrival order
  std::int64_t round = 0;               // committed rounds; the open one is this
  clock_type::time_point opened;
  bool running = false;
  bool balance = true;  // straggler.policy balances: H_k follows throughput
  // See Note [Async replay]: what the first decision records, and the record
  // being followed, with the global weights its rounds still start from.
  std::string job_identity, data_fingerprint;
  bool recorded_identity = false;
  std::optional<async_replay> replay;
  std::map<std::int64_t, std::shared_ptr<const std::vector<float>>> bases;
  double last_lr = 0.0;  // the last round's outer rate
  // Reporting.
  batch_stats since_event;
  // Each open epoch's training statistics, by the epoch of the samples (a
  // round of the next epoch may commit before the last of this one's).
  std::map<std::int64_t, batch_stats> epoch_train;
  std::int64_t samples = 0, samples_at_event = 0;
  clock_type::time_point event_time, epoch_time, train_start;
  // When each open epoch's first claim was handed out: its seconds run from
  // there to its last commit (the next epoch's claims start before this
  // one's last commit, and may all commit before it).
  std::map<std::int64_t, clock_type::time_point> epoch_started;
  std::int64_t epochs_done = 0, epoch_rounds = 0, requeued = 0, bytes_sent = 0;
  double last_test_loss = std::numeric_limits<double>::quiet_NaN();
  double last_test_accuracy = std::numeric_limits<double>::quiet_NaN();
  std::int64_t last_evaluated_round = -1;
  std::vector<std::uint32_t> test_rows;
  static inline const char* name = "dpactor.async_reducer";
};

using reducer_ptr = caf::stateful_actor<async_reducer_state>*;

std::size_t parameters(const async_reducer_state& st) { return st.global->layout().parameter_size; }

// The outer rate of a round that merged `samples` (See Note [Async merge]).
double outer_rate(const async_reducer_state& st, double samples) {
  return async_outer_rate(st.plan->outer_optimizer.lr, st.config.sync.outer_lr > 0.0, samples,
                          static_cast<double>(st.plan->shape.every * st.plan->shape.batch));
}

void publish(async_reducer_state& st) {
  auto p = std::make_shared<std::vector<float>>(parameters(st));
  st.global->copy_parameters(*p);
  st.published = std::move(p);
}

// See Note [Async checkpoints]: the global state after `round` committed
// rounds, each worker's state at the start of its first round not decided
// (its round in flight or waiting is trained again after a resume), and the
// claims with those rounds' claims given back.
write_checkpoint_msg checkpoint_of(const async_reducer_state& st) {
  write_checkpoint_msg m;
  m.step = st.round - 1;  // the writer records step + 1: the committed rounds
  m.epoch = st.epochs_done;
  m.state = st.global->export_state();
  std::vector<async_claim> outstanding;
  std::vector<std::int64_t> first_undecided(st.workers.size());
  for (std::size_t k = 0; k < st.workers.size(); ++k) first_undecided[k] = st.workers[k].rounds;
  const auto undecided = [&](const pending_contribution& p) {
    outstanding.push_back(p.claim);
    first_undecided[p.worker] = std::min(first_undecided[p.worker], p.worker_round);
  };
  for (const auto& p : st.in_flight)
    if (p) undecided(*p);
  for (const pending_contribution& p : st.arrived) undecided(p);
  const logical_worker_store& store = *st.plan->rounds->store;
  for (std::size_t k = 0; k < st.workers.size(); ++k) {
    const std::vector<float> w = store.read(k, first_undecided[k]);
    m.state.insert(m.state.end(), w.begin(), w.end());
  }
  m.position.epoch = st.epochs_done;
  m.position.async = st.claims->position(outstanding);
  m.decisions = st.decisions;
  return m;
}

void finish(reducer_ptr self, bool stopped);
void fail(reducer_ptr self, const std::string& what);

// Writes a checkpoint (train.checkpoint_dir); with `ending`, the run ends
// once it is written: finished, stopped, or failed with `failure`.
void write_checkpoint(reducer_ptr self, bool ending, bool stopped = false, std::string failure = {}) {
  auto& st = self->state;
  if (!st.writer || (ending && st.ending)) return;
  if (ending) st.ending = true;
  const std::int64_t round = st.round;
  // Writing takes as long as the disk does: no timeout.
  self->request(st.writer, caf::infinite, checkpoint_of(st))
      .then(
          [self, ending, stopped, failure, round](const checkpoint_written_msg& written) {
            auto& st = self->state;
            if (!written.error.empty()) {
              fail(self, (failure.empty() ? "" : failure + "; ") + "no checkpoint written: " + written.error);
              return;
            }
            engine_log()->info("checkpoint written: {}", written.path);
            st.last_checkpoint = written.path;
            st.control->emit(checkpoint_event{round, written.path, -1});
            if (!ending) return;
            st.ending = false;
            if (!failure.empty()) fail(self, failure + "; checkpoint written to " + written.path);
            else finish(self, stopped);
          },
          [self, failure](const caf::error& err) {
            fail(self, (failure.empty() ? "" : failure + "; ") + "the checkpoint writer failed: " +
                           self->system().render(err));
          });
}

// The test set on the global model.
batch_stats evaluate(async_reducer_state& st) {
  const dataset& test = *st.plan->data.test;
  if (st.test_rows.size() != test.rows) {
    st.test_rows.resize(test.rows);
    std::iota(st.test_rows.begin(), st.test_rows.end(), 0u);
  }
  batch_stats s;
  const std::size_t step = st.global->max_rows();
  for (std::size_t at = 0; at < test.rows; at += step) {
    const std::span<const std::uint32_t> rows(st.test_rows.data() + at, std::min(step, test.rows - at));
    s += st.global->evaluate(test.batch(rows));
  }
  st.last_evaluated_round = st.round;
  st.last_test_loss = mean_loss(s);
  st.last_test_accuracy = accuracy(s);
  return s;
}

double fastest(const async_reducer_state& st) {
  double best = 0.0;
  for (const async_worker& w : st.workers) best = std::max(best, w.throughput);
  return best;
}

spawned_device spawn_async_device(caf::actor_system& system, const job_config& config, const launch_plan& plan,
                                  const std::shared_ptr<run_control>& control, int id, caf::actor reducer) {
  auto setup = make_device_setup(config, plan, id);
  if (config.train.record_trained) setup->on_trained = [control](const trained_event& e) { control->emit(e); };
  auto watch = std::make_shared<async_device_watch>();
  return {system.spawn<caf::detached>(async_device, std::move(setup), std::move(reducer), watch), watch};
}

// A device becomes a member (at the start, or joining): watched, so that its
// failure is seen, and its progress read, so that its hang is (See Note
// [Async faults]).
// A device in another process (See Note [Async rounds across processes])
// has no watch the reducer can read; it gets its fault specs in a message.
void add_device(reducer_ptr self, spawned_device device, std::string name, bool remote = false) {
  auto& st = self->state;
  self->monitor(device.actor);
  if (remote)
    for (const fault_spec& f : st.plan->faults)
      if (is_device_fault(f) && static_cast<std::size_t>(f.device) == st.devices.size())
        self->send(device.actor, inject_msg{f.text});
  st.watches.push_back(device.watch ? std::move(device.watch) : std::make_shared<async_device_watch>());
  st.devices.push_back(std::move(device.actor));
  st.device_worker.push_back(-1);
  st.in_flight.emplace_back();
  st.live.push_back(true);
  st.leaving.push_back(false);
  st.remote.push_back(remote);
  st.names.push_back(std::move(name));
}

std::size_t live_devices(const async_reducer_state& st) {
  return static_cast<std::size_t>(std::count(st.live.begin(), st.live.end(), true));
}

// Gives device d a round of a worker that is free: its own worker first.
void dispatch(reducer_ptr self, std::size_t d) {
  auto& st = self->state;
  if (!st.running || st.ending || !st.live[d] || st.leaving[d] || st.device_worker[d] >= 0) return;
  std::optional<std::size_t> pick;
  auto free = [&](std::size_t k) {
    if (st.workers[k].device >= 0 || st.workers[k].waiting) return false;
    if (!st.replay) return true;
    // See Note [Async replay]: its next recorded round, once its base is committed.
    const round_contribution* next = st.replay->next_round(k);
    return next != nullptr && next->base_round <= st.round;
  };
  // One worker a device (or fewer): each stays on its device, so that its
  // measured throughput is its device's. More workers than devices: the
  // free worker that has run the fewest rounds.
  for (std::size_t k = 0; k < st.workers.size() && !pick; ++k)
    if (free(k) && st.workers[k].last_device == static_cast<int>(d)) pick = k;
  for (std::size_t k = 0; k < st.workers.size() && !pick; ++k)
    if (free(k) && st.workers[k].last_device < 0) pick = k;
  if (!pick && st.workers.size() > live_devices(st))
    for (std::size_t k = 0; k < st.workers.size(); ++k)
      if (free(k) && (!pick || st.workers[k].rounds < st.workers[*pick].rounds)) pick = k;
  if (!pick) return;
  async_worker& w = st.workers[*pick];
  const round_shape& shape = st.plan->shape;
  async_round_msg m;
  m.worker = *pick;
  std::optional<async_claim> claim;
  if (st.replay) {
    const round_contribution& next = *st.replay->next_round(*pick);
    const auto base = st.bases.find(next.base_round);
    if (next.worker_round != w.rounds || base == st.bases.end())
      throw std::logic_error("async replay: worker " + std::to_string(*pick) + "'s round " +
                             std::to_string(next.worker_round) + " from round " + std::to_string(next.base_round) +
                             " cannot start");
    claim = st.claims->claim_at(next.epoch, next.first, static_cast<std::size_t>(next.samples));
    w.inner_steps = (next.samples + shape.worker_batch() - 1) / shape.worker_batch();
    m.base_round = next.base_round;
    m.global = base->second;
    st.replay->handed_out(*pick);
  } else {
    w.inner_steps = st.balance ? async_inner_steps(shape.every, w.throughput, fastest(st)) : shape.every;
    claim = st.claims->claim(static_cast<std::size_t>(w.inner_steps * shape.worker_batch()));
    if (!claim) return;  // every sample is handed out
    m.base_round = st.round;
    m.global = st.published;
  }
  st.epoch_started.try_emplace(claim->epoch, clock_type::now());
  m.worker_round = w.rounds++;
  // See Note [Round data]: where the claim's first inner step falls on the
  // inner schedule, as in diloco: epoch x inner steps of an epoch + its
  // place in the epoch's order over the global batch.
  m.first_position = static_cast<double>(claim->epoch * shape.inner_steps_per_epoch()) +
                     static_cast<double>(claim->first) / static_cast<double>(shape.batch);
  m.claim = std::move(*claim);
  w.device = static_cast<int>(d);
  w.last_device = static_cast<int>(d);
  st.device_worker[d] = static_cast<int>(*pick);
  st.in_flight[d] = pending_contribution{*pick, m.worker_round, m.base_round, m.claim, nullptr, {}};
  if (st.remote[d]) {  // See Note [Async rounds across processes]
    // Its progress as its relay reports it, from now: the first round
    // gets the first-step bound.
    device_progress& progress = st.watches[d]->progress;
    if (progress.read().step < 0) progress.begin_warm_up(device_phase::forward, m.worker_round);
    else progress.mark(device_phase::forward, m.worker_round);
    async_remote_round_msg r;
    r.device = d;
    r.worker = m.worker;
    r.worker_round = m.worker_round;
    r.base_round = m.base_round;
    r.epoch = m.claim.epoch;
    r.first = m.claim.first;
    r.rows = std::move(m.claim.rows);
    r.first_position = m.first_position;
    r.global = *m.global;
    r.state = st.plan->rounds->store->read(m.worker, m.worker_round);
    st.bytes_sent += static_cast<std::int64_t>((r.global.size() + r.state.size()) * sizeof(float));
    self->send(st.devices[d], std::move(r));
    return;
  }
  st.bytes_sent += static_cast<std::int64_t>(parameters(st) * sizeof(float));
  self->send(st.devices[d], std::move(m));
}

void dispatch_all(reducer_ptr self) {
  for (std::size_t d = 0; d < self->state.devices.size(); ++d) dispatch(self, d);
}

void finish(reducer_ptr self, bool stopped) {
  auto& st = self->state;
  if (!st.running) return;
  st.running = false;
  if (st.last_evaluated_round != st.round) evaluate(st);
  run_summary s;
  s.test_accuracy = st.last_test_accuracy;
  s.test_loss = st.last_test_loss;
  const auto now = clock_type::now();
  s.wall_s = seconds_between(st.started, now);
  s.train_s = seconds_between(st.train_start, now);
  s.samples_per_s = s.train_s > 0.0 ? static_cast<double>(st.samples) / s.train_s : 0.0;
  s.steps = st.round;
  s.epochs = st.epochs_done;
  s.samples = st.samples;
  s.requeued = st.requeued;
  s.bytes_sent = st.bytes_sent;
  s.largest_send = static_cast<std::int64_t>(parameters(st) * sizeof(float));
  s.stopped = stopped;
  s.membership_changes = st.generation - 1;  // after the start
  s.checkpoint = st.last_checkpoint;
  st.control->finish(s);
  for (const caf::actor& d : st.devices) self->send_exit(d, caf::exit_reason::user_shutdown);
  if (st.writer) self->send_exit(st.writer, caf::exit_reason::user_shutdown);
  self->quit();
}

void fail(reducer_ptr self, const std::string& what) {
  auto& st = self->state;
  if (!st.running) return;
  st.running = false;
  st.control->fail(std::make_exception_ptr(error(error_kind::training, what)));
  for (const caf::actor& d : st.devices) self->send_exit(d, caf::exit_reason::user_shutdown);
  if (st.writer) self->send_exit(st.writer, caf::exit_reason::user_shutdown);
  self->quit();
}

void emit_step(async_reducer_state& st, clock_type::time_point now) {
  step_event e;
  e.step = st.round;
  e.epoch = st.epochs_done;
  e.epoch_step = st.epoch_rounds;
  e.epoch_steps = st.plan->epoch_steps;
  e.total_steps = st.plan->run_steps;
  e.loss = mean_loss(st.since_event);
  e.accuracy = accuracy(st.since_event);
  e.lr = st.last_lr;
  const double dt = seconds_between(st.event_time, now);
  e.samples_per_s = dt > 0.0 ? static_cast<double>(st.samples - st.samples_at_event) / dt : 0.0;
  for (const async_worker& w : st.workers) {
    worker_account a;
    a.contributed = w.contributed;
    a.dropped = w.dropped;
    a.mean_staleness = w.contributed > 0 ? static_cast<double>(w.staleness) / static_cast<double>(w.contributed) : 0.0;
    a.inner_steps = w.inner_steps;
    a.samples_per_s = w.throughput;
    e.workers.push_back(a);
  }
  // The members' shares and throughput are their workers' where each device
  // runs one (worker k on device k: See dispatch).
  if (st.workers.size() == st.devices.size() && live_devices(st) == st.devices.size())
    for (const async_worker& w : st.workers) {
      e.shares.push_back(static_cast<double>(w.inner_steps) / static_cast<double>(st.plan->shape.every));
      e.throughput.push_back(w.throughput);
    }
  e.bytes_sent = st.bytes_sent;
  e.samples = st.samples;
  st.control->emit(e);
  st.since_event = {};
  st.samples_at_event = st.samples;
  st.event_time = now;
}

// Epochs all of whose samples are committed: their records, in order.
void close_epochs(async_reducer_state& st, clock_type::time_point now) {
  while (st.epochs_done < st.claims->epochs() && st.claims->epoch_done(st.epochs_done)) {
    const std::int64_t e = st.epochs_done;
    epoch_event ev;
    ev.epoch = e;
    ev.step = st.round;
    const batch_stats trained = st.epoch_train[e];
    st.epoch_train.erase(e);
    ev.train_loss = mean_loss(trained);
    ev.train_accuracy = accuracy(trained);
    const std::int64_t every = st.config.train.eval_every;
    if (every > 0 && ((e + 1) % every == 0 || e + 1 == st.claims->epochs())) {
      evaluate(st);
      ev.test_loss = st.last_test_loss;
      ev.test_accuracy = st.last_test_accuracy;
    } else {
      ev.test_loss = ev.test_accuracy = std::numeric_limits<double>::quiet_NaN();
    }
    const auto started = st.epoch_started.find(e);
    ev.seconds = seconds_between(started != st.epoch_started.end() ? started->second : st.epoch_time, now);
    if (started != st.epoch_started.end()) st.epoch_started.erase(started);
    ev.samples = static_cast<std::int64_t>(st.claims->samples());
    ev.requeued = st.claims->requeued(e);
    ev.samples_per_s = ev.seconds > 0.0 ? static_cast<double>(ev.samples) / ev.seconds : 0.0;
    if (st.since_event.samples > 0) emit_step(st, now);  // the epoch's last round, before its epoch
    st.control->emit(ev);
    st.epoch_time = clock_type::now();  // the evaluation is not the next epoch's
    st.epoch_rounds = 0;
    ++st.epochs_done;
  }
}

void open_round(reducer_ptr self) {
  auto& st = self->state;
  st.opened = clock_type::now();
  const auto wait = std::chrono::duration<double>(st.rule->deadline_s());
  self->delayed_send(self, std::chrono::duration_cast<std::chrono::microseconds>(wait), async_deadline_msg{st.round});
}

// The workers that can still contribute: running or waiting.
std::size_t alive(const async_reducer_state& st) {
  std::size_t n = 0;
  for (const async_worker& w : st.workers) n += (w.device >= 0 || w.waiting) ? 1 : 0;
  return n;
}

// A decision's record; the run's first says which job it is.
void emit_record(async_reducer_state& st, round_decision_event& record) {
  if (!std::exchange(st.recorded_identity, true)) {
    record.job = st.job_identity;
    record.data = st.data_fingerprint;
    record.workers = static_cast<std::int64_t>(st.workers.size());
  }
  if (st.writer) st.decisions += to_json(event{record}).dump() + "\n";
  st.control->emit(record);
}

round_contribution recorded(const pending_contribution& p) {
  return {static_cast<std::int64_t>(p.worker), p.worker_round, p.base_round, p.claim.epoch, p.claim.first,
          static_cast<std::int64_t>(p.claim.rows.size())};
}

void apply_membership_faults(reducer_ptr self);

// Applies a decision of the open round: drops `d.dropped`, and when it
// commits merges `d.merged` (See Note [Async rounds]); records it (See Note
// [Async replay]).
void apply(reducer_ptr self, const async_decision& d) {
  auto& st = self->state;
  round_decision_event record;
  record.round = st.round;
  record.committed = d.commit;
  const auto emit = [&] { emit_record(st, record); };
  auto take = [&](std::size_t worker) {
    const auto it = std::find_if(st.arrived.begin(), st.arrived.end(), [&](const auto& p) { return p.worker == worker; });
    if (it == st.arrived.end()) throw std::logic_error("async: worker " + std::to_string(worker) + " has no contribution waiting");
    pending_contribution p = std::move(*it);
    st.arrived.erase(it);
    st.workers[worker].waiting = false;
    return p;
  };
  for (const async_contribution& c : d.dropped) {
    pending_contribution p = take(c.worker);
    record.dropped.push_back(recorded(p));
    ++st.workers[c.worker].dropped;
    st.requeued += static_cast<std::int64_t>(p.claim.rows.size());
    engine_log()->debug("async: round {}: worker {}'s contribution from round {} is past sync.max_staleness = {}: "
                        "dropped, its {} samples go back to epoch {}",
                        st.round, c.worker, c.base_round, st.rule->rule().max_staleness, p.claim.rows.size(), p.claim.epoch);
    st.claims->give_back(std::move(p.claim));
  }
  if (!d.commit) {
    if (!record.dropped.empty()) emit();
    return;
  }
  std::vector<pending_contribution> merged;
  for (const auto& m : d.merged) {
    merged.push_back(take(m.worker));
    record.merged.push_back(recorded(merged.back()));
    ++st.workers[m.worker].contributed;
    st.workers[m.worker].staleness += m.staleness;
  }
  emit();
  const std::vector<async_leaf> leaves = merged_leaves(d, [&](std::size_t worker) {
    const auto it = std::find_if(merged.begin(), merged.end(), [&](const auto& p) { return p.worker == worker; });
    return std::span<const float>(*it->values);
  });
  std::span<float> sum = st.global->gradients();
  async_weighted_sum(st.workers.size(), leaves, sum.first(parameters(st)));
  st.last_lr = outer_rate(st, d.samples);
  st.global->update_in_place(st.last_lr, d.samples);
  publish(st);
  // The training statistics add up in worker order, not arrival order: the
  // records are then a function of the decisions, as the bytes are.
  std::sort(merged.begin(), merged.end(), [](const auto& a, const auto& b) { return a.worker < b.worker; });
  for (pending_contribution& p : merged) {
    st.claims->commit(p.claim);
    st.samples += static_cast<std::int64_t>(p.claim.rows.size());
    st.since_event += p.stats;
    st.epoch_train[p.claim.epoch] += p.stats;
  }
  ++st.round;
  ++st.epoch_rounds;
  if (st.replay) {  // the global weights the rounds still to hand out start from
    st.bases[st.round] = st.published;
    std::erase_if(st.bases, [&](const auto& b) { return b.first < std::min(st.round, st.replay->oldest_base()); });
  }
  const auto now = clock_type::now();
  const std::int64_t log_every = std::max<std::int64_t>(1, st.config.train.log_every);
  if (st.round % log_every == 0) emit_step(st, now);
  close_epochs(st, now);
  const bool last = st.claims->all_done() || (st.config.train.max_steps > 0 && st.round >= st.config.train.max_steps);
  if (last) {
    if (st.since_event.samples > 0) emit_step(st, now);
    if (st.writer) write_checkpoint(self, true);
    else finish(self, false);
    return;
  }
  const std::int64_t every = st.config.train.checkpoint_every;
  if (st.writer && every > 0 && st.round % every == 0) write_checkpoint(self, false);
  if (!st.replay) open_round(self);
  apply_membership_faults(self);
}

// The members now (live devices, in number order), with why they changed.
void emit_membership(async_reducer_state& st, const std::string& reason) {
  membership_event m;
  m.generation = st.generation++;
  m.step = st.round;
  m.reason = reason;
  for (std::size_t d = 0; d < st.devices.size(); ++d)
    if (st.live[d]) {
      m.members.push_back(st.names[d]);
      m.actor_ids.push_back(st.devices[d].id());
    }
  st.control->emit(m);
}

// See Note [Async faults]: device d is gone (failed, or left). Its round in
// flight is lost: the claim goes back to its epoch, the worker's round
// counter back to that round (its state in the store is the one the round
// started from: a round writes its state only when it ends), and the record
// says so. The worker is free for any device.
void remove_device(reducer_ptr self, std::size_t d, const std::string& reason) {
  auto& st = self->state;
  if (!st.live[d]) return;
  st.live[d] = false;
  if (std::optional<pending_contribution> lost = std::exchange(st.in_flight[d], std::nullopt)) {
    engine_log()->warn("async: {}: worker {}'s round {} from round {} is lost, its {} samples go back to epoch {}",
                       reason, lost->worker, lost->worker_round, lost->base_round, lost->claim.rows.size(),
                       lost->claim.epoch);
    async_worker& w = st.workers[lost->worker];
    w.device = -1;
    w.rounds = lost->worker_round;
    round_decision_event record;
    record.round = st.round;
    record.lost.push_back(recorded(*lost));
    emit_record(st, record);
    if (st.replay) {
      st.replay->lost(lost->worker);
    } else {
      st.requeued += static_cast<std::int64_t>(lost->claim.rows.size());
      st.claims->give_back(std::move(lost->claim));
    }
    ++st.lost_rounds;
  }
  st.device_worker[d] = -1;
  emit_membership(st, reason);
  if (live_devices(st) < static_cast<std::size_t>(std::max<std::int64_t>(1, st.config.cluster.min_devices))) {
    const std::string what = "async: " + reason + ": " + std::to_string(live_devices(st)) + " devices left, below "
                             "cluster.min_devices = " + std::to_string(st.config.cluster.min_devices);
    if (st.writer) write_checkpoint(self, true, false, what);
    else fail(self, what);
    return;
  }
  dispatch_all(self);
}

// leave:R@S: device d has no round in flight and leaves.
void leave(reducer_ptr self, std::size_t d) {
  auto& st = self->state;
  self->demonitor(st.devices[d]);
  self->send_exit(st.devices[d], caf::exit_reason::user_shutdown);
  remove_device(self, d, st.names[d] + " left");
}

void try_commit(reducer_ptr self);

// See Note [Async faults]: a device in its own work without progress for
// longer than the hang timeout is given up on, as a failed one is; the
// check runs about four times a timeout.
void check_hangs(reducer_ptr self) {
  auto& st = self->state;
  if (!st.running) return;
  std::vector<double> sorted(st.inner_step_s.begin(), st.inner_step_s.end());
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted.empty() ? 0.0 : sorted[sorted.size() / 2];
  const hang_limits limits{hang_timeout(st.config.cluster.hang_timeout_s, median), st.config.cluster.first_step_timeout_s};
  const auto now = device_progress::clock::now();
  for (std::size_t d = 0; d < st.devices.size() && st.running && !st.ending; ++d) {
    if (!st.live[d] || !st.in_flight[d]) continue;
    const device_progress::snapshot p = st.watches[d]->progress.read();
    const double stalled = stalled_alone_s(p, now, limits);
    if (stalled <= 0.0) continue;
    const std::string name = st.names[d];
    char what[160];
    std::snprintf(what, sizeof what, " hung: in %s of worker %zu's round %lld for %.1f s (hang timeout %.1f s)",
                  std::string(phase_name(p.phase)).c_str(), st.in_flight[d]->worker,
                  static_cast<long long>(st.in_flight[d]->worker_round), stalled, limits.timeout_s);
    self->demonitor(st.devices[d]);
    st.watches[d]->released = true;  // a hung fault returns, and the device exits
    self->send_exit(st.devices[d], caf::exit_reason::user_shutdown);
    remove_device(self, d, name + what);
    try_commit(self);
  }
  if (st.running) {
    const auto every = std::chrono::duration<double>(std::clamp(limits.timeout_s / 4.0, 0.01, 1.0));
    self->delayed_send(self, std::chrono::duration_cast<std::chrono::microseconds>(every), async_hang_tick_msg{});
  }
}

// join:cpu@S and leave:R@S, once round S - 1 (steps count from 1) is next.
void apply_membership_faults(reducer_ptr self) {
  auto& st = self->state;
  auto due = [&](const fault_spec& f) { return f.step - 1 <= st.round; };
  std::vector<fault_spec> now;
  std::erase_if(st.membership_faults, [&](const fault_spec& f) {
    if (!due(f)) return false;
    now.push_back(f);
    return true;
  });
  for (const fault_spec& f : now) {
    if (f.kind == fault_kind::join) {
      const int id = static_cast<int>(st.devices.size());
      add_device(self,
                 spawn_async_device(self->system(), st.config, *st.plan, st.control, id, caf::actor_cast<caf::actor>(self)),
                 device_name(st.config, id));
      emit_membership(st, st.names.back() + " joined");
    } else if (f.kind == fault_kind::leave && static_cast<std::size_t>(f.device) < st.devices.size() &&
               st.live[static_cast<std::size_t>(f.device)]) {
      const auto d = static_cast<std::size_t>(f.device);
      st.leaving[d] = true;
      if (st.device_worker[d] < 0) leave(self, d);  // else once its round is in
    }
  }
}

// See Note [Async replay]: the recorded decisions whose contributions have
// all arrived, in order.
void follow_record(reducer_ptr self) {
  auto& st = self->state;
  while (st.running) {
    const round_decision_event* next = st.replay->next_decision();
    if (next == nullptr) {  // the recorded run ended here (it was stopped, or its checkpoint was taken)
      if (st.writer) write_checkpoint(self, true, true);
      else finish(self, true);
      return;
    }
    const auto here = [&](const round_contribution& c) {
      return std::any_of(st.arrived.begin(), st.arrived.end(), [&](const pending_contribution& p) {
        return static_cast<std::int64_t>(p.worker) == c.worker && p.worker_round == c.worker_round;
      });
    };
    if (!std::all_of(next->merged.begin(), next->merged.end(), here) ||
        !std::all_of(next->dropped.begin(), next->dropped.end(), here))
      return;
    if (next->round != st.round)
      throw std::logic_error("async replay: a decision of round " + std::to_string(next->round) + " in round " +
                             std::to_string(st.round));
    if (!next->lost.empty()) {  // the recorded run lost these rounds: their claims went back
      round_decision_event record = *next;
      record.job.clear();
      record.data.clear();
      record.workers = 0;
      for (const round_contribution& c : next->lost) {
        st.requeued += c.samples;
        st.claims->give_back(st.claims->claim_at(c.epoch, c.first, static_cast<std::size_t>(c.samples)));
      }
      st.replay->applied();
      emit_record(st, record);
      continue;
    }
    async_decision d;
    d.commit = next->committed;
    for (const round_contribution& c : next->merged) {
      const std::int64_t staleness = next->round - c.base_round;
      const auto n = static_cast<double>(c.samples);
      d.merged.push_back({static_cast<std::size_t>(c.worker), staleness, n, async_weight(n, staleness)});
      d.samples += n;
    }
    for (const round_contribution& c : next->dropped)
      d.dropped.push_back({static_cast<std::size_t>(c.worker), c.base_round, static_cast<double>(c.samples)});
    st.replay->applied();
    apply(self, d);
  }
}

// See Note [Async rounds]: asks the rule (or the record being replayed),
// drops, commits.
void try_commit(reducer_ptr self) {
  auto& st = self->state;
  if (!st.running || st.ending) return;
  if (st.replay) {
    follow_record(self);
  } else if (!st.arrived.empty()) {
    std::vector<async_contribution> arrived;
    for (const pending_contribution& p : st.arrived)
      arrived.push_back({p.worker, p.base_round, static_cast<double>(p.claim.rows.size())});
    apply(self, st.rule->decide(st.round, arrived, alive(st), seconds_between(st.opened, clock_type::now())));
  }
  dispatch_all(self);
}

// A device's contribution is in (See Note [Async rounds]).
void contribution_arrived(reducer_ptr self, async_contribution_msg& m) {
  auto& st = self->state;
  if (!st.running || st.ending) return;  // ending: the checkpoint gave its round back
  if (!m.error.empty()) {
    fail(self, "async: " + m.error);
    return;
  }
  if (!st.live[m.device]) return;  // lost meanwhile: its round went back already
  st.device_worker[m.device] = -1;
  st.in_flight[m.device].reset();
  async_worker& w = st.workers[m.worker];
  w.device = -1;
  w.waiting = true;
  const double rate = m.seconds > 0.0 ? static_cast<double>(m.claim.rows.size()) / m.seconds : 0.0;
  const auto inner = static_cast<double>((m.claim.rows.size() + st.plan->shape.worker_batch() - 1) /
                                         st.plan->shape.worker_batch());
  st.inner_step_s.push_back(m.seconds / std::max(1.0, inner));
  if (st.inner_step_s.size() > 64) st.inner_step_s.pop_front();
  const double a = st.config.straggler.smoothing;
  w.throughput = w.throughput > 0.0 ? a * rate + (1.0 - a) * w.throughput : rate;
  st.bytes_sent += static_cast<std::int64_t>(parameters(st) * sizeof(float));
  // The deadline learns from fresh arrivals: seconds from their round's opening.
  if (m.base_round == st.round) st.rule->record_arrival(seconds_between(st.opened, clock_type::now()));
  st.arrived.push_back({m.worker, m.worker_round, m.base_round, std::move(m.claim), std::move(m.values), m.stats});
  if (st.leaving[m.device]) leave(self, m.device);
  try_commit(self);
  dispatch_all(self);
}

caf::behavior async_reducer(reducer_ptr self, job_config config, std::shared_ptr<const launch_plan> plan,
                            std::shared_ptr<run_control> control, clock_type::time_point started,
                            std::shared_ptr<async_record> record, checkpoint_writer_actor writer) {
  auto& st = self->state;
  // An exception here is a bug: the run ends with it, never hangs.
  self->set_exception_handler([self](std::exception_ptr& x) -> caf::error {
    std::string what = "an unknown exception";
    try {
      std::rethrow_exception(x);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    const bool running = self->state.running;
    self->state.running = false;
    if (running) self->state.control->fail(std::make_exception_ptr(error(error_kind::internal, "async: the reducer failed: " + what)));
    for (const caf::actor& d : self->state.devices) self->send_exit(d, caf::exit_reason::user_shutdown);
    return caf::exit_reason::unhandled_exception;
  });
  st.config = std::move(config);
  st.plan = std::move(plan);
  st.control = std::move(control);
  st.started = started;
  st.writer = std::move(writer);
  const job_config& c = st.config;
  job_config outer = c;
  outer.optimizer = st.plan->outer_optimizer;
  const replica_shape shape{static_cast<std::size_t>(c.train.micro_batch), st.plan->data.train->feature_count,
                            st.plan->blas_threads};
  st.global = make_replica(outer, shape, 0, st.plan->torch_factory);
  st.global->import_state(*st.plan->initial_state);
  publish(st);
  const auto K = static_cast<std::size_t>(st.plan->shape.workers);
  async_rule rule;
  rule.quorum = static_cast<std::size_t>(c.sync.quorum_of(static_cast<std::int64_t>(K)));
  rule.max_staleness = c.sync.max_staleness;
  rule.grace_s = c.sync.grace_ms / 1000.0;
  rule.mad_factor = 3.0;
  st.rule.emplace(rule);
  st.workers.resize(K);
  // See Note [Async checkpoints]: a resumed run goes on from the
  // checkpoint's claims and committed rounds; every worker's next round is
  // numbered from there (the store holds their states at that round).
  if (st.plan->resume_position && st.plan->resume_position->async.active) {
    const async_position& at = st.plan->resume_position->async;
    st.claims.emplace(st.plan->data.train->rows, static_cast<std::uint64_t>(c.train.seed), c.train.shuffle,
                      c.train.epochs, at);
    st.round = st.plan->start_step;
    st.epochs_done = at.done;
    for (async_worker& w : st.workers) w.rounds = st.plan->start_step;
  } else {
    st.claims.emplace(st.plan->data.train->rows, static_cast<std::uint64_t>(c.train.seed), c.train.shuffle,
                      c.train.epochs);
  }
  st.job_identity = std::move(record->job);
  st.data_fingerprint = std::move(record->data);
  if (record->replay) {
    st.replay = std::move(record->replay);
    st.bases[0] = st.published;
  }
  st.balance = c.straggler.policy == straggler_policy::balance || c.straggler.policy == straggler_policy::balance_cut;
  for (const fault_spec& f : st.plan->faults)
    if (f.kind == fault_kind::join || f.kind == fault_kind::leave) st.membership_faults.push_back(f);
  // See Note [Async faults]: a device that ends on its own has failed.
  self->set_down_handler([self](caf::down_msg& m) {
    auto& st = self->state;
    if (!st.running || st.ending) return;
    for (std::size_t d = 0; d < st.devices.size(); ++d)
      if (st.devices[d].address() == m.source && st.live[d]) {
        // An injected failure's reason is a runtime_error with its text.
        std::string why = self->system().render(m.reason);
        if (m.reason.context().match_elements<std::string>()) why = m.reason.context().get_as<std::string>(0);
        remove_device(self, d, st.names[d] + " failed: " + why);
        try_commit(self);  // the quorum of the workers still alive may be there now
        return;
      }
  });
  return {
      [self](start_atom) {
        auto& st = self->state;
        if (st.running) return;
        st.running = true;
        st.train_start = st.event_time = st.epoch_time = clock_type::now();
        emit_membership(st, "start");
        // A resumed run that had ended: nothing left to train.
        if (st.claims->all_done() || (st.config.train.max_steps > 0 && st.round >= st.config.train.max_steps)) {
          engine_log()->info("async: every round of the run is committed already (round {}): nothing to train", st.round);
          finish(self, false);
          return;
        }
        engine_log()->info("async: {} logical workers on {} devices, a round commits with {} of them or at its "
                           "deadline (at least {} ms), contributions at most {} rounds old",
                           st.workers.size(), st.devices.size(), st.rule->rule().quorum, st.config.sync.grace_ms,
                           st.rule->rule().max_staleness);
        open_round(self);
        apply_membership_faults(self);
        dispatch_all(self);
        check_hangs(self);
      },
      [self](stop_atom) {  // a stopped run leaves a checkpoint to resume from
        if (self->state.writer) write_checkpoint(self, true, true);
        else finish(self, true);
      },
      [self](async_devices_msg& m) {
        for (spawned_device& d : *m.devices) {
          const int id = static_cast<int>(self->state.devices.size());
          add_device(self, std::move(d), device_name(self->state.config, id));
        }
      },
      // See Note [Async rounds across processes]: a worker process's
      // devices, before the start or joining during training.
      [self](node_joined_msg& m) {
        auto& st = self->state;
        if (st.ending) return;
        for (std::size_t i = 0; i < m.devices.size(); ++i) {
          add_device(self, {caf::actor_cast<caf::actor>(m.devices[i]), nullptr}, m.names[i], true);
          if (st.running) emit_membership(st, m.names[i] + " joined");
        }
        if (st.running) dispatch_all(self);
      },
      // A device in another process's progress, by its relay: what the
      // reducer's watch of it says from now (a report of an earlier round,
      // overtaken by this one's start, is not).
      [self](const async_progress_msg& m) {
        auto& st = self->state;
        const auto d = static_cast<std::size_t>(m.device);
        if (d >= st.devices.size() || !st.remote[d] || !st.live[d]) return;
        if (st.in_flight[d] && st.in_flight[d]->worker_round != m.step) return;
        device_progress& progress = st.watches[d]->progress;
        if (m.warming) {
          progress.begin_warm_up(static_cast<device_phase>(m.phase), m.step);
        } else {
          progress.end_warm_up();
          progress.mark(static_cast<device_phase>(m.phase), m.step);
        }
      },
      [self](trained_event& e) {  // a device in another process's own record
        if (self->state.running) self->state.control->emit(std::move(e));
      },
      [self](async_remote_contribution_msg& m) {
        auto& st = self->state;
        const auto d = static_cast<std::size_t>(m.device);
        if (!st.running || st.ending || d >= st.devices.size() || !st.live[d] || !st.in_flight[d]) return;
        const pending_contribution& p = *st.in_flight[d];
        if (p.worker != m.worker || p.worker_round != m.worker_round)
          throw std::logic_error("async: " + st.names[d] + " sent worker " + std::to_string(m.worker) + "'s round " +
                                 std::to_string(m.worker_round) + " while it ran worker " + std::to_string(p.worker) +
                                 "'s round " + std::to_string(p.worker_round));
        async_contribution_msg c;
        c.device = d;
        c.worker = p.worker;
        c.worker_round = p.worker_round;
        c.base_round = p.base_round;
        c.claim = p.claim;
        c.stats = batch_stats{m.loss_sum, m.correct, m.samples};
        c.seconds = m.seconds;
        c.error = std::move(m.error);
        if (c.error.empty()) {
          if (m.values.size() != parameters(st) || m.state.empty())
            throw std::logic_error("async: " + st.names[d] + " sent a contribution of " + std::to_string(m.values.size()) +
                                   " floats for " + std::to_string(parameters(st)) + " parameters");
          st.watches[d]->progress.end_warm_up();  // its first round is done, if it was that
          // Its state after the round, kept where every worker's is.
          st.bytes_sent += static_cast<std::int64_t>(m.state.size() * sizeof(float));
          st.plan->rounds->store->write(p.worker, p.worker_round, std::move(m.state));
          c.values = std::make_shared<const std::vector<float>>(std::move(m.values));
        }
        contribution_arrived(self, c);
      },
      [self](async_hang_tick_msg) { check_hangs(self); },
      [self](async_deadline_msg m) {
        if (m.round == self->state.round) try_commit(self);
      },
      [self](async_contribution_msg& m) { contribution_arrived(self, m); },
  };
}

}  // namespace

async_run spawn_async_run(caf::actor_system& system, const job_config& config, std::shared_ptr<const launch_plan> plan,
                          std::shared_ptr<run_control> control, std::chrono::steady_clock::time_point started,
                          async_record record, std::shared_ptr<const checkpoint_writer_setup> writer_setup) {
  async_run run;
  checkpoint_writer_actor writer;
  if (writer_setup) writer = system.spawn<caf::detached>(checkpoint_writer_behavior, std::move(writer_setup));
  run.writer = caf::actor_cast<caf::actor>(writer);
  run.reducer = system.spawn<caf::detached>(async_reducer, config, plan, control, started,
                                            std::make_shared<async_record>(std::move(record)), writer);
  auto devices = std::make_shared<std::vector<spawned_device>>();
  for (int d = 0; d < plan->replicas; ++d) {
    devices->push_back(spawn_async_device(system, config, *plan, control, d, run.reducer));
    run.devices.push_back(devices->back().actor);
  }
  caf::anon_send(run.reducer, async_devices_msg{std::move(devices)});
  return run;
}

}  // namespace dpactor
