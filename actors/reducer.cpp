#include "actors/reducer.hpp"

#include <algorithm>
#include <cmath>


#include <dpactor/error.hpp>
#include "actors/log.hpp"

namespace dpactor {
namespace {

using clock_type = reducer_state::clock;
using phase = reducer_state::phase;

// How often the reducer looks for hung members.
constexpr auto tick_interval = std::chrono::milliseconds(20);
// See Note [A collective that fails in every generation].
constexpr int max_unblamed_failures = 5;
// Shares are re-sent to the loader when one moves by more than this.
constexpr double share_resend_threshold = 0.01;

// Note [A failing run waits for its checkpoint writes]
// A run that fails (a lost worker process, a reducer error, ...) ends the
// engine, and with it the checkpoint writer: the engine's teardown lets a
// write in progress finish (within its bound) but nobody hears of it (no
// checkpoint event, no log line), and a write queued behind it never
// starts. So the failure stops the training at once
// (the group is aborted, nothing more commits) but is reported only when
// the writes in flight have finished, or after failing_write_wait, whichever
// comes first: a disk that hangs must not hang the failure too.
constexpr auto failing_write_wait = std::chrono::seconds(30);

bool writes_in_flight(const reducer_state& st) {
  return std::any_of(st.checkpoints.begin(), st.checkpoints.end(), [](const auto& c) { return c.second.sent; });
}

void end_failing_run(reducer_ptr self, bool timed_out) {
  auto& st = self->state;
  if (!st.failing.error || (!timed_out && writes_in_flight(st))) return;
  if (timed_out && writes_in_flight(st))
    engine_log()->warn("the run ends while a checkpoint is still being written (it waits at most {} s)",
                       std::chrono::duration_cast<std::chrono::seconds>(failing_write_wait).count());
  st.setup.control->fail(std::exchange(st.failing.error, nullptr));
}

// The members that have not left, in rank order ("cpu:0", "node/cpu:1").
std::vector<std::string> member_names(const reducer_state& st) {
  std::vector<std::string> names;
  for (const auto& m : st.members->members())
    if (!m.gone) names.push_back(m.name);
  return names;
}

double seconds(clock_type::duration d) { return std::chrono::duration<double>(d).count(); }

bool accepting_reports(const reducer_state& st, std::int64_t generation) {
  return generation == st.plan.generation && !st.failed && (st.current == phase::running || st.current == phase::pausing);
}

void try_write_checkpoint(reducer_ptr self, std::int64_t step) {
  auto& st = self->state;
  auto it = st.checkpoints.find(step);
  if (it == st.checkpoints.end() || it->second.sent || !it->second.state || !it->second.position || !st.setup.writer) return;
  auto& workers = it->second.workers;
  if (workers.size() < st.setup.logical_workers) return;  // See Note [A checkpoint's logical workers]
  it->second.sent = true;
  // See Note [Replaying a lost worker's rounds]: across processes, the
  // newest backups (abort_remote: other processes take part).
  if (st.setup.abort_remote)
    for (const auto& [k, one] : workers) st.backups.insert_or_assign(k, std::pair{step, one});
  for (auto& [k, one] : workers) it->second.state->insert(it->second.state->end(), one.begin(), one.end());
  workers.clear();
  write_checkpoint(self, write_checkpoint_msg{step, it->second.position->epoch, false, std::move(*it->second.state),
                                              *it->second.position});
}

// A checkpoint on disk: the log, the summary and an event say so. Also the
// checkpoint of a run that stops on an error is an event: the metrics file
// and the service see it before the run's end.
void told_written(reducer_ptr self, const checkpoint_written_msg& msg) {
  auto& st = self->state;
  engine_log()->info("checkpoint written: {}", msg.path);
  st.book->summary().checkpoint = msg.path;
  st.last_checkpoint = msg.step;
  st.setup.control->emit(checkpoint_event{msg.step + 1, msg.path, msg.committed_sequence});
}

void on_checkpoint_written(reducer_ptr self, const checkpoint_written_msg& msg) {
  auto& st = self->state;
  st.checkpoints.erase(msg.step);
  if (st.failing.error) {  // See Note [A failing run waits for its checkpoint writes]
    if (msg.error.empty()) told_written(self, msg);
    else engine_log()->warn("the checkpoint of step {} was not written: {}", msg.step + 1, msg.error);
    end_failing_run(self, false);
    return;
  }
  if (!msg.error.empty()) {
    if (st.current == phase::stopping)
      fail_run(self, std::make_exception_ptr(training_error(st.stop_message + "; no checkpoint written: " + msg.error)));
    else
      fail_run(self, std::make_exception_ptr(checkpoint_error(msg.error)));
    return;
  }
  told_written(self, msg);
  if (st.current == phase::stopping) {
    fail_run(self, std::make_exception_ptr(training_error(st.stop_message + "; checkpoint written to " + msg.path)));
    return;
  }
  maybe_finish(self);
}

void update_shares(reducer_ptr self) {
  auto& st = self->state;
  const auto policy = st.setup.straggler.policy;
  if (policy != straggler_policy::balance && policy != straggler_policy::balance_cut) return;
  std::vector<double> shares = st.book->throughput().shares();
  bool changed = st.sent_shares.size() != shares.size();
  for (std::size_t r = 0; !changed && r < shares.size(); ++r)
    changed = std::abs(shares[r] - st.sent_shares[r]) > share_resend_threshold;
  if (!changed) return;
  st.sent_shares = shares;
  self->send(st.setup.loader, shares_msg{st.plan.generation, std::move(shares)});
}

void commit_ready_steps(reducer_ptr self) {
  auto& st = self->state;
  if (st.failed) return;
  const std::int64_t before = st.book->committed();
  step_commit commit;
  try {
    commit = st.book->commit_ready(st.members->members().size(), clock_type::now());
  } catch (const replicas_diverged& e) {
    const auto name = [&](std::int32_t rank) { return st.handle(static_cast<std::size_t>(rank)).name; };
    fail_run(self, std::make_exception_ptr(training_error(
                       "replicas diverged: " + name(e.other) + " carried a different state or step counter into step " +
                       std::to_string(e.step + 1) + " than " + name(e.rank) + " (train.verify_replicas)")));
    return;
  } catch (const nonfinite_step& e) {
    // See Note [Non-finite steps]: every member holds the step before.
    end_run(self, std::string("training stopped: ") + e.what() +
                      ": training diverged; lower optimizer.lr, or set train.on_nonfinite = \"skip\"");
    return;
  }
  for (const auto& why : commit.skipped) engine_log()->warn("{}", why);
  if (st.setup.crash_at && before < *st.setup.crash_at && st.book->committed() >= *st.setup.crash_at)
    throw error(error_kind::internal, "injected crash (fault spec crash:reducer@" + std::to_string(*st.setup.crash_at + 1) + ")");
  if (st.book->committed() > before)
    self->send(st.setup.loader, committed_msg{st.plan.generation, commit.through, std::move(commit.returned)});
  update_shares(self);
  check_pause_complete(self);
  maybe_finish(self);
}

void check_hangs(reducer_ptr self) {
  auto& st = self->state;
  if (st.failed || (st.current != phase::running && st.current != phase::pausing)) return;
  if (st.forming) return;  // waiting for moved states, under its own deadline (Note [Moving logical workers])
  if (st.work && !st.eval_outstanding) return;  // no work left
  if (st.idle) return;  // waiting for a stream's records
  // See Note [Progress-based hang detection].
  const hang_limits limits{hang_timeout(st.setup.hang_timeout_s, st.book->median_step_s()), st.setup.first_step_timeout_s};
  const auto last_commit = std::max(st.book->last_progress(), st.idle_ended);
  const auto now = clock_type::now();
  if (!stall_possible(now, last_commit, limits)) return;
  std::vector<member_progress> progress;
  for (std::size_t r = 0; r < st.members->members().size(); ++r) {
    const member& m = st.members->members()[r];
    if (!m.gone) progress.push_back({r, m.name, st.handle(r).control->progress.read()});
  }
  const std::vector<std::size_t> late = st.members->late_suspects(st.book->committed());
  const hang_verdict v = find_hang(progress, now, last_commit, limits, late);
  if (!v.stalled) return;
  char text[96];
  std::snprintf(text, sizeof text, "no progress for %.1f s (hang timeout %.1f s)", v.stalled_s, v.allowed_s);
  if (v.blameable) {
    for (const auto rank : v.suspects) handle_fault(self, rank, std::string("hung: ") + text + ": " + v.where);
    return;
  }
  // Nobody to blame: one new generation from the last committed step, in
  // case the whole machine stalled; the same stall again ends the run.
  const std::int64_t committed = st.book->committed();
  if (st.unblamed_stall_at != committed) {
    st.unblamed_stall_at = committed;
    handle_fault(self, std::nullopt, std::string(text) + " and no device to blame (" + v.where + "): retried once");
    return;
  }
  end_run(self, std::string("training stopped: ") + text + " and no device to blame, twice at step " +
                    std::to_string(committed + 2) + ": " + v.where +
                    "; raise cluster.hang_timeout_s if this is a slow step, not a hang");
}

// What every device sent, across generations (See Note [Bytes sent]): this
// process's by their counters, another process's (whose control here is a
// stand-in that counts nothing) by their last bytes_msg.
bytes_totals device_bytes(const reducer_state& st) {
  bytes_totals t;
  for (const auto& [id, h] : st.devices) {
    t.sent += h.control->bytes.sent.load(std::memory_order_relaxed);
    t.largest_call = std::max(t.largest_call, h.control->bytes.largest_call.load(std::memory_order_relaxed));
  }
  for (const auto& [device, remote] : st.remote_bytes) {
    t.sent += remote.sent;
    t.largest_call = std::max(t.largest_call, remote.largest_call);
  }
  t.sent += static_cast<std::uint64_t>(st.moved_state_bytes);  // See Note [Moving logical workers]
  return t;
}

void start(reducer_ptr self) {
  auto& st = self->state;
  std::vector<member> initial;
  for (const auto& d : st.setup.devices) {
    st.devices[d.id] = d;
    self->monitor(d.actor);
    st.next_device_id = std::max(st.next_device_id, d.id + 1);
    initial.push_back({d.id, d.name});
  }
  st.members.emplace(std::move(initial), st.setup.membership_faults);
  // Note [A resume across processes]
  // A round mode resumed by a coordinator: the checkpoint's worker states
  // are in the coordinator's store only. They are the reducer's backups,
  // and every worker's previous node is the checkpoint, a node that is not
  // alive: the first generation hands each worker to its node as for a
  // worker lost with its process, with its backup and nothing to run again
  // (the backups are at the step before the first; See Notes [Replaying a
  // lost worker's rounds] and [Fast rounds across processes]).
  if (st.setup.abort_remote && !st.setup.resumed_workers.empty() && st.setup.logical_workers > 0) {
    const std::size_t size = st.setup.resumed_workers.size() / st.setup.logical_workers;
    const auto& all = st.setup.resumed_workers;
    for (std::size_t k = 0; k < st.setup.logical_workers; ++k)
      st.backups.insert_or_assign(static_cast<std::uint32_t>(k),
                                  std::pair{st.setup.book.start_step - 1,
                                            std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(k * size),
                                                               all.begin() + static_cast<std::ptrdiff_t>((k + 1) * size))});
    st.worker_owner.assign(st.setup.logical_workers, "the resumed checkpoint");
  }
  st.setup.book.bytes = [self] { return device_bytes(self->state); };
  st.book.emplace(st.setup.book, [control = st.setup.control](const event& e) {
    if (const auto* r = std::get_if<recovery_event>(&e))
      engine_log()->info("recovered: step {} committed {:.1f} ms after the fault", r->step, r->recovery_ms);
    control->emit(e);
  }, clock_type::now());
  self->monitor(st.setup.loader);
  if (st.setup.writer) self->monitor(st.setup.writer);
  st.plan.generation = -1;
  form_generation(self, 0);
  request_graceful_change(self);  // planned joins and leaves, if any
  self->send(self, tick_atom::value);
}

}  // namespace

void maybe_finish(reducer_ptr self) {
  auto& st = self->state;
  if (st.failed || st.current != phase::running || !st.work || st.book->committed() < st.work->last_step) return;
  if (!st.final_eval_step || *st.final_eval_step != st.work->last_step) return;
  if (st.work->snapshot && st.last_checkpoint != st.work->last_step) return;
  st.book->log_last_step(clock_type::now());
  run_summary s = st.book->summary();
  s.wall_s = seconds(clock_type::now() - st.setup.started);
  s.train_s = seconds(st.book->last_commit() - st.book->started());
  s.samples_per_s = s.train_s > 0.0 ? static_cast<double>(s.samples) / s.train_s : 0.0;
  s.steps = st.book->committed() + 1;
  s.stopped = st.stop_requested;
  const bytes_totals bytes = device_bytes(st);
  s.bytes_sent = static_cast<std::int64_t>(bytes.sent);
  s.largest_send = static_cast<std::int64_t>(bytes.largest_call);
  s.overlapped_exchanges = 0;
  for (const auto& [id, h] : st.devices) s.overlapped_exchanges += h.control->overlapped.load(std::memory_order_relaxed);
  for (const auto& [device, n] : st.remote_overlapped) s.overlapped_exchanges += n;
  st.setup.control->finish(s);
}

void write_checkpoint(reducer_ptr self, write_checkpoint_msg msg) {
  const std::int64_t step = msg.step;
  // Writing takes as long as the disk does: no timeout.
  self->request(self->state.setup.writer, caf::infinite, std::move(msg))
      .then([self](const checkpoint_written_msg& written) { on_checkpoint_written(self, written); },
            [self, step](const caf::error& err) {
              on_checkpoint_written(self, {step, {}, "the checkpoint writer failed: " + caf::to_string(err)});
            });
}

void fail_run(reducer_ptr self, std::exception_ptr error) {
  auto& st = self->state;
  if (st.failed) return;
  st.failed = true;
  if (st.plan.group.local) st.plan.group.local->abort();
  if (st.setup.abort_remote) st.setup.abort_remote(st.plan.generation, "the run failed");
  if (writes_in_flight(st) && !st.setup.control->done()) {
    engine_log()->info("the run failed; waiting for the checkpoint being written");
    st.failing.error = std::move(error);
    st.failing.deadline = clock_type::now() + failing_write_wait;  // the ticks go on while it waits
    return;
  }
  st.setup.control->fail(std::move(error));
}

reducer_actor::behavior_type reducer_behavior(reducer_ptr self, reducer_setup setup) {
  self->state.setup = std::move(setup);
  // An exception here is a bug: the run ends with it, never hangs.
  self->set_exception_handler([self](std::exception_ptr& x) {
    const caf::error e = error_of(x);
    fail_run(self, std::make_exception_ptr(error(error_kind::internal, "the reducer failed: " + caf::to_string(e))));
    end_failing_run(self, true);  // the reducer ends here: nothing would wait for the writes
    return e;
  });
  self->set_down_handler([self](const caf::down_msg& msg) {
    auto& st = self->state;
    if (st.failed || st.setup.control->done()) return;
    for (const auto& [actor, name] : {std::pair{st.setup.loader.address(), "loader"},
                                      std::pair{st.setup.writer.address(), "checkpoint writer"}})
      if (actor && msg.source == actor) {
        fail_run(self, std::make_exception_ptr(error(error_kind::internal, std::string("the ") + name +
                                                                               " failed: " + caf::to_string(msg.reason))));
        return;
      }
    for (const auto& [id, h] : st.devices)
      if (h.actor.address() == msg.source)
        if (const auto rank = st.members->rank_of(id)) handle_fault(self, *rank, "exited: " + caf::to_string(msg.reason));
  });
  self->set_exit_handler([self](const caf::exit_msg& msg) {
    // Shutdown: take every device ever spawned along, joined ones included.
    for (const auto& [id, h] : self->state.devices) self->send_exit(h.actor, msg.reason);
    self->quit(msg.reason);
  });
  return {
      [self](start_atom) { start(self); },
      [self](shard_cut_msg& msg) {
        auto& st = self->state;
        // Also while recovering: a step the state source applied commits
        // without the indices this member returned, which it never trained.
        const bool recovering = st.current == phase::recovering;
        if (msg.generation != st.plan.generation || st.failed || (!accepting_reports(st, msg.generation) && !recovering))
          return;
        st.book->cut(msg.step, msg.rank, msg.returned);
        if (!recovering) commit_ready_steps(self);
      },
      [self](const late_msg& msg) {
        auto& st = self->state;
        if (!accepting_reports(st, msg.generation)) return;
        const auto cut = st.members->on_late(msg.step, msg.rank, msg.missing, st.book->committed());
        if (!st.setup.cuts) return;
        // See Note [Cutting a step short].
        for (const auto rank : cut)
          st.handle(static_cast<std::size_t>(rank)).control->cut_step.store(msg.step, std::memory_order_release);
      },
      [self](steps_done_msg& msg) {
        auto& st = self->state;
        if (!accepting_reports(st, msg.generation)) return;
        for (auto& rec : msg.steps) st.book->record(msg.rank, std::move(rec));
        commit_ready_steps(self);
      },
      [self](const evaluated_msg& msg) {
        auto& st = self->state;
        if (!accepting_reports(st, msg.generation)) return;
        if (!st.book->evaluated(msg.step, msg.epoch_end, msg.epoch, msg.loss_sum, msg.correct, msg.samples,
                                st.members->members().size(), clock_type::now()))
          return;
        self->send(st.setup.loader, eval_done_msg{msg.step, msg.epoch_end});
        st.eval_outstanding = false;
        st.final_eval_step = msg.step;
        maybe_finish(self);
      },
      [self](const epoch_ledger_msg& msg) {
        auto& st = self->state;
        st.book->epoch_closed({msg.epoch, msg.committed, msg.requeued, msg.evaluated}, clock_type::now());
        if (msg.evaluated) st.eval_outstanding = true;
      },
      [self](state_msg& msg) {
        self->state.checkpoints[msg.step].state = std::move(msg.state);
        try_write_checkpoint(self, msg.step);
      },
      [self](const bytes_msg& msg) {
        // Running totals, whatever the generation: the bytes were sent.
        bytes_totals& b = self->state.remote_bytes[caf::actor_cast<caf::actor_addr>(self->current_sender())];
        b.sent = std::max(b.sent, msg.sent);
        b.largest_call = std::max(b.largest_call, msg.largest_call);
        std::int64_t& o = self->state.remote_overlapped[caf::actor_cast<caf::actor_addr>(self->current_sender())];
        o = std::max(o, msg.overlapped);
      },
      [self](worker_states_msg& msg) {
        auto& st = self->state;
        if (!msg.error.empty()) {
          fail_run(self, std::make_exception_ptr(training_error(
                             "the checkpoint after step " + std::to_string(msg.step + 1) +
                             " cannot have its logical workers' states: " + msg.error)));
          return;
        }
        if (msg.workers.empty() || (st.last_checkpoint && msg.step <= *st.last_checkpoint)) return;
        const std::size_t size = msg.states.size() / msg.workers.size();
        auto& pending = st.checkpoints[msg.step];
        if (pending.sent) return;
        for (std::size_t i = 0; i < msg.workers.size(); ++i)
          pending.workers.try_emplace(msg.workers[i], msg.states.begin() + static_cast<std::ptrdiff_t>(i * size),
                                      msg.states.begin() + static_cast<std::ptrdiff_t>((i + 1) * size));
        try_write_checkpoint(self, msg.step);
      },
      [self](ledger_snapshot_msg& msg) {
        self->state.checkpoints[msg.step].position = std::move(msg.position);
        try_write_checkpoint(self, msg.step);
      },
      [self](const work_done_msg& msg) {
        auto& st = self->state;
        st.work = msg;
        st.book->summary().requeued = msg.requeued;
        st.eval_outstanding = true;
        maybe_finish(self);
      },
      [self](device_failed_msg& msg) {
        auto& st = self->state;
        if (!msg.state.empty() && (!st.rescue_state || st.rescue_state->first < msg.last_step))
          st.rescue_state.emplace(msg.last_step, std::move(msg.state));
        if (msg.generation != st.plan.generation || st.members->members().at(static_cast<std::size_t>(msg.rank)).gone) return;
        handle_fault(self, static_cast<std::size_t>(msg.rank), "failed: " + msg.what);
      },
      [self](const step_aborted_msg& msg) {
        // After the reducer's own abort, survivors' failed collectives are expected.
        auto& st = self->state;
        if (!accepting_reports(st, msg.generation)) return;
        const std::string what = "collective failed at step " + std::to_string(msg.step + 1) + ": " + msg.what;
        // See Note [A collective that fails in every generation].
        const std::int64_t committed = st.book->committed();
        if (st.unblamed_failures.at != committed) st.unblamed_failures = {committed, 0};
        if (++st.unblamed_failures.count > max_unblamed_failures) {
          end_run(self, "training stopped: the collective failed in " + std::to_string(st.unblamed_failures.count) +
                            " generations in a row at step " + std::to_string(committed + 2) +
                            " with no member lost (" + what + "); where many processes form a group on few cores, "
                            "raise cluster.rendezvous_timeout_s");
          return;
        }
        handle_fault(self, std::nullopt, what);
      },
      [self](const rollback_done_msg& msg) {
        self->state.book->requeued_by_fault(msg.requeued);
        self->state.book->rollback_applied(msg.committed_samples);
      },
      [self](const idle_msg& msg) {
        auto& st = self->state;
        if (msg.generation != st.plan.generation) return;
        if (st.idle && !msg.idle) st.idle_ended = clock_type::now();
        st.idle = msg.idle;
      },
      [self](const paused_msg& msg) {
        auto& st = self->state;
        if (st.current != phase::pausing || msg.generation != st.plan.generation) return;
        st.pause_point = msg.last_step;
        check_pause_complete(self);
      },
      [self](tick_atom) {
        check_hangs(self);
        expire_suspend_requests(self);
        auto& st = self->state;
        if (st.failing.error && clock_type::now() >= st.failing.deadline) end_failing_run(self, true);
        if (!st.failed || st.failing.error) self->delayed_send(self, tick_interval, tick_atom::value);
      },
      [self](const add_device_msg& msg) {
        auto& st = self->state;
        st.members->request_join();
        st.join_replies.push_back(msg.reply);
        request_graceful_change(self);
      },
      [self](const node_joined_msg& msg) {
        auto& st = self->state;
        for (std::size_t d = 0; d < msg.devices.size() && d < msg.names.size(); ++d) {
          member_handle h{msg.devices[d], st.next_device_id++, msg.names[d], std::make_shared<device_control>()};
          for (const auto& f : st.setup.remote_device_faults)
            if (f.device == h.id) self->send(h.actor, inject_msg{f.text});
          st.arrivals.push_back(std::move(h));
          st.members->request_join();
        }
        request_graceful_change(self);
      },
      [self](const remove_device_msg& msg) {
        if (!self->state.members->request_leave(msg.name)) {
          engine_log()->warn("remove_device: {} is not a member", msg.name);
          return;
        }
        request_graceful_change(self);
      },
      [self](const leave_request& msg) {
        auto& st = self->state;
        const bool member = st.members->request_leave(msg.name);
        msg.reply->set_value(leave_reply{member, member ? std::vector<std::string>{} : member_names(st)});
        if (member) request_graceful_change(self);
      },
      [self](const members_request& msg) { msg.reply->set_value(member_names(self->state)); },
      // See Note [A remote device's record arrives before its gradients]:
      // the answer lets the device go on to the step's exchange.
      [self](const trained_event& e) {
        self->state.setup.control->emit(e);
        return e.step;
      },
      [self](checkpoint_atom) { self->send(self->state.setup.loader, checkpoint_atom::value); },
      [self](const lr_msg& msg) { self->send(self->state.setup.loader, msg); },
      [self](const inject_msg& msg) {
        auto& st = self->state;
        const fault_spec f = parse_fault_spec(msg.spec);
        if (f.kind == fault_kind::crash) {
          engine_log()->warn("{}: crash specs act only when given at the start (--inject, [faults] inject)", msg.spec);
        } else if (!is_device_fault(f)) {
          st.members->plan(f);
          request_graceful_change(self);
        } else if (const auto rank = st.members->rank_of(f.device)) {
          self->send(st.handle(*rank).actor, msg);
        }
      },
      [self](stop_atom) {
        auto& st = self->state;
        if (st.stop_requested) return;
        st.stop_requested = true;
        self->send(st.setup.loader, stop_atom::value);
      },
      [self](params_request& req) {
        auto& st = self->state;
        if (st.members->members().empty()) {
          req.reply->set_exception(std::make_exception_ptr(std::runtime_error("the generation has no members")));
          return;
        }
        // High priority: answered at the member's next step boundary, ahead of
        // the shards already queued for it.
        self->send<caf::message_priority::high>(st.handle(0).actor, std::move(req));
      },
  };
}

}  // namespace dpactor
