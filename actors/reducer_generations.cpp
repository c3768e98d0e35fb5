// The reducer's generations: forming them, ending them on faults and graceful
// changes, recovery, and stopping below the minimum. See Note [Generations]
// in reducer.hpp; the book-keeping is train/membership.hpp's.

#include <algorithm>
#include <cstdio>
#include <sstream>


#include "actors/reducer.hpp"
#include <dpactor/error.hpp>
#include "actors/log.hpp"
#include "train/worker_placement.hpp"

namespace dpactor {
namespace {

using clock_type = reducer_state::clock;
using phase = reducer_state::phase;

// Time a stopping reducer gives a member or the loader to answer.
constexpr auto stop_request_timeout = std::chrono::seconds(30);
// Least time survivors get to answer after an abort.
constexpr double suspend_timeout_floor_s = 10.0;


// The actor's side of taking a member out: it gets an exit (a hung thread
// acts on it when it wakes) and is no longer watched.
void let_go(reducer_ptr self, int id) {
  auto& st = self->state;
  const member_handle& h = st.devices.at(id);
  self->demonitor(h.actor.address());
  self->send_exit(h.actor, caf::exit_reason::user_shutdown);
  st.awaiting_suspend.erase(id);
}

void remove_member(reducer_ptr self, std::size_t rank, const std::string& reason) {
  auto& st = self->state;
  const member& m = st.members->members().at(rank);
  if (!st.members->remove(rank, reason)) return;
  st.unblamed_failures.count = 0;  // See Note [A collective that fails in every generation]
  engine_log()->debug("{} removed: {}", m.name, reason);
  let_go(self, m.id);
}

void apply_leaves(reducer_ptr self, std::optional<int> keep = std::nullopt) {
  for (const int id : self->state.members->apply_leaves(keep)) let_go(self, id);
}

// Admits the devices waiting to join: the workers' that arrived, then new
// ones spawned here. They adopt the state by broadcast.
void admit_joins(reducer_ptr self) {
  auto& st = self->state;
  while (st.members->pending_joins() > 0) {
    member_handle h;
    if (!st.arrivals.empty()) {
      h = std::move(st.arrivals.front());
      st.arrivals.pop_front();
    } else {
      h = st.setup.spawn_device(st.next_device_id++);
      if (!st.join_replies.empty()) {
        st.join_replies.front()->set_value(h.name);
        st.join_replies.erase(st.join_replies.begin());
      }
    }
    self->monitor(h.actor);
    st.devices[h.id] = h;
    st.members->admit({h.id, h.name});
  }
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
            write_checkpoint(self, {step, ledger.position.epoch, true, std::move(state), std::move(ledger.position)});
          },
          [self](caf::error& err) {
            fail_run(self, std::make_exception_ptr(training_error(self->state.stop_message + "; no checkpoint: the loader did not answer (" +
                                                                  caf::to_string(err) + ")")));
          });
}

// Stops training with `message` after writing the state of step `step`
// (`source`'s, else the rescue state) as a checkpoint.
void stop_with_checkpoint(reducer_ptr self, std::int64_t step, std::optional<device_actor> source, std::string message) {
  auto& st = self->state;
  st.current = phase::stopping;
  st.stop_message = std::move(message);
  engine_log()->error("{}", st.stop_message);
  const auto last_resort = [self] {
    auto& st = self->state;
    if (st.rescue_state) write_stop_checkpoint(self, st.rescue_state->first, st.rescue_state->second);
    else
      fail_run(self, std::make_exception_ptr(training_error(
                         st.stop_message + "; no replica state left to checkpoint" +
                         (st.book->summary().checkpoint.empty() ? "" : "; the newest checkpoint is " + st.book->summary().checkpoint))));
  };
  if (!source) {
    last_resort();
    return;
  }
  self->request(*source, stop_request_timeout, state_atom::value)
      .then([self, step, last_resort](state_msg& s) {
              // The source answered the suspend with this step: anything else would be a bug.
              if (s.step != step) last_resort();
              else write_stop_checkpoint(self, step, std::move(s.state));
            },
            [last_resort](caf::error&) { last_resort(); });
}

void stop_below_minimum(reducer_ptr self, std::int64_t step, std::optional<device_actor> source) {
  auto& st = self->state;
  const std::size_t live = st.members->live();
  std::ostringstream why;
  why << "training stopped after step " << step + 1 << ": " << live << " device" << (live == 1 ? "" : "s")
      << " left, fewer than cluster.min_devices = " << st.setup.min_devices << " (" << st.members->reasons() << ")";
  stop_with_checkpoint(self, step, std::move(source), why.str());
}

void finish_recovery(reducer_ptr self) {
  auto& st = self->state;
  engine_log()->debug("generation {}: every member suspended or gone", st.plan.generation);
  const std::int64_t committed = st.book->committed();
  const state_source source = st.members->choose_state_source(
      st.suspend_replies, committed, st.rescue_state ? std::optional(st.rescue_state->first) : std::nullopt);
  if (st.rescue_state && st.rescue_state->first < committed) st.rescue_state.reset();

  // Steps up to `through` are in the state source's parameters: commit them.
  const std::int64_t through = source.through;
  step_commit commit = st.book->commit_through(through, clock_type::now());
  st.book->requeued_by_fault(0);  // the loader says how many (rollback_done_msg)
  const std::int64_t generation = st.plan.generation;
  self->send(st.setup.loader, rollback_msg{generation, committed_msg{generation, through, std::move(commit.returned)}});
  if (st.work && st.work->last_step > through) {
    st.work.reset();
    st.final_eval_step.reset();
  }
  for (auto it = st.checkpoints.begin(); it != st.checkpoints.end();) {
    const bool keep = it->second.sent ||
                      (it->second.state && it->second.position && it->second.workers.size() >= st.setup.logical_workers) ||
                      (st.work && it->first == st.work->last_step && it->first <= through);
    it = keep && it->first <= through ? std::next(it) : st.checkpoints.erase(it);
  }

  if (st.ending) {
    stop_with_checkpoint(self, through, source.rank ? std::optional(st.handle(*source.rank).actor) : std::nullopt,
                         *st.ending);
    return;
  }
  if (!source.rank) {
    stop_below_minimum(self, through, std::nullopt);
    return;
  }
  // Apply the graceful changes that were waiting (the state source's own
  // leave waits for the next boundary), then form the generation.
  const member_handle source_handle = st.handle(*source.rank);
  apply_leaves(self, source_handle.id);
  admit_joins(self);
  if (st.members->members().size() < static_cast<std::size_t>(st.setup.min_devices)) {
    stop_below_minimum(self, through, source_handle.actor);
    return;
  }
  form_generation(self, static_cast<std::int32_t>(*st.members->rank_of(source_handle.id)));
  request_graceful_change(self);
  maybe_finish(self);
}

void check_recovery_complete(reducer_ptr self) {
  auto& st = self->state;
  if (st.current == phase::recovering && st.awaiting_suspend.empty()) finish_recovery(self);
}

}  // namespace

void on_suspend_reply(reducer_ptr self, std::int64_t generation, int id, std::optional<std::int64_t> last_step,
                      const std::string& error) {
  auto& st = self->state;
  if (st.current != phase::recovering || generation != st.plan.generation || !st.awaiting_suspend.count(id)) return;
  st.awaiting_suspend.erase(id);
  if (last_step) st.suspend_replies[id] = *last_step;
  else if (const auto rank = st.members->rank_of(id)) remove_member(self, *rank, "hung: did not answer after the abort (" + error + ")");
  check_recovery_complete(self);
}

namespace {

// See Note [Worker placement]: the nodes are the members' processes, in the
// order the members name them first. Fills the plan's nodes; what moves
// between live nodes (See Note [Moving logical workers]) and what is run
// again for a node that is gone (See Note [Replaying a lost worker's
// rounds]) go into `forming`.
void place_logical_workers(reducer_state& st, reducer_state::forming_generation& forming) {
  std::vector<placement_node> nodes;
  st.plan.member_node.clear();
  for (const device_actor& a : st.plan.members) {
    const std::string name = caf::to_string(a.node());
    auto it = std::find_if(nodes.begin(), nodes.end(), [&](const placement_node& n) { return n.name == name; });
    if (it == nodes.end()) it = nodes.insert(nodes.end(), placement_node{name, 0});
    ++it->devices;
    st.plan.member_node.push_back(static_cast<std::int32_t>(it - nodes.begin()));
  }
  const worker_placement placed = place_workers(st.setup.logical_workers, nodes, st.worker_owner);
  const auto node_index = [&](const std::string& name) {
    return std::find_if(nodes.begin(), nodes.end(), [&](const placement_node& n) { return n.name == name; }) - nodes.begin();
  };
  st.plan.worker_node.clear();
  for (const std::string& owner : placed.owner) st.plan.worker_node.push_back(static_cast<std::int32_t>(node_index(owner)));
  forming.owner = placed.owner;
  // A node's first member gives or takes its workers.
  const auto first_member = [&](std::ptrdiff_t node) {
    return static_cast<std::size_t>(
        std::find(st.plan.member_node.begin(), st.plan.member_node.end(), static_cast<std::int32_t>(node)) -
        st.plan.member_node.begin());
  };
  for (const worker_move& m : placed.moves) {
    if (m.from.empty()) continue;
    const auto k = static_cast<std::uint32_t>(m.worker);
    const auto from = node_index(m.from);
    if (from != static_cast<std::ptrdiff_t>(nodes.size())) {
      forming.asks[first_member(from)].push_back(k);
      continue;
    }
    // A backup after the last committed step has nothing to run again nor
    // to restart without: it moves as it is (a resume's, a checkpoint's
    // at the last step).
    const auto backup = st.backups.find(k);
    if (backup != st.backups.end() && backup->second.first == st.book->committed()) forming.states[k] = backup->second.second;
    else if (st.setup.replay_lost_workers) forming.replays.emplace_back(k, first_member(node_index(m.to)));
    else forming.restarts.push_back(k);
  }
}

// Why the run stops when a lost worker cannot be run again (See Note
// [Replaying a lost worker's rounds]).
std::string cannot_replay(const reducer_state& st, const std::string& why) {
  return "a logical worker lost with its process cannot be run again (" + why +
         "); resume the newest checkpoint in one process (--resume with the checkpoint directory takes its latest" +
         (st.book->summary().checkpoint.empty() ? std::string(")")
                                                : "; the newest confirmed so far is " + st.book->summary().checkpoint + ")");
}

// The generation in `st.forming` has its moved workers' states: it starts.
void start_generation(reducer_ptr self) {
  auto& st = self->state;
  reducer_state::forming_generation f = std::move(*st.forming);
  st.forming.reset();
  if (st.setup.logical_workers > 0) st.worker_owner = std::move(f.owner);
  st.plan.moved = {};
  // See Note [Fast rounds across processes]: a lost worker's backup goes
  // with it.
  for (const std::uint32_t k : f.restarts) {
    const auto it = st.backups.find(k);
    engine_log()->warn("generation {}: logical worker {}, lost with its process, restarts from {} (fast mode)",
                       st.plan.generation, k,
                       it == st.backups.end() ? std::string("the first round's state")
                                              : "its state after step " + std::to_string(it->second.first + 1));
    if (it != st.backups.end()) f.states[k] = it->second.second;
  }
  st.plan.moved.restart = f.restarts;
  if (!f.states.empty()) {  // See Note [Moving logical workers]
    st.plan.moved.step = st.book->committed();
    std::int64_t bytes = f.gathered_bytes;
    for (auto& [k, state] : f.states) {
      if (std::find(f.restarts.begin(), f.restarts.end(), k) == f.restarts.end())  // See Note [Replaying a lost worker's rounds]
        st.backups.insert_or_assign(k, std::pair{st.plan.moved.step, state});
      st.plan.moved.workers.push_back(k);
      st.plan.moved.states.insert(st.plan.moved.states.end(), state.begin(), state.end());
      for (std::size_t r = 0; r < st.plan.members.size(); ++r)
        if (st.plan.member_node[r] == st.plan.worker_node.at(k) && st.plan.members[r].node() != self->node())
          bytes += static_cast<std::int64_t>(state.size() * sizeof(float));
    }
    st.moved_state_bytes += bytes;
    std::string which;
    for (const std::uint32_t k : st.plan.moved.workers)
      if (std::find(f.restarts.begin(), f.restarts.end(), k) == f.restarts.end())
        which += (which.empty() ? "" : ", ") + std::to_string(k);
    if (!which.empty())
      engine_log()->info("generation {}: logical workers {} move to another process with their states ({:.2f} MB)",
                         st.plan.generation, which, static_cast<double>(bytes) / 1e6);
  }
  st.plan.group = st.setup.make_group(f.ids, st.plan.generation);
  st.book->start_generation(st.plan.generation, f.ids.size(), f.started);
  st.sent_shares.clear();
  st.idle = false;
  st.pause_point.reset();
  st.suspend_replies.clear();
  st.awaiting_suspend.clear();
  st.suspend_deadline.reset();
  st.rescue_state.reset();
  st.current = phase::running;

  const membership_event& e = f.event;
  const std::string names = member_list(e.members);
  if (e.generation == 0) {
    engine_log()->info("generation 0: {} members ({})", e.members.size(), names);
  } else {
    ++st.book->summary().membership_changes;
    engine_log()->warn("generation {} from step {}: {} members ({}); {}", e.generation, e.step + 1, e.members.size(), names, e.reason);
  }
  st.setup.control->emit(e);
  // The final checkpoint's state went with a member that is gone: the new
  // first member sends it, in order after adopting the state.
  st.plan.snapshot_step = -2;
  if (st.work && st.work->snapshot && st.last_checkpoint != st.work->last_step && st.book->committed() >= st.work->last_step) {
    auto& pending = st.checkpoints[st.work->last_step];
    if (!pending.sent && (!pending.state || pending.workers.size() < st.setup.logical_workers))
      st.plan.snapshot_step = st.work->last_step;
  }
  self->send(st.setup.loader, st.plan);
  st.plan.moved = {};
}

// One answer the forming generation waited for has come: the last starts it.
void answer_arrived(reducer_ptr self) {
  auto& st = self->state;
  if (--st.forming->awaited > 0) return;
  start_generation(self);
  request_graceful_change(self);
  maybe_finish(self);
}

// Whether an answer for `generation` is still wanted.
bool forming(const reducer_state& st, std::int64_t generation) {
  return st.forming && st.plan.generation == generation && !st.failed && !st.ending && st.current != phase::stopping;
}

// The replays of the forming generation, with the loader's shards of the
// rounds since the oldest backup (See Note [Replaying a lost worker's
// rounds]).
void send_replays(reducer_ptr self, std::int64_t generation, round_log_msg& log) {
  auto& st = self->state;
  if (!forming(st, generation)) return;
  const std::int64_t through = st.book->committed();
  for (const auto& [k, rank] : st.forming->replays) {
    replay_msg msg{generation, k, -1, {}, {}};
    if (const auto it = st.backups.find(k); it != st.backups.end()) {
      msg.from_step = it->second.first;
      msg.state = it->second.second;
    }
    for (const step_shard& shard : log.rounds)
      if (shard.step > msg.from_step && shard.step <= through) msg.rounds.push_back(shard);
    if (static_cast<std::int64_t>(msg.rounds.size()) != through - msg.from_step) {
      const std::string why = "the loader no longer has the rounds since step " + std::to_string(msg.from_step + 2);
      engine_log()->error("{}", cannot_replay(st, why));
      st.forming.reset();
      end_run(self, cannot_replay(st, why));
      return;
    }
    const device_actor target = st.plan.members.at(rank);
    const int id = st.forming->ids.at(rank);
    engine_log()->info("generation {}: logical worker {}, lost with its process, runs its steps {} to {} again on {}",
                       generation, k, msg.from_step + 2, through + 1, st.handle(rank).name);
    if (target.node() != self->node())
      st.moved_state_bytes += static_cast<std::int64_t>(msg.state.size() * sizeof(float));
    // A round of the default job takes 10-150 ms.
    const auto limit = stop_request_timeout + std::chrono::seconds(msg.rounds.size());
    self->request(target, limit, std::move(msg))
        .then(
            [self, generation](const std::string& error) {
              auto& st = self->state;
              if (!forming(st, generation)) return;
              if (!error.empty()) {
                const std::string why = cannot_replay(st, error);
                engine_log()->error("{}", why);
                st.forming.reset();
                end_run(self, why);
                return;
              }
              answer_arrived(self);
            },
            [self, generation, id](caf::error& err) {
              auto& st = self->state;
              if (!forming(st, generation)) return;
              handle_fault(self, st.members->rank_of(id), "did not run a lost logical worker's rounds again (" +
                                                             caf::to_string(err) + ")");
            });
  }
  answer_arrived(self);  // the loader's
}

// A member's answer with the states of the workers that leave its node (See
// Note [Moving logical workers]).
void on_moved_states(reducer_ptr self, std::int64_t generation, bool remote, worker_states_msg& msg) {
  auto& st = self->state;
  if (!forming(st, generation)) return;
  if (!msg.error.empty() || msg.workers.empty() || msg.states.size() % msg.workers.size() != 0) {
    fail_run(self, std::make_exception_ptr(training_error("logical workers cannot move to another process: " +
                                                          (msg.error.empty() ? std::string("no states came") : msg.error))));
    return;
  }
  const std::size_t size = msg.states.size() / msg.workers.size();
  for (std::size_t i = 0; i < msg.workers.size(); ++i)
    st.forming->states[msg.workers[i]].assign(msg.states.begin() + static_cast<std::ptrdiff_t>(i * size),
                                              msg.states.begin() + static_cast<std::ptrdiff_t>((i + 1) * size));
  if (remote) st.forming->gathered_bytes += static_cast<std::int64_t>(msg.states.size() * sizeof(float));
  answer_arrived(self);
}

}  // namespace

void form_generation(reducer_ptr self, std::int32_t state_source) {
  auto& st = self->state;
  const auto now = clock_type::now();
  const std::string reason = st.members->form_generation();
  st.plan.generation = st.members->generation();
  st.plan.reducer = caf::actor_cast<reducer_actor>(self);
  st.plan.members.clear();
  st.forming.emplace();
  reducer_state::forming_generation& f = *st.forming;
  f.started = now;
  f.event = membership_event{st.plan.generation, st.book->committed() + 1, {}, {}, reason};
  for (std::size_t r = 0; r < st.members->members().size(); ++r) {
    const member_handle& h = st.handle(r);
    st.plan.members.push_back(h.actor);
    h.control->cut_step.store(-1);
    // A new generation starts the clock (the device marks it too when the
    // generation reaches it).
    h.control->progress.mark(device_phase::data, st.book->committed() + 1);
    f.ids.push_back(h.id);
    f.event.members.push_back(h.name);
    f.event.actor_ids.push_back(h.actor.id());
  }
  st.plan.state_source = state_source;
  if (st.setup.logical_workers > 0 && !st.plan.members.empty()) place_logical_workers(st, f);
  if (f.asks.empty() && f.replays.empty()) {
    start_generation(self);
    return;
  }
  // See Notes [Moving logical workers] and [Replaying a lost worker's
  // rounds]: the plan waits for the states and the replays.
  f.awaited = f.asks.size() + f.replays.size() + (f.replays.empty() ? 0 : 1);
  const std::int64_t generation = st.plan.generation;
  if (!f.replays.empty()) {
    std::int64_t from = st.book->committed() + 1;
    for (const auto& [k, rank] : f.replays)
      from = std::min(from, st.backups.count(k) ? st.backups.at(k).first + 1 : std::int64_t{0});
    self->request(st.setup.loader, stop_request_timeout, round_log_request{from, st.book->committed()})
        .then([self, generation](round_log_msg& log) { send_replays(self, generation, log); },
              [self, generation](caf::error& err) {
                auto& st = self->state;
                if (!forming(st, generation)) return;
                st.forming.reset();
                end_run(self, cannot_replay(st, "the loader did not answer: " + caf::to_string(err)));
              });
  }
  for (const auto& [rank, workers] : f.asks) {
    const device_actor giver = st.plan.members[rank];
    const int id = f.ids[rank];
    const bool remote = giver.node() != self->node();
    self->request(giver, stop_request_timeout, move_states_msg{generation, st.book->committed(), workers})
        .then([self, generation, remote](worker_states_msg& msg) { on_moved_states(self, generation, remote, msg); },
              [self, generation, id](caf::error& err) {
                auto& st = self->state;
                if (!st.forming || st.plan.generation != generation) return;
                const auto rank = st.members->rank_of(id);
                handle_fault(self, rank, "did not give its logical workers' states (" + caf::to_string(err) + ")");
              });
  }
}

void handle_fault(reducer_ptr self, std::optional<std::size_t> rank, const std::string& reason) {
  auto& st = self->state;
  if (st.failed || st.current == phase::stopping) return;
  if (rank) remove_member(self, *rank, reason);
  else st.members->note(reason);
  if (st.current == phase::running || st.current == phase::pausing) {
    st.book->fault_detected(clock_type::now());
    // Wake every member blocked in the collective, from outside.
    st.plan.group.local->abort();
    if (st.setup.abort_remote) st.setup.abort_remote(st.plan.generation, reason);
    st.current = phase::recovering;
    st.suspend_replies.clear();
    st.awaiting_suspend.clear();
    // Survivors answer once their failed step returns; an evaluation in
    // progress is not interruptible, so they get at least this long. See
    // Note [One deadline for the suspend requests].
    st.suspend_timeout_s = std::max(hang_timeout(st.setup.hang_timeout_s, st.book->median_step_s()), suspend_timeout_floor_s);
    st.suspend_deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                                  std::chrono::duration<double>(st.suspend_timeout_s));
    const std::int64_t generation = st.plan.generation;
    engine_log()->debug("generation {} aborted ({}): suspending its members", generation, reason);
    for (const auto& m : st.members->members()) {
      if (m.gone) continue;
      const int id = m.id;
      st.awaiting_suspend.insert(id);
      self->request(st.devices.at(id).actor, caf::infinite, suspend_atom::value)
          .then([self, generation, id](std::int64_t last) { on_suspend_reply(self, generation, id, last, {}); },
                [self, generation, id](caf::error& err) {
                  on_suspend_reply(self, generation, id, std::nullopt, caf::to_string(err));
                });
    }
  }
  check_recovery_complete(self);
}

void expire_suspend_requests(reducer_ptr self) {
  auto& st = self->state;
  if (st.current != phase::recovering || !st.suspend_deadline || clock_type::now() < *st.suspend_deadline) return;
  st.suspend_deadline.reset();
  char why[64];
  std::snprintf(why, sizeof why, "no answer within %.1f s", st.suspend_timeout_s);
  const std::int64_t generation = st.plan.generation;
  for (const int id : std::set<int>(st.awaiting_suspend)) on_suspend_reply(self, generation, id, std::nullopt, why);
}

void end_run(reducer_ptr self, const std::string& why) {
  auto& st = self->state;
  if (st.ending || st.failed || st.current == phase::stopping) return;
  st.ending = why;
  handle_fault(self, std::nullopt, why);
}

void request_graceful_change(reducer_ptr self) {
  auto& st = self->state;
  if (st.current != phase::running || st.failed) return;
  const auto after = st.members->next_pause(st.book->committed(), st.work ? std::optional(st.work->last_step) : std::nullopt);
  if (!after) return;
  st.current = phase::pausing;
  engine_log()->debug("generation {}: a membership change waits for step {} (committed: {})", st.plan.generation,
                      *after + 1, st.book->committed() + 1);
  self->send(st.setup.loader, pause_msg{st.plan.generation, *after});
}

void check_pause_complete(reducer_ptr self) {
  auto& st = self->state;
  if (st.current != phase::pausing || !st.pause_point || st.book->committed() < *st.pause_point) return;
  // Every member has applied the pause point's step; nothing is in flight.
  engine_log()->debug("generation {}: paused after step {}", st.plan.generation, *st.pause_point + 1);
  st.members->take_due_changes(*st.pause_point);
  // Every member holds the pause point's state, the leaving ones too: one of
  // them is asked for it if too few are left, before any is let go.
  const std::optional<device_actor> holder =
      st.members->members().empty() ? std::nullopt : std::optional(st.handle(0).actor);
  const std::vector<int> left = st.members->apply_leaves();
  admit_joins(self);
  if (st.members->members().empty() || st.members->members().size() < static_cast<std::size_t>(st.setup.min_devices)) {
    stop_below_minimum(self, st.book->committed(), holder);  // the devices that left end with the run
    return;
  }
  for (const int id : left) let_go(self, id);
  form_generation(self, 0);  // the old members are identical; rank 0 is one of them
  request_graceful_change(self);
  maybe_finish(self);
}

}  // namespace dpactor
