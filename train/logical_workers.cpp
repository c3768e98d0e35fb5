#include "train/logical_workers.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <utility>

#include "comms/collective.hpp"
#include "train/bf16_codec.hpp"
#include "train/int8_codec.hpp"

namespace dpactor {

logical_worker_store::logical_worker_store(std::size_t workers, std::vector<float> initial)
    : initial_(std::move(initial)), states_(workers) {}

logical_worker_store::logical_worker_store(std::size_t workers, std::span<const float> initial, std::int64_t first_round)
    : first_round_(first_round), states_(workers) {
  const std::size_t per = initial.size() / workers;
  initial_.assign(initial.begin(), initial.begin() + static_cast<std::ptrdiff_t>(per));  // not read: every worker has one
  for (std::size_t k = 0; k < workers; ++k)
    states_[k].rounds.emplace(first_round - 1, std::vector<float>(initial.begin() + static_cast<std::ptrdiff_t>(k * per),
                                                                  initial.begin() + static_cast<std::ptrdiff_t>((k + 1) * per)));
}

std::vector<float> logical_worker_store::read_all(std::int64_t round) const {
  std::vector<float> out;
  for (std::size_t k = 0; k < states_.size(); ++k) {
    const std::vector<float> one = read(k, round);
    out.insert(out.end(), one.begin(), one.end());
  }
  return out;
}

bool logical_worker_store::holds(std::size_t k) const {
  const std::lock_guard lock(mutex_);
  return states_.at(k).held;
}

void logical_worker_store::hold_only(std::span<const std::size_t> workers) {
  const std::lock_guard lock(mutex_);
  std::vector<bool> keep(states_.size(), false);
  for (const std::size_t k : workers) keep.at(k) = true;
  for (std::size_t k = 0; k < states_.size(); ++k)
    if (!keep[k]) states_[k] = kept{{}, false, false};
}

std::vector<float> logical_worker_store::read(std::size_t k, std::int64_t round) const {
  const std::lock_guard lock(mutex_);
  if (!states_.at(k).held)
    throw std::logic_error("logical worker " + std::to_string(k) + " is not held by this process (another node runs it)");
  const auto& rounds = states_.at(k).rounds;
  const auto it = rounds.lower_bound(round);  // the first at or after `round`
  if (it != rounds.begin()) return std::prev(it)->second;
  if (states_[k].pruned)
    throw std::logic_error("logical worker " + std::to_string(k) + ": its state before round " +
                           std::to_string(round) + " is no longer kept");
  return initial_;
}

std::optional<std::vector<float>> logical_worker_store::read_when_written(std::size_t k, std::int64_t round,
                                                                          const std::function<bool()>& stop,
                                                                          const std::function<void()>& waiting) const {
  {
    std::unique_lock lock(mutex_);
    bool told = false;
    while (round > first_round_ && states_.at(k).held && states_[k].rounds.count(round - 1) == 0) {
      lock.unlock();
      if (stop()) return std::nullopt;
      if (!std::exchange(told, true)) waiting();
      lock.lock();
      written_.wait_for(lock, std::chrono::milliseconds(5));
    }
  }
  return read(k, round);
}

void logical_worker_store::write(std::size_t k, std::int64_t round, std::vector<float> state) {
  const std::lock_guard lock(mutex_);
  written_.notify_all();
  auto& w = states_.at(k);
  w.rounds.insert_or_assign(round, std::move(state));
  const auto keep = w.rounds.lower_bound(w.rounds.rbegin()->first - kept_rounds);
  if (keep != w.rounds.begin()) {
    w.rounds.erase(w.rounds.begin(), keep);
    w.pruned = true;
  }
}

void logical_worker_store::reset(std::size_t k, std::int64_t round, std::vector<float> state) {
  const std::lock_guard lock(mutex_);
  written_.notify_all();
  auto& w = states_.at(k);
  w.rounds.clear();
  w.rounds.emplace(round - 1, std::move(state));
  w.pruned = true;  // nothing before it
  w.held = true;
}
void logical_worker_store::install_first(std::size_t k) {
  const std::lock_guard lock(mutex_);
  if (first_round_ != 0)
    throw std::logic_error("logical worker " + std::to_string(k) + ": a resumed store has no first round to start from");
  written_.notify_all();
  states_.at(k) = kept{{}, false, true};
}
std::vector<float> logical_worker_store::first_state() const {
  const std::lock_guard lock(mutex_);
  if (first_round_ != 0) throw std::logic_error("a resumed store has no first round's state");
  return initial_;
}
void logical_worker_store::install(std::size_t k, std::int64_t round, std::vector<float> state) {
  const std::lock_guard lock(mutex_);
  auto& w = states_.at(k);
  if (w.held && !w.rounds.empty() && w.rounds.rbegin()->first >= round - 1) return;
  written_.notify_all();
  w.rounds.clear();
  w.rounds.emplace(round - 1, std::move(state));
  w.pruned = true;  // nothing before it
  w.held = true;
}

logical_worker_runner::logical_worker_runner(std::unique_ptr<replica> inner, std::shared_ptr<const round_setup> setup)
    : inner_(std::move(inner)), setup_(std::move(setup)) {}

batch_stats logical_worker_runner::compute(const step_shard& shard, std::size_t slice,
                                           std::span<const std::uint32_t> rows, const dataset& train, replica& model,
                                           std::span<float> out, device_progress& progress) {
  return run(slice, shard.step, shard.schedule_position, rows, train, model.state_buffer(), out, progress);
}

batch_stats logical_worker_runner::run(std::size_t k, std::int64_t round, double first_position,
                                       std::span<const std::uint32_t> rows, const dataset& train,
                                       std::span<const float> global, std::span<float> out,
                                       device_progress& progress) {
  const state_layout& layout = inner_->layout();
  const worker_state_shape shape = setup_->state_shape(layout);
  const std::size_t p = shape.parameters;
  if (global.size() < p || out.size() < p)
    throw std::logic_error("a logical worker's round: the global model's parameters do not match the inner model's");
  std::vector<float> own;
  if (stop_) {  // See Note [Overlapped delayed rounds]
    auto ready = setup_->store->read_when_written(k, round, stop_, [&] { progress.mark(device_phase::collective, round); });
    if (!ready)
      throw collective_error(collective_errc::aborted, "the generation ended while logical worker " + std::to_string(k) +
                                                           " waited for its round " + std::to_string(round));
    own = std::move(*ready);
  } else {
    own = setup_->store->read(k, round);
  }
  if (own.size() != shape.size()) throw std::logic_error("a logical worker's state does not match the inner model's");
  // Where the worker starts: the global parameters, or with fragments its
  // own, with the fragment exchanged last step taken from the global ones
  // (See Note [Fragments]).
  const auto [fb, fe] = setup_->fragment(round);
  state_.resize(layout.total_size());
  if (shape.own_parameters()) {
    const auto [lb, le] = setup_->fragment(round - 1);
    std::copy_n(own.begin() + static_cast<std::ptrdiff_t>(shape.parameters_at()), p, state_.begin());
    std::copy(global.begin() + static_cast<std::ptrdiff_t>(lb), global.begin() + static_cast<std::ptrdiff_t>(le),
              state_.begin() + static_cast<std::ptrdiff_t>(lb));
  } else if (shape.delayed) {
    // See Note [Delayed rounds]: the global weights plus its progress.
    const float* d = own.data() + shape.progress_at();
    for (std::size_t i = 0; i < p; ++i) state_[i] = global[i] + d[i];
  } else {
    std::copy_n(global.begin(), p, state_.begin());
  }
  std::copy_n(own.begin(), shape.kept, state_.begin() + static_cast<std::ptrdiff_t>(p));
  inner_->import_state(state_);
  batch_stats stats;
  const auto batch = static_cast<std::size_t>(setup_->worker_batch);
  const std::size_t micro = inner_->max_rows();
  for (std::size_t at = 0, j = 0; at < rows.size(); at += batch, ++j) {
    const auto step_rows = rows.subspan(at, std::min(batch, rows.size() - at));
    inner_->zero_grad();
    for (std::size_t m = 0; m < step_rows.size(); m += micro) {
      progress.mark(device_phase::forward, round);
      stats += inner_->accumulate(train.batch(step_rows.subspan(m, std::min(micro, step_rows.size() - m))));
    }
    progress.mark(device_phase::optimizer, round);
    inner_->update_in_place(setup_->inner_schedule.at(first_position + static_cast<double>(j)),
                            static_cast<double>(step_rows.size()));
  }
  const std::vector<float> after = inner_->export_state();
  // The weight: the samples trained since the exchanged fragment's last
  // exchange (this step's alone without fragments).
  auto n = static_cast<float>(rows.size());
  if (shape.own_parameters()) {
    float* samples = own.data() + shape.samples_at();
    for (std::size_t f = 0; f < shape.fragments; ++f) samples[f] += n;
    const auto f = static_cast<std::size_t>(round % static_cast<std::int64_t>(shape.fragments));
    n = samples[f];
    samples[f] = 0.0f;
    std::copy_n(after.begin(), p, own.begin() + static_cast<std::ptrdiff_t>(shape.parameters_at()));
  }
  weight_ = n;
  std::fill(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(p), 0.0f);
  if (shape.delayed) {
    // Against where it started; the run's last round is applied at once (a
    // flush), so the worker keeps no progress after it.
    float* d = own.data() + shape.progress_at();
    const bool last = flushes(round);
    for (std::size_t i = 0; i < p; ++i) {
      out[i] = n * (state_[i] - after[i]);
      d[i] = last ? 0.0f : after[i] - state_[i];
    }
  } else {
    for (std::size_t i = fb; i < fe; ++i) out[i] = n * (global[i] - after[i]);
  }
  std::copy(after.begin() + static_cast<std::ptrdiff_t>(p), after.end(), own.begin());  // the slots and the tail
  if (!shape.residual) {
    setup_->store->write(k, round, std::move(own));
    return stats;
  }
  for (std::size_t i = fb; i < fe; ++i) out[i] += own[shape.residual_at() + i];
  const std::lock_guard lock(pending_mutex_);
  pending_.insert_or_assign({k, round}, std::move(own));
  return stats;
}

void logical_worker_runner::keep_residual(std::int64_t step, std::size_t slice, std::span<const float> residual) {
  if (!setup_->residual()) return;
  std::vector<float> state;
  {
    const std::lock_guard lock(pending_mutex_);
    const auto it = pending_.find({slice, step});
    if (it == pending_.end()) throw std::logic_error("a logical worker's residual without its round");
    state = std::move(it->second);
    pending_.erase(it);
    // Rounds a failed exchange left behind are never told.
    std::erase_if(pending_, [&](const auto& e) { return e.first.second < step - 1; });
  }
  const auto [fb, fe] = setup_->fragment(step);
  const std::size_t at = setup_->state_shape(inner_->layout()).residual_at();
  std::copy(residual.begin() + static_cast<std::ptrdiff_t>(fb), residual.begin() + static_cast<std::ptrdiff_t>(fe),
            state.begin() + static_cast<std::ptrdiff_t>(at + fb));
  setup_->store->write(slice, step, std::move(state));
}

void logical_worker_runner::discard(std::int64_t step, std::size_t slice) {
  {
    const std::lock_guard lock(pending_mutex_);
    pending_.erase({slice, step});
  }
  setup_->store->write(slice, step, setup_->store->read(slice, step));
}

}  // namespace dpactor

namespace dpactor {

void logical_worker_runner::step_starts(std::int64_t step, std::span<const float> state) {
  if (!setup_->history) return;
  setup_->history->record_start(step, state.first(std::min(state.size(), setup_->state_shape(inner_->layout()).parameters)));
}

void logical_worker_runner::keep_maxima(std::int64_t step, std::span<const float> maxima) {
  if (setup_->history) setup_->history->record_maxima(step, maxima);
}

void logical_worker_runner::replay(std::size_t k, const step_shard& shard, const dataset& train,
                                   std::span<float> scratch, device_progress& progress) {
  const auto missing = [&](const char* what) {
    return std::runtime_error("logical worker " + std::to_string(k) + "'s round " + std::to_string(shard.step + 1) +
                              " cannot be run again here: this process no longer keeps the round's " + what);
  };
  if (!setup_->history) throw missing("global parameters");
  const std::optional<std::vector<float>> global = setup_->history->start(shard.step);
  if (!global) throw missing("global parameters");
  const std::span<const std::uint32_t> all = shard.all_indices();
  const std::size_t at = std::min(all.size(), k * shard.slice_rows);  // as step_runner::compute_slices cuts them
  const auto rows = all.subspan(at, std::min<std::size_t>(shard.slice_rows, all.size() - at));
  run(k, shard.step, shard.schedule_position, rows, train, *global, scratch, progress);
  if (!setup_->residual()) return;
  // What the exchange would have kept (step_runner::exchange_int8 and
  // exchange_bf16), on the round's fragment.
  const auto [fb, fe] = setup_->fragment(shard.step);
  const std::span<float> v = scratch.subspan(fb, fe - fb);
  if (setup_->codec == sync_codec::int8) {
    const std::optional<std::vector<float>> maxima = setup_->history->maxima(shard.step);
    if (!maxima) throw missing("int8 block maxima");
    int8_plan plan;
    plan.build(*maxima, maxima->size() / int8_blocks(v.size()));
    std::vector<std::int8_t> sum(v.size(), 0);
    plan.encode(k, v, sum);
  } else {
    for (float& x : v) x -= from_bf16(to_bf16(x));
  }
  keep_residual(shard.step, k, scratch);
}

}  // namespace dpactor

namespace dpactor {

void logical_worker_runner::restart(std::size_t k, std::int64_t round, std::vector<float> state,
                                    std::span<const float> global) {
  const worker_state_shape shape = setup_->state_shape(inner_->layout());
  const std::size_t p = shape.parameters;
  if (state.size() != shape.size() || global.size() < p)
    throw std::logic_error("a restarted logical worker's state does not match the inner model's");
  const auto at = [&](std::size_t i) { return state.begin() + static_cast<std::ptrdiff_t>(i); };
  if (shape.residual) std::fill(at(shape.residual_at()), at(shape.residual_at() + p), 0.0f);
  if (shape.own_parameters()) {
    std::copy_n(global.begin(), p, at(shape.parameters_at()));
    std::fill(at(shape.samples_at()), at(shape.samples_at() + shape.fragments), 0.0f);
  } else if (shape.delayed) {
    std::fill(at(shape.progress_at()), at(shape.progress_at() + p), 0.0f);
  }
  setup_->store->install(k, round, std::move(state));
}

}  // namespace dpactor
