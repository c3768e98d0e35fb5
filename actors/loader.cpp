#include "actors/loader.hpp"

#include <algorithm>

namespace dpactor {
namespace {

using loader_ptr = caf::stateful_actor<loader_state>*;

// Rows [begin, end) of `total` for member `rank` of `size`: as even as
// possible, the first (total % size) members taking one more.
std::pair<std::size_t, std::size_t> even_slice(std::size_t total, std::size_t rank, std::size_t size) {
  const std::size_t base = total / size, extra = total % size;
  const std::size_t begin = rank * base + std::min(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

void send_evaluation(loader_ptr self, bool epoch_end) {
  auto& st = self->state;
  const auto& members = st.plan.members;
  for (std::size_t r = 0; r < members.size(); ++r) {
    const auto [begin, end] = even_slice(st.setup.test_rows, r, members.size());
    self->send(members[r], evaluate_msg{st.plan.generation, st.ledger->epoch(), st.next_step - 1,
                                        static_cast<std::uint32_t>(begin), static_cast<std::uint32_t>(end), epoch_end});
  }
}

// The ledger as a checkpoint after `step` must record it: steps issued after
// it are not committed, so their indices go back to the front, in order.
void send_ledger_snapshot(loader_ptr self, std::int64_t step) {
  auto& st = self->state;
  st.scratch.clear();
  for (const auto& [s, flight] : st.in_flight)
    if (s > step) st.scratch.insert(st.scratch.end(), flight.indices.begin(), flight.indices.end());
  self->send(st.reducer, ledger_snapshot_msg{step, st.ledger->position(st.scratch)});
}

// No more steps: the last issued step is the final one.
void finish(loader_ptr self, bool evaluated) {
  auto& st = self->state;
  st.finished = true;
  const std::int64_t last = st.next_step - 1;
  const auto& members = st.plan.members;
  if (!evaluated) send_evaluation(self, false);
  if (st.setup.checkpoints) {
    self->send(members.at(0), snapshot_msg{st.plan.generation, last});
    auto it = st.in_flight.find(last);
    if (it != st.in_flight.end())
      it->second.snapshot = true;
    else
      send_ledger_snapshot(self, last);  // already committed (or nothing trained)
  }
  for (const auto& m : members) self->send(m, finish_msg{st.plan.generation, last});
  self->send(st.reducer, work_done_msg{last, !evaluated, st.setup.checkpoints});
}

void issue_step(loader_ptr self) {
  auto& st = self->state;
  const std::int64_t step = st.next_step++;
  auto& flight = st.in_flight[step];
  const auto want = std::min<std::size_t>(static_cast<std::size_t>(st.setup.batch_size), st.ledger->waiting());
  st.ledger->take(want, flight.indices);
  const auto& members = st.plan.members;
  for (std::size_t r = 0; r < members.size(); ++r) {
    const auto [begin, end] = even_slice(flight.indices.size(), r, members.size());
    self->send(members[r], shard_msg{st.plan.generation, step, st.ledger->epoch(),
                                     {flight.indices.begin() + static_cast<std::ptrdiff_t>(begin),
                                      flight.indices.begin() + static_cast<std::ptrdiff_t>(end)}});
  }
  self->send(st.reducer, step_planned_msg{step, st.ledger->epoch(), static_cast<std::int64_t>(flight.indices.size()),
                                                st.ledger->waiting() == 0});
  if (st.setup.checkpoints && st.setup.checkpoint_every > 0 && (step + 1) % st.setup.checkpoint_every == 0) {
    self->send(members.at(0), snapshot_msg{st.plan.generation, step});
    flight.snapshot = true;
  }
}

// Issues as many steps as the prefetch window allows.
void pump(loader_ptr self) {
  auto& st = self->state;
  while (st.have_plan && !st.finished) {
    if (st.next_step - st.committed_step > st.setup.prefetch) return;
    const bool step_limit = st.setup.max_steps > 0 && st.next_step >= st.setup.max_steps;
    if (st.ledger->waiting() == 0) {
      if (!st.in_flight.empty()) return;  // the epoch ends once all of it is committed
      st.ledger->verify_complete();
      self->send(st.reducer, epoch_ledger_msg{st.ledger->epoch(), static_cast<std::int64_t>(st.ledger->committed()),
                                                    static_cast<std::int64_t>(st.ledger->requeued_total())});
      send_evaluation(self, true);
      if (step_limit || st.ledger->epoch() + 1 >= st.setup.epochs) {
        finish(self, true);
        return;
      }
      st.ledger->start_epoch(st.ledger->epoch() + 1);
      continue;
    }
    if (step_limit) {
      finish(self, false);
      return;
    }
    issue_step(self);
  }
}

}  // namespace

caf::behavior loader_actor(caf::stateful_actor<loader_state>* self, loader_setup setup) {
  auto& st = self->state;
  st.setup = std::move(setup);
  st.ledger.emplace(st.setup.train_rows, st.setup.seed, st.setup.shuffle);
  st.next_step = st.setup.start_step;
  st.committed_step = st.setup.start_step - 1;
  if (st.setup.resume_position) {
    st.ledger->restore(*st.setup.resume_position);
    // A checkpoint taken at the end of an epoch resumes with the next one; that
    // epoch was already evaluated.
    if (st.ledger->epoch_complete() && st.ledger->epoch() + 1 < st.setup.epochs)
      st.ledger->start_epoch(st.ledger->epoch() + 1);
  } else {
    st.ledger->start_epoch(0);
  }
  return {
      [self](generation_plan& plan) {
        auto& st = self->state;
        st.plan = std::move(plan);
        st.reducer = st.plan.reducer;
        st.have_plan = true;
        const auto size = static_cast<std::int32_t>(st.plan.members.size());
        for (std::int32_t r = 0; r < size; ++r)
          self->send(st.plan.members[static_cast<std::size_t>(r)],
                     begin_generation_msg{st.plan.generation, st.reducer, r, size, st.plan.state_source, st.plan.group});
        pump(self);
      },
      [self](const committed_msg& msg) {
        auto& st = self->state;
        auto it = st.in_flight.find(msg.step);
        if (it == st.in_flight.end()) return;
        st.ledger->commit(it->second.indices);
        st.committed_step = std::max(st.committed_step, msg.step);
        const bool snapshot = it->second.snapshot;
        st.in_flight.erase(it);
        if (snapshot) send_ledger_snapshot(self, msg.step);
        pump(self);
      },
      [self](stop_atom) {
        auto& st = self->state;
        if (!st.finished && st.have_plan) finish(self, false);
      },
  };
}

}  // namespace dpactor
