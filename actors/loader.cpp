#include "actors/loader.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "train/schedule_position.hpp"
#include "train/straggler.hpp"

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
  eval.epoch = st.issued->ledger().epoch();
  eval.step = st.next_step - 1;
  eval.epoch_end = epoch_end;
  st.pending_eval = eval;
  send_evaluation(self, eval);
}

// The ledger, or the stream's position, as a checkpoint after `step` records it.
ledger_position position_after(const loader_state& st, std::int64_t step) {
  if (!st.records) return st.issued->position_after(step);
  ledger_position p;
  p.stream = st.records->position_after(step);
  return p;
}

bool in_flight(const loader_state& st, std::int64_t step) {
  return st.records ? st.records->in_flight(step) : st.issued->in_flight(step);
}

void mark_snapshot(loader_state& st, std::int64_t step) {
  st.last_snapshot_mark = std::chrono::steady_clock::now();
  st.last_snapshot_step = step;
  if (st.records) st.records->mark_snapshot(step);
  else st.issued->mark_snapshot(step);
}

void send_ledger_snapshot(loader_ptr self, std::int64_t step) {
  auto& st = self->state;
  self->send(st.reducer, ledger_snapshot_msg{step, position_after(st, step)});
}

// Applies a commit: every step up to `through`, whose cut indices go back to
// the ledger (or the stream) while the rest is trained.
void apply_commit(loader_ptr self, const committed_msg& msg) {
  auto& st = self->state;
  if (st.records) {
    for (auto& s : st.records->commit(msg.through, msg.returned)) {
      ledger_position p;
      p.stream = std::move(s.position);
      self->send(st.reducer, ledger_snapshot_msg{s.step, std::move(p)});
    }
  } else {
    for (auto& s : st.issued->commit(msg.through, msg.returned))
      self->send(st.reducer, ledger_snapshot_msg{s.step, std::move(s.position)});
  }
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
    self->send(members.at(0), snapshot_msg{st.plan.generation, last});
    if (in_flight(st, last))
      mark_snapshot(st, last);
    else
      send_ledger_snapshot(self, last);  // already committed (or nothing trained)
  }
  for (const auto& m : members) self->send(m, finish_msg{st.plan.generation, last});
  self->send(st.reducer, work_done_msg{last, !evaluated, st.setup.checkpoints,
                                       st.requeued_before + static_cast<std::int64_t>(st.issued->ledger().requeued_total())});
}

// Stream mode: whether a step's records are there: a whole batch, or what is
// left at the end of the stream.
bool records_ready(const loader_state& st) {
  const std::size_t available = st.records->available();
  return available >= static_cast<std::size_t>(st.setup.batch_size) || (available > 0 && st.records->queue().closed());
}

// Whether the next step may go out: not past max_steps or a pause point.
bool may_issue(const loader_state& st) {
  if (st.setup.max_steps > 0 && st.next_step >= st.setup.max_steps) return false;
  if (st.pause_after && st.next_step > *st.pause_after) return false;
  return st.records ? records_ready(st) : st.issued->ledger().waiting() > 0;
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
      throw std::runtime_error("injected crash (fault spec crash:loader@" + std::to_string(step + 1) + ")");
    const epoch_ledger& ledger = st.issued->ledger();
    const std::int64_t epoch = ledger.epoch();
    // See Note [Schedule position]: reproducible mode has no cuts, and there
    // the position is the step's index, also when a fault re-plans the step;
    // a stream has no epochs to place a step in.
    const double position = st.setup.slice_rows > 0 || st.records
                                ? static_cast<double>(step)
                                : schedule_position(epoch, st.setup.epoch_steps, ledger.samples() - ledger.waiting(),
                                                    st.setup.batch_size);
    std::shared_ptr<const dataset> rows;
    if (st.records) {
      // A stream's step addresses the rows of its own chunk.
      rows = st.records->issue(step, static_cast<std::size_t>(st.setup.batch_size));
      st.chunk_rows.resize(rows->rows);
      std::iota(st.chunk_rows.begin(), st.chunk_rows.end(), 0u);
    }
    const std::span<const std::uint32_t> indices =
        st.records ? std::span<const std::uint32_t>(st.chunk_rows)
                   : st.issued->issue(step, static_cast<std::size_t>(st.setup.batch_size));
    const std::size_t rotation = static_cast<std::size_t>(step) % members.size();
    if (st.setup.slice_rows > 0) {
      // Every member gets the whole step and a range of its slices (See Note
      // [Stealing slices]).
      const std::size_t slices = (indices.size() + st.setup.slice_rows - 1) / st.setup.slice_rows;
      const auto sizes = split_by_weight(slices, weights, rotation);
      const auto board = std::make_shared<slice_board>(slices, st.setup.steal_slices);
      std::uint32_t first = 0;
      for (std::size_t r = 0; r < members.size(); ++r) {
        const auto last = first + static_cast<std::uint32_t>(sizes[r]);
        out[r].steps.push_back(step_shard{step, epoch, {indices.begin(), indices.end()}, st.setup.slice_rows, first,
                                          last, board, position, st.lr_override, rows});
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
  if (snapshot_step) self->send(members.at(0), snapshot_msg{st.plan.generation, *snapshot_step});
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
  if (in_flight(st, last)) {
    if (st.records ? st.records->snapshot_marked(last) : st.issued->snapshot_marked(last)) return;  // already coming
    mark_snapshot(st, last);
  } else {
    st.last_snapshot_mark = std::chrono::steady_clock::now();
    st.last_snapshot_step = last;
    send_ledger_snapshot(self, last);
  }
  self->send(st.plan.members.at(0), snapshot_msg{st.plan.generation, last});
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

// Stream mode: issues steps while records are there; See Note [Work flows
// through the loader].
void pump_stream(loader_ptr self) {
  auto& st = self->state;
  while (st.have_plan && !st.finished && !st.paused) {
    if (st.stop_requested) {
      finish(self, false);
      return;
    }
    const std::int64_t in_flight = st.next_step - st.committed_step - 1;
    if (st.pause_after && st.next_step > *st.pause_after) {
      st.paused = true;
      self->send(st.reducer, paused_msg{st.plan.generation, st.next_step - 1});
      return;
    }
    if (st.setup.max_steps > 0 && st.next_step >= st.setup.max_steps) {
      finish(self, false);
      return;
    }
    if (st.records->drained()) {
      if (in_flight == 0) finish(self, false);  // the end of the stream, all of it committed
      return;
    }
    if (!records_ready(st)) {
      // A pause point cannot be reached without records: the generation
      // may change after the steps already out.
      if (st.pause_after) {
        st.paused = true;
        self->send(st.reducer, paused_msg{st.plan.generation, st.next_step - 1});
        return;
      }
      if (in_flight == 0) {
        set_idle(self, true);
        checkpoint_while_idle(self);
      }
      const std::size_t want = static_cast<std::size_t>(st.setup.batch_size) - st.records->sent_back();
      // Weak: the queue may outlive the actor system.
      const auto wake = [loader = caf::actor_cast<caf::weak_actor_ptr>(self->ctrl())] {
        if (auto strong = loader.lock()) caf::anon_send(caf::actor_cast<loader_actor>(strong), records_atom::value);
      };
      if (st.records->queue().notify_when(want, wake))
        continue;  // they came meanwhile
      return;
    }
    if (in_flight >= st.setup.prefetch * st.steps_per_message) return;
    set_idle(self, false);
    issue_message(self);
  }
}

// Issues as many shard messages as the prefetch window allows.
void pump(loader_ptr self) {
  auto& st = self->state;
  if (st.records) {
    pump_stream(self);
    return;
  }
  while (st.have_plan && !st.finished && !st.paused) {
    if (st.stop_requested) {
      finish(self, false);
      return;
    }
    if (st.pause_after && st.next_step > *st.pause_after) {
      st.paused = true;
      self->send(st.reducer, paused_msg{st.plan.generation, st.next_step - 1});
      return;
    }
    const std::int64_t in_flight = st.next_step - st.committed_step - 1;
    if (in_flight >= st.setup.prefetch * st.steps_per_message || st.pending_eval) return;
    const bool step_limit = st.setup.max_steps > 0 && st.next_step >= st.setup.max_steps;
    if (st.issued->ledger().waiting() == 0) {
      if (!st.issued->empty()) return;  // the epoch ends once all of it is committed
      st.issued->ledger().verify_complete();
      const bool last = step_limit || st.issued->ledger().epoch() + 1 >= st.setup.epochs;
      // Evaluated every eval_every epochs, and always at the end of the run.
      const bool evaluate =
          last || (st.setup.eval_every > 0 && (st.issued->ledger().epoch() + 1) % st.setup.eval_every == 0);
      self->send(st.reducer, epoch_ledger_msg{st.issued->ledger().epoch(), static_cast<std::int64_t>(st.issued->ledger().committed()),
                                              static_cast<std::int64_t>(st.issued->ledger().requeued_total()), evaluate});
      if (evaluate) start_evaluation(self, true);
      if (last) {
        finish(self, true);
        return;
      }
      st.requeued_before += static_cast<std::int64_t>(st.issued->ledger().requeued_total());
      st.issued->ledger().start_epoch(st.issued->ledger().epoch() + 1);
      if (evaluate) return;  // the next epoch starts when the evaluation is complete
      continue;
    }
    if (step_limit) {
      finish(self, false);
      return;
    }
    issue_message(self);
  }
}

// Steps after `through` are not in the state the next generation starts
// from: their indices go back to the ledger, in order, and will be planned
// again under the same step numbers.
void roll_back(loader_ptr self, const rollback_msg& msg) {
  auto& st = self->state;
  const std::int64_t through = msg.commit.through;
  apply_commit(self, msg.commit);
  const std::size_t undone = st.records ? st.records->roll_back(through) : st.issued->roll_back(through);
  self->send(st.reducer, rollback_done_msg{static_cast<std::int64_t>(undone)});
  st.committed_step = through;
  st.last_commit_step = -1;  // the step-time measurement restarts
  if (st.pending_eval && st.pending_eval->step > through) st.pending_eval.reset();
  if (st.next_step > through + 1) {
    st.next_step = through + 1;
    st.finished = false;  // work remains, or the final evaluation must be redone
  }
}

}  // namespace

loader_actor::behavior_type loader_behavior(loader_ptr self, loader_setup setup) {
  auto& st = self->state;
  st.setup = std::move(setup);
  // An exception (a broken exactly-once invariant, ledger_error) ends the
  // loader with its message; the reducer, which monitors it, ends the run.
  self->set_exception_handler([](std::exception_ptr& x) { return error_of(x); });
  st.issued.emplace(st.setup.train_rows, st.setup.seed, st.setup.shuffle);
  st.last_snapshot_mark = std::chrono::steady_clock::now();
  if (st.setup.stream)
    st.records.emplace(*st.setup.stream, st.setup.resume_position ? st.setup.resume_position->stream : stream_position{});
  st.next_step = st.setup.start_step;
  st.committed_step = st.setup.start_step - 1;
  st.steps_per_message = std::max<std::int64_t>(1, st.setup.steps_per_message);
  if (st.setup.resume_position && !st.records) {
    st.issued->ledger().restore(*st.setup.resume_position);
    // A checkpoint taken at the end of an epoch resumes with the next one; that
    // epoch was already evaluated.
    if (st.issued->ledger().epoch_complete() && st.issued->ledger().epoch() + 1 < st.setup.epochs)
      st.issued->ledger().start_epoch(st.issued->ledger().epoch() + 1);
  } else {
    st.issued->ledger().start_epoch(0);
  }
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
        for (std::int32_t r = 0; r < size; ++r)
          self->send(st.plan.members[static_cast<std::size_t>(r)],
                     begin_generation_msg{st.plan.generation, st.reducer, r, size, st.plan.state_source, st.plan.group});
        if (st.plan.snapshot_step >= -1)
          self->send(st.plan.members.at(0), snapshot_msg{st.plan.generation, st.plan.snapshot_step});
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
        if (!st.paused && (st.finished || !st.have_plan)) {
          st.paused = true;
          self->send(st.reducer, paused_msg{st.plan.generation, st.next_step - 1});
        }
      },
      [self](const shares_msg& msg) {
        auto& st = self->state;
        if (msg.generation == st.plan.generation) st.weights = msg.weights;
      },
      [self](ledger_atom) {
        auto& st = self->state;
        return ledger_snapshot_msg{st.committed_step, position_after(st, st.committed_step)};
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
