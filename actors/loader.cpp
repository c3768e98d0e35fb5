#include "actors/loader.hpp"
#include "train/work_ahead.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "train/issued_records.hpp"
#include "train/issued_steps.hpp"
#include "train/straggler.hpp"
#include "train/worker_placement.hpp"
#include <dpactor/error.hpp>

namespace dpactor {
namespace {

using loader_ptr = loader_actor::stateful_pointer<loader_state>;

// Rows [begin, end) of `total` for member `rank` of `size`: as even as
// possible, the first (total % size) members taking one more.
std::pair<std::size_t, std::size_t> even_slice(std::size_t total, std::size_t rank, std::size_t size) {
  const std::size_t base = total / size, extra = total % size;
  const std::size_t begin = rank * base + std::min(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

// Sends each member its slice of the test set; `eval` gives epoch, step and kind.
void send_evaluation(loader_ptr self, evaluate_msg eval) {
  auto& st = self->state;
  const auto& members = st.plan.members;
  eval.generation = st.plan.generation;
  for (std::size_t r = 0; r < members.size(); ++r) {
    const auto [begin, end] = even_slice(st.setup.test_rows, r, members.size());
    eval.begin = static_cast<std::uint32_t>(begin);
    eval.end = static_cast<std::uint32_t>(end);
    self->send(members[r], eval);
  }
}

void start_evaluation(loader_ptr self, bool epoch_end) {
  auto& st = self->state;
  evaluate_msg eval;
  eval.epoch = st.source->epoch();
  eval.step = st.next_step - 1;
  eval.epoch_end = epoch_end;
  st.pending_eval = eval;
  send_evaluation(self, eval);
}

// The training set's epochs, or the stream, resumed where the checkpoint
// stood.
std::unique_ptr<data_source> make_source(const loader_setup& setup) {
  if (setup.stream)
    return std::make_unique<issued_records>(*setup.stream,
                                            setup.resume_position ? setup.resume_position->stream : stream_position{});
  auto steps = std::make_unique<issued_steps>(setup.train_rows, setup.seed, setup.shuffle);
  if (!setup.resume_position) {
    steps->start_epoch(0);
    return steps;
  }
  steps->ledger().restore(*setup.resume_position);
  // A checkpoint taken at the end of an epoch resumes with the next one; that
  // epoch was already evaluated.
  if (steps->ledger().epoch_complete() && steps->epoch() + 1 < setup.epochs) steps->start_epoch(steps->epoch() + 1);
  return steps;
}

void mark_snapshot(loader_state& st, std::int64_t step) {
  st.last_snapshot_mark = std::chrono::steady_clock::now();
  st.last_snapshot_step = step;
  st.source->mark_snapshot(step);
}

// Asks the members for the state after `step`: the first member's replica
// state, and in the round modes every member's logical workers, with each
// node's first member also sending its node's workers that the step gave
// nobody, or all of them when the members did not run the step in this
// generation (See Note [A checkpoint's logical workers]). Only the last
// step issued is asked for, or a new generation's snapshot_step.
void send_snapshot(loader_ptr self, std::int64_t step) {
  auto& st = self->state;
  const auto& members = st.plan.members;
  if (st.plan.worker_node.empty()) {
    self->send(members.at(0), snapshot_msg{st.plan.generation, step, {}});
    return;
  }
  const bool ran = step == st.next_step - 1 && st.issued_generation == st.plan.generation;
  const std::size_t slices = ran ? st.issued_slices : 0;
  std::vector<bool> asked(members.size(), false);  // by node: its first member is asked for the rest
  for (std::size_t r = 0; r < members.size(); ++r) {
    snapshot_msg msg{st.plan.generation, step, {}};
    const auto node = static_cast<std::size_t>(st.plan.member_node.at(r));
    if (!asked.at(node)) {
      asked[node] = true;
      for (std::size_t k = slices; k < st.plan.worker_node.size(); ++k)
        if (st.plan.worker_node[k] == st.plan.member_node[r]) msg.workers.push_back(static_cast<std::uint32_t>(k));
    }
    self->send(members[r], std::move(msg));
  }
}

void send_ledger_snapshot(loader_ptr self, std::int64_t step) {
  auto& st = self->state;
  self->send(st.reducer, ledger_snapshot_msg{step, st.source->position_after(step)});
}

// Applies a commit: every step up to `through`, whose cut samples go back to
// the source while the rest is trained.
void apply_commit(loader_ptr self, const committed_msg& msg) {
  auto& st = self->state;
  for (auto& s : st.source->commit(msg.through, msg.returned))
    self->send(st.reducer, ledger_snapshot_msg{s.step, std::move(s.position)});
  st.committed_step = std::max(st.committed_step, msg.through);
}

// Steps per shard message: about `message_work` of work each, from the
// measured step time. See Note [Work flows through the loader].
constexpr double message_work_s = 0.002;
constexpr std::int64_t max_steps_per_message = 64;

void measure_step_time(loader_ptr self, std::int64_t through) {
  auto& st = self->state;
  const auto now = std::chrono::steady_clock::now();
  if (st.last_commit_step >= 0 && through > st.last_commit_step) {
    const double per_step = std::chrono::duration<double>(now - st.last_commit_time).count() /
                            static_cast<double>(through - st.last_commit_step);
    st.step_seconds = st.step_seconds == 0.0 ? per_step : 0.8 * st.step_seconds + 0.2 * per_step;
  }
  st.last_commit_time = now;
  st.last_commit_step = through;
  if (st.setup.steps_per_message > 0) {
    st.steps_per_message = st.setup.steps_per_message;
  } else if (st.step_seconds > 0.0) {
    st.steps_per_message = std::clamp<std::int64_t>(static_cast<std::int64_t>(message_work_s / st.step_seconds), 1,
                                                    max_steps_per_message);
  }
}

// No more steps: the last issued step is the final one.
void finish(loader_ptr self, bool evaluated) {
  auto& st = self->state;
  st.finished = true;
  if (st.pause_after && !st.paused) {  // nothing more will be issued: the pause point is reached
    st.paused = true;
    self->send(st.reducer, paused_msg{st.plan.generation, st.next_step - 1});
  }
  const std::int64_t last = st.next_step - 1;
  const auto& members = st.plan.members;
  if (!evaluated) start_evaluation(self, false);
  if (st.setup.checkpoints) {
    send_snapshot(self, last);
    if (st.source->in_flight(last))
      mark_snapshot(st, last);
    else
      send_ledger_snapshot(self, last);  // already committed (or nothing trained)
  }
  for (const auto& m : members) self->send(m, finish_msg{st.plan.generation, last});
  self->send(st.reducer,
             work_done_msg{last, !evaluated, st.setup.checkpoints, st.requeued_before + st.source->requeued()});
}

// Whether the next step may go out: not past max_steps or a pause point.
bool may_issue(const loader_state& st) {
  if (st.setup.max_steps > 0 && st.next_step >= st.setup.max_steps) return false;
  if (st.pause_after && st.next_step > *st.pause_after) return false;
  return st.source->what_next(static_cast<std::size_t>(st.setup.batch_size)) == data_source::next::step;
}

// A checkpoint is due after `step`: every checkpoint_every steps, or
// checkpoint_every_s after the last one.
bool snapshot_due(const loader_state& st, std::int64_t step) {
  if (!st.setup.checkpoints) return false;
  if (st.checkpoint_requested) return true;
  if (st.setup.checkpoint_every > 0 && (step + 1) % st.setup.checkpoint_every == 0) return true;
  return st.setup.checkpoint_every_s > 0.0 &&
         std::chrono::duration<double>(std::chrono::steady_clock::now() - st.last_snapshot_mark).count() >=
             st.setup.checkpoint_every_s;
}

// Sends each member a message with up to steps_per_message consecutive steps.
// A message ends at a checkpoint step, whose snapshot request follows it.
void issue_message(loader_ptr self) {
  auto& st = self->state;
  const auto& members = st.plan.members;
  std::vector<shard_msg> out(members.size(), shard_msg{st.plan.generation, {}});
  const std::vector<double> even(members.size(), 1.0);
  const auto& weights = st.weights.size() == members.size() ? st.weights : even;
  std::optional<std::int64_t> snapshot_step;
  for (std::int64_t i = 0; i < st.steps_per_message && may_issue(st) && !snapshot_step; ++i) {
    const std::int64_t step = st.next_step++;
    if (st.setup.crash_at == step)
      throw error(error_kind::internal, "injected crash (fault spec crash:loader@" + std::to_string(step + 1) + ")");
    const std::int64_t epoch = st.source->epoch();
    // See Note [Schedule position]: reproducible mode has no cuts, and there
    // the position is the step's index, also when a fault re-plans the step.
    // A round's position is its first inner step's (See Note [Round data]).
    const double position = st.setup.rounds ? st.setup.rounds->first_inner_position(step, epoch)
                            : st.setup.slice_rows > 0
                                ? static_cast<double>(step)
                                : st.source->schedule_position(step, st.setup.epoch_steps, st.setup.batch_size);
    const auto [indices, rows] = st.source->issue(step, static_cast<std::size_t>(st.setup.batch_size));
    const std::size_t rotation = static_cast<std::size_t>(step) % members.size();
    if (st.setup.slice_rows > 0) {
      // Every member gets the whole step and a range of its slices (See Note
      // [Stealing slices]); in a round, a slice is a logical worker's share.
      const auto slice_rows = st.setup.rounds ? static_cast<std::uint32_t>(st.setup.rounds->share_rows(
                                                    static_cast<std::int64_t>(indices.size())))
                                              : st.setup.slice_rows;
      const std::size_t slices =
          st.setup.rounds ? static_cast<std::size_t>(st.setup.rounds->slices(static_cast<std::int64_t>(indices.size())))
                          : (indices.size() + slice_rows - 1) / slice_rows;
      const auto sizes = split_by_weight(slices, weights, rotation);
      // A round's workers stay on their nodes (See Note [Worker placement]).
      const auto placed = st.plan.worker_node.empty() ? std::vector<std::vector<std::uint32_t>>{}
                          : worker_slices(st.plan.member_node, st.plan.worker_node, weights, rotation, slices);
      st.issued_slices = slices;
      st.issued_generation = st.plan.generation;
      if (st.setup.rounds)
        st.round_log.insert_or_assign(step, step_shard{step, epoch, {indices.begin(), indices.end()}, slice_rows, 0, 0,
                                                       nullptr, position, 0.0, nullptr,
                                                       static_cast<std::uint32_t>(slices)});
      const auto board = std::make_shared<slice_board>(slices, st.setup.steal_slices);
      const auto shared = std::make_shared<const std::vector<std::uint32_t>>(indices.begin(), indices.end());
      std::uint32_t first = 0;
      for (std::size_t r = 0; r < members.size(); ++r) {
        const auto last = first + static_cast<std::uint32_t>(sizes[r]);
        step_shard& shard = out[r].steps.emplace_back(step_shard{step, epoch, {}, slice_rows, first, last, board,
                                                                 position, st.lr_override, rows,
                                                                 static_cast<std::uint32_t>(slices)});
        if (!placed.empty()) shard.own(placed[r]);
        // See step_shard::shared_indices: a copy only for another process.
        if (members[r].node() == self->node()) shard.shared_indices = shared;
        else shard.indices = *shared;
        first = last;
      }
    } else {
      const auto sizes = split_by_weight(indices.size(), weights, rotation);
      std::size_t begin = 0;
      for (std::size_t r = 0; r < members.size(); ++r) {
        const auto part = indices.subspan(begin, sizes[r]);
        out[r].steps.push_back(
            step_shard{step, epoch, {part.begin(), part.end()}, 0, 0, 0, nullptr, position, st.lr_override, rows});
        begin += sizes[r];
      }
    }
    if (snapshot_due(st, step)) {
      st.checkpoint_requested = false;
      mark_snapshot(st, step);
      snapshot_step = step;
    }
  }
  for (std::size_t r = 0; r < members.size(); ++r) self->send(members[r], std::move(out[r]));
  if (snapshot_step) send_snapshot(self, *snapshot_step);
}

// A checkpoint asked for from outside: after the last step issued, or, when
// every issued step is committed (a stream waiting for records), after the
// last one committed, at once.
void checkpoint_soon(loader_ptr self) {
  auto& st = self->state;
  if (!st.setup.checkpoints || !st.have_plan || st.finished) return;
  const std::int64_t last = st.next_step - 1;
  if (last < 0) {
    st.checkpoint_requested = true;  // nothing trained yet: with the first step
    return;
  }
  if (st.source->in_flight(last)) {
    if (st.source->snapshot_marked(last)) return;  // already coming
    mark_snapshot(st, last);
  } else {
    st.last_snapshot_mark = std::chrono::steady_clock::now();
    st.last_snapshot_step = last;
    send_ledger_snapshot(self, last);
  }
  send_snapshot(self, last);
}

// An idle stream still checkpoints what it trained, checkpoint_every_s
// after the last checkpoint, so that the committed offset does not wait for
// the next records (See Note [Exactly-once offsets]).
void checkpoint_while_idle(loader_ptr self) {
  auto& st = self->state;
  if (!st.setup.checkpoints || st.setup.checkpoint_every_s <= 0.0 || st.committed_step <= st.last_snapshot_step) return;
  const auto every = std::chrono::duration<double>(st.setup.checkpoint_every_s);
  const auto since = std::chrono::steady_clock::now() - st.last_snapshot_mark;
  if (since >= every) {
    checkpoint_soon(self);
    return;
  }
  self->delayed_send(self, std::chrono::duration_cast<std::chrono::milliseconds>(every - since) +
                               std::chrono::milliseconds(1),
                     records_atom::value);
}

void set_idle(loader_ptr self, bool idle) {
  auto& st = self->state;
  if (st.idle == idle) return;
  st.idle = idle;
  self->send(st.reducer, idle_msg{st.plan.generation, idle});
}

// Ends an epoch once all of it is committed: reports it, evaluates, and
// starts the next one, or finishes after the last.
void end_epoch(loader_ptr self, bool step_limit) {
  auto& st = self->state;
  const auto totals = st.source->end_epoch();
  const bool last = step_limit || totals.epoch + 1 >= st.setup.epochs;
  // Evaluated every eval_every epochs, and always at the end of the run.
  const bool evaluate = last || (st.setup.eval_every > 0 && (totals.epoch + 1) % st.setup.eval_every == 0);
  self->send(st.reducer, epoch_ledger_msg{totals.epoch, totals.committed, totals.requeued, evaluate});
  if (evaluate) start_evaluation(self, true);
  if (last) {
    finish(self, true);
    return;
  }
  st.requeued_before += totals.requeued;
  st.source->start_epoch(totals.epoch + 1);
}

// A stream waits for records: the loader tells the reducer it is idle once
// nothing is in flight, and wakes when they come. Returns true when they
// came meanwhile.
bool wait_for_records(loader_ptr self, std::int64_t in_flight) {
  auto& st = self->state;
  if (in_flight == 0) {
    set_idle(self, true);
    checkpoint_while_idle(self);
  }
  // Weak: the queue may outlive the actor system.
  const auto wake = [loader = caf::actor_cast<caf::weak_actor_ptr>(self->ctrl())] {
    if (auto strong = loader.lock()) caf::anon_send(caf::actor_cast<loader_actor>(strong), records_atom::value);
  };
  return st.source->wake_when_ready(static_cast<std::size_t>(st.setup.batch_size), wake);
}

void pause_here(loader_ptr self) {
  auto& st = self->state;
  st.paused = true;
  self->send(st.reducer, paused_msg{st.plan.generation, st.next_step - 1});
}

// Issues as many shard messages as the prefetch window allows; See Note
// [Work flows through the loader].
void pump(loader_ptr self) {
  auto& st = self->state;
  while (st.have_plan && !st.finished && !st.paused) {
    if (st.stop_requested) {
      finish(self, false);
      return;
    }
    if (st.pause_after && st.next_step > *st.pause_after) {
      pause_here(self);
      return;
    }
    const std::int64_t in_flight = st.next_step - st.committed_step - 1;
    const std::int64_t ahead =
        messages_ahead(st.setup.prefetch, st.setup.work_ahead_s, st.step_seconds, st.steps_per_message);
    if (in_flight >= ahead * st.steps_per_message || st.pending_eval) return;
    const bool step_limit = st.setup.max_steps > 0 && st.next_step >= st.setup.max_steps;
    switch (st.source->what_next(static_cast<std::size_t>(st.setup.batch_size))) {
      case data_source::next::step:
        if (step_limit) {
          finish(self, false);
          return;
        }
        set_idle(self, false);
        issue_message(self);
        break;
      case data_source::next::wait_commits:
        return;
      case data_source::next::epoch_end:
        end_epoch(self, step_limit);
        if (st.pending_eval) return;  // the next epoch starts when the evaluation is complete
        break;
      case data_source::next::wait_records:
        if (step_limit) {
          finish(self, false);
          return;
        }
        // A pause point cannot be reached without records: the generation
        // may change after the steps already out.
        if (st.pause_after) {
          pause_here(self);
          return;
        }
        if (!wait_for_records(self, in_flight)) return;
        break;  // they came meanwhile
      case data_source::next::end:
        finish(self, false);  // the end of the stream, all of it committed
        return;
    }
  }
}

// Steps after `through` are not in the state the next generation starts
// from: their indices go back to the ledger, in order, and will be planned
// again under the same step numbers.
void roll_back(loader_ptr self, const rollback_msg& msg) {
  auto& st = self->state;
  const std::int64_t through = msg.commit.through;
  apply_commit(self, msg.commit);
  const std::size_t undone = st.source->roll_back(through);
  self->send(st.reducer, rollback_done_msg{static_cast<std::int64_t>(undone), st.source->committed_samples()});
  st.committed_step = through;
  st.last_commit_step = -1;  // the step-time measurement restarts
  if (st.pending_eval && st.pending_eval->step > through) st.pending_eval.reset();
  if (st.next_step > through + 1) {
    st.next_step = through + 1;
    st.finished = false;  // work remains, or the final evaluation must be redone
  }
}

// The states in `plan.moved` of the workers placed on `node` (See Note
// [Moving logical workers]).
moved_workers moved_to(const generation_plan& plan, std::int32_t node) {
  moved_workers out{plan.moved.step, {}, {}, {}};
  for (const std::uint32_t k : plan.moved.restart)
    if (plan.worker_node.at(k) == node) out.restart.push_back(k);
  if (plan.moved.workers.empty()) return out;
  const std::size_t size = plan.moved.states.size() / plan.moved.workers.size();
  for (std::size_t i = 0; i < plan.moved.workers.size(); ++i) {
    const std::uint32_t k = plan.moved.workers[i];
    if (plan.worker_node.at(k) != node) continue;
    out.workers.push_back(k);
    out.states.insert(out.states.end(), plan.moved.states.begin() + static_cast<std::ptrdiff_t>(i * size),
                      plan.moved.states.begin() + static_cast<std::ptrdiff_t>((i + 1) * size));
  }
  return out;
}

}  // namespace

loader_actor::behavior_type loader_behavior(loader_ptr self, loader_setup setup) {
  auto& st = self->state;
  st.setup = std::move(setup);
  // An exception (a broken exactly-once invariant, ledger_error) ends the
  // loader with its message; the reducer, which monitors it, ends the run.
  self->set_exception_handler([](std::exception_ptr& x) { return error_of(x); });
  st.source = make_source(st.setup);
  st.last_snapshot_mark = std::chrono::steady_clock::now();
  st.next_step = st.setup.start_step;
  st.committed_step = st.setup.start_step - 1;
  st.steps_per_message = std::max<std::int64_t>(1, st.setup.steps_per_message);
  return {
      [self](generation_plan& plan) {
        auto& st = self->state;
        st.plan = std::move(plan);
        st.reducer = st.plan.reducer;
        st.have_plan = true;
        st.paused = false;
        st.idle = false;  // a new generation starts busy (the reducer's view too)
        st.pause_after.reset();
        st.weights.clear();
        st.last_commit_step = -1;
        const auto size = static_cast<std::int32_t>(st.plan.members.size());
        for (std::int32_t r = 0; r < size; ++r) {
          const auto rank = static_cast<std::size_t>(r);
          const std::int32_t node = st.plan.member_node.empty() ? -1 : st.plan.member_node[rank];
          self->send(st.plan.members[rank],
                     begin_generation_msg{st.plan.generation, st.reducer, r, size, st.plan.state_source, st.plan.group,
                                          node, st.plan.worker_node, moved_to(st.plan, node)});
        }
        st.plan.moved = {};
        if (st.plan.snapshot_step >= -1) send_snapshot(self, st.plan.snapshot_step);
        if (st.pending_eval) send_evaluation(self, *st.pending_eval);
        pump(self);
      },
      [self](const committed_msg& msg) {
        apply_commit(self, msg);
        measure_step_time(self, msg.through);
        pump(self);
      },
      [self](const eval_done_msg& msg) {
        auto& st = self->state;
        if (st.pending_eval && st.pending_eval->step == msg.step && st.pending_eval->epoch_end == msg.epoch_end)
          st.pending_eval.reset();
        pump(self);
      },
      [self](const rollback_msg& msg) { roll_back(self, msg); },
      [self](const pause_msg& msg) {
        auto& st = self->state;
        if (msg.generation != st.plan.generation) return;
        st.pause_after = msg.after;
        pump(self);
        if (!st.paused && (st.finished || !st.have_plan)) pause_here(self);
      },
      [self](const shares_msg& msg) {
        auto& st = self->state;
        if (msg.generation == st.plan.generation) st.weights = msg.weights;
      },
      [self](const round_log_request& r) {
        round_log_msg out;
        const auto& log = self->state.round_log;
        for (auto it = log.lower_bound(r.from); it != log.end() && it->first <= r.through; ++it)
          out.rounds.push_back(it->second);
        return out;
      },
      [self](ledger_atom) {
        auto& st = self->state;
        return ledger_snapshot_msg{st.committed_step, st.source->position_after(st.committed_step)};
      },
      [self](stop_atom) {
        self->state.stop_requested = true;
        pump(self);
      },
      [self](records_atom) { pump(self); },
      [self](checkpoint_atom) { checkpoint_soon(self); },
      [self](const lr_msg& msg) { self->state.lr_override = msg.lr; },
  };
}

}  // namespace dpactor
