// The reducer's membership authority: generations, faults, graceful joins and
// leaves, hang detection and cuts. See Note [Generations] in reducer.hpp.

#include <algorithm>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "actors/reducer.hpp"
#include "tensors/error.hpp"

namespace dpactor {
namespace {

using clock_type = reducer_state::clock;
using phase = reducer_state::phase;

// Time a stopping reducer gives a member or the loader to answer.
constexpr auto stop_request_timeout = std::chrono::seconds(30);
// Least time survivors get to answer after an abort.
constexpr double suspend_timeout_floor_s = 10.0;
// Least time an evaluation may take before the job counts as stalled.
constexpr double evaluation_timeout_floor_s = 60.0;

double seconds(clock_type::duration d) { return std::chrono::duration<double>(d).count(); }

caf::duration as_duration(double s) {
  return caf::duration{std::chrono::microseconds(static_cast<std::int64_t>(s * 1e6))};
}

std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

std::size_t live_members(const reducer_state& st) {
  return static_cast<std::size_t>(std::count_if(st.members.begin(), st.members.end(), [](const auto& m) { return !m.gone; }));
}

// Takes a member out: it gets an exit (a hung thread acts on it when it wakes).
void remove_member(reducer_ptr self, std::size_t rank, const std::string& reason) {
  auto& st = self->state;
  auto& m = st.members.at(rank);
  if (m.gone) return;
  m.gone = true;
  self->demonitor(m.handle.actor);
  self->send_exit(m.handle.actor, caf::exit_reason::user_shutdown);
  st.awaiting_suspend.erase(m.handle.id);
  st.change_reasons.push_back(m.handle.name + " " + reason);
  spdlog::debug("{} removed: {}", m.handle.name, reason);
}

void stop_below_minimum(reducer_ptr self, std::int64_t step, std::optional<caf::actor> source);

// Spawns the devices waiting to join; they adopt the state by broadcast.
void admit_joins(reducer_ptr self) {
  auto& st = self->state;
  for (; st.pending_joins > 0; --st.pending_joins) {
    member_handle h = st.setup.spawn_device(st.next_device_id++);
    self->monitor(h.actor);
    st.every_device.push_back(h.actor);
    st.change_reasons.push_back(h.name + " joined");
    st.members.push_back({h, st.committed, clock_type::now(), clock_type::now()});
    if (!st.join_replies.empty()) {
      st.join_replies.front()->set_value(h.name);
      st.join_replies.erase(st.join_replies.begin());
    }
  }
}

void finish_recovery(reducer_ptr self) {
  auto& st = self->state;
  // The state source: the most advanced survivor, the oldest on a tie.
  std::optional<std::size_t> source;
  std::int64_t through = st.committed;
  // A member behind the committed step (a newcomer whose broadcast failed)
  // holds no state worth keeping.
  for (std::size_t r = 0; r < st.members.size(); ++r) {
    if (st.members[r].gone) continue;
    const std::int64_t last = st.suspend_replies.at(st.members[r].handle.id);
    if (last < st.committed) continue;
    if (!source || last > through) {
      source = r;
      through = std::max(through, last);
    }
  }
  if (st.rescue_state && st.rescue_state->first < st.committed) st.rescue_state.reset();
  if (!source && st.rescue_state) through = std::max(through, st.rescue_state->first);

  // Steps up to `through` are in the state source's parameters: commit them.
  rollback_msg rollback{st.plan.generation, committed_msg{st.plan.generation, st.committed, {}}};
  for (std::int64_t s = st.committed + 1; s <= through; ++s) {
    auto it = st.steps.find(s);
    reducer_state::step_tally tally = it == st.steps.end() ? reducer_state::step_tally{} : std::move(it->second);
    account_step(self, s, std::move(tally), rollback.commit);
  }
  rollback.commit.through = through;
  st.requeued_by_fault = 0;  // the loader says how many (rollback_done_msg)
  st.steps.clear();
  st.evals.clear();
  self->send(st.setup.loader, std::move(rollback));
  if (st.work && st.work->last_step > through) {
    st.work.reset();
    st.final_eval_step.reset();
  }
  for (auto it = st.checkpoints.begin(); it != st.checkpoints.end();) {
    const bool keep = it->second.sent || (it->second.state && it->second.position) ||
                      (st.work && it->first == st.work->last_step && it->first <= through);
    it = keep && it->first <= through ? std::next(it) : st.checkpoints.erase(it);
  }

  if (!source) {
    stop_below_minimum(self, through, std::nullopt);
    return;
  }
  // Apply the graceful changes that were waiting, then form the generation.
  const caf::actor source_actor = st.members[*source].handle.actor;
  std::vector<std::string> deferred;  // the state source leaves at the next boundary
  for (const auto& name : std::exchange(st.pending_leaves, {})) {
    for (std::size_t r = 0; r < st.members.size(); ++r) {
      if (st.members[r].handle.name != name || st.members[r].gone) continue;
      if (st.members[r].handle.actor == source_actor) deferred.push_back(name);
      else remove_member(self, r, "left");
    }
  }
  st.pending_leaves = std::move(deferred);
  std::erase_if(st.members, [](const auto& m) { return m.gone; });
  admit_joins(self);
  if (st.members.size() < static_cast<std::size_t>(st.setup.min_devices)) {
    stop_below_minimum(self, through, source_actor);
    return;
  }
  const auto it = std::find_if(st.members.begin(), st.members.end(), [&](const auto& m) { return m.handle.actor == source_actor; });
  form_generation(self, static_cast<std::int32_t>(it - st.members.begin()));
  request_graceful_change(self);
  maybe_finish(self);
}

void check_recovery_complete(reducer_ptr self) {
  auto& st = self->state;
  if (st.current == phase::recovering && st.awaiting_suspend.empty()) finish_recovery(self);
}

void on_suspend_reply(reducer_ptr self, std::int64_t generation, int id, std::int64_t last_step) {
  auto& st = self->state;
  if (st.current != phase::recovering || generation != st.plan.generation || !st.awaiting_suspend.count(id)) return;
  st.awaiting_suspend.erase(id);
  st.suspend_replies[id] = last_step;
  check_recovery_complete(self);
}

void on_suspend_failed(reducer_ptr self, std::int64_t generation, int id, const std::string& why) {
  auto& st = self->state;
  if (st.current != phase::recovering || generation != st.plan.generation || !st.awaiting_suspend.count(id)) return;
  for (std::size_t r = 0; r < st.members.size(); ++r)
    if (st.members[r].handle.id == id) remove_member(self, r, "hung: did not answer after the abort (" + why + ")");
  check_recovery_complete(self);
}

void write_stop_checkpoint(reducer_ptr self, std::int64_t step, std::vector<float> state) {
  auto& st = self->state;
  if (!st.setup.writer) {
    fail_run(self, std::make_exception_ptr(training_error(st.stop_message + "; no checkpoint: train.checkpoint_dir is empty")));
    return;
  }
  self->request(st.setup.loader, stop_request_timeout, ledger_atom::value)
      .then(
          [self, step, state = std::move(state)](ledger_snapshot_msg& ledger) mutable {
            write_checkpoint_msg msg{step, ledger.position.epoch, true, std::move(state), std::move(ledger.position)};
            self->send(self->state.setup.writer, std::move(msg));
          },
          [self](caf::error& err) {
            fail_run(self, std::make_exception_ptr(training_error(self->state.stop_message + "; no checkpoint: the loader did not answer (" +
                                                                  caf::to_string(err) + ")")));
          });
}

void stop_below_minimum(reducer_ptr self, std::int64_t step, std::optional<caf::actor> source) {
  auto& st = self->state;
  st.current = phase::stopping;
  std::ostringstream why;
  why << "training stopped after step " << step + 1 << ": " << live_members(st) << " device"
      << (live_members(st) == 1 ? "" : "s") << " left, fewer than cluster.min_devices = " << st.setup.min_devices
      << " (" << joined(st.change_reasons) << ")";
  st.stop_message = why.str();
  spdlog::error("{}", st.stop_message);
  if (source) {
    self->request(*source, stop_request_timeout, state_atom::value)
        .then([self, step](state_msg& s) { write_stop_checkpoint(self, step, std::move(s.state)); },
              [self, step](caf::error&) {
                auto& st = self->state;
                if (st.rescue_state) write_stop_checkpoint(self, st.rescue_state->first, st.rescue_state->second);
                else fail_run(self, std::make_exception_ptr(training_error(st.stop_message + "; no replica state left to checkpoint")));
                (void)step;
              });
  } else if (st.rescue_state) {
    write_stop_checkpoint(self, st.rescue_state->first, st.rescue_state->second);
  } else {
    fail_run(self, std::make_exception_ptr(training_error(st.stop_message + "; no replica state left to checkpoint")));
  }
}

}  // namespace

double hang_timeout(const reducer_state& st) {
  if (st.setup.hang_timeout_s > 0.0) return st.setup.hang_timeout_s;
  return std::max(1.0, 20.0 * st.step_intervals.median());
}

void form_generation(reducer_ptr self, std::int32_t state_source) {
  auto& st = self->state;
  const auto now = clock_type::now();
  st.plan.generation += 1;
  st.plan.reducer = self;
  st.plan.members.clear();
  for (auto& m : st.members) {
    st.plan.members.push_back(m.handle.actor);
    m.last_heard = m.step_started = now;
    m.last_done = st.committed;
    m.handle.control->cut_step.store(-1);
  }
  st.plan.state_source = state_source;
  std::vector<int> ids;
  for (const auto& m : st.members) ids.push_back(m.handle.id);
  st.plan.group = group_ticket{"local", st.plan.generation, "", st.setup.make_group(ids)};
  st.throughput.reset(st.members.size());
  st.sent_shares.clear();
  st.steps.clear();
  st.evals.clear();
  st.pause_point.reset();
  st.suspend_replies.clear();
  st.awaiting_suspend.clear();
  st.late = {};
  st.last_progress = now;
  st.rescue_state.reset();
  st.current = phase::running;

  membership_event e;
  e.generation = st.plan.generation;
  e.step = st.committed + 1;
  for (const auto& m : st.members) {
    e.members.push_back(m.handle.name);
    e.actor_ids.push_back(m.handle.actor.id());
  }
  e.reason = joined(st.change_reasons);
  st.change_reasons.clear();
  std::string names;
  for (const auto& n : e.members) names += (names.empty() ? "" : ", ") + n;
  if (e.generation == 0) {
    spdlog::info("generation 0: {} members ({})", e.members.size(), names);
  } else {
    ++st.summary.membership_changes;
    spdlog::warn("generation {} from step {}: {} members ({}); {}", e.generation, e.step + 1, e.members.size(), names, e.reason);
  }
  st.setup.control->emit(e);
  // The final checkpoint's state went with a member that is gone: the new
  // first member sends it, in order after adopting the state.
  st.plan.snapshot_step = -2;
  if (st.work && st.work->snapshot && st.last_checkpoint != st.work->last_step && st.committed >= st.work->last_step) {
    auto& pending = st.checkpoints[st.work->last_step];
    if (!pending.state && !pending.sent) st.plan.snapshot_step = st.work->last_step;
  }
  self->send(st.setup.loader, st.plan);
}

void handle_fault(reducer_ptr self, std::optional<std::size_t> rank, const std::string& reason) {
  auto& st = self->state;
  if (st.failed || st.current == phase::stopping) return;
  if (rank) remove_member(self, *rank, reason);
  else st.change_reasons.push_back(reason);
  if (st.current == phase::running || st.current == phase::pausing) {
    st.fault_time = clock_type::now();
    // Wake every member blocked in the collective, from outside.
    st.plan.group.local->abort();
    st.current = phase::recovering;
    st.suspend_replies.clear();
    st.awaiting_suspend.clear();
    // Survivors answer once their failed step returns; an evaluation in
    // progress is not interruptible, so they get at least this long.
    const auto timeout = as_duration(std::max(hang_timeout(st), suspend_timeout_floor_s));
    const std::int64_t generation = st.plan.generation;
    for (const auto& m : st.members) {
      if (m.gone) continue;
      const int id = m.handle.id;
      st.awaiting_suspend.insert(id);
      self->request(m.handle.actor, timeout, suspend_atom::value)
          .then([self, generation, id](std::int64_t last) { on_suspend_reply(self, generation, id, last); },
                [self, generation, id](caf::error& err) { on_suspend_failed(self, generation, id, caf::to_string(err)); });
    }
  }
  check_recovery_complete(self);
}

void request_graceful_change(reducer_ptr self) {
  auto& st = self->state;
  if (st.current != phase::running || st.failed) return;
  // Planned changes past the end of the run never happen.
  if (st.work)
    std::erase_if(st.planned_changes, [&](const fault_spec& f) { return f.step - 2 >= st.work->last_step; });
  std::optional<std::int64_t> after;
  if (st.pending_joins > 0 || !st.pending_leaves.empty()) after = st.committed;  // as soon as possible
  else if (!st.planned_changes.empty()) after = std::max(st.committed, st.planned_changes.front().step - 2);
  if (!after) return;
  st.current = phase::pausing;
  self->send(st.setup.loader, pause_msg{st.plan.generation, *after});
}

void check_pause_complete(reducer_ptr self) {
  auto& st = self->state;
  if (st.current != phase::pausing || !st.pause_point || st.committed < *st.pause_point) return;
  // Every member has applied the pause point's step; nothing is in flight.
  while (!st.planned_changes.empty() && st.planned_changes.front().step - 2 <= *st.pause_point) {
    const fault_spec f = st.planned_changes.front();
    st.planned_changes.erase(st.planned_changes.begin());
    if (f.kind == fault_kind::join) ++st.pending_joins;
    else st.pending_leaves.push_back("cpu:" + std::to_string(f.device));
  }
  for (const auto& name : std::exchange(st.pending_leaves, {}))
    for (std::size_t r = 0; r < st.members.size(); ++r)
      if (st.members[r].handle.name == name && !st.members[r].gone) remove_member(self, r, "left");
  std::erase_if(st.members, [](const auto& m) { return m.gone; });
  const std::size_t old_members = st.members.size();
  admit_joins(self);
  if (old_members == 0 || st.members.size() < static_cast<std::size_t>(st.setup.min_devices)) {
    stop_below_minimum(self, st.committed,
                       old_members > 0 ? std::optional<caf::actor>(st.members.front().handle.actor) : std::nullopt);
    return;
  }
  form_generation(self, 0);  // the old members are identical; rank 0 is one of them
  request_graceful_change(self);
  maybe_finish(self);
}

void check_hangs(reducer_ptr self) {
  auto& st = self->state;
  if (st.failed || (st.current != phase::running && st.current != phase::pausing)) return;
  const bool has_work = !st.work || st.eval_outstanding;
  // An evaluation is one long stretch without reports.
  const double timeout = st.eval_outstanding ? std::max(hang_timeout(st), evaluation_timeout_floor_s) : hang_timeout(st);
  const double stalled = seconds(clock_type::now() - st.last_progress);
  if (!has_work || stalled <= timeout) return;
  char text[160];
  std::snprintf(text, sizeof text, "hung: no progress for %.2f s (hang timeout %.2f s)", stalled, timeout);
  // The members the others waited for in the stalled step are the suspects;
  // without them, the abort and the survivors' answers tell.
  if (st.late.step > st.committed && !st.late.missing.empty()) {
    const auto suspects = st.late.missing;
    for (const auto rank : suspects)
      if (static_cast<std::size_t>(rank) < st.members.size()) handle_fault(self, static_cast<std::size_t>(rank), text);
    return;
  }
  char stall[160];
  std::snprintf(stall, sizeof stall, "step %lld made no progress for %.2f s (hang timeout %.2f s)",
                static_cast<long long>(st.committed + 2), stalled, timeout);
  handle_fault(self, std::nullopt, stall);
}

void on_late(reducer_ptr self, const late_msg& msg) {
  auto& st = self->state;
  if (msg.step <= st.committed) return;
  // A member missing in one report may have arrived by the next: the
  // suspects are those missing from every report of the step, and never a
  // member that reported waiting itself.
  if (st.late.step != msg.step) {
    st.late = {msg.step, msg.missing, {}};
  } else if (!msg.missing.empty()) {
    std::erase_if(st.late.missing, [&](std::int32_t r) {
      return std::find(msg.missing.begin(), msg.missing.end(), r) == msg.missing.end();
    });
  }
  st.late.waiting.push_back(msg.rank);
  std::erase(st.late.missing, msg.rank);
  if (msg.missing.empty()) {
    // The backend cannot tell who is missing (NCCL): the members that have not
    // said they are waiting. One still waiting short of its own deadline may
    // be counted too; cutting a member that has finished computing is a no-op.
    st.late.missing.clear();
    for (std::size_t r = 0; r < st.members.size(); ++r)
      if (std::find(st.late.waiting.begin(), st.late.waiting.end(), static_cast<std::int32_t>(r)) == st.late.waiting.end())
        st.late.missing.push_back(static_cast<std::int32_t>(r));
  }
  const auto policy = st.setup.straggler.policy;
  if (policy != straggler_policy::cut && policy != straggler_policy::balance_cut) return;
  // See Note [Cutting a step short].
  for (const auto rank : msg.missing.empty() ? st.late.missing : msg.missing)
    if (static_cast<std::size_t>(rank) < st.members.size())
      st.members[static_cast<std::size_t>(rank)].handle.control->cut_step.store(msg.step, std::memory_order_release);
}

}  // namespace dpactor
